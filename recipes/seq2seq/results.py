"""The seq2seq comparison's section of ``benchmarks/RESULTS.md``: the block ``seq2seq`` (``layerfusion
report`` renders it through the command table, :data:`~layerfusion_recipes.commands.COMMANDS`).

Seq2seq comparison: the reserved name ``seq2seq`` shows the ``results.json`` of one ``layerfusion
seq2seq --output`` folder, its only parameter::

    <!-- generated: seq2seq output=benchmarks/results/seq2seq -->
    <!-- end generated: seq2seq output=benchmarks/results/seq2seq -->

The block has the recipe's own summary table (the copy of the corrupted input, then per method the
selected LR, test mean ± 95% t-CI over seeds and the paired per-seed differences to vanilla), the
table of every run (dev and test scores), one cost line (runs, their wall and CPU time, peak RSS, and
the note stored with the resources) and the ``layerfusion seq2seq`` command, built from the stored
settings (the options not at their default). A comparison that has not finished (``complete`` false)
stops with an error naming the marker.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import one_line
from ..reporting.markdown import (
    Block,
    block_error,
    duration,
    memory,
    option_defaults,
    option_flags,
    shown_path,
)
from .experiment import METHOD_NAMES as SEQ2SEQ_METHOD_NAMES
from .experiment import RUN_TABLE_HEADER, run_row, summary_table

SEQ2SEQ = "seq2seq"  # the block's reserved name: the results.json of a `layerfusion seq2seq --output` folder
SEQ2SEQ_FILE = "results.json"


def seq2seq_command(results: dict[str, Any], output: str, root: Path, defaults: dict[str, Any]) -> str:
    """The ``layerfusion seq2seq`` command of a ``results.json``, from its stored settings.

    ``--data`` when the training and test files are ``valid.txt`` and ``test.txt`` of one folder,
    else ``--train-file`` and ``--test-file``; then every option not at its default.

    Args:
        results: A ``layerfusion seq2seq`` ``results.json``.
        output: The folder it lies in, as the marker names it.
        root: The repository root (paths under its parent folder are shown relative to it).
        defaults: The defaults of ``layerfusion seq2seq``'s options
            (:func:`~layerfusion_recipes.reporting.markdown.option_defaults`).

    Example:
        >>> import json
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> defaults = option_defaults(COMMANDS["seq2seq"].add_arguments)
        >>> results = json.loads(Path("benchmarks/results/seq2seq/results.json").read_text())
        >>> seq2seq_command(results, "benchmarks/results/seq2seq", Path("."), defaults)
        'layerfusion seq2seq --data .../wikitext-2 --output benchmarks/results/seq2seq'
    """
    defaults = defaults | {"methods": list(SEQ2SEQ_METHOD_NAMES)}
    train, test = Path(results["train_file"]), Path(results["test_file"])
    if (train.name, test.name) == ("valid.txt", "test.txt") and train.parent == test.parent:
        flags = ["--data", shown_path(str(train.parent), root)]
    else:
        flags = ["--train-file", shown_path(str(train), root), "--test-file", shown_path(str(test), root)]
    lists = {key: list(results[key]) for key in ("methods", "seeds", "learning_rates")}
    flags += option_flags(lists, defaults, shown=lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    flags += option_flags({k: v for k, v in results["settings"].items() if k in defaults}, defaults)
    return " ".join(["layerfusion seq2seq", *flags, "--output", output])


def seq2seq_cost_line(results: dict[str, Any], output: str) -> str:
    """Runs, their summed wall and CPU time, the peak RSS and the stored note of a ``results.json``.

    Example:
        >>> import json
        >>> results = json.loads(Path("benchmarks/results/seq2seq/results.json").read_text())
        >>> seq2seq_cost_line(results, "benchmarks/results/seq2seq")
        '12 runs in `benchmarks/results/seq2seq/results.json`; 1 h 16 min 06 s of run wall time, ...'
    """
    resources = results.get("resources") or {}
    line = f"{len(results['runs'])} runs in `{output}/{SEQ2SEQ_FILE}`"
    if "seconds_all_runs" not in resources:
        return line + "; wall time not recorded."
    line += (
        f"; {duration(resources['seconds_all_runs'])} of run wall time, "
        f"{duration(resources['cpu_seconds_all_runs'])} of CPU"
    )
    processes = resources.get("processes") or [resources]
    peaks = [process["peak_rss_mb"] for process in processes if "peak_rss_mb" in process]
    if peaks:
        line += f", peak RSS {memory(max(peaks))}"
    if len(processes) > 1:
        walls = ", ".join(duration(process["wall_seconds"]) for process in processes)
        line += f"; {len(processes)} processes side by side, wall {walls}"
    return line + (f" ({resources['note']})." if resources.get("note") else ".")


def render_results(block: Block, root: Path, add_arguments: Callable[[argparse.ArgumentParser], None]) -> str:
    """The content of a ``seq2seq`` block: the ``results.json`` of its ``output=`` folder (module docstring).

    Args:
        block: A block named ``seq2seq`` with the one parameter ``output=``.
        root: The repository root.
        add_arguments: The options of ``layerfusion seq2seq`` (the command table's): the command shown
            leaves out the options at their default.

    Raises:
        MarkerError: Other parameters, no results file, or a comparison that has not finished.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> from layerfusion_recipes.reporting.results_md import find_blocks
        >>> spec = "seq2seq output=benchmarks/results/seq2seq"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> content = render_results(find_blocks(text)[0], Path("."), COMMANDS["seq2seq"].add_arguments)
        >>> print(content.splitlines()[0])
        | method | LR | exact match | chrF | BLEU | Δ EM vs vanilla | Δ chrF | Δ BLEU |
    """
    if [key for key, _ in block.params] != ["output"]:
        raise block_error(
            block,
            f"the {SEQ2SEQ} block takes one parameter, output=FOLDER (a `layerfusion seq2seq --output`)",
        )
    output = block.params[0][1]
    path = root / output / SEQ2SEQ_FILE
    if not path.is_file():
        raise block_error(block, f"no {SEQ2SEQ_FILE} in {output} under {root}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise block_error(block, f"{output}/{SEQ2SEQ_FILE}: {one_line(error)}") from error
    if not results.get("complete"):
        raise block_error(
            block, f"{output}/{SEQ2SEQ_FILE} is not complete: finish the comparison (it resumes) first"
        )
    seeds = ", ".join(map(str, results["seeds"]))
    grid = ", ".join(f"{lr:g}" for lr in results["learning_rates"])
    legend = (
        f"Test, {results['settings']['test_sentences']} pieces: mean ± 95% t-CI over seeds {seeds}, and "
        f"the paired per-seed differences (Δ) to vanilla. LR: "
        + (
            f"{grid} for every method."
            if len(results["learning_rates"]) == 1
            else f"selected per method from {grid} on dev (exact match, then chrF) with seed "
            f"{results['seeds'][0]}."
        )
    )
    runs = "\n".join(run_row(run) for run in results["runs"])
    command = seq2seq_command(results, output, root, option_defaults(add_arguments))
    return (
        f"{summary_table(results)}\n\n{legend}\n\nEvery run:\n\n{RUN_TABLE_HEADER}\n{runs}\n\n"
        f"{seq2seq_cost_line(results, output)}\n\n```\n{command}\n```"
    )
