"""``layerfusion classify``: the grid of its options run by the shared sweep
(:func:`~layerfusion_recipes.core.sweeps.sweep.run_sweep`), then ``table.md`` and the figures."""

from __future__ import annotations

import argparse

from ..core.sweeps.sweep import run_sweep
from ..core.sweeps.true_few_shot import protocol_main
from ..reporting.sweep_report import print_sweep_report
from .settings import resolve


def classify_main(args: argparse.Namespace) -> int:
    """Resolve the options, run every cell at every LR of its grid (resumable), write the table and
    the figures; one line and exit code 2 for bad data or options, before any run.

    Example:
        >>> import sys
        >>> from layerfusion_recipes.cli import build_parser
        >>> from layerfusion_recipes.core.errors import run_command
        >>> args = build_parser().parse_args(["classify", "--data", "missing/", "--model", "minilm/"])
        >>> run_command(classify_main, args, prog="layerfusion classify", stream=sys.stdout)
        layerfusion classify: ...missing/...
        2
    """
    settings, grid = resolve(args)
    if grid["selection"] == "cv":
        return protocol_main(settings, grid)
    return run_sweep(settings, grid, print_sweep_report, figures=True, config=getattr(args, "config", None))
