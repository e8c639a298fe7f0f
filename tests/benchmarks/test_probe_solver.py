"""``benchmarks/probe_solver.py``: the planted problem, one child's measurement, and both codes compared."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def solver(script):
    return script("probe_solver")


def test_the_planted_problem_is_seeded_and_ignores_every_50th_row(solver):
    states, labels = solver.planted(120, 30, 3)
    again, same = solver.planted(120, 30, 3)
    assert torch.equal(states, again) and torch.equal(labels, same)
    assert states.shape == (120, 30)
    assert (labels == -100).nonzero().squeeze(1).tolist() == [0, 50, 100]
    assert set(labels[labels >= 0].tolist()) == {0, 1, 2}


def test_a_child_times_the_probe_and_keeps_its_out_of_fold_scores(solver, tmp_path):
    found = solver.child("60x40", 3, 1, tmp_path / "scores.pt")
    assert set(found) == {"seconds", "peak_rss_gb", "penalty"} and found["seconds"] > 0
    scores = torch.load(tmp_path / "scores.pt")
    assert scores.shape == (60, 3) and scores[[0, 50]].isnan().all() and not scores[1:50].isnan().any()


def test_the_same_code_on_both_sides_agrees_exactly(solver, capsys):
    args = argparse.Namespace(
        before_code=BENCHMARKS.parent, shapes=["40x60"], classes=2, threads=1, tolerance=0.0
    )
    report = solver.compare(args)
    (row,) = report["rows"]
    assert row["largest_score_gap"] == 0.0 and row["agree"]
    assert capsys.readouterr().out.splitlines()[2].startswith("| 40x60 |")


def test_a_before_code_without_the_library_stops_in_one_line(solver, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["probe_solver.py", "--before-code", str(tmp_path)])
    with pytest.raises(SystemExit):
        solver.main()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"probe_solver.py: error: --before-code={tmp_path}: expected a checkout holding peft_layerfusion/"
    )
