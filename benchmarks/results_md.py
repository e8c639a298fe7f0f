"""Regenerate the generated blocks of ``benchmarks/RESULTS.md`` from the grid files and their results.

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

Per-language grids: ``wikiann_fe.yaml`` has no ``output:``; each language's sweep gets
``--language`` and ``--output`` on the command line. Its results are shown as one block per
language, each marker naming the two options of that language's sweep::

    <!-- generated: wikiann_fe language=de output=benchmarks/results/wikiann/de -->
    <!-- end generated: wikiann_fe language=de output=benchmarks/results/wikiann/de -->

(rather than one block looping over the folders found under an output: the marker says exactly
which sweep the block shows, with no convention on folder names, and its command reruns it).

Each block is regenerated from its grid's ``results.jsonl`` (``output:`` or ``results:``, relative
to the repository root): the tables ``layerfusion plot`` writes to ``table.md`` (test F1 mean ± CI
at the dev-selected LR, edge flags, paired differences), then one line with the number of runs, the
grid's wall time (summed over the invocations in ``sweeps.jsonl`` beside the results; "wall time not
recorded" without one), its peak RSS (the largest), workers, threads and the load at the sweeps'
starts, then the sweep and plot command lines. Text outside the blocks is never touched.

Usage (from anywhere; paths are relative to ``--root``, by default this repository)::

    python benchmarks/results_md.py            # rewrite the blocks (atomically) where they changed
    python benchmarks/results_md.py --check    # exit 1 with a diff when RESULTS.md is out of date

A marker without its grid file, a grid without an output folder, missing results or unpaired markers
stop with exit code 2 and one line naming the marker; nothing is written.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from layerfusion_recipes.arguments import add_experiment_arguments
from layerfusion_recipes.errors import is_user_error, one_line
from layerfusion_recipes.options import load_config, option, results_path
from layerfusion_recipes.plot import table_markdown
from layerfusion_recipes.results import read_records
from layerfusion_recipes.sweep_log import SweepTotals, read_sweep_log, sweep_totals

from peft_layerfusion.utils import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent  # the repository: grid outputs are relative to it
RESULTS_MD = Path("benchmarks/RESULTS.md")
GRIDS = Path("benchmarks/grids")
# a marker is a line of its own (a marker quoted inside prose is not one)
MARKER = re.compile(
    r"^<!--[ \t]*(?P<end>end[ \t]+)?generated:[ \t]*(?P<spec>.*?)[ \t]*-->[ \t]*$", re.MULTILINE
)
NAME = re.compile(r"[\w.-]+")


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
    params: tuple[tuple[str, str], ...]
    start: int
    stop: int


def _parse_spec(spec: str) -> tuple[str, tuple[tuple[str, str], ...]]:
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


def _sweep_flags(block: Block) -> list[str]:
    return [text for key, value in block.params for text in (f"--{key.replace('_', '-')}", value)]


def _grid_results(block: Block, root: Path) -> str:
    """The results file of the block's grid, relative to ``root`` as the grid file names it."""
    grid = root / GRIDS / f"{block.name}.yaml"
    if not grid.is_file():
        raise MarkerError(f"marker 'generated: {block.spec}': no grid file {GRIDS / grid.name} under {root}")
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)  # --shot is not --shots
    add_experiment_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(["--config", str(grid), *_sweep_flags(block)])
        loaded = load_config(args)
    except Exception as error:  # a bad value in the marker, a grid file the sweep would refuse
        if not (isinstance(error, argparse.ArgumentError) or is_user_error(error)):
            raise
        raise MarkerError(f"marker 'generated: {block.spec}': {one_line(error)}") from error
    if unknown:
        raise MarkerError(f"marker 'generated: {block.spec}': not a `layerfusion sweep` option: {unknown}")
    output, results = option(args, loaded, "output"), option(args, loaded, "results")
    if not output and not results:
        raise MarkerError(
            f"marker 'generated: {block.spec}': {GRIDS / grid.name} has no output: name the grid's output "
            f"folder in the marker (output=...), e.g. one block per language"
        )
    return results_path(output, results)


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
        totals: The grid's logged sweeps (:func:`~layerfusion_recipes.sweep_log.sweep_totals`), if any.

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


def render_block(block: Block, root: Path) -> str:
    """The content of ``block``: ``table.md``'s tables, the cost line and the commands.

    Raises:
        MarkerError: No grid file, no output folder or no results for the marker.

    Example:
        >>> print(render_block(find_blocks(Path("benchmarks/RESULTS.md").read_text())[0], Path(".")))
    """
    results = _grid_results(block, root)
    records = read_records(root / results)
    if not records:
        raise MarkerError(f"marker 'generated: {block.spec}': no results in {results} under {root}")
    totals = sweep_totals(read_sweep_log(root / results))
    sweep = " ".join(
        ["layerfusion sweep --config", (GRIDS / f"{block.name}.yaml").as_posix(), *_sweep_flags(block)]
    )
    return (
        f"{table_markdown(records).rstrip()}\n\n{cost_line(len(records), results, totals)}\n\n"
        f"```\n{sweep}\nlayerfusion plot {results}\n```"
    )


def regenerate(text: str, root: Path) -> str:
    """``text`` with every generated block rendered anew (:func:`render_block`), the rest unchanged.

    Example:
        >>> regenerate(Path("benchmarks/RESULTS.md").read_text(), Path("."))
    """
    parts, last = [], 0
    for block in find_blocks(text):
        parts += [text[last : block.start], f"\n\n{render_block(block, root)}\n\n"]
        last = block.stop
    return "".join(parts) + text[last:]


def main(argv: list[str] | None = None) -> int:
    """Regenerate RESULTS.md, or check it (``--check``); returns the exit code.

    Example:
        >>> main(["--check"])
        0
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="Print a diff and exit 1 when out of date.")
    parser.add_argument("--root", type=Path, default=ROOT, help="Repository root (default: this one).")
    parser.add_argument("--file", type=Path, default=RESULTS_MD, help="File to regenerate, under --root.")
    args = parser.parse_args(argv)
    path = args.root / args.file
    if not path.is_file():
        parser.error(f"{path}: no such file")
    old = path.read_text(encoding="utf-8")
    try:
        new = regenerate(old, args.root)
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
        print(f"{path} is out of date: run python benchmarks/results_md.py", file=sys.stderr)
        return 1
    atomic_write_text(path, new)
    print(f"{path}: regenerated {_blocks(len(find_blocks(new)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
