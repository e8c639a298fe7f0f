"""The one LR-selection rule and procedure every task calls (NER, masked LM, seq2seq)."""

from __future__ import annotations

import math

import pytest

from layerfusion_recipes.core.results.selection import best_on_dev, select_lr, select_then_repeat


def test_the_best_dev_score_wins_ties_go_to_the_smaller_lr_and_nan_ranks_last():
    assert best_on_dev({3e-3: 0.4, 1e-3: 0.6, 1e-2: 0.6}) == 1e-3  # whatever order the grid is in
    assert best_on_dev({1e-3: 20.0, 3e-3: 18.0, 1e-2: math.nan}, lower_is_better=True) == 3e-3
    assert best_on_dev({1e-3: math.nan, 3e-3: 0.1}) == 3e-3
    assert best_on_dev({1e-3: math.inf, 3e-3: 30.0}, lower_is_better=True) == 3e-3  # diverged
    assert best_on_dev({1e-3: (5.0, 70.0), 3e-3: (5.0, 71.0), 1e-2: (4.0, 99.0)}) == 3e-3  # in order
    with pytest.raises(ValueError, match="at least one LR"):
        best_on_dev({})


def test_ner_selection_is_the_same_rule_on_the_mean_over_trials():
    runs = [
        {"lr": lr, "trial": trial, "dev_f1": f1}
        for lr, f1s in {1e-3: (0.5, 0.7), 1e-2: (0.7, 0.5), 1e-1: (0.2, 0.2)}.items()
        for trial, f1 in enumerate(f1s)
    ]
    selection = select_lr(runs)
    assert selection.lr == 1e-3 and selection.dev_means[1e-2] == pytest.approx(0.6)  # tie: the smaller


def test_every_lr_on_the_first_seed_then_the_selected_lr_on_the_others():
    dev = {1e-3: 0.5, 3e-3: 0.8, 1e-2: 0.6}
    calls = []

    def run(lr, seed):
        calls.append((lr, seed))
        return {"lr": lr, "seed": seed, "dev": dev[lr] - seed}  # later seeds never choose

    selected, records = select_then_repeat(list(dev), [0, 1, 2], run, lambda r: r["dev"])
    assert selected == 3e-3
    assert calls == [(1e-3, 0), (3e-3, 0), (1e-2, 0), (3e-3, 1), (3e-3, 2)]
    assert [(r["lr"], r["seed"]) for r in records] == calls
    lower, _ = select_then_repeat(list(dev), [0], run, lambda r: r["dev"], lower_is_better=True)
    assert lower == 1e-3


def test_a_one_lr_grid_needs_no_dev_score():
    def unscored(record):
        raise AssertionError("a one-LR grid selected on dev")

    selected, records = select_then_repeat([3e-3], [0, 1], lambda lr, seed: {"seed": seed}, unscored)
    assert selected == 3e-3 and [r["seed"] for r in records] == [0, 1]
