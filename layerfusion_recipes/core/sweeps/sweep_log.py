"""The log of a grid's sweeps: ``sweeps.jsonl`` beside its results file, one line per invocation.

Every ``layerfusion sweep`` (and ``layerfusion ner``) appends one JSON line when it ends, normally,
on an error or on Ctrl-C, with the append of the results file
(:func:`~layerfusion_recipes.core.results.records.append_line`: locked, one write, fsync). Keys of a line:

* ``start``, ``end``: ISO 8601 times in UTC (seconds); ``wall_s``: seconds between them (monotonic
  clock), from the grid's resolution to the end (the interpreter's start-up is not counted);
* ``peak_rss_mb``: the larger of ``peak_rss_self_mb`` (this process's peak resident set) and
  ``peak_rss_children_mb`` (the largest of its finished child processes, e.g. the ``--workers``
  pool), from ``getrusage`` ``ru_maxrss``, in MB of 2**20 bytes;
* ``workers``, ``threads`` (torch threads of the process), ``num_processes`` (of an ``accelerate
  launch``; 1 without);
* ``argv`` (``sys.argv``), ``config`` (the ``--config`` path, or null), ``results`` (the results file);
* ``runs``: the grid's runs added to the results file during the invocation (by all its processes
  and workers; a second sweep writing the same file at the same time counts too); ``runs_total``:
  the grid's runs in the file at the end; ``runs_planned``: the grid's runs once complete;
* ``cpu_count`` and ``load_1min`` (the 1-minute load average at the start): was the machine shared?
* ``completed``: whether the invocation ended normally; ``error``: else the exception's type name
  (e.g. ``"KeyboardInterrupt"``, or ``"SIGTERM"`` for a ``kill``: SIGTERM raises inside the block,
  :func:`~layerfusion_recipes.core.errors.sigterm_raises`), null when completed.

An invocation refused by its checks before its first run (bad data, a sample size the train split
cannot give) writes no line, and creates no folder: nothing ran (``checks_first``).

Under ``accelerate launch`` only the main process writes the line; its peak RSS is its own (and its
children's), not the other processes'.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import Terminated, sigterm_raises
from ..results.records import append_line, finished_keys, read_lines, without_probe_choice

SWEEP_LOG = "sweeps.jsonl"
# ru_maxrss is in kilobytes on Linux, in bytes on macOS
_RSS_UNITS_PER_MB = 2**20 if sys.platform == "darwin" else 2**10


def sweep_log_path(results: str | os.PathLike) -> Path:
    """The sweep log of a results file: ``sweeps.jsonl`` in its folder.

    Example:
        >>> sweep_log_path("benchmarks/results/conll_fe_lr/results.jsonl")
        PosixPath('benchmarks/results/conll_fe_lr/sweeps.jsonl')
    """
    return Path(results).with_name(SWEEP_LOG)


def peak_rss_mb() -> tuple[float, float]:
    """Peak resident set size so far, in MB: ``(this process, its largest finished child)``.

    Example:
        >>> own, children = peak_rss_mb()
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / _RSS_UNITS_PER_MB
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / _RSS_UNITS_PER_MB
    return round(own, 1), round(children, 1)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class SweepStart:
    """Yielded by :func:`logged_sweep`: the block calls :meth:`begin` when its checks passed and its
    first run is about to start; an error before that logs no line (with ``checks_first``)."""

    begun: bool = True

    def begin(self) -> None:
        self.begun = True


@contextmanager
def logged_sweep(
    results: str | os.PathLike,
    grid_keys: Collection[str],
    fields: dict[str, Any],
    enabled: bool = True,
    checks_first: bool = False,
) -> Iterator[SweepStart]:
    """Append the invocation's line to :func:`sweep_log_path` of ``results`` when the block ends.

    Args:
        results: The grid's results file.
        grid_keys: Every key the grid's runs can have, start blocks left out (counts ``runs`` and
            ``runs_total``).
        fields: Added to the line as they are: ``workers``, ``threads``, ``num_processes``, ``argv``,
            ``config``, ``runs_planned``.
        enabled: Write the line (``False`` on the processes of a launch other than the main one).
        checks_first: The block opens with checks that may refuse the invocation and calls
            ``begin()`` on the yielded :class:`SweepStart` after them: an error before that writes
            no line (the folder is not created for it). The wall time still counts the checks.

    The block's exception, if any, propagates (SIGTERM in the main thread raises
    :class:`~layerfusion_recipes.core.errors.Terminated` there); a log that cannot be written after one is
    reported on stderr instead of hiding it.

    Example:
        >>> with logged_sweep("logged/results.jsonl", set(), {"workers": 2}, checks_first=True) as start:
        ...     pass  # the checks (e.g. NerExperiment(settings)): a bad --data stops here, no line, no folder
        ...     start.begin()  # from here on the sweep is logged, however it ends
        ...     pass  # run_cells(cells, "logged/results.jsonl", settings, experiment=experiment)
        >>> [(entry["workers"], entry["completed"]) for entry in read_sweep_log("logged/results.jsonl")]
        [(2, True)]
    """
    start_of_runs = SweepStart(begun=not checks_first)
    grid_keys = set(grid_keys)
    before = _grid_runs(results, grid_keys) if enabled else set()
    start, started = _now(), time.monotonic()
    load = os.getloadavg()[0]
    error = None
    try:
        with sigterm_raises():  # a `kill` ends the block like Ctrl-C, so the line is still written
            yield start_of_runs
    except BaseException as exception:  # Ctrl-C included: the line says how the invocation ended
        error = str(exception) if isinstance(exception, Terminated) else type(exception).__name__
        raise
    finally:
        if enabled and (start_of_runs.begun or error is None):
            after = _grid_runs(results, grid_keys)
            own, children = peak_rss_mb()
            line = {
                **fields,
                "start": start,
                "end": _now(),
                "wall_s": round(time.monotonic() - started, 3),
                "peak_rss_mb": max(own, children),
                "peak_rss_self_mb": own,
                "peak_rss_children_mb": children,
                "results": str(results),
                "runs": len(after - before),
                "runs_total": len(after),
                "cpu_count": os.cpu_count(),
                "load_1min": round(load, 2),
                "completed": error is None,
                "error": error,
            }
            try:
                append_line(sweep_log_path(results), line)
            except OSError as failure:
                if error is None:
                    raise
                print(f"could not log the sweep in {sweep_log_path(results)}: {failure}", file=sys.stderr)


@dataclass
class SweepTotals:
    """What the sweeps of one results file add up to (see :func:`sweep_totals`).

    Args:
        sweeps: Invocations logged.
        interrupted: Those that did not end normally.
        wall_s: Their wall time, summed.
        peak_rss_mb: The largest peak RSS of any of them.
        runs: Runs they added to the results file, summed.
        workers: The ``--workers`` values they ran with, ascending.
        threads: The thread counts they ran with, ascending.
        cpu_count: The largest CPU count they saw.
        load_1min: The highest 1-minute load average at a start.
    """

    sweeps: int
    interrupted: int
    wall_s: float
    peak_rss_mb: float
    runs: int
    workers: list[int]
    threads: list[int]
    cpu_count: int | None
    load_1min: float


def sweep_totals(entries: Iterable[dict[str, Any]]) -> SweepTotals | None:
    """Sum the wall time and take the largest peak RSS of logged invocations; ``None`` without any.

    Example:
        >>> logged = [{"wall_s": 3000.0, "peak_rss_mb": 900.0}, {"wall_s": 168.4, "peak_rss_mb": 1200.0}]
        >>> totals = sweep_totals(logged)
        >>> totals.wall_s, totals.peak_rss_mb
        (3168.4, 1200.0)
    """
    entries = list(entries)
    if not entries:
        return None
    cpus = [e["cpu_count"] for e in entries if e.get("cpu_count")]
    return SweepTotals(
        sweeps=len(entries),
        interrupted=sum(not e.get("completed") for e in entries),
        wall_s=sum(e["wall_s"] for e in entries),
        peak_rss_mb=max(e["peak_rss_mb"] for e in entries),
        runs=sum(e.get("runs", 0) for e in entries),
        workers=sorted({e["workers"] for e in entries if e.get("workers") is not None}),
        threads=sorted({e["threads"] for e in entries if e.get("threads") is not None}),
        cpu_count=max(cpus) if cpus else None,
        load_1min=max(e.get("load_1min", 0.0) for e in entries),
    )


def read_sweep_log(results: str | os.PathLike) -> list[dict[str, Any]]:
    """The logged invocations of the sweeps of ``results`` (empty when none was logged).

    Example:
        >>> from layerfusion_recipes.core.results.records import append_line
        >>> for completed in (False, True):
        ...     append_line(sweep_log_path("sweeps/results.jsonl"), {"completed": completed})
        >>> [entry["completed"] for entry in read_sweep_log("sweeps/results.jsonl")]
        [False, True]
    """
    return read_lines(sweep_log_path(results))


def _grid_runs(results: str | os.PathLike, grid_keys: set[str]) -> set[str]:
    """The keys of ``results`` that are runs of the grid: in ``grid_keys`` once what the probes chose
    is left out (a probe-guided run's blocks are chosen after the log opens:
    :func:`~.records.without_probe_choice`)."""
    return {key for key in finished_keys(results) if without_probe_choice(key) in grid_keys}
