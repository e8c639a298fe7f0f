"""``layerfusion sweep``: a grid of cells, resumable, with a progress bar and worker processes.

Grid: methods x regimes x shots x max-epochs x trials, from a YAML file (``--config``) or
flags. Every finished cell is appended atomically to the results file (one JSON line, see
``layerfusion_recipes.results``); re-running the same command skips the cells already there, so a
killed sweep loses nothing and redoes nothing (a cell interrupted mid-way runs again).
``--workers N`` runs N processes on this machine (spawned; each rebuilds the experiment, and
they share the feature cache through ``--cache-dir``).
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

from .experiment import Cell, Experiment, ExperimentSettings, check_sample_sizes
from .options import add_experiment_parser, resolve
from .results import append_record, finished_keys, read_records


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


def longest_first(cells: Iterable[Cell]) -> list[Cell]:
    """``cells`` by decreasing training steps (epochs x shots; stable otherwise), so that
    parallel workers do not end with one long cell running alone.

    Example:
        >>> [c.shots for c in longest_first([Cell("none", "fe", 8, 25, 0), Cell("none", "fe", 128, 25, 0)])]
        [128, 8]
    """
    return sorted(cells, key=lambda cell: cell.epochs * cell.shots, reverse=True)


_WORKER: Experiment | Exception | None = None


def _init_worker(settings: ExperimentSettings, threads: int) -> None:
    global _WORKER
    torch.set_num_threads(threads)
    try:
        _WORKER = Experiment(settings)
    except Exception as error:  # a failing initializer is respawned forever: fail the first cell instead
        _WORKER = error


def _run_in_worker(cell: Cell) -> dict[str, Any]:
    if isinstance(_WORKER, Exception):
        raise _WORKER  # e.g. bad --data: reaches the parent, which shows it as one line
    assert _WORKER is not None
    return _WORKER.run(cell)


def run_cells(
    cells: Iterable[Cell],
    results: str | os.PathLike,
    settings: ExperimentSettings,
    workers: int = 1,
    progress: bool = True,
    experiment: Experiment | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the cells not yet in ``results``; append each record as soon as it is finished.

    Args:
        cells: The grid.
        results: JSON-lines results file (created if missing).
        settings: The experiment settings (each worker builds its own :class:`Experiment`).
        workers: Processes on this machine; 1 runs in this process.
        progress: Show a tqdm bar with ETA.
        experiment: A prepared experiment to use in-process (``workers == 1``).
        on_record: Called after each record is safely on disk.

    Returns:
        Every record of the results file for these cells (old and new).

    Example:
        >>> run_cells(grid_cells(grid), "out/results.jsonl", settings, workers=2)
    """
    from tqdm.auto import tqdm

    cells = list(cells)
    done = finished_keys(results)
    todo = [cell for cell in cells if cell.key not in done]
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(todo),
        desc="cells",
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    try:
        if todo and workers > 1:
            todo = longest_first(todo)
            threads = max(1, torch.get_num_threads() // workers)
            context = multiprocessing.get_context("spawn")
            with context.Pool(workers, _init_worker, (settings, threads)) as pool:
                for record in pool.imap_unordered(_run_in_worker, todo):
                    _finish(results, record, bar, on_record)
        elif todo:
            experiment = experiment or Experiment(settings)
            for cell in todo:
                _finish(results, experiment.run(cell), bar, on_record)
    finally:
        bar.close()
    wanted = {cell.key for cell in cells}
    return [record for record in read_records(results) if record["key"] in wanted]


def _finish(results, record: dict[str, Any], bar, on_record) -> None:
    from accelerate import PartialState

    if PartialState().is_main_process:  # under `accelerate launch` every process runs the cell
        append_record(results, record)
    bar.set_postfix_str(f"{record['method']} N={record['shots']} F1={record['best_f1']:.3f}")
    bar.update(1)
    if on_record is not None:
        on_record(record)


def sweep_main(args: argparse.Namespace, figures: bool = False) -> int:
    """Resolve options, run the grid, print the summary table (and write figures).

    Options that the data or the tokenizer refuse (``--shots`` beyond the train split, a
    ``--max-length`` that leaves no gold entity in reach, a malformed data file) stop here with
    one line on stderr and exit code 2 (``errors.run_command``), before any cell runs.
    """
    from .plot import markdown_table, summarize, write_report

    settings, grid = resolve(args)
    experiment = Experiment(settings)  # loads and checks the data, the tokenizer, the dev gold
    check_sample_sizes(settings, grid["shots"], len(experiment.data.train), experiment.num_types)
    if grid["threads"]:
        torch.set_num_threads(grid["threads"])
    records = run_cells(
        grid_cells(grid),
        grid["results"],
        settings,
        workers=grid["workers"],
        progress=not grid["quiet"],
        experiment=experiment,
    )
    if figures:
        paths = write_report(records, grid["output"])
        print(paths["table"].read_text())
        print("figures: " + ", ".join(str(p) for key, p in paths.items() if key != "table"))
    else:
        print(markdown_table(summarize(records)))
    print(f"results: {grid['results']} ({len(records)} cells)")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``layerfusion sweep``."""
    return add_experiment_parser(
        subparsers,
        "sweep",
        "Grid of few-shot NER runs (methods x regimes x shots x epochs x trials), resumable.",
        __doc__,
        sweep_main,
    )
