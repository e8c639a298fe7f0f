"""``benchmarks/selection_cost.py``: the two protocols' commands and the per-child cost it reads."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture
def cost(script):
    return script("selection_cost")


def test_both_protocols_share_every_option_but_the_selection(cost):
    args = argparse.Namespace(task="classify", shots=[8, 32], trials=4, threads=1, model="m", data="d")
    base = cost.base_command(args, ["--pooling", "mean"])
    assert base == [
        "classify", "--shots", "8", "32", "--trials", "4", "--threads", "1",
        "--model", "m", "--data", "d", "--pooling", "mean",
    ]  # fmt: skip
    assert cost.CV_RECIPE == ["--selection", "cv"]
    assert cost.DEV_RECIPE[:2] == ["--selection", "dev"] and "--probe-start" in cost.DEV_RECIPE


def test_a_failing_child_is_measured_and_reported(cost, tmp_path):
    # a model that does not exist: the command refuses it in one line, before loading anything
    command = ["ner", "--model", str(tmp_path / "missing")]
    result = cost.run("cv", command, cost.CV_RECIPE, str(tmp_path / "out"))
    assert result.returncode == 2
    assert 0 < result.wall_s < 60 and 0 <= result.cpu_s <= result.wall_s * 2 + 1
    assert 0.01 < result.peak_rss_gb < 4  # the child's own peak, in GB (ru_maxrss is KiB)
    assert result.command.startswith("layerfusion ner --model ") and "--selection cv" in result.command
