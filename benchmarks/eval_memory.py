"""Memory and time of evaluating stacked LR candidates: all at once against groups within a byte budget,
and the replay of the cache: every block's padded state built at once against one block at a time.

The reproduction of the FE sweep's peak (issue 25) without the sweep: a random encoder of MiniLM's
architecture and tokenizer with ``--shape`` states (13x768: BERT-base), the ``--sentences`` longest
sentences of CoNLL-2003's test split (the largest evaluation batches of the sweep: 64 sentences of
128 sub-words), ``--candidates`` stacked candidates of ``--method`` (FE, the N = 32 sample of trial
0 in the cache too) and one ``predict_labelled`` over them, in batches of 64, largest first, as
``fit`` evaluates. Each ``--budgets`` value (bytes; ``0``: every candidate in one forward, the code
before the groups) runs in its own process, ``--rounds`` times, interleaved: the process's peak RSS
(``ru_maxrss``) above its RSS before the call, the peak of what glibc's heap has in use
(``mallinfo2``, sampled every 2 ms) above the same point, the seconds of the call, and whether the
predictions are those of the first budget, bitwise.

``--replays`` compares how the cache is replayed (each budget runs with each): ``whole`` builds every
block's padded ``(batch, seq, d)`` state of a batch at once and the fusion's capture keeps them whole
until the fusion gathers the read positions (the code before), ``blocks`` builds each block's state
when the block is called and the capture keeps only the read positions of each (``FeatureCache.batch``,
``BlockCapture``'s ``select``).

Usage::

    python benchmarks/eval_memory.py --data path/to/conll2003 [--shape 13x768] \\
        [--method dwatt] [--budgets 0 134217728] [--replays blocks] [--rounds 2] \\
        [--work /tmp/lf-eval-memory] [--output benchmarks/results/perf/eval_memory.json]

The cache (the sentences and the sample) is filled once into ``--work``, in a process of its own,
and memory-mapped by the measured ones.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from cache_speed import parse_shape, random_encoder_like

from layerfusion_recipes.core.cache.feature_cache import FeatureCache
from layerfusion_recipes.core.engine import runner as runner_module
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.engine.runner import predict_labelled
from layerfusion_recipes.core.models.demo import demo_model_path
from layerfusion_recipes.core.results.cells import Cell
from layerfusion_recipes.ner.experiment import NerExperiment, NerSettings
from layerfusion_recipes.reporting.benchmark_report import Report
from peft_layerfusion.layer import fusion_layer_of

SHOTS, EVAL_BATCH = 32, 64
REPLAYS = ("whole", "blocks")  # every block's padded state at once (the code before), or one at a time


class HeapInUse(threading.Thread):
    """The largest ``mallinfo2`` in-use bytes (heap + mmapped chunks) seen while it runs."""

    class Info(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                "fordblks", "keepcost",
            )
        ]  # fmt: skip

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallinfo2.restype = self.Info
        self.start_bytes = self.bytes()
        self.peak, self.running = self.start_bytes, True

    def bytes(self) -> int:
        info = self.libc.mallinfo2()
        return info.uordblks + info.hblkhd

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.bytes())
            time.sleep(0.002)


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def experiment(args: argparse.Namespace) -> tuple[NerExperiment, Cell]:
    """The experiment whose dev split is the ``--sentences`` longest test sentences, cache filled."""
    blocks, width = args.shape
    model = args.work / f"random-{blocks}x{width}"
    if not (model / "config.json").exists():
        random_encoder_like(demo_model_path(), blocks - 1, width, model)
    settings = NerSettings(model=str(model), data=args.data, dev_limit=1, cache_dir=str(args.work))
    run = NerExperiment(settings, plan=SweepPlan(cache_positions="labelled"))
    run.dev, run.test = run.test[-args.sentences :], []  # sorted by length: the longest
    cell = Cell(args.method, "fe", SHOTS, 1, 0)
    run.prefill_cache([cell])
    return run, cell


def replay_whole(model) -> None:
    """Replay as the code before: every block's padded state of a batch built at once (``(L, batch, seq,
    d)``, the probes' layout) and kept whole by the capture until the fusion gathers."""
    batch = FeatureCache.batch
    FeatureCache.batch = lambda cache, features: batch(cache, features).stacked()
    fusion_layer_of(model).capture.select = None


def child(args: argparse.Namespace) -> None:
    """Measure one ``predict_labelled`` at budget ``args.child``, replayed as ``args.child_replay`` (one
    JSON line on stdout)."""
    run, cell = experiment(args)
    model, located = run.build(cell)
    if args.child_replay == "whole":
        replay_whole(model)
    runner = run.runner(model, located, run.cache(), count=args.candidates)
    if args.child > 0:
        runner_module.EVALUATION_BYTES = args.child
    else:  # every candidate in one forward
        runner_module.EVALUATION_BYTES = 2**62
    before, heap = rss_bytes(), HeapInUse()
    heap.start()
    start = time.perf_counter()
    predicted = predict_labelled(runner, run.dev, EVAL_BATCH, torch.device("cpu"))
    seconds = time.perf_counter() - start
    heap.running = False
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    digest = hashlib.sha256(predicted.numpy().tobytes()).hexdigest()[:16]
    line = {"peak": peak - before, "heap": heap.peak - heap.start_bytes, "seconds": seconds, "digest": digest}
    print(json.dumps(line))


def measure(args: argparse.Namespace, value: int, script: str = __file__, replay: str = "blocks") -> dict:
    """The JSON line of ``script`` run as a child process with ``--child value`` (``--child-replay``)."""
    command = [sys.executable, script, *args.argv, "--child", str(value), "--child-replay", replay]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_reproduction_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a reproduction of the sweep's cell (this script's and ``train_memory.py``'s)."""
    parser.add_argument("--data", required=True, help="CoNLL-2003 folder.")
    parser.add_argument("--shape", type=parse_shape, default=(13, 768), help="STATESxWIDTH (default 13x768).")
    parser.add_argument("--method", default="dwatt")
    parser.add_argument("--candidates", type=int, default=7, help="Stacked candidates (the FE grid: 7).")
    parser.add_argument("--sentences", type=int, default=128, help="Longest test sentences evaluated.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lf-eval-memory")
    parser.add_argument("--output", help="Also save the printed report here (JSON).")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-replay", default="blocks", help=argparse.SUPPRESS)


def parse_reproduction(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options (threads set, ``--work`` made); ``args.given``: the command line, ``args.argv``:
    what a child is given (without ``--output``)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    args.given, args.argv = argv, [a for a in argv if a != "--output" and a != args.output]
    return args


def ratio_rows(rounds: list[dict], values: list, names: list[str], keys: tuple[str, ...]) -> list[str]:
    """One table row per value of ``values`` (``rounds``: ``{value: child's line}`` each): its name, the
    median run's ``keys`` in GB and its seconds (the median by seconds, the slower of two), each with
    its ratio to the first value's, and ``same`` when every run has the first value's digest."""
    rows, first = [], None
    for value, name in zip(values, names, strict=True):
        runs = sorted((r[value] for r in rounds), key=lambda r: r["seconds"])
        middle = runs[len(runs) // 2]
        first = first or middle
        same = all(r["digest"] == rounds[0][values[0]]["digest"] for r in runs)
        cells = [f"{middle[key] / 1e9:.2f} GB ({middle[key] / first[key]:.2f}x)" for key in keys]
        time_cell = f"{middle['seconds']:.1f} s ({middle['seconds'] / first['seconds']:.2f}x)"
        rows.append(f"| {name} | {' | '.join(cells)} | {time_cell} | {'same' if same else 'DIFFER'} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_reproduction_arguments(parser)
    parser.add_argument("--budgets", type=int, nargs="+", default=[0, runner_module.EVALUATION_BYTES])
    parser.add_argument("--replays", nargs="+", choices=REPLAYS, default=["blocks"])
    args = parse_reproduction(parser, argv)
    if args.child is not None:
        child(args)
        return 0
    report = Report("benchmarks/eval_memory.py", args.given)
    variants = [(replay, budget) for replay in args.replays for budget in args.budgets]
    measure(args, args.budgets[0])  # fills the cache (its numbers are not kept)
    rounds = [
        {variant: measure(args, variant[1], replay=variant[0]) for variant in variants}
        for _ in range(args.rounds)
    ]
    blocks, width = args.shape
    report.print(
        f"{args.candidates} stacked {args.method} candidates, {blocks} x {width} random, the "
        f"{args.sentences} longest CoNLL-2003 test sentences in batches of {EVAL_BATCH}; "
        f"{args.threads} thread(s); median of {args.rounds} interleaved rounds"
    )
    report.print()
    report.print(
        "| replay, budget | peak RSS above start | heap in use above start | seconds | predictions |"
    )
    report.print("|---|---|---|---|---|")
    names = [
        f"{replay}, {'all at once' if budget == 0 else f'{budget / 2**20:.0f} MiB'}"
        for replay, budget in variants
    ]
    for row in ratio_rows(rounds, variants, names, ("peak", "heap")):
        report.print(row)
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
