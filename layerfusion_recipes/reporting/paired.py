"""``layerfusion paired``: paired per-trial differences between cells of different results files (e.g.
a budget-matched baseline trained under other ``method_options`` against a fusion row of another grid).

``layerfusion plot`` and the ``join=`` blocks of ``layerfusion report`` pair methods within one setup. A
baseline with its own method options (LoRA at a matched rank) has a setup of its own, though its trials
train on the same samples (the sample depends on the data, the seed and the trial, never on the
method or its options). This command pairs such cells by trial: each cell at its own LR selected on
dev (the one summariser, :func:`~layerfusion_recipes.core.results.summary.summarize_groups`, through
``layerfusion
plot``'s ``score_groups``), the difference of the score the tables report (test F1; best dev F1 where
the cell's runs have no test score) per shared trial, mean ± 95% t-CI.

Usage::

    layerfusion paired --shots 128 \\
        benchmarks/results/conll_regimes_128_lr/results.jsonl:dwatt:lora \\
        benchmarks/results/conll_lora_matched_128_lr/results.jsonl:none:lora

It prints the first cell minus each of the others. Each cell is ``RESULTS:METHOD:REGIME``, where
``RESULTS`` is a results file of ``layerfusion sweep``; ``--shots`` and ``--epochs`` pick the row.
A cell that would pair runs of different data, sample or settings (other than the method options) is
refused, naming what differs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from ..core.errors import UserError
from ..core.results.stats import paired_mean_ci
from ..core.sweeps.tasks import read_task_records
from .plot import format_lr, score_groups

# settings that may differ between paired cells: they change the model, not the sample or the data
MODEL_ONLY_SETTINGS = ("method_options",)


@dataclass(frozen=True)
class Cell:
    """One cell of a results file at its selected LR.

    Args:
        label: How it is named in the output (``RESULTS:METHOD:REGIME``).
        lr: The LR selected on dev.
        scores: The reported score (points) by trial at that LR
            (:func:`~layerfusion_recipes.reporting.plot.score_groups`).
        settings: The runs' settings without :data:`MODEL_ONLY_SETTINGS`.
    """

    label: str
    lr: float | None
    scores: dict[int, float]
    settings: dict[str, Any]


def read_cell(spec: str, shots: int, epochs: int) -> Cell:
    """The cell ``RESULTS:METHOD:REGIME`` at ``shots`` and ``epochs``, at its dev-selected LR.

    Raises:
        ValueError: A spec not of that form, no runs of that cell in the file, or runs of several setups.

    Example:
        >>> cell = read_cell(f"{sweep_results}:dwatt:fe", 8, 25)  # a sweep's DWAtt at N = 8, 25 epochs
        >>> cell.lr, [round(score, 1) for score in cell.scores.values()]
        (0.1, [52.0, 56.0, 60.0])
    """
    path, _, rest = spec.partition(":")
    method, _, regime = rest.partition(":")
    if not (path and method and regime) or ":" in regime:
        raise ValueError(f"cell {spec!r}: expected RESULTS:METHOD:REGIME")
    runs = [
        record
        for record in read_task_records(path)
        if (record["method"], record["regime"], record["shots"], record["epochs"])
        == (method, regime, shots, epochs)
    ]
    if not runs:
        raise ValueError(f"cell {spec!r}: no runs of {method} / {regime} at N = {shots}, {epochs} epochs")
    groups = score_groups(runs)  # one per setup: the LR selected on dev, the scores at it by trial
    if len(groups) > 1:
        setups = ", ".join(str(setting[0]) for setting, _ in groups)
        raise ValueError(f"cell {spec!r}: its runs are of {len(groups)} setups ({setups}), not one")
    (group,) = groups.values()
    scores = group.values["test" if group.stats["test"] is not None else "dev"]
    settings = next(iter(group.runs.values())).get("settings", {})
    settings = {k: v for k, v in settings.items() if k not in MODEL_ONLY_SETTINGS}
    return Cell(spec, group.lr, scores, settings)


def difference_line(cell: Cell, base: Cell) -> str:
    """``cell - base``: mean ± 95% t-CI of the per-trial differences over the trials both have.

    Raises:
        ValueError: The two cells' runs differ in a setting other than the method options.

    Example:
        >>> difference_line(Cell("a", 0.01, {0: 50.0, 1: 60.0}, {}), Cell("b", 0.1, {0: 40.0, 1: 55.0}, {}))
        'a @0.01 - b @0.1: +7.5 ± 31.8 (n=2)'
    """
    differing = sorted(
        k for k in set(cell.settings) | set(base.settings) if cell.settings.get(k) != base.settings.get(k)
    )
    if differing:
        raise ValueError(
            f"{cell.label} and {base.label} differ in {', '.join(differing)}: not the same samples"
        )
    difference = paired_mean_ci(cell.scores, base.scores)
    if difference is None:
        return f"{cell.label} - {base.label}: no trial in common"
    mean, half, n = difference
    return (
        f"{cell.label} @{format_lr(cell.lr)} - {base.label} @{format_lr(base.lr)}: "
        f"{mean:+.1f} ± {half:.1f} (n={n})"
    )


def paired_main(args: argparse.Namespace) -> int:
    """``layerfusion paired``: print the first cell minus each other one; returns the exit code (2 on a
    bad cell)."""
    if len(args.cells) < 2:
        raise UserError("give at least two cells")
    try:
        first, *others = [read_cell(spec, args.shots, args.epochs) for spec in args.cells]
        for other in others:
            print(difference_line(first, other))
    except (ValueError, OSError) as error:
        print(f"layerfusion paired: error: {error}", file=sys.stderr)
        return 2
    return 0
