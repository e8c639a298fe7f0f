"""Memory and time of training stacked LR candidates: one pass of all against passes of fewer.

The FE sweep's training peak (issue 25) without the sweep: one cell of ``--method`` (DWAtt) on a random
encoder of MiniLM's architecture and tokenizer with ``--shape`` states (13x768: BERT-base), the N = 32
sample of trial 0, the ``--sentences`` longest CoNLL-2003 test sentences as dev and the longest half of
them as test (the sweep's largest evaluation batches), ``--epochs`` epochs at the ``--candidates`` LRs
of the FE grid (``NerExperiment.run_lrs``, as a sweep runs a unit). Each ``--passes`` value (candidates per
pass; the ``--train-memory`` that gives it is set from the cell's trainable parameters) runs in its own
process, ``--rounds`` times, interleaved: the process's peak RSS (``ru_maxrss``), the same above its RSS
before the call, the seconds of the call, and whether the records are those of the first value, bitwise
(every field but ``seconds`` and ``pid``).

Usage::

    python benchmarks/train_memory.py --data path/to/conll2003 [--shape 13x768] [--method dwatt] \\
        [--passes 7 4] [--epochs 1] [--rounds 2] [--work /tmp/lf-eval-memory] \\
        [--output benchmarks/results/perf/train_memory.json]

The cache is filled once into ``--work`` (shared with ``eval_memory.py``) and memory-mapped by the
measured processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import resource
import time

from eval_memory import (
    add_reproduction_arguments,
    experiment,
    measure,
    parse_reproduction,
    ratio_rows,
    rss_bytes,
)

from layerfusion_recipes.core.cache.feature_cache import TRAINING_BYTES_PER_PARAMETER
from layerfusion_recipes.core.engine.experiment import trainable_count
from layerfusion_recipes.core.options.grids import DEFAULT_LR_GRIDS
from layerfusion_recipes.reporting.benchmark_report import Report


def child(args: argparse.Namespace) -> None:
    """Train the cell's LRs in passes of ``args.child`` candidates (one JSON line on stdout; 0: only
    fill the cache)."""
    run, cell = experiment(args)
    if args.child == 0:
        print(json.dumps({"filled": len(run.cache())}))
        return
    run.test = run.dev[len(run.dev) // 2 :]  # the longest half (sorted by length)
    cell = dataclasses.replace(cell, epochs=args.epochs)
    model, _ = run.build(cell)
    parameters = trainable_count(model)
    del model
    budget = (args.child + 0.5) * parameters * TRAINING_BYTES_PER_PARAMETER / 1e9  # GB: `child`, not one more
    run.settings = dataclasses.replace(run.settings, train_memory=budget)
    lrs = DEFAULT_LR_GRIDS["fe"][: args.candidates]
    before = rss_bytes()
    start = time.perf_counter()
    records = run.run_lrs(cell, lrs)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kept = [{k: v for k, v in r.items() if k not in ("seconds", "pid")} for r in records]
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
    line = {"peak": peak, "above": peak - before, "seconds": seconds, "digest": digest, "P": parameters}
    print(json.dumps(line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_reproduction_arguments(parser)  # --candidates: the LRs of the FE grid trained (7: all)
    parser.add_argument("--passes", type=int, nargs="+", default=[7, 4], help="Candidates per pass.")
    parser.add_argument("--epochs", type=int, default=1)
    args = parse_reproduction(parser, argv)
    if args.child is not None:
        child(args)
        return 0
    report = Report("benchmarks/train_memory.py", args.given)
    measure(args, 0, __file__)  # fills the cache, measures nothing
    rounds = [{n: measure(args, n, __file__) for n in args.passes} for _ in range(args.rounds)]
    blocks, width = args.shape
    parameters = rounds[0][args.passes[0]]["P"]
    report.print(
        f"{args.method} at {args.candidates} LRs, {blocks} x {width} random (P = {parameters / 1e6:.2f}M per "
        f"candidate), {args.epochs} epoch(s), the {args.sentences} longest CoNLL-2003 test sentences as "
        f"dev; {args.threads} thread(s); median of {args.rounds} interleaved rounds"
    )
    report.print()
    report.print("| candidates per pass | peak RSS | above start | seconds | records |")
    report.print("|---|---|---|---|---|")
    for row in ratio_rows(rounds, args.passes, [str(n) for n in args.passes], ("peak", "above")):
        report.print(row)
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
