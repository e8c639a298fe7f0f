"""``layerfusion report``: regenerate the generated blocks of ``benchmarks/RESULTS.md`` from the
summaries of the published experiments (``benchmarks/summaries/NAME.json``,
:mod:`~layerfusion_recipes.reporting.summaries`).

RESULTS.md is hand-written prose around generated blocks. A block sits between two marker lines::

    <!-- generated: conll_fe_lr -->
    ... (replaced on every run) ...
    <!-- end generated: conll_fe_lr -->

Each marker is a line of its own; the end marker repeats the begin marker's text exactly. The name is
a summary, ``benchmarks/summaries/<name>.json``, rendered by its ``kind``:

- ``sweep``: per metric its table (mean ± 95% t-CI over the trials at the LR selected on dev, the dev
  score beside it) and the paired per-trial differences, the layer probes' table where it has probes,
  the options given to its runs, the model and data by name and fingerprint with the cost, and the
  commands that make it again. ``metrics=accuracy,macro_f1`` shows those metrics' tables (default:
  the summary's first);
- ``report``: a benchmark's saved report (its lines, its command);
- ``speed``: one table of the newest timing of each method on one machine kind;
- ``table``: its columns and rows, its note, its commands;
- ``true_few_shot``: the true few-shot protocol's paired table (the recommended recipe against the block
  the same selection picks and the last-layer head), its model and data, its command.

The reserved name ``true_few_shot`` shows several ``true_few_shot`` summaries (``of=`` comma-separated
names) in one paired table. The reserved name ``guard`` shows the recommended recipe against the best
layer chosen on dev over
several sweep summaries (``of=`` comma-separated names, ``trials=fresh`` for the trials no choice was
made on, or ``trials=all``), one line per cell with layer probes::

    <!-- generated: guard of=trec_fe_mean_probe_start,sst2_fe_mean_probe_start trials=fresh -->
    <!-- end generated: guard of=trec_fe_mean_probe_start,sst2_fe_mean_probe_start trials=fresh -->

Usage (from anywhere; paths are relative to ``--root``, by default this repository)::

    layerfusion report            # rewrite the blocks (atomically) where they changed
    layerfusion report --check    # exit 1 with a diff when RESULTS.md is out of date

A marker without its summary, a summary that cannot be read, a parameter the block does not take or
unpaired markers stop with exit code 2 and one line naming the marker; nothing is written.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any

from peft_layerfusion.utils import atomic_write_text

from ..core.errors import UserError
from ..core.sweeps.true_few_shot import summaries_markdown as true_few_shot_markdown
from .markdown import Block, MarkerError, Params, block_error
from .summaries import (
    SUMMARIES,
    guard_table,
    read_summary,
    speed_markdown,
    sweep_markdown,
    table_markdown,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository: the summaries are relative to it
RESULTS_MD = Path("benchmarks/RESULTS.md")
# a marker is a line of its own (a marker quoted inside prose is not one)
MARKER = re.compile(
    r"^<!--[ \t]*(?P<end>end[ \t]+)?generated:[ \t]*(?P<spec>.*?)[ \t]*-->[ \t]*$", re.MULTILINE
)
NAME = re.compile(r"[\w.-]+")
GUARD = "guard"  # reserved name: the recipe against the best layer, over several summaries
TRUE_FEW_SHOT = "true_few_shot"  # reserved name: several true few-shot summaries in one paired table
TRIALS = ("fresh", "all")


def _parse_spec(spec: str) -> tuple[str, Params]:
    name, *params = spec.split() or [""]
    if not NAME.fullmatch(name):
        raise MarkerError(f"marker 'generated: {spec}': expected a summary name, got {name!r}")
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
            without its begin, a marker without a name or with a parameter that is not key=value.

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


def load_summary(block: Block, root: Path, name: str) -> dict[str, Any]:
    """The summary ``name`` (``benchmarks/summaries/<name>.json`` under ``root``) for ``block``.

    Raises:
        MarkerError: No such file, or one that is not a summary, naming the marker.
    """
    path = root / SUMMARIES / f"{name}.json"
    if not path.is_file():
        raise block_error(block, f"no summary {(SUMMARIES / path.name).as_posix()} under {root}")
    try:
        return read_summary(path)
    except (OSError, ValueError) as error:
        raise block_error(block, str(error).splitlines()[0]) from error


def _params(block: Block, allowed: tuple[str, ...]) -> dict[str, str]:
    params = dict(block.params)
    extra = [key for key, _ in block.params if key not in allowed] + (
        ["(a parameter given twice)"] if len(params) < len(block.params) else []
    )
    if extra:
        takes = ", ".join(f"{key}=" for key in allowed) or "no parameter"
        raise block_error(block, f"not a parameter of this block: {', '.join(extra)}; it takes {takes}")
    return params


def render_guard_block(block: Block, root: Path) -> str:
    """The content of a ``guard`` block: :func:`~layerfusion_recipes.reporting.summaries.guard_table` of
    the summaries ``of=`` names, over the trials ``trials=`` says (module docstring).

    Raises:
        MarkerError: A missing ``of=`` or ``trials=``, a summary that is not there or not a sweep's.
    """
    params = _params(block, ("of", "trials"))
    if "of" not in params or params.get("trials") not in TRIALS:
        raise block_error(
            block, f"the {GUARD} block takes of=NAME,NAME and trials= one of {', '.join(TRIALS)}"
        )
    summaries = [load_summary(block, root, name) for name in params["of"].split(",")]
    others = [summary["name"] for summary in summaries if summary["kind"] != "sweep"]
    if others:
        raise block_error(block, f"not a sweep's summary: {', '.join(others)}")
    return guard_table(summaries, params["trials"] == "fresh")


def render_block(block: Block, root: Path) -> str:
    """The content of ``block``: its summary rendered by its kind, or :func:`render_guard_block`.

    Raises:
        MarkerError: What the block cannot be regenerated from, naming its marker.

    Example:
        >>> block = find_blocks(Path("benchmarks/RESULTS.md").read_text())[1]  # conll_fe_lr
        >>> print(render_block(block, Path(".")).splitlines()[0])  # the table's header
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    if block.name == GUARD:
        return render_guard_block(block, root)
    if block.name == TRUE_FEW_SHOT:
        params = _params(block, ("of",))
        if "of" not in params:
            raise block_error(block, f"the {TRUE_FEW_SHOT} block takes of=NAME,NAME")
        summaries = [load_summary(block, root, name) for name in params["of"].split(",")]
        return true_few_shot_markdown(summaries)
    summary = load_summary(block, root, block.name)
    kind = summary["kind"]
    params = _params(block, ("metrics",) if kind == "sweep" else ())
    if kind == "sweep":
        metrics = params["metrics"].split(",") if "metrics" in params else None
        unknown = [metric for metric in metrics or [] if metric not in summary["metrics"]]
        if unknown:
            raise block_error(block, f"metrics= names {unknown}; the summary has {summary['metrics']}")
        return sweep_markdown(summary, metrics)
    if kind == "speed":
        return speed_markdown(summary)
    if kind == "table":
        return table_markdown(summary)
    if kind == "true_few_shot":
        return true_few_shot_markdown([summary])
    return report_text(summary)


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


def report_text(report: dict[str, Any]) -> str:
    """A benchmark's saved report (``kind`` ``report``): when and where it ran, what it printed, its command.

    Example:
        >>> report = {"date": "2026-11-28T22:24:00+00:00", "torch": "2.13.0+cpu", "load_1min": 1.0,
        ...           "cpu_count": 2,
        ...           "lines": ["| a |", "|---|", "| 1 |"], "command": "python benchmarks/overhead.py"}
        >>> print(report_text(report).splitlines()[0])
        Run of 2026-11-28 22:24:00 UTC, torch 2.13.0+cpu, 1-min load average 1 on 2 CPUs at its start:
    """
    when = report["date"].replace("T", " ").replace("+00:00", " UTC")
    header = (
        f"Run of {when}, torch {report['torch']}, 1-min load average {report['load_1min']:g} on "
        f"{report['cpu_count']} CPUs at its start:"
    )
    return f"{header}\n\n{report_markdown(report['lines'])}\n\n```\n{report['command']}\n```"


def regenerate(text: str, root: Path) -> str:
    """``text`` with every generated block rendered anew (:func:`render_block`), the rest unchanged.

    Example:
        >>> block = "<!-- generated: conll_fe_lr -->\\nold\\n<!-- end generated: conll_fe_lr -->"
        >>> print(regenerate(f"# Results\\n\\n{block}\\n", Path(".")).splitlines()[3])  # "old" replaced
        | regime | epochs | shots | none | dwatt | concat | average | scalar_mix | extra_layers |
    """
    parts, last = [], 0
    for block in find_blocks(text):
        parts += [text[last : block.start], f"\n{render_block(block, root)}\n"]
        last = block.stop
    return "".join(parts) + text[last:]


def _blocks(count: int) -> str:
    return f"{count} generated block" + ("" if count == 1 else "s")


def report_main(args: argparse.Namespace) -> int:
    """``layerfusion report``: regenerate RESULTS.md, or check it (``--check``); returns the exit code.

    Example:
        >>> text = "# Results\\n\\n<!-- generated: conll_fe_lr -->\\n<!-- end generated: conll_fe_lr -->\\n"
        >>> _ = Path("results.md").write_text(text)
        >>> args = argparse.Namespace(check=False, root=Path("."), file=Path("results.md"))
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
        new = regenerate(old, root)
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
