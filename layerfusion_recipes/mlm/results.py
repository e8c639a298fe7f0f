"""The masked LM's summary: the LR grids of ``layerfusion mlm`` and their other seeds, as one summary of
kind ``sweep`` (:mod:`~layerfusion_recipes.reporting.summaries`).

An LR grid is the runs of one ``--output`` folder at one seed: per (method, regime) the LR with the
lowest dev perplexity (:func:`~layerfusion_recipes.mlm.records.summarize`). Other seeds re-run each
method at that LR (``--seed S --lr LR``, one folder per seed). The summary's cells are the regimes, its
trials the seeds (the grid's seed first), its scores test and dev perplexity (lower is better), paired
per seed to the plain head. A seed run at another LR than its grid selected is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peft_layerfusion.names import METHOD_NAMES, PLAIN_HEAD, REGIME_NAMES

from ..core.options.grids import FULL_TRAIN
from ..reporting.markdown import duration, listed, memory
from ..reporting.summaries import record_sources
from .records import folder_grids, summarize

MLM_METRIC = "ppl"  # test perplexity, lower is better


def mlm_cost(runs: Sequence[dict[str, Any]]) -> str:
    """The cost of ``runs``: their number, wall time summed over the runs that say it (``seconds``), the
    largest ``peak_rss_mb``, torch's threads and the highest 1-minute load at a run's start.

    Example:
        >>> mlm_cost([{"seconds": 65.0, "peak_rss_mb": 900.0, "threads": 1}, {}])
        '2 runs; wall time 1 min 05 s, peak RSS 900 MB, threads 1 (timed: 1 of the 2 runs)'
    """
    timed = [record for record in runs if record.get("seconds") is not None]
    text = f"{len(runs)} runs"
    if not timed:
        return text + "; wall time not recorded"
    text += f"; wall time {duration(sum(record['seconds'] for record in timed))}"
    peaks = [record["peak_rss_mb"] for record in timed if record.get("peak_rss_mb") is not None]
    text += f", peak RSS {memory(max(peaks))}" if peaks else ""
    threads = sorted({record["threads"] for record in timed if record.get("threads")})
    text += f", threads {listed(threads)}" if threads else ""
    loads = [record["load_1min"] for record in timed if record.get("load_1min") is not None]
    if loads:
        cpus = max((record.get("cpu_count") or 0 for record in timed), default=0)
        text += f", 1-min load average at the starts up to {max(loads):.1f} on {cpus or '?'} CPUs"
    if len(timed) < len(runs):
        text += f" (timed: {len(timed)} of the {len(runs)} runs)"
    return text


def mlm_summary(
    grid_records: Sequence[dict[str, Any]],
    seed_folders: Sequence[Sequence[dict[str, Any]]] = (),
    *,
    name: str,
    commands: Sequence[str],
    title: str = "",
) -> dict[str, Any]:
    """The summary of an LR grid's records and of the same methods at other seeds, one folder's
    records per seed (module docstring).

    Example:
        >>> def run(method, lr, dev, test, seed=0):
        ...     settings = {"seed": seed, "epochs": 1, "model": "m", "data": "d"}
        ...     return {"method": method, "regime": "fe", "lr": lr, "dev_ppl": dev, "test_ppl": test,
        ...             "model": "m", "data": "d", "settings": settings}
        >>> grid = [run("none", 1e-3, 30.0, 31.0), run("none", 3e-3, 25.0, 26.0)]
        >>> summary = mlm_summary(grid, [[run("none", 3e-3, 24.0, 27.0, seed=1)]], name="mlm", commands=[])
        >>> summary["cells"][0]["methods"]["none"]["test"], summary["cells"][0]["methods"]["none"]["lr"]
        ([26.0, 27.0], 0.003)
    """
    grids, _ = folder_grids(grid_records)
    seeds = [folder_grids(records)[0] for records in seed_folders]
    order = [(method, regime) for regime in REGIME_NAMES for method in METHOD_NAMES]
    cells: dict[str, dict[str, Any]] = {}
    for method, regime in sorted(grids, key=lambda cell: order.index(cell) if cell in order else len(order)):
        summary = summarize(grids[method, regime])
        scores = {summary["settings"]["seed"]: (summary["test_ppl"], summary["dev_ppl"])}
        for run in (run for folder in seeds for run in folder.get((method, regime), [])):
            if run["lr"] == summary["selected_lr"] and run["settings"]["seed"] not in scores:
                scores[run["settings"]["seed"]] = (run["test_ppl"], run["dev_ppl"])
        trials = list(scores)
        cell = cells.setdefault(
            regime,
            {
                "shots": FULL_TRAIN,
                "epochs": summary["settings"].get("epochs"),
                "regime": regime,
                "methods": {},
            },
        )
        cell["methods"][method] = {
            "trials": trials,
            "test": [round(scores[t][0], 4) for t in trials],
            "dev": [round(scores[t][1], 4) for t in trials],
            "lr": summary["selected_lr"],
            "lrs": summary["lrs"],
            "dev_by_lr": [round(run["dev_ppl"], 4) for run in summary["runs"]],
            "selection_trials": trials[:1],
        }
    methods = {method for cell in cells.values() for method in cell["methods"]}
    runs = [*grid_records, *(run for records in seed_folders for run in records)]
    settings = summarize(next(iter(grids.values())))["settings"] if grids else {}
    return {
        "kind": "sweep",
        "name": name,
        "title": title,
        "task": "mlm",
        "metric": MLM_METRIC,
        "metrics": [MLM_METRIC],
        "lower_is_better": True,
        "commands": list(commands),
        **record_sources(runs),
        "setup": {
            k: v
            for k, v in settings.items()
            if k not in ("model", "data", "content", "seed", "method", "regime")
        },
        "pairs": [
            [method, PLAIN_HEAD] for method in METHOD_NAMES if method in methods and method != PLAIN_HEAD
        ],
        "runs": len(runs),
        "cost": mlm_cost(runs),
        "cells": list(cells.values()),
    }
