"""The seq2seq comparison's summary: the ``results.json`` of a ``layerfusion seq2seq --output`` folder
as a summary of kind ``sweep`` (:mod:`~layerfusion_recipes.reporting.summaries`).

One cell (the comparison's model, trained from scratch, all its training sentences), its trials the
seeds, its scores in points: exact match (the first metric), chrF and BLEU on the test pieces, dev
beside them; ``copy_input`` is the corrupted input copied (one value, no training); every method is
paired per seed with ``none``.
"""

from __future__ import annotations

from typing import Any

from ..core.cache.cache_files import path_fingerprint
from ..core.options.grids import FULL_TRAIN
from ..core.options.locations import source_name
from ..reporting.markdown import duration, memory
from .experiment import METHOD_NAMES, METRICS
from .variants import PLAIN_MODEL

BASELINE = PLAIN_MODEL
COPY = "copy_input"


def seq2seq_cost(results: dict[str, Any]) -> str:
    """The runs, their wall and CPU time, the processes' wall time and peak RSS, and the stored note.

    Example:
        >>> resources = {"seconds_all_runs": 65.0, "cpu_seconds_all_runs": 30.0}
        >>> seq2seq_cost({"runs": [{}], "resources": resources})
        '1 runs; 1 min 05 s of run wall time, 30 s of CPU'
    """
    resources = results.get("resources") or {}
    text = f"{len(results['runs'])} runs"
    if "seconds_all_runs" in resources:
        text += f"; {duration(resources['seconds_all_runs'])} of run wall time"
        text += f", {duration(resources['cpu_seconds_all_runs'])} of CPU"
    processes = resources.get("processes") or []
    if processes:
        peak = max(process["peak_rss_mb"] for process in processes)
        walls = ", ".join(duration(process["wall_seconds"]) for process in processes)
        text += f", peak RSS {memory(peak)}; {len(processes)} processes side by side, wall {walls}"
    return text + (f" ({resources['note']})" if resources.get("note") else "")


def seq2seq_summary(
    results: dict[str, Any], *, name: str, commands: list[str], title: str = ""
) -> dict[str, Any]:
    """The summary of a finished comparison's ``results.json`` (module docstring).

    Example:
        >>> run = {"method": "none", "seed": 0, "learning_rate": 0.003, "exact_match": 47.2, "chrf": 88.8,
        ...        "bleu": 88.3, "dev": {"exact_match": 41.0, "chrf": 87.5, "bleu": 87.6}}
        >>> results = {"runs": [run], "settings": {"epochs": 16}, "lr": {"none": [0.003]},
        ...            "selected_learning_rate": {"none": 0.003}, "train_file": "d/valid.txt"}
        >>> seq2seq_summary(results, name="s", commands=[])["cells"][0]["methods"]["none"]["test"]
        [47.2]
    """
    if not results.get("complete", True):
        raise ValueError(f"{name}: the comparison has not finished (it resumes): no summary of it")
    methods: dict[str, dict[str, Any]] = {}
    copy = results.get("copy_input")
    if copy:
        methods[COPY] = {
            "trials": [0],
            "test": [round(copy["test"][METRICS[0]], 4)],
            "dev": [round(copy["dev"][METRICS[0]], 4)],
            "scores": {
                m: {"test": [round(copy["test"][m], 4)], "dev": [round(copy["dev"][m], 4)]}
                for m in METRICS[1:]
            },
        }
    order = [method for method in METHOD_NAMES if any(run["method"] == method for run in results["runs"])]
    for method in order:
        lr = results["selected_learning_rate"][method]
        runs = sorted(
            (run for run in results["runs"] if run["method"] == method and run["learning_rate"] == lr),
            key=lambda run: run["seed"],
        )
        methods[method] = {
            "trials": [run["seed"] for run in runs],
            "test": [round(run[METRICS[0]], 4) for run in runs],
            "dev": [round(run["dev"][METRICS[0]], 4) for run in runs],
            "lr": lr,
            "lrs": sorted(results["lr"][method]),
            "scores": {
                m: {
                    "test": [round(run[m], 4) for run in runs],
                    "dev": [round(run["dev"][m], 4) for run in runs],
                }
                for m in METRICS[1:]
            },
        }
    data = str(results.get("train_file", "")).rsplit("/", 1)[0]
    settings = results["settings"]
    return {
        "kind": "sweep",
        "name": name,
        "title": title,
        "task": "seq2seq",
        "metric": METRICS[0],
        "metrics": list(METRICS),
        "commands": list(commands),
        "model": {"name": f"{settings.get('architecture', 'model')} from scratch", "fingerprints": []},
        "data": {"name": source_name(data), "fingerprints": [f for f in [path_fingerprint(data)] if f]},
        "setup": settings,
        "pairs": [[method, BASELINE] for method in order if method != BASELINE],
        "runs": len(results["runs"]),
        "cost": seq2seq_cost(results),
        "cells": [
            {"shots": FULL_TRAIN, "epochs": settings.get("epochs"), "regime": "scratch", "methods": methods}
        ],
    }
