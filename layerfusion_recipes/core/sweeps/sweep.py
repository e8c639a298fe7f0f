"""Sweeps of a few-shot task's grid: resumable, with a progress bar, worker processes and ``accelerate``.

Grid: methods x regimes x shots x max-epochs x trials (:mod:`layerfusion_recipes.core.results.cells`), each
cell at every LR of its regime's grid (on the feature cache the LRs of a cell train together).
Every finished run is appended atomically to the results file (one JSON line, see
:mod:`layerfusion_recipes.core.results.records`) under a key naming its cell, LR and settings; re-running the
same command skips the runs already there, so a killed sweep loses nothing and redoes nothing (a run
interrupted mid-way runs again), and changed settings make new records. Two sweeps on one results
file skip what the other finished and never write a key twice.

``select_trials M`` selects each cell's LR on its first ``M`` trials (every LR), then runs the other
trials at the selected LR only: ``M * G + (T - M)`` runs per cell instead of ``T * G`` (``G`` LRs,
``T`` trials), for the uncached regimes where every LR costs a full run. ``workers N`` runs N
processes on this machine (spawned; each rebuilds the experiment from its settings, and they share
the feature cache through its directory).

Under ``accelerate launch --num_processes P`` the P processes divide the runs among them (each run
trained by one process, on its device; see :mod:`layerfusion_recipes.core.engine.processes`): every record
is written once, with the same key and scores as one process gives, and says which of how many
processes ran it (``process_index``, ``num_processes``); only the main process prints and writes the
table and figures.

Every invocation appends one line to ``sweeps.jsonl`` beside the results file when it ends (also on
an error or Ctrl-C): its wall time, peak memory, workers, threads, command line, runs and the
machine's load (see :mod:`layerfusion_recipes.core.sweeps.sweep_log`; only the main process writes it),
and ``cache_bytes`` / ``cache_model_bytes``, the feature cache's predicted size.

Before any run, a sweep with FE cells on the feature cache prints the bytes the cache will hold
(:meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.cache_plan`: examples x kept positions
x blocks x width x bytes, the model's), the training state of its largest pass of stacked LR candidates
(:meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.training_plan`, within
``train_memory``),
the process's own, and the memory available, and refuses, in one line naming the
options that would make it fit, a cache that its processes cannot hold in memory
(:func:`~layerfusion_recipes.core.cache.feature_cache.memory_check`); ``dry_run`` prints that alone. A
one-process sweep fills the cache with everything its runs (and its layer probes) read first, then
lets the encoder go (:meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.prefill_cache`).
With ``probe_layers`` the main process trains the layer probes
(:func:`~layerfusion_recipes.core.probes.probes.run_probes`) on that cache before the runs; ``dry_run``
trains none.

A task's settings build its experiment (``settings.make_experiment(plan)``, also in each worker) and the
experiment checks the shot sizes (``check_shots``) before any run. The settings are the options as the
user gave them; what the sweep learns (the positions its cache keeps, from the grid's methods; its
resident limit; its probes' choices) is its :class:`~layerfusion_recipes.core.engine.plan.SweepPlan`
(:func:`sweep_plan`, then filled in), passed beside them.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..cache.feature_cache import CachePlan, TrainingPlan, available_memory, memory_check, resident_limit
from ..engine.experiment import FewShotExperiment, TaskSettings, cache_positions_for
from ..engine.plan import SweepPlan
from ..engine.processes import check_workers, process_state, share
from ..errors import UserError
from ..probes.probes import missing_probes, probe_cells, probe_ranks, probe_starts, run_probes, saved_probes
from ..results.cells import (
    Cell,
    Unit,
    grid_cells,
    grid_keys,
    longest_first_units,
    lrs_train_together,
    planned_runs,
)
from ..results.records import append_record, finished_keys, read_records
from ..results.selection import dev_score, select_lr
from .sweep_log import SweepStart, logged_sweep
from .tasks import check_task

_WORKER: FewShotExperiment | Exception | None = None

# What a sweep's main process shows at its end: (records, layer-probe records, grid, figures) -> None.
# The task passes it in (e.g. :func:`~layerfusion_recipes.reporting.sweep_report.print_sweep_report`):
# the core never imports the reporting.
SweepReport = Callable[[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], bool], None]


def _init_worker(settings: TaskSettings, plan: SweepPlan, threads: int) -> None:
    global _WORKER
    # Ctrl-C reaches the whole process group: the parent stops the pool, a worker says nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    try:
        _WORKER = settings.make_experiment(plan)
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
    settings: TaskSettings,
    workers: int = 1,
    progress: bool = True,
    experiment: FewShotExperiment | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    select_trials: int | None = None,
    plan: SweepPlan | None = None,
) -> list[dict[str, Any]]:
    """Run every cell at each LR of its grid (its method's under its regime), skipping the runs
    already in ``results``.

    Args:
        cells: The grid.
        results: JSON-lines results file (created if missing); each record appended when done.
        settings: The task's settings (each worker builds its own experiment from them).
        workers: Processes on this machine; 1 runs in this process.
        progress: Show a tqdm bar with ETA.
        experiment: A prepared experiment to use in-process (``workers == 1``), of ``plan``.
        on_record: Called after each record is safely on disk.
        select_trials: Select the LR on trials ``< select_trials`` (all LRs run there), then run
            the other trials at the selected LR only. ``None``: every trial runs every LR.
        plan: What the sweep learned (:class:`~layerfusion_recipes.core.engine.plan.SweepPlan`: each run's
            probe choices are in its key; each worker builds its experiment with it). ``None``:
            ``experiment``'s, else the empty plan.

    Under ``accelerate launch`` each process runs its :func:`~layerfusion_recipes.core.engine.processes.share`
    of the units (longest first) and all wait for each other before the LR selection and the end.

    Returns:
        The records of these cells at their LRs in ``results`` (old and new), one per key.

    Example:
        >>> from layerfusion_recipes.core.results.cells import grid_cells
        >>> from layerfusion_recipes.core.results.records import read_records
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> settings = NerSettings(model=model_path, data=ner_data, lr=[1e-2], eval_every=1)
        >>> grid = {"methods": ["none", "dwatt"], "regimes": ["fe"], "shots": [2], "epochs": [2], "trials": 1}
        >>> records = run_cells(grid_cells(grid), "out/results.jsonl", settings, progress=False)
        >>> sorted(record["method"] for record in read_records("out/results.jsonl"))
        ['dwatt', 'none']
    """
    cells = list(cells)
    if select_trials is not None and select_trials < 1:
        raise ValueError(f"select_trials must be >= 1 (None: every trial runs every LR), got {select_trials}")
    if plan is None:
        plan = experiment.plan if experiment is not None else SweepPlan()
    setup = settings.setup()
    state = process_state()
    check_workers(workers, state.num_processes)
    grids = {(cell.regime, cell.method): settings.lr_grid(cell.regime, cell.method) for cell in cells}
    first, later = split_trials(cells, select_trials)
    wanted = {settings.run_key(c, lr, setup, plan) for c in first for lr in grids[c.regime, c.method]}
    mine = _share_of(state)
    first_units = mine([(cell, grids[cell.regime, cell.method]) for cell in first])
    own_keys = {settings.run_key(cell, lr, setup, plan) for cell, lrs in first_units for lr in lrs}
    total = len(own_keys) + len(mine([(cell, ()) for cell in later]))
    bar = _progress_bar(total, len(own_keys & finished_keys(results)), state, progress)
    # added to each record, not to its key: which process ran it, and the task (one per results file)
    launch = {"num_processes": state.num_processes, "process_index": state.process_index}
    launch["task"] = settings.TASK
    runner = _UnitRunner(results, settings, plan, workers, experiment, bar, on_record, launch)
    try:
        runner.run(first_units)
        state.wait_for_everyone()  # the LR selection and the caller read every process's records
        if later:
            wanted |= _run_at_selected_lrs(later, wanted, runner, mine, bar)
            state.wait_for_everyone()
    finally:
        runner.close()
        bar.close()
    return [record for record in read_records(results) if record["key"] in wanted]


def _progress_bar(total: int, done: int, state, progress: bool):
    """The sweep's tqdm bar on stderr, ``done`` of ``total`` runs already there."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=done,
        desc="runs" if state.num_processes == 1 else f"runs of process {state.process_index}",
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )


def _run_at_selected_lrs(later: list[Cell], wanted: set[str], runner, mine, bar) -> set[str]:
    """Run the ``later`` trials at the LR selected on the selection runs (``wanted``); their keys."""
    results = runner.results
    chosen = selected_lrs(r for r in read_records(results) if r["key"] in wanted)
    units = [(cell, (chosen[_group(cell)],)) for cell in later]
    keys = {runner.key(cell, lrs[0]) for cell, lrs in units}
    units = mine(units)
    bar.update(len({runner.key(cell, lrs[0]) for cell, lrs in units} & finished_keys(results)))
    runner.run(units)
    return keys


def runs_left(
    cells: list[Cell],
    results: str | os.PathLike,
    settings: TaskSettings,
    select_trials: int | None,
    plan: SweepPlan | None = None,
) -> bool:
    """Whether a run of ``cells`` is missing from ``results``: one of the selection trials at any LR of
    its grid, or one of the later trials at the LR selected on them (``select_trials``); the keys
    under ``plan`` (``None``: the empty plan, no probe choices).

    Example:
        >>> from layerfusion_recipes.core.results.cells import grid_cells
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> settings = NerSettings(model="m", data="d", lr=[1e-2])
        >>> grid = {"methods": ["none"], "regimes": ["fe"], "shots": [2], "epochs": [2], "trials": 1}
        >>> runs_left(grid_cells(grid), "out/results.jsonl", settings, None)  # nothing run yet
        True
    """
    done, setup = finished_keys(results), settings.setup()
    plan = SweepPlan() if plan is None else plan
    first, later = split_trials(cells, select_trials)
    wanted = {
        settings.run_key(cell, lr, setup, plan)
        for cell in first
        for lr in settings.lr_grid(cell.regime, cell.method)
    }
    if not wanted <= done:
        return True
    chosen = selected_lrs(r for r in read_records(results) if r["key"] in wanted) if later else {}
    return any(settings.run_key(cell, chosen[_group(cell)], setup, plan) not in done for cell in later)


def split_trials(cells: list[Cell], select_trials: int | None) -> tuple[list[Cell], list[Cell]]:
    """``(first, later)``: the cells that run every LR (the selection trials; all without
    ``select_trials``) and those that run the selected one, each in grid order (the order they run).

    Example:
        >>> from layerfusion_recipes.core.results.cells import grid_cells
        >>> grid = {"methods": ["none", "dwatt"], "regimes": ["lora"], "shots": [8], "epochs": [25]}
        >>> grid["trials"] = 3
        >>> [len(part) for part in split_trials(grid_cells(grid), select_trials=1)]  # 3 trials
        [2, 4]
    """
    first = [c for c in cells if select_trials is None or c.trial < select_trials]
    later = [c for c in cells if select_trials is not None and c.trial >= select_trials]
    return first, later


def _share_of(state) -> Callable[[list[Unit]], list[Unit]]:
    """The units of this process (all of them in a one-process run, in their order)."""
    if state.num_processes == 1:
        return list
    return lambda units: share(longest_first_units(units), state.process_index, state.num_processes)


def _group(cell: Cell) -> tuple:
    return (cell.method, cell.regime, cell.shots, cell.epochs)


def selected_lrs(records: Iterable[dict[str, Any]]) -> dict[tuple, float]:
    """The LR selected on dev (:func:`~layerfusion_recipes.core.results.selection.select_lr`) for each
    (method,
    regime, shots, epochs) of ``records`` (the selection runs of one setup)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        group = tuple(record[k] for k in ("method", "regime", "shots", "epochs"))
        groups.setdefault(group, []).append(record)
    return {group: select_lr(runs).lr for group, runs in groups.items()}


class _UnitRunner:
    """Runs units (a cell and its LRs) in this process or a pool; appends and reports each record."""

    def __init__(self, results, settings, plan, workers, experiment, bar, on_record, launch) -> None:
        self.results, self.settings, self.plan, self.workers = results, settings, plan, workers
        self.experiment, self.bar, self.on_record = experiment, bar, on_record
        self.launch = launch  # {"num_processes", "process_index", "task"}: in each record, not its key
        self.setup = settings.setup()
        self.pool = None

    def key(self, cell: Cell, lr: float) -> str:
        """The key of ``cell``'s run at ``lr`` (under the sweep's settings and plan)."""
        return self.settings.run_key(cell, lr, self.setup, self.plan)

    def _missing(self, unit: Unit, done: set[str]) -> Unit:
        cell, lrs = unit
        return cell, tuple(lr for lr in lrs if self.key(cell, lr) not in done)

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
                self.pool = context.Pool(self.workers, _init_worker, (self.settings, self.plan, threads))
            pieces = [piece for unit in longest_first_units(todo) for piece in self._pieces(unit)]
            for records in self.pool.imap_unordered(_run_in_worker, pieces):
                for record in records:
                    _finish(self.results, {**record, **self.launch}, self.bar, self.on_record)
        elif todo:
            self.experiment = self.experiment or self.settings.make_experiment(self.plan)
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
    method, shots, lr, dev = record["method"], record["shots"], record["lr"], dev_score(record)
    bar.set_postfix_str(f"{method} N={shots} lr={lr:g} dev={dev:.3f}")
    bar.update(1)
    if on_record is not None:
        on_record(record)


def run_sweep(
    settings: TaskSettings,
    grid: dict[str, Any],
    report: SweepReport,
    figures: bool = False,
    argv: list[str] | None = None,
    config: str | None = None,
) -> int:
    """Run a task's grid, then show it with ``report`` (its summary table; ``table.md`` and the figures).

    Options that the data or the tokenizer refuse (shot sizes beyond the train split, a malformed
    data file, ...) stop here with one line on stderr and exit code 2 (``errors.run_command``),
    before any cell runs.

    Args:
        settings: The task's settings.
        grid: methods, regimes, shots, epochs, trials and the run options output, results,
            workers, quiet, threads, select_trials, dry_run (a task's ``resolve``; ``dry_run``: print
            the runs and the feature cache's bytes, run nothing).
        report: Shows the records at the end, in the main process (:data:`SweepReport`).
        figures: Also write ``table.md`` and the figures into the output folder (passed to ``report``).
        argv: The command line, for the sweep log (default ``sys.argv``).
        config: The ``--config`` file, for the sweep log.

    Returns:
        The exit code (0). The invocation's line in ``sweeps.jsonl`` is written however it ends,
        unless its checks refused it before the first run (then nothing is written: no folder).

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> from layerfusion_recipes.ner.settings import resolve
        >>> from layerfusion_recipes.reporting.sweep_report import print_sweep_report
        >>> options = ["--shots", "2", "--epochs", "2", "--trials", "1", "--lr", "1e-2", "--methods", "none"]
        >>> args = ["ner", "--model", model_path, "--data", ner_data, *options, "--output", "out", "--quiet"]
        >>> args = build_parser().parse_args(args)
        >>> run_sweep(*resolve(args), print_sweep_report, figures=False)
        Large-dev protocol: ...
        | regime | epochs | shots | none |
        ...
        results: out/results.jsonl (1 runs)
        summary: out/summary.json
        0
    """
    check_task(read_records(grid["results"]), grid["results"], settings.TASK)  # one task per file
    state = process_state()  # a launch accelerate cannot set up stops here, before any work
    cells = grid_cells(grid)
    fields = {
        "workers": grid["workers"],
        "threads": grid["threads"] or torch.get_num_threads(),
        "num_processes": state.num_processes,
        "argv": list(sys.argv if argv is None else argv),
        "config": config,
        "runs_planned": planned_runs(cells, settings, grid["select_trials"]),
    }
    if grid.get("dry_run"):
        return dry_run(settings, grid, cells, state)
    keys = grid_keys(cells, settings, SweepPlan())  # probe choices left out (sweep_log)
    with logged_sweep(grid["results"], keys, fields, state.is_main_process, checks_first=True) as start:
        return _sweep(settings, grid, cells, state, report, figures, start, fields)


def sweep_plan(settings: TaskSettings, grid: dict[str, Any]) -> SweepPlan:
    """What a sweep of ``grid`` knows before it starts: the positions its feature cache keeps, the
    head's only where every method of the grid reads no other
    (:func:`~layerfusion_recipes.core.engine.experiment.cache_positions_for`); the sweep adds its
    resident limit and its probes' choices as it learns them.

    Example:
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> sweep_plan(NerSettings(model="m", data="d"), {"methods": ["none", "dwatt"]}).cache_positions
        'labelled'
    """
    return SweepPlan(cache_positions=cache_positions_for(grid["methods"] or (), settings.READ_POSITIONS))


def cache_memory(
    experiment: FewShotExperiment, cells: list[Cell], grid: dict[str, Any], state
) -> tuple[CachePlan | None, TrainingPlan | None, str, str | None]:
    """The sweep's feature cache (what ``cells`` and the layer probes read) and the training state of
    its largest pass of LR candidates against the memory: ``(plan, training, line, refusal)`` (see
    :func:`~layerfusion_recipes.core.cache.feature_cache.memory_check`);
    ``(None, None, "", None)`` without one."""
    plan = experiment.cache_plan(cells + probed_cells(grid))
    if plan is None:
        return None, None, "", None
    copies = grid["workers"] * state.num_processes
    mapped = experiment.settings.cache_dir is not None
    training = experiment.training_plan(cells)
    line, refusal = memory_check(plan, copies, mapped, available_memory(), training)
    return plan, training, line, refusal


def probed_cells(grid: dict[str, Any]) -> list[Cell]:
    """The layer probes' trials of ``grid`` (:func:`~layerfusion_recipes.core.probes.probes.probe_cells`;
    none without ``probe_layers``): they read the feature cache too."""
    return probe_cells(grid) if grid.get("probe_layers") else []


def dry_run(settings: TaskSettings, grid: dict[str, Any], cells: list[Cell], state) -> int:
    """``--dry-run``: print the runs and the feature cache's bytes (and whether it fits), run nothing."""
    experiment = settings.make_experiment(sweep_plan(settings, grid))
    experiment.check_shots(grid["shots"])
    cached, _, line, refusal = cache_memory(experiment, cells, grid, state)
    print(f"runs planned: {planned_runs(cells, settings, grid['select_trials'])}")
    print(line if cached is not None else "feature cache: none (no FE cell on the cache)")
    if grid.get("probe_layers"):
        print(f"layer probes planned: {len(probed_cells(grid))} trials (not run by a dry run)")
    if refusal:
        print(f"a sweep would stop here: {refusal}")
    return 0


def _sweep(
    settings: TaskSettings,
    grid: dict[str, Any],
    cells: list[Cell],
    state,
    report: SweepReport,
    figures: bool,
    start: SweepStart,
    fields: dict[str, Any],
) -> int:
    # loads and checks the data and the tokenizer; the cache keeps what every method of the grid reads
    experiment = settings.make_experiment(sweep_plan(settings, grid))
    experiment.check_shots(grid["shots"])
    cached, training, line, refusal = cache_memory(experiment, cells, grid, state)
    if cached is not None:
        fields.update(cache_bytes=cached.nbytes, cache_model_bytes=cached.model_bytes)
        # the runs keep their resident memory near the line (trims after the steps above it)
        limit = resident_limit(cached, training, mapped=settings.cache_dir is not None)
        experiment.plan = dataclasses.replace(experiment.plan, resident_limit=limit)
        if state.is_main_process:
            print(f"layerfusion: {line}", file=sys.stderr)
    if refusal:
        raise UserError(refusal)
    start.begin()  # refused before this line: no sweeps.jsonl line (nor output folder)
    if grid["threads"]:
        torch.set_num_threads(grid["threads"])
    left = runs_left(cells, grid["results"], settings, grid["select_trials"], experiment.plan)
    probes_left = bool(grid.get("probe_layers")) and bool(missing_probes(experiment, grid))
    if cached is not None and grid["workers"] == 1 and state.num_processes == 1 and (left or probes_left):
        # everything the runs and the probes read, in the order the runs read it (the probes' samples
        # are the FE cells' where the grid has some); then the encoder that computes it goes. A grid
        # whose runs are all in the results file builds no cache: it only reports them
        first, later = split_trials(cells, grid["select_trials"])
        experiment.prefill_cache(first + later + probed_cells(grid))
    # the layer probes on the filled cache (the encoder gone after a prefill), before the runs
    probes = []
    if grid.get("probe_layers"):  # the main process trains them; the others read what it wrote
        probes = run_probes(experiment, grid, progress=not grid["quiet"]) if state.is_main_process else []
        state.wait_for_everyone()
        probes = probes if state.is_main_process else saved_probes(experiment, grid)
    if settings.probe_start:  # each trial's fusion starts on its best probed block (dev only)
        experiment.plan = dataclasses.replace(experiment.plan, probe_starts=probe_starts(probes))
    if settings.probe_fuse:  # each trial's fusion reads its best probed blocks (dev only)
        experiment.plan = dataclasses.replace(experiment.plan, probe_ranks=probe_ranks(probes))
    records = run_cells(
        cells,
        grid["results"],
        settings,
        workers=grid["workers"],
        progress=not grid["quiet"],
        experiment=experiment,
        select_trials=grid["select_trials"],
        plan=experiment.plan,
    )
    if not state.is_main_process:
        return 0  # the main process writes the table and figures, once
    report(records, probes, grid, figures)
    return 0
