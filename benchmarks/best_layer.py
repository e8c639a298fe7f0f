"""Each method against the best single layer chosen on dev, paired by trial (issue 38's comparator).

Reads a sweep's results file and its layer probes (``RESULTS.probes.jsonl``, written by
``--probe-layers`` or ``--probe-start``) and prints, per (shots, max epochs), one Markdown table:

- each method at the LR selected on dev (the mean best dev score over trials, the sweep's rule), its
  test score mean ± 95% t-CI over trials;
- **best layer (dev)**: per trial, the probe (layer, LR) with the best dev score in that trial
  (:func:`~layerfusion_recipes.core.probes.best_single_layer`), scored on test;
- the paired difference of each method minus the best layer, and minus the plain head, over the trials
  both have (bold: the interval excludes 0); and its mean dev difference to the best layer (each
  trial's best dev score at the selected LR minus the best layer's dev score: what a choice among
  methods may read).

A run made with ``method_options`` (e.g. ``{mixing_lr_multiplier: 10}``) is its own row, labelled
``method (option=value)``.

No choice reads test: LR, epoch and layer are chosen on dev. Scores in points (0-100).

``--also FILE ...`` adds the methods of other results files of the same grid (same data, model, seed,
shots and trials, hence the same samples: e.g. a later sweep of one more method into its own folder);
their runs pair with the main file's by trial.

Usage:
    python benchmarks/best_layer.py benchmarks/results/trec_fe_mean_probe_start/results.jsonl [--json OUT]
        [--also benchmarks/results/trec_fe_mean_probe_start_new/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from layerfusion_recipes.core.probes import best_single_layer, probes_path
from layerfusion_recipes.core.records import read_records
from layerfusion_recipes.core.selection import dev_score, select_lr, test_score
from layerfusion_recipes.core.stats import mean_ci, paired_mean_ci

BEST_LAYER = "best layer (dev)"
PLAIN = "none"


def method_label(record: dict[str, Any]) -> str:
    """A record's row: its method, with its ``method_options`` where it has any.

    Example:
        >>> method_label({"method": "layer_mix", "method_options": {"mixing_lr_multiplier": 10}})
        'layer_mix (mixing_lr_multiplier=10)'
    """
    options = record.get("method_options") or {}
    if not options:
        return record["method"]
    return f"{record['method']} ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})"


def method_scores(
    records: Sequence[dict[str, Any]],
) -> dict[str, tuple[float, dict[int, float], dict[int, float]]]:
    """``{label: (selected LR, {trial: test score}, {trial: dev score})}`` (points) for one (shots,
    epochs) of a sweep; labels as :func:`method_label`."""
    by_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_method[method_label(record)].append(record)
    scores = {}
    for method, runs in by_method.items():
        lr = select_lr(runs).lr
        chosen = [r for r in runs if r["lr"] == lr]
        scores[method] = (
            lr,
            {r["trial"]: 100 * test_score(r) for r in chosen},
            {r["trial"]: 100 * dev_score(r) for r in chosen},
        )
    return scores


def best_layer_scores(probes: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``{trial: best_single_layer(...)}`` of one (shots, epochs)."""
    trials: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in probes:
        trials[record["trial"]].append(record)
    return {trial: best_single_layer(found) for trial, found in trials.items()}


def difference(own: dict[int, float], base: dict[int, float]) -> str:
    paired = paired_mean_ci(own, base)
    if paired is None:
        return "-"
    text = f"{paired.mean:+.1f} ± {paired.half_width:.1f}"
    return f"**{text}**" if paired.resolved else text


def table(cell: tuple[int, int], records: list[dict], probes: list[dict]) -> tuple[str, dict[str, Any]]:
    """The Markdown table of one (shots, epochs) and its numbers."""
    scores = method_scores(records)
    best = best_layer_scores(probes)
    best_test = {trial: 100 * found["test"] for trial, found in best.items()}
    best_dev = {trial: 100 * found["dev"] for trial, found in best.items()}
    plain = scores.get(PLAIN, (None, {}, {}))[1]
    lines = [
        f"**N={cell[0]}, max {cell[1]} epochs**: best layer per trial on dev: "
        + ", ".join(f"trial {t}: z_{found['layer']} @{found['lr']:g}" for t, found in sorted(best.items())),
        "",
        "| method | test (mean ± CI) | LR | minus best layer (paired) | minus plain head (paired) "
        "| dev minus best layer |",
        "|---|---|---|---|---|---|",
    ]
    mean, half = mean_ci(list(best_test.values()))
    lines.append(f"| {BEST_LAYER} | {mean:.1f} ± {half:.1f} (n={len(best_test)}) | per trial | | "
                 f"{difference(best_test, plain)} | |")  # fmt: skip
    numbers: dict[str, Any] = {
        BEST_LAYER: {"trials": best_test, "layers": {t: b["layer"] for t, b in best.items()}}
    }
    for method, (lr, trials, dev) in scores.items():
        mean, half = mean_ci(list(trials.values()))
        shared = sorted(set(dev) & set(best_dev))
        dev_gap = sum(dev[t] - best_dev[t] for t in shared) / len(shared) if shared else float("nan")
        lines.append(
            f"| {method} | {mean:.1f} ± {half:.1f} (n={len(trials)}) | {lr:g} | "
            f"{difference(trials, best_test)} | {'' if method == PLAIN else difference(trials, plain)} "
            f"| {dev_gap:+.1f} |"
        )
        numbers[method] = {"lr": lr, "trials": trials, "dev": dev, "dev_minus_best_layer": dev_gap}
    return "\n".join(lines), numbers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="A sweep's results.jsonl (its probes file beside it).")
    parser.add_argument("--json", help="Also write the numbers here.")
    parser.add_argument("--also", nargs="+", default=[], help="Results files of more methods, same trials.")
    args = parser.parse_args(argv)
    files = (args.results, *args.also)
    records = [r for path in files for r in read_records(path) if r.get("regime") == "fe"]
    probes = read_records(probes_path(args.results))
    if not probes:
        print(
            f"{probes_path(args.results)}: no layer probes (run the sweep with --probe-layers)",
            file=sys.stderr,
        )
        return 1
    cells = sorted({(r["shots"], r["epochs"]) for r in probes})
    out = {}
    for cell in cells:
        text, numbers = table(
            cell,
            [r for r in records if (r["shots"], r["epochs"]) == cell],
            [p for p in probes if (p["shots"], p["epochs"]) == cell],
        )
        print(text + "\n")
        out[f"N={cell[0]} epochs={cell[1]}"] = numbers
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
