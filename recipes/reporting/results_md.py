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

Grids side by side: the reserved parameter ``join=`` (comma-separated grid names) shows the records of
the named grids' results together with the block's own grid's, in ONE table::

    <!-- generated: conll_plain_128_lr join=conll_regimes_128_lr,conll_ft_128_lr -->
    <!-- end generated: conll_plain_128_lr join=conll_regimes_128_lr,conll_ft_128_lr -->

Records of the same setup (data, sample, settings: the records' ``setup``) and trial trained on the
same sample, so the paired differences pair runs across the grids too. The block has the tables,
one cost line per grid and each grid's sweep and plot commands (each grid as its own file names
its output; the joined grids take no other parameters). A run found in two of the results files
stops with an error naming both, rather than being counted twice.

A task's own block: a command of the table (:data:`~layerfusion_recipes.commands.COMMANDS`) that
names a ``results`` renderer (``"module:function"``, imported when a block of that name is rendered)
reserves its name for a block of its own, rendered by its task: ``mlm``, the LR grids of a
``layerfusion mlm --output`` folder (:mod:`layerfusion_recipes.mlm.results`), and ``seq2seq``, the
``results.json`` of a ``layerfusion seq2seq --output`` folder
(:mod:`layerfusion_recipes.seq2seq.results`); their modules say what the blocks show and take. The
generator imports no task: the command table is handed to it (``layerfusion report``'s ``commands``
default, :func:`regenerate`'s ``commands``).

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
import importlib
import itertools
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from peft_layerfusion.utils import atomic_write_text

from ..core.errors import UserError, is_user_error, one_line
from ..core.grids import DEFAULT_LR_GRIDS, lr_grid
from ..core.settings import load_config, option, results_path
from ..core.sweep_log import SweepTotals, read_sweep_log, sweep_totals
from ..core.tasks import read_task_probes, read_task_records, sweep_task
from .benchmark_report import read_report
from .layers import DEFAULT_TOP, LAYERS_FIGURE, layers_markdown
from .markdown import Block, MarkerError, Params, block_error, duration, listed, memory
from .plot import format_lr, grouped_table_markdown, summarize, table_markdown


class TaskCommand(Protocol):
    """What the generator reads of a command of the table (:class:`~layerfusion_recipes.commands.Command`):
    its options (a grid's command parses its grid file with them) and its block's renderer, if any."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    results: str | None


Commands = Mapping[str, TaskCommand]  # the command table, by command name


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
REPORT = "report"  # reserved name: a benchmark script's saved report (`--output FILE.json`)


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


def _option_names(add_arguments: Callable[[argparse.ArgumentParser], None]) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return {action.dest for action in parser._actions}  # argparse lists no public view of them


def grid_commands(commands: Commands) -> tuple[str, ...]:
    """The ``layerfusion`` commands that run a grid file (options ``--config``, ``--methods`` and
    ``--output``), in the command table's order: the values ``task=`` takes.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> grid_commands(COMMANDS)
        ('ner', 'sweep', 'classify')
    """
    return tuple(
        name for name, command in commands.items() if GRID_OPTIONS <= _option_names(command.add_arguments)
    )


def _task(block: Block, params: Params, commands: Commands) -> str:
    """The command that runs the block's grid: ``task=`` (once), else :data:`DEFAULT_TASK`."""
    tasks = [value for key, value in params if key == TASK]
    allowed = grid_commands(commands)
    if len(tasks) > 1 or (tasks and tasks[0] not in allowed):
        given, names = ",".join(tasks), ", ".join(allowed)
        raise block_error(block, f"{TASK}={given}: not one command that runs a grid file; allowed: {names}")
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


def _grid_commands(block: Block, params: Params, commands: Commands) -> list[str]:
    """The command lines that ran the block's grid: one per invocation (:func:`_invocations`)."""
    grid = (GRIDS / f"{block.name}.yaml").as_posix()
    head = ["layerfusion", _task(block, params, commands), "--config", grid]
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
    block: Block, grid: Path, task: str, params: Params, commands: Commands
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The flags and the YAML of one invocation of ``task`` on ``grid`` (as the command parses them)."""
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)  # --shot is not --shots
    commands[task].add_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(["--config", str(grid), *_sweep_flags(params)])
        loaded = load_config(args)
    except Exception as error:  # a bad value in the marker, a grid file the command would refuse
        if not (isinstance(error, argparse.ArgumentError) or is_user_error(error)):
            raise
        raise block_error(block, one_line(error)) from error
    if unknown:
        raise block_error(block, f"not a `layerfusion {task}` option: {unknown}")
    return args, loaded


def _grid_outputs(block: Block, root: Path, params: Params, commands: Commands) -> GridOptions:
    """The options of the block's grid under ``params`` (as its command resolves them, per invocation)."""
    grid = root / GRIDS / f"{block.name}.yaml"
    if not grid.is_file():
        raise block_error(block, f"no grid file {GRIDS / grid.name} under {root}")
    task = _task(block, params, commands)
    parsed = [_parse_grid(block, grid, task, run, commands) for run in _invocations(params)]
    cells: dict[tuple[str, int, int, str], None] = {}
    for args, loaded in parsed:
        axes = [option(args, loaded, name) for name in ("regimes", "epochs", "shots", "methods")]
        cells.update(dict.fromkeys(itertools.product(*axes) if all(axes) else ()))
    args, loaded = parsed[0]  # the invocations share every option but their methods
    shared = (option(args, loaded, name) for name in ("output", "results", "lr", "trials"))
    return GridOptions(*shared, tuple(cells), option(args, loaded, "probe_layers"))


def _grid_results(block: Block, root: Path, commands: Commands) -> tuple[str, GridOptions]:
    """The results file of the block's grid, relative to ``root`` as the grid file names it, and the
    grid's options."""
    options = _grid_outputs(block, root, block.params, commands)
    output, results = options.output, options.results
    if not output and not results:
        raise block_error(
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
        >>> from layerfusion_recipes.core.records import append_record, read_records
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


def _blocks(count: int) -> str:
    return f"{count} generated block" + ("" if count == 1 else "s")


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
        f"; wall time {duration(totals.wall_s)} over {sweeps}, peak RSS {memory(totals.peak_rss_mb)}, "
        f"workers {listed(totals.workers)}, threads {listed(totals.threads)}, "
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
        raise block_error(block, str(error)) from error
    if not records:
        raise block_error(block, f"no results in {results} under {root}")
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


def render_grid_block(block: Block, root: Path, commands: Commands, page: Path = RESULTS_MD) -> str:
    """The content of a grid's block: ``table.md``'s tables, the layer probes (when the grid has them),
    the cost line and the commands.

    Args:
        block: A block naming a grid file.
        root: The repository root.
        commands: The command table (:data:`~layerfusion_recipes.commands.COMMANDS`): the grid's
            command parses its grid file.
        page: The file the block is in, under ``root`` (figure links are relative to its folder).

    Raises:
        MarkerError: No grid file, no output folder or no results for the marker.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> block = find_blocks(Path("benchmarks/RESULTS.md").read_text())[0]  # conll_fe_lr
        >>> print(render_grid_block(block, Path("."), COMMANDS).splitlines()[0])  # the table's header
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    results, options = _grid_results(block, root, commands)
    records, cost = _cost(block, root, results)
    rows = summarize(records)  # once, for the tables and the unfinished cells
    unfinished = unfinished_text(unfinished_lines(rows, options))
    top = options.probe_layers or DEFAULT_TOP
    probes = read_task_probes(root / results, records)
    layers = probes_text(records, probes, top, _figure_link(root, Path(results).parent, page))
    plot = f"layerfusion plot {results}" + (f" --probe-layers {top}" if probes and top != DEFAULT_TOP else "")
    lines = "\n".join([*_grid_commands(block, block.params, commands), plot])
    return (
        f"{table_markdown(records, rows).rstrip()}\n\n"
        + (f"{layers}\n\n" if layers else "")
        + f"{unfinished}{cost}\n\n```\n{lines}\n```"
    )


def _joined_grids(block: Block) -> list[Block]:
    """The block's own grid and each grid of ``join=``, as blocks of their own (no parameters)."""
    params = dict(block.params)
    names = params.pop(JOIN).split(",")
    if params:
        raise block_error(block, f"{JOIN}= shows each grid as its file names it: drop {', '.join(params)}=")
    grids = [block.name, *names]
    if not all(NAME.fullmatch(name) for name in names) or len(set(grids)) < len(grids):
        raise block_error(block, f"{JOIN}= takes distinct comma-separated grid names other than {block.name}")
    return [Block(name, name, (), block.start, block.stop) for name in grids]


def render_joined_block(block: Block, root: Path, commands: Commands) -> str:
    """The content of a ``join=`` block: the records of several grids in one table (module docstring).

    Args:
        block: A block naming a grid file, with ``join=`` naming the others.
        root: The repository root.
        commands: The command table (:func:`render_grid_block`).

    Raises:
        MarkerError: A grid without its file, output or results; a run in two results files.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> spec = "conll_plain_128_lr join=conll_regimes_128_lr"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_joined_block(find_blocks(text)[0], Path("."), COMMANDS).splitlines()[0])
        | regime | epochs | shots | none | dwatt | concat |
    """
    grids = _joined_grids(block)
    records: list[dict[str, Any]] = []
    where: dict[str, str] = {}
    costs, lines, unfinished = [], [], []
    for grid in grids:
        try:
            results, options = _grid_results(grid, root, commands)
            own, cost = _cost(grid, root, results)
        except MarkerError as error:  # say it of this block's marker: the grid has none of its own
            reason = str(error).split("': ", 1)[-1]
            raise block_error(block, f"grid {grid.name}: {reason}") from error
        for record in own:
            if record["key"] in where:
                both = f"{where[record['key']]} and {results}"
                raise block_error(block, f"run {record['key']} is in both {both}")
            where[record["key"]] = results
        records += own
        unfinished += unfinished_lines(summarize(own), options)
        costs.append(f"- {cost}")
        lines += [*_grid_commands(grid, (), commands), f"layerfusion plot {results}"]
    cost_lines = "\n".join(costs)
    waiting = unfinished_text(unfinished)
    shown = "\n".join(lines)
    return f"{table_markdown(records).rstrip()}\n\n{waiting}{cost_lines}\n\n```\n{shown}\n```"


def _languages(block: Block) -> tuple[list[str], Params]:
    """The marker's languages and its other parameters (the sweep options of every language)."""
    params = dict(block.params)
    if "language" in params:
        raise block_error(block, f"{LANGUAGES}= names every language's sweep: drop language=")
    languages = params[LANGUAGES].split(",")
    bad = [language for language in languages if not LANGUAGE.fullmatch(language)]
    if bad or len(set(languages)) < len(languages):
        raise block_error(
            block,
            f"{LANGUAGES}= takes distinct comma-separated folder names, e.g. en,de; got {bad or languages}",
        )
    return languages, tuple(pair for pair in block.params if pair[0] != LANGUAGES)


def render_languages_block(block: Block, root: Path, commands: Commands) -> str:
    """The content of a per-language block (``languages=``): one table over the languages' results.

    Language ``L``'s results are ``<output>/L/results.jsonl``, ``<output>`` the grid's (or the marker's
    ``output=``). Below the tables (:func:`~layerfusion_recipes.reporting.plot.grouped_table_markdown`): a
    cost line per language, then the loop of sweep and plot commands over the languages.

    Args:
        block: A block naming a grid file, with ``languages=``.
        root: The repository root.
        commands: The command table (:func:`render_grid_block`).

    Raises:
        MarkerError: No grid file, no output folder, a language without its folder or results.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> spec = "wikiann_fe_lr languages=en,de"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> print(render_languages_block(find_blocks(text)[0], Path("."), COMMANDS).splitlines()[0])
        | language | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    languages, params = _languages(block)
    options = _grid_outputs(block, root, params, commands)
    output, results = options.output, options.results
    if results or not output:
        raise block_error(
            block,
            f"{LANGUAGES}= needs an output folder holding a folder per language (output: in "
            f"{GRIDS / block.name}.yaml or output= in the marker), not a results: file",
        )
    groups, costs, unfinished = {}, [], []
    for language in languages:
        folder = Path(output) / language
        if not (root / folder).is_dir():
            raise block_error(block, f"no folder {folder.as_posix()} (language {language}) under {root}")
        groups[language], cost = _cost(block, root, results_path(folder.as_posix()))
        costs.append(f"- {language}: {cost}")
        unfinished += unfinished_lines(summarize(groups[language]), options, prefix=f"{language}: ")
    loop = f"{output}/$lang"
    sweeps = _grid_commands(
        block, (("language", "$lang"), ("output", loop), *(p for p in params if p[0] != "output")), commands
    )
    body = "".join(f"  {line}\n" for line in [*sweeps, f"layerfusion plot {results_path(loop)}"])
    return (
        f"{grouped_table_markdown(groups, 'language').rstrip()}\n\n{unfinished_text(unfinished)}"
        + "\n".join(costs)
        + "\n\n"
        f"```\nfor lang in {' '.join(languages)}; do\n{body}done\n```"
    )


def report_markdown(lines: list[str]) -> str:
    """A benchmark's printed lines as Markdown: runs of table rows as tables, Markdown headings as they
    are, other lines as a list (a printed line holding several lines counts as several; blank ones go).

    Example:
        >>> printed = ["torch threads: 1", "\\n### Forward", "| a | b |", "|---|---|", "| 1 | 2 |"]
        >>> print(report_markdown(printed))
        - torch threads: 1
        <BLANKLINE>
        ### Forward
        <BLANKLINE>
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    groups: list[tuple[str, list[str]]] = []  # (kind, its lines), a heading alone in its group
    for line in filter(str.strip, (part for printed in lines for part in printed.splitlines())):
        kind = "row" if line.lstrip().startswith("|") else "heading" if line.startswith("#") else "item"
        if not groups or groups[-1][0] != kind or kind == "heading":
            groups.append((kind, []))
        groups[-1][1].append(f"- {line}" if kind == "item" else line)
    return "\n\n".join("\n".join(group) for _, group in groups)


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
        raise block_error(
            block, f"the {REPORT} block takes one parameter, output=FILE (a benchmark's --output FILE.json)"
        )
    output = block.params[0][1]
    if not (root / output).is_file():
        raise block_error(block, f"no report {output} under {root} (run its command with --output {output})")
    try:
        report = read_report(root / output)
    except (OSError, ValueError) as error:
        raise block_error(block, one_line(error)) from error
    when = report["date"].replace("T", " ").replace("+00:00", " UTC")
    header = (
        f"Run of {when}, torch {report['torch']}, 1-min load average {report['load_1min']:g} on "
        f"{report['cpu_count']} CPUs at its start:"
    )
    return f"{header}\n\n{report_markdown(report['lines'])}\n\n```\n{report['command']}\n```"


def task_renderer(spec: str) -> Callable[[Block, Path, Callable[[argparse.ArgumentParser], None]], str]:
    """The function a command's ``results`` names (``"module:function"``), imported now."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def render_block(block: Block, root: Path, commands: Commands, page: Path = RESULTS_MD) -> str:
    """The content of ``block``: its task's renderer for the name of a command with ``results`` (``mlm``:
    :func:`layerfusion_recipes.mlm.results.render_results`, ``seq2seq``:
    :func:`layerfusion_recipes.seq2seq.results.render_results`), :func:`render_report_block` for
    ``report``, :func:`render_languages_block` with ``languages=``, :func:`render_joined_block` with
    ``join=``, else :func:`render_grid_block` (``commands``: the command table; ``page``: the file the
    block is in, under ``root``).

    Raises:
        MarkerError: What the block cannot be regenerated from, naming its marker.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> block = find_blocks(Path("benchmarks/RESULTS.md").read_text())[0]
        >>> print(render_block(block, Path("."), COMMANDS).splitlines()[0])
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    command = commands.get(block.name)
    if command is not None and command.results is not None:
        return task_renderer(command.results)(block, root, command.add_arguments)
    if block.name == REPORT:
        return render_report_block(block, root)
    if any(key == LANGUAGES for key, _ in block.params):
        return render_languages_block(block, root, commands)
    if any(key == JOIN for key, _ in block.params):
        return render_joined_block(block, root, commands)
    return render_grid_block(block, root, commands, page)


def regenerate(text: str, root: Path, commands: Commands, page: Path = RESULTS_MD) -> str:
    """``text`` (the file ``page`` under ``root``) with every generated block rendered anew
    (:func:`render_block`, through the command table ``commands``), the rest unchanged.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> block = "<!-- generated: conll_fe_lr -->\\nold\\n<!-- end generated: conll_fe_lr -->"
        >>> text = f"# Results\\n\\n{block}\\n"
        >>> print(regenerate(text, Path("."), COMMANDS).splitlines()[4])  # the table in place of "old"
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    parts, last = [], 0
    for block in find_blocks(text):
        parts += [text[last : block.start], f"\n\n{render_block(block, root, commands, page)}\n\n"]
        last = block.stop
    return "".join(parts) + text[last:]


def report_main(args: argparse.Namespace) -> int:
    """``layerfusion report``: regenerate RESULTS.md, or check it (``--check``); returns the exit code.
    ``args.commands`` is the command table (set by the command's parser: :mod:`layerfusion_recipes.commands`).

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> text = "# Results\\n\\n<!-- generated: conll_fe_lr -->\\n<!-- end generated: conll_fe_lr -->\\n"
        >>> _ = Path("results.md").write_text(text)
        >>> args = argparse.Namespace(check=False, root=Path("."), file=Path("results.md"), commands=COMMANDS)
        >>> report_main(args)  # rewrite
        results.md: regenerated 1 generated block
        0
        >>> report_main(argparse.Namespace(**{**vars(args), "check": True}))  # --check
        results.md: up to date (1 generated block)
        0
    """
    root = ROOT if args.root is None else args.root
    path = root / args.file
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    old = path.read_text(encoding="utf-8")
    try:
        new = regenerate(old, root, args.commands, args.file)
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
