"""The options of the commands that are no task's (``audit``, ``plot``, ``report``, ``paired``), their
defaults and help; each task's are in its folder (``ner/options.py``, ``classify/options.py``,
``mlm/options.py``, ``seq2seq/options.py``), the few-shot ones they share in
:mod:`layerfusion_recipes.core.options.task_options`.

Only the standard library is imported here (and by :mod:`layerfusion_recipes.cli`), so
``layerfusion --help`` and every ``layerfusion COMMAND --help`` answer at once; the heavy
libraries (torch, transformers, peft) load only when a command runs. Paths are checked before that
(the ``check_*`` functions below), in one line.
"""

from __future__ import annotations

import argparse
import pathlib

from .core.errors import DataSourceError
from .core.options.locations import check_source
from .core.options.options import PROBE_TOP, positive_int


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion audit``: a model config and what to count."""
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="config.json path, model directory, cached Hub name, a published LLM shape (e.g. "
        "llama-3.1-8b; an unknown name lists them), a .gguf file or gemma3-270m (the offline decoder of "
        "the `llm` extra)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object {method: params}")
    parser.add_argument("--regime", default="fe", help="training regime: fe, ft, lora, bitfit (default: fe)")
    parser.add_argument("--match", help="size LoRA / R+n / adapters to this method's budget, e.g. dwatt")
    parser.add_argument("--tolerance", type=float, help="flag budget pairs further apart (default 0.05)")


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion plot``: a results file and where the figures go."""
    parser.add_argument(
        "results", help="Results file written by `layerfusion ner` / `layerfusion sweep` (JSON lines)."
    )
    parser.add_argument(
        "--output", help="Folder for table.md and the PNG figures (default: the results file's folder)."
    )
    parser.add_argument(
        "--probe-layers",
        type=positive_int,
        metavar="K",
        help="With layer probes beside the results (RESULTS.probes.jsonl): the best K layers on dev "
        f"printed as layers=[...] (default {PROBE_TOP}).",
    )


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion report``: where RESULTS.md is and whether to check it or rewrite it."""
    parser.add_argument("--check", action="store_true", help="Print a diff and exit 1 when out of date.")
    parser.add_argument(
        "--root", type=pathlib.Path, help="Repository root (default: the one this package is installed from)."
    )
    parser.add_argument(
        "--file",
        type=pathlib.Path,
        default=pathlib.Path("benchmarks/RESULTS.md"),
        help="File to regenerate, under --root (default: benchmarks/RESULTS.md).",
    )


def add_paired_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion paired``: the cells to pair and their row."""
    parser.add_argument("cells", nargs="+", help="RESULTS:METHOD:REGIME; the first minus each other one.")
    parser.add_argument("--shots", type=int, required=True, help="N of the row.")
    parser.add_argument("--epochs", type=int, default=25, help="Max epochs of the row (default 25).")


# Checks that need no library: run before a command's module (and torch, transformers, peft) is
# imported, so a missing path answers in one line at once. The library's names are checked later.


def check_audit_config(args: argparse.Namespace) -> None:
    """``audit``: CONFIG is an existing path or a Hub name."""
    check_source(args.config, "CONFIG")


def check_results_file(args: argparse.Namespace) -> None:
    """``plot``: the results file exists."""
    if not pathlib.Path(args.results).is_file():
        raise DataSourceError(f"{args.results!r}: no such results file")
