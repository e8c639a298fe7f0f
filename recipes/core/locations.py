"""Where data and models come from: a path, or a Hugging Face Hub name (standard library only).

Light enough for the command line to refuse a ``--data`` or ``--model`` that is neither an
existing path nor a possible Hub name in one line, before torch, transformers or peft load.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import DataSourceError

TABULAR_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
TEXT_SUFFIXES = ("", ".txt", ".conll", ".conllu", ".tsv", ".bio", ".iob")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def looks_like_hub_name(source: str) -> bool:
    """``conll2003`` or ``owner/name``; not a path (``./x``, ``/x``, ``a/b/c``, ``x.jsonl``).

    Example:
        >>> looks_like_hub_name("eriktks/conll2003"), looks_like_hub_name("data/train.jsonl")
        (True, False)
    """
    suffix = Path(source).suffix.lower()
    return bool(_HUB_NAME.fullmatch(source)) and suffix not in (*TABULAR_BUILDERS, *TEXT_SUFFIXES[1:])


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


def check_model(source: str | None, option: str = "--model") -> None:
    """Refuse a model that names a local path that is not there (``None``: not given), in one line,
    before transformers would take it for a Hub name (a "Repo id must be in the form..." error, or
    a minute of retries online).

    Raises:
        DataSourceError: ``OPTION 'SOURCE': no such model folder or file`` (``no such GGUF file``).

    Example:
        >>> check_model("/models/gone")
        Traceback (most recent call last):
        layerfusion_recipes.core.errors.DataSourceError: --model '/models/gone': no such model folder or file
    """
    if source is not None and is_local_path(source) and not Path(source).expanduser().exists():
        what = "GGUF file" if source.lower().endswith(".gguf") else "model folder or file"
        raise DataSourceError(f"{option} {source!r}: no such {what}")
