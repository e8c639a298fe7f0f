"""The layer weights each trial's run learned, one line per trial: spread over depth, or one-hot?

For every method whose records carry layer weights (DWAtt's and Scaled DWAtt's mean depth attention on
dev, ScalarMix's and LayerMix's mix weights), at each (shots, epochs)'s LR selected on dev, draws
one panel per method with one line per trial, and prints each trial's largest weight and its effective
number of layers ``exp(entropy)`` (1: one-hot; K: uniform over the K fused layers).

Usage:
    python benchmarks/depth_weights.py RESULTS.jsonl [--output FIGURE.png] [--methods dwatt scaled_dwatt]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from layerfusion_recipes.core.results.selection import select_lr  # noqa: E402
from layerfusion_recipes.core.sweeps.tasks import read_task_records  # noqa: E402

WEIGHT_FIELDS = ("depth_attention", "mix_weights")


def effective_layers(weights: Sequence[float]) -> float:
    """``exp(-Σ w log w)`` over the positive weights, renormalised: 1 for one-hot, K for uniform.

    Example:
        >>> round(effective_layers([0.25] * 4), 6), effective_layers([0.0, 1.0, 0.0])
        (4.0, 1.0)
    """
    positive = [max(w, 0.0) for w in weights]
    total = sum(positive)
    return math.exp(-sum(w / total * math.log(w / total) for w in positive if w > 0))


def weights_by_trial(records: Sequence[dict[str, Any]], methods: Sequence[str] | None) -> dict[tuple, dict]:
    """``{(shots, epochs, method): {"lr", "layers", "trials": {trial: weights}}}`` at each selected LR."""
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if any(record.get(field) for field in WEIGHT_FIELDS) and (not methods or record["method"] in methods):
            cells[(record["shots"], record["epochs"], record["method"])].append(record)
    found = {}
    for cell, runs in sorted(cells.items()):
        lr = select_lr(runs).lr
        chosen = [r for r in runs if r["lr"] == lr]
        field = next(f for f in WEIGHT_FIELDS if chosen[0].get(f))
        found[cell] = {
            "lr": lr,
            "field": field,
            "layers": chosen[0].get("fused_layers") or list(range(1, len(chosen[0][field]) + 1)),
            "trials": {r["trial"]: r[field] for r in chosen},
        }
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--output", help="PNG to draw (default: none, the printout only)")
    parser.add_argument("--methods", nargs="+")
    args = parser.parse_args(argv)
    found = weights_by_trial(read_task_records(args.results), args.methods)
    if not found:
        print(f"{args.results}: no run records layer weights", file=sys.stderr)
        return 1
    for (shots, epochs, method), entry in found.items():
        for trial, weights in sorted(entry["trials"].items()):
            top = max(range(len(weights)), key=weights.__getitem__)
            print(
                f"N={shots} epochs={epochs} {method} @{entry['lr']:g} trial {trial}: largest "
                f"{weights[top]:.2f} on z_{entry['layers'][top]}, effective layers "
                f"{effective_layers(weights):.1f} of {len(weights)}"
            )
    if args.output:
        columns = sorted({(s, e) for s, e, _ in found})
        rows = sorted({m for _, _, m in found})
        figure, axes = plt.subplots(len(rows), len(columns), figsize=(4.5 * len(columns), 2.6 * len(rows)),
                                    squeeze=False, sharey=True)  # fmt: skip
        drawn = {(rows.index(m), columns.index((s, e))) for s, e, m in found}
        for row, column in {(r, c) for r in range(len(rows)) for c in range(len(columns))} - drawn:
            axes[row][column].axis("off")  # a cell this method has no run of
        for (shots, epochs, method), entry in found.items():
            ax = axes[rows.index(method)][columns.index((shots, epochs))]
            for trial, weights in sorted(entry["trials"].items()):
                ax.plot(entry["layers"], weights, marker="o", label=f"trial {trial}")
            ax.set_title(f"{method}, N={shots} (LR {entry['lr']:g})", fontsize=9)
            ax.set_xlabel("layer n (z_n)")
            ax.set_ylabel("weight")
            ax.legend(fontsize=7)
        figure.tight_layout()
        figure.savefig(args.output, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
