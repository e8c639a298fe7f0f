"""The results file of a sweep: one JSON line per finished cell, appended atomically.

Each record is written with a single ``write`` of one complete line to a file opened in
append mode, then flushed and fsync'ed, so a killed sweep leaves every finished cell on disk
and at worst no partial line. A torn last line (e.g. power loss), a line that is not JSON and an
object that is not a record are skipped when reading, said in one line on stderr with their line
numbers (:func:`read_lines`), so that cell simply runs again.

Exactly one record per key: appends hold an exclusive lock on the file and skip a key that is
already there (two sweeps on one output never write a cell twice), and reading keeps the first
record of a key (a file joined from two, or edited by hand, counts each cell once too).

:func:`append_line` appends a line without a key the same way (the sweeps' log, ``sweeps.jsonl``).

Keys: every task keys a run the same way, :func:`unit_key`: its cell, its LR and the :func:`fingerprint`
of the settings that change its result (never the grid it ran in), e.g.
``dwatt|fe|8|25|0|lr=0.001|3f2a9c0d1e4b`` (NER, classify), ``dwatt|fe|0|lr=0.001|...`` (the masked
LM), ``none|0|lr=0.003|...`` (seq2seq). Resuming (:func:`finished_records`, :func:`run_or_resume`)
reads the results file; a unit whose key is there is not run again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> bool:
    """Append ``record`` as one JSON line (write + fsync) unless its key is already in the file.

    The file is locked (``flock``) from the check to the write, so concurrent writers keep
    exactly one record per key. Returns whether the record was written.

    Example:
        >>> append_record("results.jsonl", {"key": "dwatt|fe|8|25|0|lr=0.001|3f2a", "dev_f1": 0.61})
        True
    """
    with _locked_for_append(path) as fd:
        if record["key"] in finished_keys(path):
            return False  # another sweep on this output finished it first
        _write_line(fd, path, record)
        return True


def append_line(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Append ``payload`` as one JSON line, as :func:`append_record` does (locked, write + fsync, never
    glued to a torn line) but without a key: e.g. the log of a sweep's invocations.

    Example:
        >>> append_line("out/sweeps.jsonl", {"wall_s": 61.2, "completed": True})
    """
    with _locked_for_append(path) as fd:
        _write_line(fd, path, payload)


@contextmanager
def _locked_for_append(path: str | os.PathLike) -> Iterator[int]:
    """The file (created with its folder if missing) opened for appending, under an exclusive ``flock``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
        yield fd
    finally:
        os.close(fd)


def _write_line(fd: int, path: str | os.PathLike, payload: dict[str, Any]) -> None:
    line = (json.dumps(payload, sort_keys=True) + "\n").encode()
    if os.fstat(fd).st_size and not _ends_with_newline(Path(path)):
        line = b"\n" + line  # never glue a record to a torn line
    os.write(fd, line)
    os.fsync(fd)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def read_lines(
    path: str | os.PathLike, valid: Callable[[dict[str, Any]], bool] | None = None, what: str = "JSON objects"
) -> list[dict[str, Any]]:
    """Every complete JSON object of a JSON-lines file that ``valid`` accepts, in file order (missing
    file: empty list). The other lines (torn, not JSON, not UTF-8, another object) are skipped and
    said in one line on stderr, with their numbers (:func:`warn_skipped`).

    Args:
        path: The file.
        valid: Which objects to keep (default: all).
        what: What the kept lines are, for the warning (``complete records``).

    Example:
        >>> for completed in (False, True):
        ...     append_line("logs/sweeps.jsonl", {"completed": completed})
        >>> [entry["completed"] for entry in read_lines("logs/sweeps.jsonl")]
        [False, True]
    """
    path = Path(path)
    if not path.exists():
        return []
    entries, skipped = [], []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            entry = None
        if isinstance(entry, dict) and (valid is None or valid(entry)):
            entries.append(entry)
        else:
            skipped.append(number)
    if skipped:
        warn_skipped(path, skipped, what)
    return entries


_WARNED: dict[str, set[int]] = {}  # per file, the line numbers already said skipped by this process


def warn_skipped(path: Path, numbers: list[int], what: str, stream: TextIO | None = None) -> None:
    """Say once per process and file (again only when more lines are skipped) which lines of ``path``
    were skipped: ``layerfusion: warning: out/results.jsonl:2,5: skipped 2 lines that are not
    complete records (torn, not JSON, or missing fields)``. The first 20 line numbers are listed."""
    said = _WARNED.setdefault(str(path.resolve()), set())
    if set(numbers) <= said:
        return
    said.update(numbers)
    listed = ",".join(map(str, numbers[:20])) + (",..." if len(numbers) > 20 else "")
    lines = f"{len(numbers)} line" + ("s" if len(numbers) > 1 else "")
    print(
        f"layerfusion: warning: {path}:{listed}: skipped {lines} that are not {what} "
        "(torn, not JSON, or missing fields)",
        file=stream or sys.stderr,
    )


def is_record(entry: dict[str, Any], accept: Callable[[dict[str, Any]], bool] | None = None) -> bool:
    """Whether ``entry`` is a record: a string ``key`` (and ``accept(entry)`` when given).

    Example:
        >>> is_record({"key": 5}), is_record({"key": "k"}, lambda entry: "regime" in entry)
        (False, False)
    """
    return isinstance(entry.get("key"), str) and (accept is None or accept(entry))


def read_records(
    path: str | os.PathLike, accept: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """Every complete record of a results file (:func:`is_record`: a string ``key``, and what ``accept``
    asks for, e.g. a task's fields), the first one of each key (missing file: empty list). The other
    lines are skipped and said on stderr (:func:`read_lines`): a sweep runs what they held again.

    Example:
        >>> read_records(sweep_results)[0]["key"]  # a sweep's results file
        'none|fe|8|25|0|lr=0.01|3f2a9c0d1e4b'
    """
    records, seen = [], set()
    for record in read_lines(path, lambda entry: is_record(entry, accept), "complete records"):
        if record["key"] not in seen:
            seen.add(record["key"])
            records.append(record)
    return records


START = "|start="  # a key's part naming the block a probe-guided run started on (cells.record_key)
LAYERS = "|layers="  # a key's part naming the probed blocks a run fuses (cells.record_key)


def without_probe_choice(key: str) -> str:
    """``key`` without what the probes chose for it, its start block and its fused blocks
    (:func:`~layerfusion_recipes.core.results.cells.record_key`): the cell and LR it runs, whatever blocks
    its trial's probes picked.

    Example:
        >>> without_probe_choice("layer_mix|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|start=7")
        'layer_mix|fe|8|25|0|lr=0.001|3f2a9c0d1e4b'
        >>> without_probe_choice("average|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|layers=3,4")
        'average|fe|8|25|0|lr=0.001|3f2a9c0d1e4b'
    """
    return key.split(START)[0].split(LAYERS)[0]


def finished_keys(path: str | os.PathLike) -> set[str]:
    """Keys of the cells already in the results file."""
    return {record["key"] for record in read_records(path)}


def fingerprint(fields: Mapping[str, Any]) -> str:
    """12 hex digits that name ``fields`` (the settings that change a result): the SHA-1 of their
    JSON, keys sorted (values JSON cannot write are written as ``str``).

    Example:
        >>> fingerprint({"epochs": 3, "model": "/m"}) == fingerprint({"model": "/m", "epochs": 3})
        True
    """
    text = json.dumps(dict(fields), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def unit_key(cell: str, lr: float, setup: str) -> str:
    """Key of the record of ``cell`` (its place in a task's grid, ``|``-joined) run at max LR ``lr``
    under the settings of fingerprint ``setup`` (:func:`fingerprint`).

    Example:
        >>> unit_key("dwatt|fe|8|25|0", 1e-3, "3f2a9c0d1e4b")
        'dwatt|fe|8|25|0|lr=0.001|3f2a9c0d1e4b'
    """
    return f"{cell}|lr={float(lr)!r}|{setup}"


def finished_records(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The finished runs of the results file by key (:func:`read_records`: the first record of a key).

    Example:
        >>> append_record("done/results.jsonl", {"key": "dwatt|fe|0|lr=0.001|3f2a9c0d1e4b", "dev_ppl": 21.0})
        True
        >>> sorted(finished_records("done/results.jsonl"))
        ['dwatt|fe|0|lr=0.001|3f2a9c0d1e4b']
    """
    return {record["key"]: record for record in read_records(path)}


def run_or_resume(
    path: str | os.PathLike,
    finished: dict[str, dict[str, Any]],
    key: str,
    run: Callable[[], dict[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """The record of ``key``: the finished one, else ``run()``'s, appended to ``path`` under ``key``
    (:func:`append_record`) and added to ``finished``.

    Returns:
        ``(record, trained)``: ``trained`` is False when the record was finished earlier.

    Example:
        >>> finished, key = {}, "dwatt|fe|0|lr=0.001|3f2a9c0d1e4b"
        >>> record, trained = run_or_resume("runs/results.jsonl", finished, key, lambda: {"dev_ppl": 20.0})
        >>> trained, run_or_resume("runs/results.jsonl", finished, key, lambda: {"dev_ppl": 99.0})
        (True, ({'dev_ppl': 20.0, 'key': 'dwatt|fe|0|lr=0.001|3f2a9c0d1e4b'}, False))
    """
    if key in finished:
        return finished[key], False
    record = {**run(), "key": key}
    append_record(path, record)
    finished[key] = record
    return record, True
