"""What a sweep of ``layerfusion ner`` / ``sweep`` / ``classify`` shows when its runs are done: the
summary table (with ``figures``: ``table.md`` and the figures written to the output folder), the layer
probes' tables, each method against the best single layer chosen on dev, the results file and the best
layers; and its ``summary.json`` (:func:`~layerfusion_recipes.reporting.summaries.sweep_summary`) in the
output folder. The tasks pass :func:`print_sweep_report` to
:func:`~layerfusion_recipes.core.sweeps.sweep.run_sweep` (the core does not import the reporting)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..core.options.options import PROBE_TOP
from ..core.probes.probes import probes_path
from ..core.sweeps.sweep_log import read_sweep_log, sweep_totals
from .best_layer import best_layer_section
from .layers import best_layers_lines, layers_markdown, write_layer_report
from .plot import markdown_table, summarize, write_report
from .summaries import SUMMARY_FILE, sweep_summary, write_summary


def sweep_commands(results: str | Path) -> list[str]:
    """The command lines of the sweeps logged beside ``results`` (``sweeps.jsonl``), each once, in order.

    Example:
        >>> from layerfusion_recipes.core.results.records import append_line
        >>> from layerfusion_recipes.core.sweeps.sweep_log import sweep_log_path
        >>> for first in ("/x/bin/layerfusion", "layerfusion"):  # the same command twice
        ...     append_line(sweep_log_path("out/results.jsonl"), {"argv": [first, "ner", "--shots", "8"]})
        >>> sweep_commands("out/results.jsonl")
        ['layerfusion ner --shots 8']
    """
    lines = [
        shlex.join(["layerfusion", *entry["argv"][1:]])
        for entry in read_sweep_log(results)
        if entry.get("argv")
    ]
    return list(dict.fromkeys(lines))


def write_sweep_summary(
    records: list[dict[str, Any]], probes: list[dict[str, Any]], grid: dict[str, Any]
) -> Path:
    """Write the sweep's ``summary.json`` into its output folder (the results file's folder without one):
    its records and probes summarised, its logged commands and cost; returns its path."""
    output = Path(grid.get("output") or Path(grid["results"]).parent)
    log = read_sweep_log(grid["results"])
    summary = sweep_summary(
        records, probes, name=output.name, commands=sweep_commands(grid["results"]), totals=sweep_totals(log)
    )
    return write_summary(output / SUMMARY_FILE, summary)


LARGE_DEV = (
    "Large-dev protocol: every LR and epoch chosen on the dev split, an easier setting than a few-shot "
    "user has (--selection cv: every choice from each trial's sample alone)."
)


def print_sweep_report(
    records: list[dict[str, Any]], probes: list[dict[str, Any]], grid: dict[str, Any], figures: bool
) -> None:
    """Print the sweep's table (and write ``table.md`` and the figures with ``figures``), then where
    its records are and, with layer probes, their tables and the best layers.

    Args:
        records: The runs of the sweep's cells (old and new).
        probes: The layer probes' records (empty without ``probe_layers``).
        grid: The resolved grid (``output``, ``results``, ``probe_layers``).
        figures: Also write ``table.md`` and the figures into ``grid["output"]``.

    Example:
        >>> record = {"key": "dwatt|fe|8|25|0|lr=0.001|3f2a", "method": "dwatt", "regime": "fe", "shots": 8,
        ...           "epochs": 25, "trial": 0, "lr": 1e-3, "dev_f1": 50.0, "test_f1": 45.0, "setup": "3f2a"}
        >>> print_sweep_report([record], [], {"output": "out", "results": "out/results.jsonl"}, False)
        Large-dev protocol: ...
        | regime | epochs | shots | dwatt |
        ...
        results: out/results.jsonl (1 runs)
        summary: out/summary.json
    """
    print(LARGE_DEV)
    top = grid.get("probe_layers")
    if figures:
        paths = write_report(records, grid["output"])
        paths.update(write_layer_report(records, probes, grid["output"], top or PROBE_TOP))
        print(paths["table"].read_text())
        print("figures: " + ", ".join(str(p) for key, p in paths.items() if key != "table"))
    else:
        print(markdown_table(summarize(records)))
        if probes:
            print(layers_markdown(probes, records, top))
            print(best_layer_section(records, probes))
    print(f"results: {grid['results']} ({len(records)} runs)")
    if records:
        print(f"summary: {write_sweep_summary(records, probes, grid)}")
    if probes:
        print(f"layer probes: {probes_path(grid['results'])} ({len(probes)} records)")
        print("\n".join(best_layers_lines(probes, top)))
