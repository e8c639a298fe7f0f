"""Offline decoder LLMs from GGUF files: a named model (``gemma3-270m``) or ``path/to/file.gguf``.

A named model is a GGUF file shipped split over pip packages (the optional extra
``pip install -e ".[llm]"``). :func:`resolve_model` turns a ``--model`` value into a folder that
``from_pretrained`` loads in seconds:

1. a named model's parts are concatenated, in order, into ``CACHE/gguf/FILE`` (once; through a
   temporary file renamed into place, so a crash never leaves a partial file; its sha256 checked);
2. the GGUF file is loaded by transformers (``from_pretrained(folder, gguf_file=...)``, which
   needs the ``gguf`` package), de-quantised to float32, and saved with ``save_pretrained``
   (safetensors + tokenizer) into ``CACHE/models/NAME`` (once; written into a temporary folder
   renamed into place). For Gemma 3 270M the conversion took 1-1.5 minutes on 2 CPU cores (peak
   RSS 3.3 GB); a reload of the saved copy takes about 5 s, mostly the tokenizer.

``CACHE`` is ``$LAYERFUSION_CACHE`` when set, else ``~/.cache/peft_layerfusion``. What is done and
how long it took is said on stderr. Any other ``--model`` value (a folder, a hub name) is returned
unchanged. Nothing here is tied to one architecture: a named model is a file name, its part
packages and its checksum (:data:`NAMED_MODELS`).

Example (with the ``llm`` extra installed; the first call takes about a minute, later ones none)::

    folder = resolve_model("gemma3-270m")
    model = AutoModelForCausalLM.from_pretrained(folder)

and what runs anywhere:

    >>> resolve_model("bert-base-cased")  # neither a named model nor a .gguf file: unchanged
    'bert-base-cased'
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import TextIO

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from ..options.model_names import NAMED_MODELS, NamedGGUF

CACHE_VARIABLE = "LAYERFUSION_CACHE"
DEFAULT_CACHE = Path("~/.cache/peft_layerfusion")
INSTALL_EXTRA = 'pip install -e ".[llm]"'
CHUNK = 1 << 22  # bytes read at a time while concatenating and hashing


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$LAYERFUSION_CACHE`` if set (and not empty), else ``~/.cache/peft_layerfusion``."""
    return Path(environ.get(CACHE_VARIABLE) or DEFAULT_CACHE).expanduser()


def distribution_name(package: str) -> str:
    """The pip name of a part package (``gemma3_270m_..._part1`` -> ``gemma3-270m-...-part1``)."""
    return package.replace("_", "-")


def part_paths(name: str, named: NamedGGUF) -> list[Path]:
    """The installed part files of ``named``, in order; a one-line error when any is missing."""
    missing = [package for package in named.packages if importlib.util.find_spec(package) is None]
    if missing == list(named.packages):
        raise ValueError(f"--model {name}: the optional extra is not installed: {INSTALL_EXTRA}")
    if missing:
        wanted = ", ".join(distribution_name(package) for package in missing)
        raise ValueError(f"--model {name}: part package(s) {wanted} not installed: {INSTALL_EXTRA}")
    paths = []
    for index, package in enumerate(named.packages):
        path = Path(str(files(package).joinpath("data", f"{named.file}.part{index:02d}")))
        if not path.is_file():
            raise FileNotFoundError(f"--model {name}: package {distribution_name(package)} lacks {path}")
        paths.append(path)
    return paths


def say(stream: TextIO, message: str) -> None:
    """One line on ``stream`` (stderr by default in the callers), flushed at once."""
    print(f"layerfusion: {message}", file=stream, flush=True)


@contextmanager
def timed(stream: TextIO, doing: str) -> Iterator[None]:
    """Say ``doing ...`` before the block and ``... done in S s`` after it."""
    say(stream, f"{doing} ...")
    start = time.perf_counter()
    yield
    say(stream, f"{doing}: done in {time.perf_counter() - start:.1f} s")


def publish(temporary: Path, target: Path, mode: int) -> None:
    """Give ``temporary`` (made private by ``tempfile``) the permissions ``mode`` less the umask, and
    rename it to ``target`` in one step."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, mode & ~umask)
    os.rename(temporary, target)


def assemble(parts: Sequence[Path], target: Path, sha256: str, stream: TextIO = sys.stderr) -> Path:
    """Concatenate ``parts`` into ``target`` unless it is there; check the sha256 of what is written.

    The bytes go to a temporary file beside ``target``, renamed into place only once complete and
    checked, so ``target`` is either absent or whole (a crash or a wrong checksum leaves nothing).
    A ``target`` already there was checked when it was written and is trusted.

    Example:
        >>> import hashlib
        >>> parts = [Path("f.gguf.part00"), Path("f.gguf.part01")]
        >>> for part, data in zip(parts, [b"GGUF", b"rest"]):
        ...     _ = part.write_bytes(data)
        >>> sha256 = hashlib.sha256(b"GGUFrest").hexdigest()
        >>> assemble(parts, Path("cache/f.gguf"), sha256, stream=sys.stdout)
        layerfusion: assembling f.gguf from 2 parts into cache ...
        layerfusion: assembling f.gguf from 2 parts into cache: done in ... s
        PosixPath('cache/f.gguf')
    """
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with timed(stream, f"assembling {target.name} from {len(parts)} parts into {target.parent}"):
        digest = hashlib.sha256()
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                for part in parts:
                    with part.open("rb") as source:
                        while chunk := source.read(CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
            if digest.hexdigest() != sha256:
                raise ValueError(
                    f"{target.name}: sha256 of the assembled parts is {digest.hexdigest()}, expected "
                    f"{sha256}: reinstall the parts ({INSTALL_EXTRA} --force-reinstall)"
                )
            publish(Path(temporary), target, 0o666)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return target


def gguf_is_installed() -> bool:
    """Whether the ``gguf`` package (transformers' GGUF reader) can be imported."""
    return importlib.util.find_spec("gguf") is not None


def load_gguf(gguf_path: Path) -> tuple[torch.nn.Module, object]:
    """``(model, tokenizer)`` from a GGUF file, de-quantised to float32 and made serialisable.

    transformers marks a GGUF-loaded model as quantised (``hf_quantizer``,
    ``config.quantization_config``) and ``save_pretrained`` refuses it; its weights are plain
    float32 tensors by then, so both markers are dropped.
    """
    if not gguf_is_installed():
        raise ValueError(f"{gguf_path.name}: reading GGUF files needs the gguf package: {INSTALL_EXTRA}")
    folder, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


Loader = Callable[[Path], tuple[torch.nn.Module, object]]


def convert(gguf_path: Path, folder: Path, stream: TextIO = sys.stderr, load: Loader = load_gguf) -> Path:
    """Save ``load(gguf_path)`` with ``save_pretrained`` into ``folder`` unless it is there.

    Model and tokenizer are written into a temporary folder beside ``folder``, renamed into place
    once both are saved, so ``folder`` is either absent or complete. When another process renamed
    its copy first, that one is kept and this one discarded.

    Example:
        >>> class Tokenizer:  # stands in for the GGUF file's tokenizer
        ...     def save_pretrained(self, folder):
        ...         pass
        >>> load = lambda path: (base_model, Tokenizer())  # load_gguf reads the file (minutes, once)
        >>> convert(Path("f.gguf"), Path("models/f"), stream=sys.stdout, load=load)
        layerfusion: converting f.gguf to a float32 copy in models/f ...
        layerfusion: converting f.gguf to a float32 copy in models/f: done in ... s
        PosixPath('models/f')
        >>> convert(Path("f.gguf"), Path("models/f"), stream=sys.stdout, load=load)  # there: instant
        PosixPath('models/f')
    """
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with timed(stream, f"converting {gguf_path.name} to a float32 copy in {folder}"):
        temporary = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
        try:
            model, tokenizer = load(gguf_path)
            model.save_pretrained(temporary)
            tokenizer.save_pretrained(temporary)
            try:
                publish(temporary, folder, 0o777)
            except OSError:  # another process's complete copy is there: keep it
                if not folder.is_dir():
                    raise
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
    return folder


def gguf_folder_name(gguf_path: Path) -> str:
    """The cache folder of a GGUF file given by path: its stem and a hash of where and what it is.

    The path, size and modification time stand for the content (hashing a multi-GB file on each
    call would cost seconds): a file replaced in place gets a new folder.
    """
    status = gguf_path.stat()
    key = f"{gguf_path.resolve()}\0{status.st_size}\0{status.st_mtime_ns}".encode()
    return f"{gguf_path.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def resolve_model(
    model: str, environ: Mapping[str, str] = os.environ, stream: TextIO = sys.stderr, load: Loader = load_gguf
) -> str:
    """The folder (or hub name) that ``from_pretrained`` loads for a ``--model`` value.

    Args:
        model: a name of :data:`NAMED_MODELS`, a path to a ``.gguf`` file, or anything else
            ``from_pretrained`` takes (returned unchanged).
        environ: where ``LAYERFUSION_CACHE`` is looked up.
        stream: where the steps taken and their durations are said.
        load: GGUF path -> ``(model, tokenizer)`` (:func:`load_gguf`; tests pass a stand-in).

    Example:
        >>> Path("cache/models/gemma3-270m").mkdir(parents=True)  # converted by an earlier call
        >>> resolve_model("gemma3-270m", environ={"LAYERFUSION_CACHE": "cache"})  # found: not converted again
        'cache/models/gemma3-270m'
        >>> resolve_model("bert-base-cased")
        'bert-base-cased'
    """
    source = gguf_source(model, cache_root(environ), stream)
    if source is None:
        return model
    folder, gguf_path = source
    return str(folder if gguf_path is None else convert(gguf_path, folder, stream, load))


def gguf_config(gguf_path: Path) -> PretrainedConfig:
    """The model config in a GGUF file's header, read without its tensors (nothing de-quantised).

    Example (with the ``llm`` extra installed and a GGUF file at hand)::

        gguf_config(Path("gemma-3-270m-it-Q8_0.gguf")).num_hidden_layers  # 18
    """
    if not gguf_is_installed():
        raise ValueError(f"{gguf_path.name}: reading GGUF files needs the gguf package: {INSTALL_EXTRA}")
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if hasattr(config, "quantization_config"):  # the shapes are what counts, not the file's storage
        del config.quantization_config
    return config


def resolve_config(
    model: str, environ: Mapping[str, str] = os.environ, stream: TextIO = sys.stderr
) -> str | PretrainedConfig:
    """What ``layerfusion audit`` counts for a model value, never reading a weight: a named model's or a
    GGUF file's float32 copy when it is there (its ``config.json``), else the config in the GGUF
    header (:func:`gguf_config`; a named model's parts are assembled first); anything else unchanged.

    Example (with the ``llm`` extra installed)::

        resolve_config("gemma3-270m").num_hidden_layers  # 18; no float32 copy yet: from the header
    """
    source = gguf_source(model, cache_root(environ), stream)
    if source is None:
        return model
    folder, gguf_path = source
    return str(folder) if gguf_path is None else gguf_config(gguf_path)


def gguf_source(model: str, root: Path, stream: TextIO = sys.stderr) -> tuple[Path, Path | None] | None:
    """Where a ``--model`` value's float32 copy lives under the cache ``root``, and the GGUF file to
    convert or read when that copy is not there yet (``None`` once it is); ``None`` for a value that
    names neither a named model nor a ``.gguf`` file. A named model's parts are assembled first.

    Raises:
        FileNotFoundError: a ``.gguf`` value that is no file.

    Example:
        >>> gguf_source("bert-base-cased", Path("cache")) is None
        True
    """
    if model in NAMED_MODELS:
        named = NAMED_MODELS[model]
        folder = root / "models" / model
        if folder.is_dir():
            return folder, None
        return folder, assemble(part_paths(model, named), root / "gguf" / named.file, named.sha256, stream)
    if model.lower().endswith(".gguf"):
        gguf_path = Path(model).expanduser()
        if not gguf_path.is_file():
            raise FileNotFoundError(f"--model {model}: no such GGUF file")
        folder = root / "models" / gguf_folder_name(gguf_path)
        return folder, None if folder.is_dir() else gguf_path
    return None


# python -m layerfusion_recipes.core.models.gemma NAME_OR_GGUF: build, print the folder
if __name__ == "__main__":
    print(resolve_model(sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"))
