"""``benchmarks/llm_speed.py`` and the timing helpers it shares with ``benchmarks/overhead.py``.

The benchmarks are scripts run from their folder (``python benchmarks/llm_speed.py``), so the tests
import them the same way: with ``benchmarks/`` on the path.
"""

from __future__ import annotations

import doctest
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def scripts(script):
    """The two scripts as modules (``llm_speed``, ``overhead``), imported as they run."""
    return script("llm_speed"), script("overhead")


def test_every_other_round_runs_in_reverse_order(scripts):
    _, overhead = scripts
    order = []
    runs = {name: (lambda n=name: order.append(n) or float(len(order))) for name in ("base", "a", "b")}
    times = overhead.interleaved(runs, rounds=3)
    warm_up, *rounds = (order[i : i + 3] for i in range(0, len(order), 3))
    assert warm_up == ["base", "a", "b"]
    assert rounds == [["base", "a", "b"], ["b", "a", "base"], ["base", "a", "b"]]
    assert times == {"base": [4.0, 9.0, 10.0], "a": [5.0, 8.0, 11.0], "b": [6.0, 7.0, 12.0]}
    # best over best, the median of 5/4, 8/9, 11/10, and no interval from 3 rounds
    assert overhead.ratios(times, "a") == (5.0 / 4.0, 11.0 / 10.0, None)


def test_the_op_count_counts_what_computes_and_not_views(scripts):
    _, overhead = scripts
    x = torch.ones(2, 3)
    assert overhead.count_call_ops(lambda: x.view(3, 2).t()) == (0, 0)
    assert overhead.count_call_ops(lambda: (x * 2).sum()) == (2, 0)
    assert overhead.count_call_ops(lambda: torch.stack([x, x]).unbind(0)) == (1, 0)  # unbind: views
    assert overhead.count_call_ops(lambda: bool(x.sum() > 0)) == (3, 1)  # sum, gt and the host's read


def test_the_ops_part_counts_each_method_and_r_n_against_its_bound_as_a_model(scripts, capsys):
    llm_speed, _ = scripts
    argv = ["--random-decoder", "2x64", "--parts", "ops", "--methods", "average", "layer_mix", "extra_layers"]
    assert llm_speed.main([*argv, "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "2 blocks, d = 64" in printed and "rounds" not in printed  # nothing timed
    rows = {
        line.split(" | ")[0].strip("| "): line.strip(" |").split(" | ")[1:]
        for line in printed.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| method")
    }
    assert list(rows) == ["average", "layer_mix", "extra_layers", "deeper base"]
    ops = {name: int(row[1]) for name, row in rows.items()}
    assert rows["average"][0] == rows["layer_mix"][0] == "1.000x"  # FLOP bound: no parameters to speak of
    assert 0 < ops["average"] < ops["layer_mix"]  # LayerMix also normalises every state
    assert rows["extra_layers"][0] == rows["deeper base"][0] != "1.000x"  # R+n's bound is the deeper model
    assert 0 < ops["extra_layers"] - ops["deeper base"] < ops["average"]  # its hooks: a few ops
    assert {row[3] for row in rows.values()} == {"+0"}  # no host sync of their own (LayerMix's start had 2)


def test_the_timed_tables_start_with_a_second_copy_of_the_base(scripts, capsys):
    llm_speed, _ = scripts
    argv = ["--random-decoder", "2x64", "--parts", "forward", "generate", "steps", "--methods", "scalar_mix"]
    assert llm_speed.main([*argv, "--rounds", "1", "--new-tokens", "2", "--batch", "1", "--seq", "8"]) == 0
    first_rows = [
        line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| method")
    ]
    assert [row[0] for row in first_rows] == ["| base again", "| scalar_mix"] * 3  # forward, generate, steps
    forward_again, _, generate_again, _, steps_again, _ = first_rows
    assert forward_again[4] == generate_again[4] == steps_again[4] == "1.000x"  # the same FLOPs as the base
    assert generate_again[-1] == steps_again[-1] == "yes |"  # and the same tokens
    # one round gives no interval of the median, so no verdict either
    assert forward_again[3] == generate_again[3] == steps_again[3] == "-"
    assert forward_again[-1] == "not resolved |" and generate_again[-2] == steps_again[-2] == "not resolved"


def test_the_greedy_decoder_decodes_the_tokens_generate_does(scripts):
    llm_speed, _ = scripts
    base = llm_speed.random_decoder(2, 64).eval()
    inputs = llm_speed.prompt_inputs(base, None)
    decoder = llm_speed.GreedyDecoder(base, inputs)
    assert decoder.seconds == 0.0  # the prompt's forward is not timed
    for _ in range(4):
        decoder.step()
    expected = llm_speed.generated(base, inputs, new_tokens=5)[:, inputs["input_ids"].shape[1] :]  # (1, 5)
    assert torch.equal(torch.cat(decoder.tokens, dim=1), expected)  # the prompt's token and 4 steps'
    assert decoder.seconds > 0.0


def test_the_models_take_turns_at_every_decoding_step(scripts, monkeypatch):
    llm_speed, _ = scripts
    order = []

    class Decoder:  # one model's decoding: each step takes as many seconds as steps were taken before it
        def __init__(self, model, inputs):
            self.name, self.seconds = model, 0.0

        def step(self):
            order.append(self.name)
            self.seconds += len(order)

    monkeypatch.setattr(llm_speed, "GreedyDecoder", Decoder)
    times = llm_speed.stepwise({"base": "base", "a": "a"}, inputs={}, steps=3, rounds=2)
    warm_up, *rounds = (order[i : i + 6] for i in range(0, len(order), 6))
    assert warm_up == rounds[0] == rounds[1] == ["base", "a", "a", "base", "base", "a"]
    # each round's seconds summed over its steps (no warm-up): the base's 7 + 10 + 11, 13 + 16 + 17
    assert times == {"base": [28.0, 46.0], "a": [29.0, 47.0]}


# Page faults of writing a fresh 64 MiB tensor, six times in a row, each freed before the next, in a new
# process (the allocator's settings last for the whole process). glibc as it comes maps such a block and
# unmaps it when freed, so each of its 16384 pages faults every time. Held steady, malloc keeps what it
# frees: a block is written on pages already there, except where the heap had to grow (a small
# allocation landed in the freed space), which happens now and then, not every time.
FAULTS_OF_FRESH_BLOCKS = """
import resource, sys, torch
import overhead
overhead.use_allocator(sys.argv[1])
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(2**24)  # 64 MiB
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del block
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_steady_allocator_reuses_freed_memory_without_page_faults():
    def fewest_faults_after_the_first(allocator: str) -> int:
        command = [sys.executable, "-c", FAULTS_OF_FRESH_BLOCKS, allocator]
        run = subprocess.run(command, cwd=BENCHMARKS, capture_output=True, text=True, check=True)
        return min(int(line) for line in run.stdout.split()[-5:])

    assert fewest_faults_after_the_first("glibc") >= 2**24 * 4 // 4096  # every page of a block, every time
    assert fewest_faults_after_the_first("steady") < 100


@pytest.mark.parametrize("libc", [None, type("Refusing", (), {"mallopt": staticmethod(lambda *_: 0)})()])
def test_the_steady_allocator_says_what_it_needs_where_malloc_is_not_glibcs(scripts, monkeypatch, libc):
    _, overhead = scripts
    monkeypatch.setattr(overhead, "glibc", lambda: libc)  # not glibc, or a mallopt that refuses
    with pytest.raises(RuntimeError, match="--allocator steady needs glibc's mallopt"):
        overhead.use_allocator("steady")
    overhead.use_allocator("glibc")  # as it comes: nothing to set, nothing to refuse


def test_the_median_interval_is_the_binomial_order_statistics(scripts):
    _, overhead = scripts
    values = [float(v) for v in range(1, 21)]
    assert overhead.median_interval(values[:5]) is None  # 2 / 2**5 > 5%: no interval at 95%
    assert overhead.median_interval(values[:6]) == (1.0, 6.0)  # 2 / 2**6 = 3.1%
    assert overhead.median_interval(values[:10]) == (2.0, 9.0)  # P(B <= 1) = 1.1%, P(B <= 2) = 5.5%
    assert overhead.median_interval(values) == (6.0, 15.0)  # n = 20: P(B <= 5) = 2.07%, P(B <= 6) = 5.77%
    assert overhead.median_interval(list(reversed(values))) == (6.0, 15.0)  # order of the rounds: none


def test_the_median_interval_covers_the_median_of_a_skewed_distribution(scripts):
    """Timings are skewed (a slow spell only adds time): over 4000 draws of 10 rounds from an
    exponential distribution, the interval holds the true median (ln 2) in 97.9% of them (1 - 2 P(B <= 1))."""
    _, overhead = scripts
    draws = torch.empty(4000, 10).exponential_(generator=torch.Generator().manual_seed(0)).tolist()
    intervals = [overhead.median_interval(rounds) for rounds in draws]
    covered = sum(low <= 0.6931 <= high for low, high in intervals) / len(intervals)
    assert 0.97 < covered < 0.99


def test_the_verdict_reads_the_interval_against_the_margin(scripts):
    llm_speed, overhead = scripts
    assert overhead.verdict((0.99, 1.02), at_most=1.03) == "met"
    assert overhead.verdict((1.031, 1.2), at_most=1.03) == "missed"
    assert overhead.verdict((1.0, 1.031), at_most=1.03) == "not resolved"
    assert overhead.verdict(None, at_most=1.03) == "not resolved"
    # generation: 0.95 of the base's tokens/s, or 3% under a FLOP bound that leaves less
    assert llm_speed.decoding_target(0.99) == 0.95
    assert llm_speed.decoding_target(0.927) == pytest.approx(0.927 / 1.03)
    # as tokens/s: a median in 0.96-1.02x meets 0.95; in 0.90-0.96x it is not resolved
    assert overhead.interval_text((1 / 1.02, 1 / 0.96), invert=True) == "0.960-1.020x"
    assert overhead.verdict((1 / 1.02, 1 / 0.96), at_most=1 / 0.95) == "met"
    assert overhead.verdict((1 / 0.96, 1 / 0.90), at_most=1 / 0.95) == "not resolved"


def test_the_scripts_examples_run(scripts):
    results = [doctest.testmod(module) for module in scripts]  # llm_speed, overhead
    assert [result.failed for result in results] == [0, 0]
    assert all(result.attempted >= 1 for result in results)  # they have examples, and they ran
