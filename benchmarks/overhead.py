"""Forward overhead of each fusion method against the plain encoder, measured in one run.

A 12-block, width-768 random BERT (BERT-base shape), batch 16 x 128 tokens, eval mode,
``torch.no_grad``. For every method the script prints

* ``latency``: median forward time relative to the base model; the models are timed in
  interleaved rounds (base, dwatt, concat, ... , base, dwatt, ...), so machine noise hits
  all of them alike;
* ``peak mem``: peak resident memory added by one forward, relative to the base's
  (each model measured in a fresh child process);
* ``FLOP bound``: the ratio of counted floating-point operations
  (``torch.utils.flop_counter``), the best a perfect implementation could do.

Usage::

    python benchmarks/overhead.py [--rounds 7] [--batch 16] [--seq 128] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from peft import get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

import peft_layerfusion as plf

METHODS = {
    "dwatt": plf.DWAttConfig,
    "concat": plf.ConcatConfig,
    "scalar_mix": plf.ScalarMixConfig,
    "average": plf.AverageConfig,
    "extra_layers": plf.ExtraLayersConfig,
}


def base_model() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(), add_pooling_layer=False).eval()  # 12 x 768, BERT-base shape


def build(method: str) -> torch.nn.Module:
    model = base_model()
    return model if method == "base" else get_peft_model(model, METHODS[method]()).eval()


def inputs(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(1000, 20000, (batch, seq), generator=torch.Generator().manual_seed(0))


def count_flops(model: torch.nn.Module, ids: torch.Tensor) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    return counter.get_total_flops()


def time_forward(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        model(ids)
        return time.perf_counter() - start


def current_rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4  # 4 KiB pages


def child_peak_memory(method: str, batch: int, seq: int) -> None:
    """In a child process: peak RSS added by one forward, in KiB (printed as JSON)."""
    import resource

    model, ids = build(method), inputs(batch, seq)
    with torch.no_grad():
        model(ids[:1, :8])  # allocator warm-up on a tiny batch
    before = current_rss_kib()
    with torch.no_grad():
        model(ids)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"added_kib": max(peak - before, 1)}))


def peak_memory(method: str, batch: int, seq: int, threads: int) -> int:
    command = [sys.executable, __file__, "--child-memory", method, "--batch", str(batch), "--seq", str(seq),
               "--threads", str(threads)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])["added_kib"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (median reported)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--child-memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child_memory:
        child_peak_memory(args.child_memory, args.batch, args.seq)
        return

    names = ["base", *args.methods]
    models = {name: build(name) for name in names}
    ids = inputs(args.batch, args.seq)
    flops = {name: count_flops(model, ids) for name, model in models.items()}
    for model in models.values():  # warm-up
        time_forward(model, ids)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            times[name].append(time_forward(models[name], ids))
    memory = {name: peak_memory(name, args.batch, args.seq, args.threads) for name in names}

    base_time = statistics.median(times["base"])
    print(f"BERT-base shape (12 x 768), batch {args.batch} x {args.seq} tokens, {args.threads} threads, "
          f"{args.rounds} interleaved rounds, torch {torch.__version__}")
    print(f"base forward: {base_time * 1000:.0f} ms median, {flops['base'] / 1e9:.1f} GFLOP, "
          f"peak +{memory['base'] / 1024:.0f} MiB")
    print("| method | latency / base | peak mem / base | FLOP bound |")
    print("|---|---|---|---|")
    for name in args.methods:
        latency = statistics.median(times[name]) / base_time
        print(f"| {name} | {latency:.3f}x | {memory[name] / memory['base']:.3f}x | "
              f"{flops[name] / flops['base']:.3f}x |")


if __name__ == "__main__":
    main()
