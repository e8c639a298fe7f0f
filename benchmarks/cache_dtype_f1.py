"""What a half-precision feature cache does to F1: the same grid run with ``--cache-dtype`` float32 and
bfloat16 (or float16), paired.

Reads two results files of the same grid (same data, samples and settings but the cache dtype) and
prints, per method, the paired test-F1 difference half - float32 in points, mean ± 95% t-CI over the
pairs: (a) at each cell's LR selected on dev (each file selects its own, as the tables do; pairs are
trials), and (b) at every LR of the grid (pairs are trial x LR), with the largest difference; and how
often the selected LR differs. Every run of the half-precision file must have its float32 twin; a
method whose half-precision runs are not all there yet is listed as not finished.

Usage::

    python benchmarks/cache_dtype_f1.py benchmarks/results/conll_fe_lr/results.jsonl \\
        benchmarks/results/conll_fe_lr_bf16/results.jsonl --shots 32 --epochs 25 \\
        [--output benchmarks/results/perf/cache_dtype_f1.json]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.results.selection import select_lr
from layerfusion_recipes.core.results.stats import paired_mean_ci
from layerfusion_recipes.reporting.benchmark_report import Report


def runs_by_method(path: str, shots: int, epochs: int) -> dict[str, dict[tuple[int, float], dict]]:
    """The FE runs of ``path`` at ``shots`` and ``epochs``: method -> (trial, lr) -> record."""
    runs: dict[str, dict[tuple[int, float], dict]] = defaultdict(dict)
    for record in read_records(path):
        if record["regime"] == "fe" and record["shots"] == shots and record["epochs"] == epochs:
            runs[record["method"]].setdefault((record["trial"], record["lr"]), record)
    return runs


def points(record: dict) -> float:
    return 100 * record["test_f1"]


def selected_scores(runs: dict[tuple[int, float], dict]) -> tuple[float, dict[int, float]]:
    """The LR selected on dev and the test F1 (points) of each trial at it."""
    lr = select_lr(list(runs.values())).lr
    return lr, {trial: points(record) for (trial, rlr), record in runs.items() if rlr == lr}


def described(difference) -> str:
    """``mean ± half-width (pairs)`` of a
    :class:`~layerfusion_recipes.core.results.stats.PairedDifference`."""
    return f"{difference.mean:+.2f} ± {difference.half_width:.2f} ({difference.n})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("float32", help="Results file of the float32 cache.")
    parser.add_argument("half", help="Results file of the same grid on a half-precision cache.")
    parser.add_argument("--shots", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--output", help="Also save the printed report here (JSON).")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    report = Report("benchmarks/cache_dtype_f1.py", argv)
    exact, half = (runs_by_method(path, args.shots, args.epochs) for path in (args.float32, args.half))
    dtypes = {r["settings"].get("cache_dtype", "float32") for runs in half.values() for r in runs.values()}
    report.print(
        f"N = {args.shots}, {args.epochs} epochs; test F1 of {'/'.join(sorted(dtypes))} - float32, points"
    )
    report.print()
    report.print(
        "| method | selected LR float32 / half | at the selected LR (pairs) | at every LR (pairs) "
        "| largest at one LR |"
    )
    report.print("|---|---|---|---|---|")
    changed, compared = 0, 0
    for method in sorted(half, key=list(exact).index):
        if set(half[method]) - set(exact[method]):  # a run of the half grid that float32 never ran
            raise SystemExit(f"{method}: half-precision runs without a float32 twin (trial, lr)")
        if set(exact[method]) - set(half[method]):  # the half grid is not finished there
            done = f"{len(half[method])} of {len(exact[method])}"
            report.print(f"| {method} | not finished: {done} runs | | | |")
            continue
        compared += 1
        (lr_exact, at_exact), (lr_half, at_half) = (
            selected_scores(exact[method]),
            selected_scores(half[method]),
        )
        changed += lr_exact != lr_half
        selected = paired_mean_ci(at_half, at_exact)
        every = {key: points(record) for key, record in half[method].items()}
        base = {key: points(record) for key, record in exact[method].items()}
        overall = paired_mean_ci(every, base)
        largest = max((every[key] - base[key] for key in base), key=abs)
        report.print(
            f"| {method} | {lr_exact:g} / {lr_half:g} | {described(selected)} | {described(overall)} "
            f"| {largest:+.2f} |"
        )
    report.print()
    report.print(f"selected LR changed in {changed} of {compared} cells")
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
