"""``layerfusion mlm``: the grid of its options (:class:`~layerfusion_recipes.mlm.settings.MlmSettings`)
run by :func:`~layerfusion_recipes.mlm.experiment.run_mlm`, a line per LR, then the summary."""

from __future__ import annotations

import argparse
import sys

from .experiment import edge_warning, run_mlm, summary_line
from .records import results_file
from .settings import MlmSettings


def mlm_main(args: argparse.Namespace) -> int:
    """``layerfusion mlm``: run the grid, print a line per LR, the data caveat and the summary.

    Args:
        args: The parsed ``layerfusion mlm`` options.

    Returns:
        The exit code, 0.

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> args = ["mlm", "--data", text_path, "--model", model_path, "--lr", "1e-3", "--epochs", "1",
        ...         "--block-size", "16", "--output", "mlm-out"]
        >>> mlm_main(build_parser().parse_args(args))
        lr 0.001: ...
        ...
        0
    """
    settings = MlmSettings.from_args(args)
    summary = run_mlm(settings, progress=lambda line: print(line, flush=True))  # runs take minutes
    print(f"data: {summary['data']}")
    print(summary_line(summary, results_file(settings.output)))
    warning = edge_warning(summary)
    if warning is not None:
        print(f"layerfusion mlm: {warning}", file=sys.stderr)
    return 0
