"""Files of the feature cache: the content key, safe shard files, and crashed writers' leftovers.

* **Key** (:func:`feature_key`): a hash of what the features are computed from, not of a name:
  the encoder's weights (every tensor of the backbone, the head excluded), its config, the
  tokenizer, the max length, which positions are kept and the storage dtype. New weights saved
  at the same path give a new key, and so does a cache kept in another precision. The records of
  a sweep are keyed by content too, before any model is loaded: :func:`path_fingerprint` hashes the
  files of a local model or data path the same way (new weights or data at the same path, a new key).
* **Shards** (:func:`write_shard`, :func:`read_shard`): safetensors files, which hold tensors and
  string metadata only, so loading one cannot execute code (whatever the torch version or
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``). One shard holds a table of sentences (token ids, kept
  positions) and their states as one ``(positions, L, d)`` tensor; it is read memory-mapped. A
  shard is written to a temporary file, fsync'ed and renamed (atomic); a failed write removes its
  temporary file. Reading checks the header, the key, and every table's and tensor's shape;
  anything else raises :class:`CorruptShardError` naming the file. A shard is never changed once
  written; a process that maps one survives its removal (``rm``), but not a rewrite in place
  (truncating a mapped file ends the reader with a bus error).
* **Pages** (:func:`mapped_range`, :func:`drop_mapped_pages`): the pages of a shard a process has
  read count in its resident memory (RSS) until it lets them go; dropping them
  (``madvise(MADV_DONTNEED)``) takes them out of the process, not out of the page cache, and the
  next read maps them again from there (or from disk when the kernel needed the memory). Only pages
  of a file mapping are ever dropped: an anonymous copy would read back as zeros.
* **Leftovers** (:func:`remove_stale_temp_files`): a writer killed mid-write (``kill -9``, power
  loss) leaves its temporary file. Temporary names carry the writer's pid and host; a temporary
  file is removed when its writer is known dead (same host, no such process) or when it is older
  than :data:`STALE_TEMP_SECONDS` (a writer on another host, or a name that says nothing).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..options.options import DEFAULT_CACHE_DTYPE

# a sentence in the cache: its token ids and the positions whose states are kept (ascending)
SentenceKey = tuple[tuple[int, ...], tuple[int, ...]]

SHARD_SUFFIX = ".safetensors"
TEMP_SUFFIX = ".tmp"
# 3: one table of sentences (ids, kept positions) and one (positions, L, d) tensor per shard, z_0 left out
SHARD_FORMAT = "layerfusion-features/3"
SHARD_TENSORS = ("lengths", "ids", "kept", "positions", "states")
STALE_TEMP_SECONDS = 3600.0  # no shard write takes an hour: older temporary files are leftovers
MADV_DONTNEED = 4  # Linux: drop the pages from this process; a file mapping's are read again on use
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# config fields that name the head or the files, not the computation of the block outputs
_CONFIG_FIELDS_IGNORED = ("id2label", "label2id", "_name_or_path", "architectures", "transformers_version")


class CorruptShardError(ValueError):
    """A shard file that cannot be used (truncated, empty, foreign), with the file and the problem."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 of every tensor (name, dtype, shape, bytes) of the model's backbone.

    The backbone is ``model.base_model`` for a transformers model (the encoder without its task
    head, whose random init does not change the block outputs); the whole model otherwise.
    Cost: one pass over the weights (0.05 s for MiniLM-L6's 90 MB on one CPU core).

    Example:
        >>> len(weights_fingerprint(base_model))  # hex SHA-256
        64
    """
    backbone = getattr(model, "base_model", model)
    digest = hashlib.sha256()
    for name, tensor in backbone.state_dict().items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # (numel,)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def path_fingerprint(path: str | os.PathLike) -> str | None:
    """16 hex digits naming the content of a local file or folder (a model's weights, config and
    tokenizer; a data set's files); ``None`` where ``path`` does not exist (a Hub name).

    A folder counts every file under it (followed links included) but hidden ones (``.git``, ``.cache``),
    by relative name and content (:func:`file_fingerprint`). Keep a sweep's output and cache folders
    outside its data folder: their files would count as the data's.

    Example:
        >>> len(path_fingerprint(model_path)), path_fingerprint("bert-base-cased")  # a folder; a Hub name
        (16, None)
    """
    root = Path(path)
    if not root.exists():
        return None
    files = [(root.name, root)] if root.is_file() else sorted(_visible_files(root))
    digest = hashlib.sha256()
    for name, file in files:
        digest.update(f"{name}|{file_fingerprint(file)}|".encode())
    return digest.hexdigest()[:16]


def _visible_files(root: Path) -> Iterable[tuple[str, Path]]:
    """``(name relative to root, path)`` of every file under ``root`` but those under a hidden name
    or in ``__pycache__``."""
    for file in root.rglob("*"):
        parts = file.relative_to(root).parts
        if file.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in parts):
            yield "/".join(parts), file


READ_BYTES = 2**24  # a file is hashed in reads of 16 MB
_FILE_FINGERPRINTS: dict[tuple, str] = {}  # (real path, size, mtime_ns, inode) -> fingerprint


def file_fingerprint(path: Path) -> str:
    """SHA-256 of a file's size and whole content: the same bytes give the same fingerprint however they
    got there (a copy, a reinstall, a download again, ``touch``), and any changed byte changes it. A
    weights file is read whole once per process (about 1.5 s per GB on two cores); memoized on the
    file's identity and time, so a second call costs a ``stat``.

    Example:
        >>> _ = Path("train.txt").write_text("EU rejects German call")
        >>> first = file_fingerprint(Path("train.txt"))
        >>> len(first), first == file_fingerprint(Path("train.txt"))  # 64 hex digits, memoized
        (64, True)
    """
    stat = path.stat()
    identity = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if identity in _FILE_FINGERPRINTS:
        return _FILE_FINGERPRINTS[identity]
    digest = hashlib.sha256(f"{stat.st_size}|".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_BYTES):
            digest.update(chunk)
    _FILE_FINGERPRINTS[identity] = digest.hexdigest()
    return _FILE_FINGERPRINTS[identity]


def config_fingerprint(model: nn.Module) -> str:
    """SHA-256 of the model's config (activation, norms, positions...), head labels excluded."""
    config = getattr(model, "config", None)
    fields = config.to_dict() if config is not None else {}
    kept = {k: v for k, v in fields.items() if k not in _CONFIG_FIELDS_IGNORED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of a tokenizer's full definition (fast: its JSON; slow: its vocabulary); ``"none"``."""
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


def feature_key(
    model: nn.Module,
    tokenizer,
    max_length: int,
    num_blocks: int,
    positions: str = "all",
    dtype: str = DEFAULT_CACHE_DTYPE,
) -> str:
    """Key of the cached block outputs of ``model``: weights, config, tokenizer, max length, blocks,
    which positions are kept (a :class:`~layerfusion_recipes.core.cache.feature_cache.KeptPositions` name)
    and the storage dtype: a cache of other positions or another precision is another folder.

    Example:
        >>> len(feature_key(base_model, tokenizer, 128, 3))  # hex, the cache folder's name
        16
    """
    parts = (
        SHARD_FORMAT,
        weights_fingerprint(model),
        config_fingerprint(model),
        tokenizer_fingerprint(tokenizer),
        str(max_length),
        str(num_blocks),
        positions,
        dtype,
    )
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def write_shard(
    path: Path,
    keys: Sequence[SentenceKey],
    states: torch.Tensor,
    key: str,
) -> None:
    """Write the states of the sentences ``keys`` to ``path`` atomically and durably.

    Args:
        path: The shard file.
        keys: One ``(token ids, kept positions)`` per sentence.
        states: Their states, sentence after sentence: ``(sum of kept positions, L, d)``.
        key: The cache's :func:`feature_key`.

    The data goes to ``tmp-<pid>-<random>-<host>.tmp`` next to ``path``, is fsync'ed, then
    renamed to ``path``; on any error the temporary file is removed.

    Example:
        >>> folder = Path("cache/features-0123456789abcdef")
        >>> folder.mkdir(parents=True)
        >>> states = torch.randn(1, 6, 32)  # one kept position, 6 blocks, width 32
        >>> write_shard(folder / "shard-1.safetensors", [((101, 7592, 102), (1,))], states, "k")
        >>> [path.name for path in folder.iterdir()]  # no temporary file left
        ['shard-1.safetensors']
    """
    kept = [len(positions) for _, positions in keys]
    if states.dim() != 3 or states.shape[0] != sum(kept):
        raise ValueError(f"states of shape {tuple(states.shape)} for {sum(kept)} kept positions")
    tensors = {
        "lengths": torch.tensor([len(ids) for ids, _ in keys], dtype=torch.int64),  # (count,)
        "ids": torch.tensor([i for ids, _ in keys for i in ids], dtype=torch.int64),  # (sum of lengths,)
        "kept": torch.tensor(kept, dtype=torch.int64),  # (count,)
        "positions": torch.tensor([p for _, positions in keys for p in positions], dtype=torch.int64),
        "states": states.contiguous(),  # (sum of kept, L, d)
    }
    metadata = {
        "format": SHARD_FORMAT,
        "key": key,
        "count": str(len(keys)),
    }
    temp = path.with_name(f"tmp-{os.getpid()}-{uuid.uuid4().hex}-{socket.gethostname()}{TEMP_SUFFIX}")
    try:
        save_file(tensors, temp, metadata=metadata)
        _fsync(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)  # only still there when something failed
    _fsync(path.parent)  # the rename itself survives a power loss


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_shard(path: Path, key: str, num_blocks: int) -> dict[SentenceKey, torch.Tensor]:
    """The states of a shard written by :func:`write_shard` for ``key``: each sentence's ``(token ids,
    kept positions)`` to its ``(kept, L, d)`` states, views of the file, memory-mapped (read from disk
    when first touched, shared through the page cache by every process that reads the shard, never
    copied into this process's own memory).

    Raises:
        CorruptShardError: the file is empty, truncated, not a shard of this key, or holds
            tables or states of inconsistent shapes (the message names the file).

    Example:
        >>> shard = Path("shard-1.safetensors")
        >>> write_shard(shard, [((101, 7592, 102), (1,))], torch.randn(1, 6, 32), "k")  # 6 blocks
        >>> [tuple(state.shape) for state in read_shard(shard, "k", num_blocks=6).values()]
        [(1, 6, 32)]
    """
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = set(handle.keys())
            tensors = {name: handle.get_tensor(name) for name in names}  # memory-mapped
    except (SafetensorError, OSError) as error:
        raise CorruptShardError(path, f"unreadable ({error})") from error
    if metadata.get("format") != SHARD_FORMAT or metadata.get("key") != key:
        raise CorruptShardError(
            path, f"not a shard of key {key} (format {metadata.get('format')!r}, key {metadata.get('key')!r})"
        )
    try:
        count = int(metadata["count"])  # a shard of an older version also says its blocks' output length
    except (KeyError, ValueError) as error:
        raise CorruptShardError(path, f"bad metadata {metadata}") from error
    if names != set(SHARD_TENSORS):
        raise CorruptShardError(path, f"expected the tensors {list(SHARD_TENSORS)}, found {sorted(names)}")
    problem = _table_problem(tensors, count, num_blocks)
    if problem:
        raise CorruptShardError(path, problem)
    lengths, kept = tensors["lengths"].tolist(), tensors["kept"].tolist()
    ids, positions = tensors["ids"].tolist(), tensors["positions"].tolist()
    states: dict[SentenceKey, torch.Tensor] = {}
    token, row = 0, 0
    for length, n in zip(lengths, kept, strict=True):
        sentence = (tuple(ids[token : token + length]), tuple(positions[row : row + n]))
        if any(not 0 <= p < length for p in sentence[1]):
            raise CorruptShardError(
                path, f"kept positions {sentence[1]} outside a sentence of {length} tokens"
            )
        states[sentence] = tensors["states"][row : row + n]  # (kept, L, d), a view of the file
        token, row = token + length, row + n
    return states


def mapped_range(tensor: torch.Tensor, path: str | os.PathLike) -> tuple[int, int] | None:
    """``(start, length)``: the whole pages of this process's memory that hold ``tensor``'s storage,
    when they lie in one mapping of the file ``path`` (``/proc/self/maps``); ``None`` otherwise (the
    tensor was read into memory, or the maps cannot be read: not Linux).

    Only such a range may be given to :func:`drop_mapped_pages`: its pages read back from the file.

    Example:
        >>> shard = Path("shard-1.safetensors")
        >>> write_shard(shard, [((101, 7592, 102), (1,))], torch.randn(1, 6, 32), "k")  # 6 blocks
        >>> states = read_shard(shard, "k", num_blocks=6)
        >>> mapped_range(next(iter(states.values())), shard)  # doctest: +SKIP
        (140230010863616, 4096)
    """
    storage = tensor.untyped_storage()
    begin, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    try:
        with open("/proc/self/maps") as handle:
            maps = handle.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)  # the maps name the resolved path
    for line in maps:
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path
        low, high = (int(address, 16) for address in fields[0].split("-"))
        if low <= begin and end <= high:
            if len(fields) < 6 or fields[5] != target:
                return None  # anonymous memory, or another file
            start = max(low, begin - begin % mmap.PAGESIZE)
            stop = min(high, -(-end // mmap.PAGESIZE) * mmap.PAGESIZE)
            return start, stop - start
    return None


def drop_mapped_pages(ranges: Iterable[tuple[int, int]]) -> bool:
    """Take the pages of the file mappings ``ranges`` (from :func:`mapped_range`) out of this
    process's resident memory; they stay in the page cache and are mapped again when read (a minor
    page fault each). ``False`` where that cannot be done (not Linux): nothing changes.

    Example:
        >>> shard = Path("shard-1.safetensors")
        >>> write_shard(shard, [((101, 7592, 102), (1,))], torch.randn(1, 6, 32), "k")  # 6 blocks
        >>> states = read_shard(shard, "k", num_blocks=6)
        >>> drop_mapped_pages([mapped_range(next(iter(states.values())), shard)])  # on Linux
        True
    """
    if _LIBC is None:
        return False
    for start, length in ranges:
        if _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_DONTNEED) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"madvise of {length} bytes at {start:#x}: {os.strerror(error)}")
    return True


def _table_problem(tensors: dict[str, torch.Tensor], count: int, num_blocks: int) -> str | None:
    """What is inconsistent in a shard's tables and states (``None``: nothing)."""
    lengths, kept, states = tensors["lengths"], tensors["kept"], tensors["states"]
    if lengths.shape != (count,) or kept.shape != (count,):
        return f"tables of {lengths.numel()} and {kept.numel()} sentences, metadata says {count}"
    if tensors["ids"].shape != (int(lengths.sum()),) or tensors["positions"].shape != (int(kept.sum()),):
        return (
            f"{tensors['ids'].numel()} token ids and {tensors['positions'].numel()} positions do not add up"
        )
    if states.dim() != 3 or states.shape[:2] != (int(kept.sum()), num_blocks):
        return f"states of shape {tuple(states.shape)}, expected ({int(kept.sum())}, {num_blocks}, d)"
    return None


def remove_stale_temp_files(folder: Path, max_age: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Remove the temporary files of writers that died; returns the removed paths.

    A ``*.tmp`` file is removed when the pid in its name is not a live process on this host,
    or when it was last modified more than ``max_age`` seconds ago (whoever wrote it).

    Example:
        >>> folder = Path("cache/features-a1b2c3d4e5f60718")
        >>> folder.mkdir(parents=True)
        >>> _ = (folder / "tmp-4242-9f3c-host.tmp").write_bytes(b"")  # its writer died long ago
        >>> os.utime(folder / "tmp-4242-9f3c-host.tmp", (0, 0))
        >>> remove_stale_temp_files(folder)
        [PosixPath('cache/features-a1b2c3d4e5f60718/tmp-4242-9f3c-host.tmp')]
    """
    removed = []
    now = time.time()
    for temp in folder.glob(f"*{TEMP_SUFFIX}"):
        try:
            old = now - temp.stat().st_mtime > max_age
        except FileNotFoundError:
            continue  # renamed or removed meanwhile
        if old or _writer_is_dead(temp.name):
            temp.unlink(missing_ok=True)
            removed.append(temp)
    return removed


def _writer_is_dead(name: str) -> bool:
    """Whether the ``tmp-<pid>-<random>-<host>.tmp`` file's writer is known to be gone."""
    if not name.startswith("tmp-"):
        return False
    pid, _, rest = name[len("tmp-") : -len(TEMP_SUFFIX)].partition("-")
    host = rest.partition("-")[2]
    if not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by another user
    return False
