"""Forward overhead of each fusion method against the plain encoder, measured in one run.

A 12-block, width-768 random BERT (BERT-base shape), batch 16 x 128 tokens, eval mode,
``torch.no_grad``. For every method the script prints

* ``latency``: forward time relative to the base model; the models are timed in
  interleaved rounds (base, dwatt, concat, ..., then the same in reverse order, ...). Two
  estimators: the best time of each model over the rounds (noise only ever adds time), and the
  median over rounds of the ratio to the base timed in the same round (paired: a slow spell that
  lasts a round hits both sides of its ratio), with its 95% interval (distribution-free, from the
  order statistics of the rounds' ratios: ``median_interval``; at least 6 rounds), and whether that
  interval shows the method within 3% of its FLOP bound ("met"), shows it over ("missed") or
  straddles the margin ("not resolved": the run's noise is wider than 3%; more rounds narrow it).
  The first row, ``base again``, is a second copy of the base timed like a method: how far from
  1.000x two identical models land in this run, the noise floor every other row is read against;
* ``peak mem``: peak bytes of tensors alive during one forward, relative to the base's
  (the torch profiler's allocator events: deterministic, unaffected by machine noise);
* ``FLOP bound``: the ratio of counted floating-point operations
  (``torch.utils.flop_counter``), the best a perfect implementation could do.

Usage::

    python benchmarks/overhead.py [--rounds 7] [--batch 16] [--seq 128] [--threads N]
        [--allocator glibc|steady] [--output FILE.json]

``--output FILE.json`` also saves what it prints, with the command, time and load
(``layerfusion_recipes.reporting.benchmark_report``), for ``layerfusion report``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from peft import get_peft_model
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from layerfusion_recipes.core.memory import glibc
from layerfusion_recipes.reporting.benchmark_report import Report
from peft_layerfusion.registration import TRAINED_METHODS

METHODS = {method.name: method for method in TRAINED_METHODS}  # every encoder method that trains
CONTROL = "base again"  # a second copy of the base, timed like a method: the run's noise floor (A/A)
FLOP_MARGIN = 1.03  # the target: a method's time at most 3% over its FLOP bound
ALLOCATORS = ("glibc", "steady")  # --allocator: glibc's malloc as it comes, or held steady (steady_allocator)
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
NEVER_TRIM = 2**31 - 1  # bytes: the largest M_TRIM_THRESHOLD mallopt takes
ALLOCATOR_HELP = (
    "glibc (default): malloc as it comes; steady: malloc keeps and reuses what it frees, so no forward "
    "page-faults on fresh memory (steady_allocator)"
)


def base_model() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(), add_pooling_layer=False).eval()  # 12 x 768, BERT-base shape


def build(method: str) -> torch.nn.Module:
    model = base_model()
    if method in ("base", CONTROL):
        return model
    return get_peft_model(model, METHODS[method].make_config()).eval()


def inputs(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(1000, 20000, (batch, seq), generator=torch.Generator().manual_seed(0))


def addmm_inplace_flop(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    """FLOPs of ``c.addmm_(a, b)`` (torch's counter knows only the out-of-place ``addmm``)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def parse_shape(text: str) -> tuple[int, int]:
    """``"12x768"`` -> ``(12, 768)`` (blocks, width; width a multiple of 64)."""
    try:
        blocks, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 12x768 (blocks x width), got {text!r}") from None
    if blocks < 1 or width < 64 or width % 64:
        raise argparse.ArgumentTypeError(f"{text!r}: need >= 1 block and a width that is a multiple of 64")
    return blocks, width


def count_flops(model: torch.nn.Module, ids: torch.Tensor) -> int:
    return count_call_flops(lambda: model(ids))


def count_call_flops(call: Callable[[], object]) -> int:
    """Floating-point operations counted while ``call()`` runs without autograd (matmuls and the like)."""
    in_place = {torch.ops.aten.addmm_: addmm_inplace_flop}  # in case a module accumulates in place
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=in_place) as counter:
        call()
    return counter.get_total_flops()


class OpCount(NamedTuple):
    """What a call dispatches: ``ops``, the aten ops that compute (views aside; on a GPU each is a kernel
    launch), and ``syncs``, the ones that read a tensor's value on the host (``.item()``, ``bool(t)``:
    on a GPU the host waits there for every kernel queued before)."""

    ops: int
    syncs: int


class KernelOpCounter(TorchDispatchMode):
    """Counts the aten ops that compute (views aside) dispatched while it is active, and the host syncs
    among them: what a decoding step at batch 1 on a GPU is bound by. Deterministic, unlike a timing."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        self.ops += not func.is_view
        self.syncs += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def count_call_ops(call: Callable[[], object]) -> OpCount:
    """Aten ops that compute (no views), and host syncs, dispatched while ``call()`` runs without autograd.

    Example:
        >>> x = torch.ones(3)
        >>> count_call_ops(lambda: (x * 2 + 1).view(3, 1))  # mul, add; the view launches nothing
        OpCount(ops=2, syncs=0)
        >>> count_call_ops(lambda: x.sum().item())  # sum, and the read of its value
        OpCount(ops=2, syncs=1)
    """
    with torch.no_grad(), KernelOpCounter() as counter:
        call()
    return OpCount(counter.ops, counter.syncs)


def steady_allocator() -> None:
    """Make glibc's malloc keep the memory it frees and reuse it: no block of its own mapping (``mmap``),
    and no return of the heap's free top to the system.

    As it comes, glibc maps every block over a threshold that moves with the program's history (128 KiB
    to 32 MiB), unmaps it when it is freed, and trims the heap's free top; each page of a new mapping
    then faults and is zeroed when first written. A decoder forward of ``--random-decoder 30x576`` does
    12-63 thousand such faults (about 50 to 250 MiB of fresh pages), and how many varies from forward to
    forward and from model to model with the order of earlier allocations, not with the work done: a
    per-model offset that more rounds do not average away. Held steady, no forward faults and every
    model is timed on its own work. Call it before the models are built.

    Raises:
        RuntimeError: where the C library is not glibc, or refuses the settings.
    """
    libc = glibc()
    if libc is None or not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)):
        raise RuntimeError("--allocator steady needs glibc's mallopt; use --allocator glibc on this system")


def use_allocator(name: str) -> None:
    """Set up the allocator ``--allocator`` names (:data:`ALLOCATORS`): ``"steady"`` calls
    :func:`steady_allocator`, ``"glibc"`` leaves malloc as it comes."""
    if name == "steady":
        steady_allocator()


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--threads``, ``--allocator``, ``--output``: what every timing benchmark takes (:func:`start`)."""
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--allocator", default="glibc", choices=ALLOCATORS, help=ALLOCATOR_HELP)
    parser.add_argument("--output", help="Also save the printed report here (JSON, for RESULTS.md).")


def start(
    parser: argparse.ArgumentParser, argv: list[str] | None, script: str
) -> tuple[argparse.Namespace, Report]:
    """The parsed ``argv`` (default: the command line's) and the run's :class:`Report`, the torch threads
    and the allocator set as they say (:func:`add_run_arguments`)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    report = Report(script, argv)
    torch.set_num_threads(args.threads)
    use_allocator(args.allocator)
    return args, report


def time_forward(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        model(ids)
        synchronize(ids.device)
        return time.perf_counter() - start


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each run over ``rounds`` interleaved rounds, after one warm-up call each.

    Every other round runs in reverse order, so no model always runs first, or always right after the
    same other model.

    Example:
        >>> order = []
        >>> runs = {name: (lambda n=name: order.append(n) or 0.0) for name in ("a", "b")}
        >>> interleaved(runs, rounds=2)
        {'a': [0.0, 0.0], 'b': [0.0, 0.0]}
        >>> order  # warm-up, round 1, round 2 (reversed)
        ['a', 'b', 'a', 'b', 'b', 'a']
    """
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_index in range(rounds):
        names = list(runs) if round_index % 2 == 0 else list(runs)[::-1]
        for name in names:
            times[name].append(runs[name]())
    return times


class Ratios(NamedTuple):
    """A model's time over the base's in one run: best over best, the median of the same round's ratios,
    and that median's 95% interval (:func:`median_interval`; ``None`` under 6 rounds)."""

    best: float
    paired: float
    interval: tuple[float, float] | None


def ratios(times: dict[str, list[float]], name: str) -> Ratios:
    """``name``'s time over the base's (:class:`Ratios`), from the rounds of :func:`interleaved`.

    Example:
        >>> ratios({"base": [1.0, 2.0, 1.2], "m": [1.1, 2.4, 1.2]}, "m")
        Ratios(best=1.1, paired=1.1, interval=None)
    """
    per_round = [t / b for t, b in zip(times[name], times["base"], strict=True)]
    best = min(times[name]) / min(times["base"])
    return Ratios(best, statistics.median(per_round), median_interval(per_round))


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``values``: the ``k``-th smallest and the ``k``-th
    largest, with ``k`` the largest count whose two tails hold at most ``1 - confidence`` of
    Binomial(n, 1/2) (each value falls on either side of the true median with probability 1/2; no
    assumption on the distribution). ``None`` where ``n`` is too small for one (under 6 at 95%).

    Example:
        >>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])  # 97.9%: k = 2
        (2.0, 9.0)
        >>> median_interval([1.0, 2.0, 3.0]) is None
        True
    """
    n = len(values)
    tail = 0.0  # P(Binomial(n, 1/2) < k), k = 1, 2, ...
    k = 0
    while k < n // 2 and 2 * (tail + math.comb(n, k) / 2**n) <= 1 - confidence:
        tail += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def interval_text(interval: tuple[float, float] | None, invert: bool = False) -> str:
    """``"0.950-1.020x"`` (``invert``: the interval of the reciprocal, e.g. tokens/s from times), or ``"-"``
    where the rounds are too few for one.

    Example:
        >>> interval_text((0.8, 1.25), invert=True)
        '0.800-1.250x'
        >>> interval_text(None)
        '-'
    """
    if interval is None:
        return "-"
    low, high = sorted(1 / value for value in interval) if invert else interval
    return f"{low:.3f}-{high:.3f}x"


def verdict(interval: tuple[float, float] | None, at_most: float) -> str:
    """Whether a ratio's 95% interval shows it at most ``at_most`` (``"met"``), shows it above
    (``"missed"``), or straddles it (``"not resolved"``: this run's noise is wider than the margin).

    Example:
        >>> [verdict(interval, at_most=1.03) for interval in [(0.98, 1.02), (1.04, 1.1), (1.0, 1.05), None]]
        ['met', 'missed', 'not resolved', 'not resolved']
    """
    if interval is None or interval[0] <= at_most < interval[1]:
        return "not resolved"
    return "met" if interval[1] <= at_most else "missed"


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a GPU's kernels run asynchronously); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_forward_memory(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Peak bytes of tensors allocated during one forward (torch profiler's allocator events)."""
    with torch.no_grad():
        return peak_allocated(lambda: model(ids))


def peak_allocated(run: Callable[[], object]) -> int:
    """Peak bytes of tensors allocated during ``run()`` and alive at once (the torch profiler's
    allocator events; tensors alive before the call do not count)."""
    with tempfile.TemporaryDirectory() as folder:
        trace_path = os.path.join(folder, "trace.json")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
        prof.export_chrome_trace(trace_path)
        with open(trace_path) as trace:
            events = json.load(trace)["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_run_arguments(parser)
    args, report = start(parser, argv, "benchmarks/overhead.py")
    names = ["base", CONTROL, *args.methods]
    models = {name: build(name) for name in names}
    ids = inputs(args.batch, args.seq)
    flops = {name: count_flops(model, ids) for name, model in models.items()}
    runs = {name: (lambda m=model: time_forward(m, ids)) for name, model in models.items()}
    times = interleaved(runs, args.rounds)
    memory = {name: peak_forward_memory(model, ids) for name, model in models.items()}
    best = {name: min(values) for name, values in times.items()}  # noise only ever adds time
    report.print(
        f"BERT-base shape (12 x 768), batch {args.batch} x {args.seq} tokens, {args.threads} threads, "
        f"{args.rounds} interleaved rounds, {args.allocator} allocator, torch {torch.__version__}"
    )
    base_median = statistics.median(times["base"])
    report.print(
        f"base forward: {best['base'] * 1000:.0f} ms best, {base_median * 1000:.0f} ms median, "
        f"{flops['base'] / 1e9:.1f} GFLOP, "
        f"peak tensor memory {memory['base'] / 2**20:.0f} MiB"
    )
    report.print(
        "| method | latency / base (best) | latency / base (median of paired rounds) | its 95% interval "
        "| peak mem / base | FLOP bound | within 3% of the bound |"
    )
    report.print("|---|---|---|---|---|---|---|")
    for name in names[1:]:
        (best_ratio, paired, interval), bound = ratios(times, name), flops[name] / flops["base"]
        within = verdict(interval, FLOP_MARGIN * bound)
        report.print(
            f"| {name} | {best_ratio:.3f}x | {paired:.3f}x | {interval_text(interval)} | "
            f"{memory[name] / memory['base']:.3f}x | {bound:.3f}x | {within} |"
        )
    report.save(args.output)


if __name__ == "__main__":
    main()
