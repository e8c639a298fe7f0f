"""What letting a memory-mapped feature cache's pages go costs: one pass over its states, pages kept
against pages let go after every ``MAPPED_BYTES_HELD`` served (``FeatureCache`` with ``--cache-dir``).

Random states of ``--blocks`` x ``--width`` at ``--positions`` kept positions per sentence are written
as shards of ``FLUSH_BYTES`` (``write_shard``, ``--gigabytes`` in all, in ``--work``) and read back
memory-mapped (``read_shard``). One pass reads them as an evaluation's replay does: batches of 64
sentences, each block's rows of the batch gathered (``torch.cat``), block after block. Each variant
runs a pass to warm, then ``--rounds`` measured passes, interleaved: wall seconds, system CPU seconds
and minor page faults of a pass (``getrusage``), and its ratio to the pass with the pages kept.

Usage::

    python benchmarks/mapped_pages.py [--gigabytes 4] [--blocks 24] [--width 1024] [--positions 15] \\
        [--rounds 3] [--work /tmp/lf-mapped-pages] [--output benchmarks/results/perf/mapped_pages.json]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from layerfusion_recipes.core.cache import feature_cache
from layerfusion_recipes.core.cache.cache_files import (
    drop_mapped_pages,
    mapped_range,
    read_shard,
    write_shard,
)
from layerfusion_recipes.reporting.benchmark_report import Report

KEY = "benchmark"
BATCH = 64  # TrainSettings.eval_batch_size


def write_states(args: argparse.Namespace) -> list[Path]:
    """The shards of ``args.gigabytes`` of random states (written once per shape into ``args.work``)."""
    folder = args.work / f"{args.blocks}x{args.width}x{args.positions}"
    folder.mkdir(parents=True, exist_ok=True)
    per_sentence = args.positions * args.blocks * args.width * 4  # float32
    per_shard = max(1, feature_cache.FLUSH_BYTES // per_sentence)
    shards = max(1, round(args.gigabytes * 1e9 / (per_shard * per_sentence)))
    generator = torch.Generator().manual_seed(0)
    paths = []
    for index in range(shards):
        path = folder / f"shard-{index}.safetensors"
        if not path.exists():
            ids = [(index, n, *range(args.positions)) for n in range(per_shard)]  # unique token ids
            keys = [(sentence, tuple(range(args.positions))) for sentence in ids]  # (ids, kept)
            states = torch.randn(per_shard * args.positions, args.blocks, args.width, generator=generator)
            write_shard(path, keys, states, KEY)
        paths.append(path)
    return paths


def one_pass(states: list[torch.Tensor], ranges: list[tuple[int, int]] | None) -> dict[str, float]:
    """Read every state once, as a replay does; with ``ranges``, let their pages go after every
    ``MAPPED_BYTES_HELD`` served and at the end. Wall and system seconds, minor faults."""
    before, start, served = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    for first in range(0, len(states), BATCH):
        batch = states[first : first + BATCH]  # (kept, L, d) each
        for block in range(batch[0].shape[1]):
            torch.cat([kept[:, block] for kept in batch]).sum()  # (batch kept, d)
        served += sum(kept.nbytes for kept in batch)
        if ranges is not None and served > feature_cache.MAPPED_BYTES_HELD:
            drop_mapped_pages(ranges)
            served = 0
    if ranges is not None:
        drop_mapped_pages(ranges)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall": time.perf_counter() - start,
        "system": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gigabytes", type=float, default=4.0)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--positions", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lf-mapped-pages")
    parser.add_argument("--output", help="Also save the printed report here (JSON).")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = Report("benchmarks/mapped_pages.py", argv)
    states, ranges = [], []
    for path in write_states(args):
        shard = read_shard(path, KEY, args.blocks)
        states += list(shard.values())
        ranges.append(mapped_range(states[-1], path))
    if None in ranges:
        report.print("the shards are not memory-mapped here (not Linux?): nothing to measure")
        return 1
    gigabytes = sum(kept.nbytes for kept in states) / 1e9
    report.print(
        f"{len(states)} sentences x {args.positions} positions x {args.blocks} blocks x {args.width}: "
        f"{gigabytes:.2f} GB in {len(ranges)} shards; pages let go after every "
        f"{feature_cache.MAPPED_BYTES_HELD / 2**20:.0f} MiB; 1 thread, {args.rounds} rounds"
    )
    variants = {"pages kept": None, "pages let go": ranges}
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for dropped in variants.values():
        one_pass(states, dropped)  # warm: the page cache, the allocator
    for _ in range(args.rounds):
        for name, dropped in variants.items():
            measured[name].append(one_pass(states, dropped))
    report.print()
    report.print("| variant | wall per pass (median) | / pages kept | system CPU | minor faults | per GB |")
    report.print("|---|---|---|---|---|---|")
    kept_wall = sorted(m["wall"] for m in measured["pages kept"])[args.rounds // 2]
    for name, runs in measured.items():
        middle = sorted(runs, key=lambda m: m["wall"])[args.rounds // 2]
        wall, system, faults = middle["wall"], middle["system"], middle["faults"]
        report.print(
            f"| {name} | {wall:.2f} s | {wall / kept_wall:.2f}x | {system:.2f} s | {faults:.0f} "
            f"| {(wall - kept_wall) / gigabytes:+.3f} s |"
        )
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
