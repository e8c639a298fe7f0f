"""``layerfusion sweep`` and ``layerfusion ner``: NER's grid run by the shared sweep
(:mod:`layerfusion_recipes.core.sweeps.sweep`: resumable, ``--workers``, ``--select-trials``, ``accelerate``
splitting, one line per invocation in ``sweeps.jsonl``).

Grid: methods x regimes x shots x max-epochs x trials, from a YAML file (``--config``) or flags, each
cell at every LR of its regime's grid (``--lr``, else ``DEFAULT_LR_GRIDS``).
"""

from __future__ import annotations

import argparse

from ..core.sweeps.sweep import run_sweep
from ..core.sweeps.true_few_shot import protocol_main
from ..reporting.sweep_report import print_sweep_report
from .settings import resolve

__all__ = ["ner_main", "sweep_main"]


def sweep_main(args: argparse.Namespace, figures: bool = False) -> int:
    """Resolve options, run the grid, print the summary table (and write figures).

    Options that the data or the tokenizer refuse (``--shots`` beyond the train split, a
    ``--max-length`` that leaves no gold entity in reach, a malformed data file) stop here with
    one line on stderr and exit code 2 (``errors.run_command``), before any cell runs.

    Args:
        args: The parsed options of ``layerfusion sweep`` (flags over ``--config`` over defaults).
        figures: Also write ``table.md`` and the figures into the output folder (``layerfusion ner``).

    Returns:
        The exit code (0). The invocation's line in ``sweeps.jsonl`` is written however it ends.

    Example:
        >>> import sys
        >>> from layerfusion_recipes.cli import build_parser
        >>> from layerfusion_recipes.core.errors import run_command
        >>> args = build_parser().parse_args(["sweep", "--config", "missing.yaml"])
        >>> run_command(sweep_main, args, prog="layerfusion sweep", stream=sys.stdout)
        layerfusion sweep: ...missing.yaml...
        2
    """
    settings, grid = resolve(args)
    if grid["selection"] == "cv":
        return protocol_main(settings, grid)
    return run_sweep(settings, grid, print_sweep_report, figures, config=getattr(args, "config", None))


def ner_main(args: argparse.Namespace) -> int:
    """``layerfusion ner``: the sweep of its options, then the table and the figures."""
    return sweep_main(args, figures=True)
