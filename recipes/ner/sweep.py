"""``layerfusion sweep``: a grid of cells, resumable, with a progress bar and worker processes.

Grid: methods x regimes x shots x max-epochs x trials, from a YAML file (``--config``) or
flags, and each cell at every LR of its regime's grid (``--lr``, else
``experiment.DEFAULT_LR_GRIDS``; on the feature cache the LRs of a cell train together).
Every finished run is appended atomically to the results file (one JSON line, see
``layerfusion_recipes.core.records``) under a key naming its cell, LR and settings; re-running the same
command skips the runs already there, so a killed sweep loses nothing and redoes nothing (a run
interrupted mid-way runs again), and changed settings make new records. Two sweeps on one
results file skip what the other finished and never write a key twice.

``--select-trials M`` selects each cell's LR on its first ``M`` trials (every LR), then runs
the other trials at the selected LR only: ``M * G + (T - M)`` runs per cell instead of
``T * G`` (``G`` LRs, ``T`` trials), for the uncached regimes where every LR costs a full run.
``--workers N`` runs N processes on this machine (spawned; each rebuilds the experiment, and
they share the feature cache through ``--cache-dir``).

Under ``accelerate launch --num_processes P`` the P processes divide the runs among them (each
run trained by one process, on its device; see ``layerfusion_recipes.core.processes``): every record
is written once, with the same key and F1 as one process gives, and says which of how many
processes ran it (``process_index``, ``num_processes``); only the main process prints and writes
the table and figures.

Every invocation appends one line to ``sweeps.jsonl`` beside the results file when it ends (also on
an error or Ctrl-C): its wall time, peak memory, workers, threads, command line, runs and the
machine's load (see ``layerfusion_recipes.core.sweep_log``; only the main process of a launch writes it).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core.processes import check_workers, process_state, share
from ..core.records import append_record, finished_keys, read_records
from ..core.selection import select_lr
from ..core.sweep_log import SweepStart, logged_sweep
from ..reporting.plot import markdown_table, summarize, write_report
from .experiment import (
    Cell,
    Experiment,
    ExperimentSettings,
    check_sample_sizes,
    lrs_train_together,
    record_key,
)
from .settings import resolve

Unit = tuple[Cell, tuple[float, ...]]  # a cell and the LRs it still has to run


def grid_cells(grid: dict[str, Any]) -> list[Cell]:
    """Every cell of ``grid`` (keys methods, regimes, shots, epochs, trials), trials innermost.

    Example:
        >>> grid = {"methods": ["dwatt"], "regimes": ["fe"], "shots": [8, 16], "epochs": [25], "trials": 5}
        >>> len(grid_cells(grid))
        10
    """
    return [
        Cell(method, regime, shots, epochs, trial)
        for epochs, shots, regime, method, trial in itertools.product(
            grid["epochs"], grid["shots"], grid["regimes"], grid["methods"], range(grid["trials"])
        )
    ]


def grid_keys(cells: Iterable[Cell], settings: ExperimentSettings) -> set[str]:
    """Every key the runs of ``cells`` can have: each cell at each LR of its regime's grid.

    Example:
        >>> len(grid_keys(grid_cells(grid), settings))  # 10 cells x the 5 LRs of the FE grid
        50
    """
    setup = settings.setup()
    return {record_key(cell, lr, setup) for cell in cells for lr in settings.lr_grid(cell.regime)}


def planned_runs(
    cells: Iterable[Cell], settings: ExperimentSettings, select_trials: int | None = None
) -> int:
    """How many runs :func:`run_cells` makes for ``cells`` from scratch: every LR of a cell's grid, or
    with ``select_trials`` every LR on the selection trials and the selected one on the others.

    Example:
        >>> lora = {"methods": ["none"], "regimes": ["lora"], "shots": [8], "epochs": [25], "trials": 3}
        >>> planned_runs(grid_cells(lora), settings, select_trials=1)  # 4 LRs on trial 0, then 1 + 1
        6
    """
    return sum(
        len(settings.lr_grid(cell.regime)) if select_trials is None or cell.trial < select_trials else 1
        for cell in cells
    )


def longest_first(cells: Iterable[Cell]) -> list[Cell]:
    """``cells`` by decreasing training steps (epochs x shots; stable otherwise), so that
    parallel workers do not end with one long cell running alone.

    Example:
        >>> [c.shots for c in longest_first([Cell("none", "fe", 8, 25, 0), Cell("none", "fe", 128, 25, 0)])]
        [128, 8]
    """
    return sorted(cells, key=lambda cell: cell.epochs * cell.shots, reverse=True)


_WORKER: Experiment | Exception | None = None


def longest_first_units(units: Iterable[Unit]) -> list[Unit]:
    """``units`` (a cell and its LRs) ordered by :func:`longest_first` of their cells."""
    lrs_of = dict(units)
    return [(cell, lrs_of[cell]) for cell in longest_first(lrs_of)]


def _init_worker(settings: ExperimentSettings, threads: int) -> None:
    global _WORKER
    torch.set_num_threads(threads)
    try:
        _WORKER = Experiment(settings)
    except Exception as error:  # a failing initializer is respawned forever: fail the first cell instead
        _WORKER = error


def _run_in_worker(unit: Unit) -> list[dict[str, Any]]:
    if isinstance(_WORKER, Exception):
        raise _WORKER  # e.g. bad --data: reaches the parent, which shows it as one line
    assert _WORKER is not None
    return _WORKER.run_lrs(*unit)


def run_cells(
    cells: Iterable[Cell],
    results: str | os.PathLike,
    settings: ExperimentSettings,
    workers: int = 1,
    progress: bool = True,
    experiment: Experiment | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    select_trials: int | None = None,
) -> list[dict[str, Any]]:
    """Run every cell at each LR of its regime's grid, skipping the runs already in ``results``.

    Args:
        cells: The grid.
        results: JSON-lines results file (created if missing); each record appended when done.
        settings: The experiment settings (each worker builds its own :class:`Experiment`).
        workers: Processes on this machine; 1 runs in this process.
        progress: Show a tqdm bar with ETA.
        experiment: A prepared experiment to use in-process (``workers == 1``).
        on_record: Called after each record is safely on disk.
        select_trials: Select the LR on trials ``< select_trials`` (all LRs run there), then run
            the other trials at the selected LR only. ``None``: every trial runs every LR.

    Under ``accelerate launch`` each process runs its :func:`~layerfusion_recipes.core.processes.share`
    of the units (longest first) and all wait for each other before the LR selection and the end.

    Returns:
        The records of these cells at their LRs in ``results`` (old and new), one per key.

    Example:
        >>> run_cells(grid_cells(grid), "out/results.jsonl", settings, workers=2)
    """
    from tqdm.auto import tqdm

    cells = list(cells)
    if select_trials is not None and select_trials < 1:
        raise ValueError(f"select_trials must be >= 1 (None: every trial runs every LR), got {select_trials}")
    setup = settings.setup()
    state = process_state()
    check_workers(workers, state.num_processes)
    grids = {cell.regime: settings.lr_grid(cell.regime) for cell in cells}
    first = [c for c in cells if select_trials is None or c.trial < select_trials]
    later = [c for c in cells if select_trials is not None and c.trial >= select_trials]
    wanted = {record_key(c, lr, setup) for c in first for lr in grids[c.regime]}
    mine = _share_of(state)
    first_units = mine([(cell, grids[cell.regime]) for cell in first])
    own_keys = {record_key(cell, lr, setup) for cell, lrs in first_units for lr in lrs}
    bar = tqdm(
        total=len(own_keys) + len(mine([(cell, ()) for cell in later])),
        initial=len(own_keys & finished_keys(results)),
        desc="runs" if state.num_processes == 1 else f"runs of process {state.process_index}",
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    launch = {"num_processes": state.num_processes, "process_index": state.process_index}
    runner = _UnitRunner(results, settings, workers, experiment, bar, on_record, launch)
    try:
        runner.run(first_units)
        state.wait_for_everyone()  # the LR selection and the caller read every process's records
        if later:
            chosen = selected_lrs(r for r in read_records(results) if r["key"] in wanted)
            units = [(cell, (chosen[_group(cell)],)) for cell in later]
            wanted |= {record_key(cell, lrs[0], setup) for cell, lrs in units}
            units = mine(units)
            bar.update(len({record_key(cell, lrs[0], setup) for cell, lrs in units} & finished_keys(results)))
            runner.run(units)
            state.wait_for_everyone()
    finally:
        runner.close()
        bar.close()
    return [record for record in read_records(results) if record["key"] in wanted]


def _share_of(state) -> Callable[[list[Unit]], list[Unit]]:
    """The units of this process (all of them in a one-process run, in their order)."""
    if state.num_processes == 1:
        return list
    return lambda units: share(longest_first_units(units), state.process_index, state.num_processes)


def _group(cell: Cell) -> tuple:
    return (cell.method, cell.regime, cell.shots, cell.epochs)


def selected_lrs(records: Iterable[dict[str, Any]]) -> dict[tuple, float]:
    """The LR selected on dev (:func:`~layerfusion_recipes.core.selection.select_lr`) for each (method,
    regime, shots, epochs) of ``records`` (the selection runs of one setup)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        group = tuple(record[k] for k in ("method", "regime", "shots", "epochs"))
        groups.setdefault(group, []).append(record)
    return {group: select_lr(runs).lr for group, runs in groups.items()}


class _UnitRunner:
    """Runs units (a cell and its LRs) in this process or a pool; appends and reports each record."""

    def __init__(self, results, settings, workers, experiment, bar, on_record, launch) -> None:
        self.results, self.settings, self.workers = results, settings, workers
        self.experiment, self.bar, self.on_record = experiment, bar, on_record
        self.launch = launch  # {"num_processes", "process_index"}: added to each record, not to its key
        self.setup = settings.setup()
        self.pool = None

    def _missing(self, unit: Unit, done: set[str]) -> Unit:
        cell, lrs = unit
        return cell, tuple(lr for lr in lrs if record_key(cell, lr, self.setup) not in done)

    def _pieces(self, unit: Unit) -> list[Unit]:
        """What one pool task runs: the whole unit where its LRs train together, else one LR each
        (each record then reaches the results file when its own run ends)."""
        cell, lrs = unit
        if lrs_train_together(cell, self.settings.use_cache):
            return [unit]
        return [(cell, (lr,)) for lr in lrs]

    def run(self, units: list[Unit]) -> None:
        done = finished_keys(self.results)
        todo = [unit for unit in (self._missing(u, done) for u in units) if unit[1]]
        if todo and self.workers > 1:
            if self.pool is None:
                threads = max(1, torch.get_num_threads() // self.workers)
                context = multiprocessing.get_context("spawn")
                self.pool = context.Pool(self.workers, _init_worker, (self.settings, threads))
            pieces = [piece for unit in longest_first_units(todo) for piece in self._pieces(unit)]
            for records in self.pool.imap_unordered(_run_in_worker, pieces):
                for record in records:
                    _finish(self.results, {**record, **self.launch}, self.bar, self.on_record)
        elif todo:
            self.experiment = self.experiment or Experiment(self.settings)
            for unit in todo:
                # another sweep on this results file may have finished some of it meanwhile
                cell, lrs = self._missing(unit, finished_keys(self.results))
                for record in self.experiment.iter_lrs(cell, lrs) if lrs else []:
                    _finish(self.results, {**record, **self.launch}, self.bar, self.on_record)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _finish(results, record: dict[str, Any], bar, on_record) -> None:
    append_record(results, record)
    method, shots, lr, f1 = record["method"], record["shots"], record["lr"], record["dev_f1"]
    bar.set_postfix_str(f"{method} N={shots} lr={lr:g} F1={f1:.3f}")
    bar.update(1)
    if on_record is not None:
        on_record(record)


def sweep_main(args: argparse.Namespace, figures: bool = False) -> int:
    """Resolve options, run the grid, print the summary table (and write figures).

    Options that the data or the tokenizer refuse (``--shots`` beyond the train split, a
    ``--max-length`` that leaves no gold entity in reach, a malformed data file) stop here with
    one line on stderr and exit code 2 (``errors.run_command``), before any cell runs.

    Args:
        args: The parsed options of ``layerfusion sweep`` (flags over ``--config`` over defaults).
        figures: Also write ``table.md`` and the figures into the output folder (``layerfusion ner``).

    Returns:
        The exit code (0). The invocation's line in ``sweeps.jsonl`` is written however it ends,
        unless its checks refused it before the first run (then nothing is written: no folder).

    Example:
        >>> sweep_main(build_parser().parse_args(["sweep", "--config", "grid.yaml"]))
        0
    """
    state = process_state()  # a launch accelerate cannot set up stops here, before any work
    settings, grid = resolve(args)
    cells = grid_cells(grid)
    fields = {
        "workers": grid["workers"],
        "threads": grid["threads"] or torch.get_num_threads(),
        "num_processes": state.num_processes,
        "argv": list(sys.argv),
        "config": getattr(args, "config", None),
        "runs_planned": planned_runs(cells, settings, grid["select_trials"]),
    }
    keys = grid_keys(cells, settings)
    with logged_sweep(grid["results"], keys, fields, state.is_main_process, checks_first=True) as start:
        return _sweep(settings, grid, cells, state, figures, start)


def _sweep(
    settings: ExperimentSettings,
    grid: dict[str, Any],
    cells: list[Cell],
    state,
    figures: bool,
    start: SweepStart,
) -> int:
    experiment = Experiment(settings)  # loads and checks the data, the tokenizer, the dev gold
    check_sample_sizes(settings, grid["shots"], len(experiment.data.train), experiment.num_types)
    start.begin()  # refused before this line: no sweeps.jsonl line (nor output folder)
    if grid["threads"]:
        torch.set_num_threads(grid["threads"])
    records = run_cells(
        cells,
        grid["results"],
        settings,
        workers=grid["workers"],
        progress=not grid["quiet"],
        experiment=experiment,
        select_trials=grid["select_trials"],
    )
    if not state.is_main_process:
        return 0  # the main process writes the table and figures, once
    if figures:
        paths = write_report(records, grid["output"])
        print(paths["table"].read_text())
        print("figures: " + ", ".join(str(p) for key, p in paths.items() if key != "table"))
    else:
        print(markdown_table(summarize(records)))
    print(f"results: {grid['results']} ({len(records)} runs)")
    return 0


def ner_main(args: argparse.Namespace) -> int:
    """``layerfusion ner``: the sweep of its options, then the table and the figures."""
    return sweep_main(args, figures=True)
