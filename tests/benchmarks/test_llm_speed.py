"""``benchmarks/llm_speed.py`` and the timing helpers it shares with ``benchmarks/overhead.py``.

The benchmarks are scripts run from their folder (``python benchmarks/llm_speed.py``), so the tests
import them the same way: with ``benchmarks/`` on the path.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def scripts(monkeypatch):
    """The two scripts as modules (``llm_speed``, ``overhead``), imported as they run."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("llm_speed"), importlib.import_module("overhead")


def test_every_other_round_runs_in_reverse_order(scripts):
    _, overhead = scripts
    order = []
    runs = {name: (lambda n=name: order.append(n) or float(len(order))) for name in ("base", "a", "b")}
    times = overhead.interleaved(runs, rounds=3)
    warm_up, *rounds = (order[i : i + 3] for i in range(0, len(order), 3))
    assert warm_up == ["base", "a", "b"]
    assert rounds == [["base", "a", "b"], ["b", "a", "base"], ["base", "a", "b"]]
    assert times == {"base": [4.0, 9.0, 10.0], "a": [5.0, 8.0, 11.0], "b": [6.0, 7.0, 12.0]}
    assert overhead.ratios(times, "a") == (5.0 / 4.0, 11.0 / 10.0)  # median of 5/4, 8/9, 11/10


def test_the_op_count_counts_what_computes_and_not_views(scripts):
    _, overhead = scripts
    x = torch.ones(2, 3)
    assert overhead.count_call_ops(lambda: x.view(3, 2).t()) == 0
    assert overhead.count_call_ops(lambda: (x * 2).sum()) == 2
    assert overhead.count_call_ops(lambda: torch.stack([x, x]).unbind(0)) == 1  # unbind: views


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


def test_the_timed_tables_start_with_a_second_copy_of_the_base(scripts, capsys):
    llm_speed, _ = scripts
    argv = ["--random-decoder", "2x64", "--parts", "forward", "generate", "--methods", "scalar_mix"]
    assert llm_speed.main([*argv, "--rounds", "1", "--new-tokens", "2", "--batch", "1", "--seq", "8"]) == 0
    first_rows = [
        line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| method")
    ]
    assert [row[0] for row in first_rows] == ["| base again", "| scalar_mix"] * 2  # forward, generate
    forward_again, _, generate_again, _ = first_rows
    assert forward_again[-1] == "1.000x |" and generate_again[3] == "1.000x"  # the same FLOPs as the base
    assert generate_again[-1] == "yes |"  # and the same tokens
