"""The one summariser (core.results.summary): selection on dev, the edge flag, mean ± t-CI, paired
differences."""

from __future__ import annotations

import math

import pytest

from layerfusion_recipes.core.results.summary import Layout, MeanCI, fields, paired_by_trial, summarize_groups

T_975_1, T_975_2 = 12.706205, 4.302653  # Student t quantiles (0.975) at 1 and 2 degrees of freedom
FEW_SHOT = Layout(setting=lambda r: r["shots"], dev=lambda r: r["dev"], metrics=fields("dev", "test"))


def _runs(method, shots, grid):
    """Records of one group: ``grid`` is ``{lr: [(dev, test) per trial]}``."""
    return [
        {"method": method, "shots": shots, "lr": lr, "trial": trial, "dev": dev, "test": test}
        for lr, scores in grid.items()
        for trial, (dev, test) in enumerate(scores)
    ]


def test_ties_go_to_the_smaller_lr_nan_ranks_last_and_the_edge_is_flagged():
    grid = {
        3e-2: [(math.nan, 99.0), (0.9, 99.0)],
        1e-2: [(0.7, 0.1), (0.5, 0.1)],
        1e-3: [(0.6, 0.4), (0.6, 0.5)],
    }
    (group,) = summarize_groups(_runs("dwatt", 8, grid), FEW_SHOT).values()
    assert group.lr == 1e-3 and group.lrs == [1e-3, 1e-2, 3e-2]  # dev means 0.6 = 0.6 > NaN
    assert group.dev_by_lr[1e-2] == pytest.approx(0.6) and math.isnan(group.dev_by_lr[3e-2])
    assert group.at_edge and group.selection.trials == [0, 1]
    # test 0.4, 0.5: mean 0.45, sd 0.0707, half-width t(1) * sd / sqrt(2) = 12.706 * 0.05
    mean, half, n = group.stats["test"]
    assert (mean, n) == (pytest.approx(0.45), 2) and half == pytest.approx(T_975_1 * 0.05, rel=1e-6)
    assert group.by_lr["test"] == pytest.approx({1e-3: 0.45, 1e-2: 0.1, 3e-2: 99.0})
    assert group.values["test"] == {0: 0.4, 1: 0.5}


def test_lower_is_better_and_an_inner_lr_is_not_at_the_edge():
    layout = Layout(dev=lambda r: r["dev_ppl"], lower_is_better=True, metrics=fields("test_ppl"))
    runs = [{"method": "none", "lr": lr, "dev_ppl": d, "test_ppl": t} for lr, d, t in [
        (1e-4, 30.0, 1.0), (1e-2, 20.0, 2.0), (1e-3, 20.0, 25.0), (1e-1, math.inf, 0.5)
    ]]  # fmt: skip
    group = summarize_groups(runs, layout)[(), "none"]
    assert group.lr == 1e-3 and not group.at_edge  # the lowest dev, tie to the smaller; test never chooses
    assert group.stats["test_ppl"] == MeanCI(25.0, 0.0, 1)  # one run: no interval
    assert list(group.runs) == [None]  # records without a trial field: one trial, None


def test_selection_averages_the_trials_every_lr_has_and_reports_every_trial_at_the_lr():
    grid = {1e-3: [(0.9, 10.0), (0.1, 20.0), (0.1, 30.0)], 1e-2: [(0.8, 90.0)]}
    group = summarize_groups(_runs("dwatt", 8, grid), FEW_SHOT)[8, "dwatt"]
    assert group.lr == 1e-3 and group.selection.trials == [0]  # 0.9 > 0.8 on trial 0 (else 0.37 < 0.8)
    # 10, 20, 30: mean 20, sd 10, half-width t(2) * 10 / sqrt(3)
    assert group.stats["test"] == (20.0, pytest.approx(T_975_2 * 10 / 3**0.5, rel=1e-6), 3)


def test_one_run_per_lr_and_trial_the_first():
    runs = _runs("dwatt", 8, {1e-3: [(0.5, 40.0)]}) + _runs("dwatt", 8, {1e-3: [(0.9, 99.0)]})
    group = summarize_groups(runs, FEW_SHOT)[8, "dwatt"]
    assert group.stats["test"] == MeanCI(40.0, 0.0, 1) and group.values["dev"] == {0: 0.5}


def test_a_missing_metric_is_none_and_runs_at_one_lr_need_no_dev_score():
    runs = [{"method": "m", "seed": s, "bleu": b} for s, b in [(0, 1.0), (1, 3.0)]] + [
        {"method": "n", "seed": 0, "bleu": None}
    ]
    groups = summarize_groups(runs, Layout(trial="seed", metrics=fields("bleu")))
    assert groups[(), "m"].stats["bleu"] == (2.0, pytest.approx(T_975_1 * 1.0, rel=1e-6), 2)
    assert groups[(), "n"].stats["bleu"] is None and groups[(), "n"].by_lr["bleu"] == {None: None}
    assert groups[(), "m"].dev_by_lr == {} and groups[(), "m"].lr is None
    two_lrs = [{"method": "m", "lr": lr} for lr in (1e-3, 1e-2)]
    with pytest.raises(ValueError, match=r"LRs \[0.001, 0.01\] and no dev score"):
        summarize_groups(two_lrs, Layout(metrics=fields("bleu")))


def test_paired_differences_take_each_method_at_its_own_lr_over_shared_trials():
    base = _runs("none", 8, {1e-3: [(0.5, 10.0), (0.5, 20.0), (0.5, 30.0)]})
    # x selects 1e-2 (dev 0.9): test 12, 21, 33 (+ a trial the base lacks); at 1e-3 it would be 0, 0
    own = _runs("x", 8, {1e-2: [(0.9, 12.0), (0.9, 21.0), (0.9, 33.0), (0.9, 99.0)], 1e-3: [(0.1, 0.0)] * 2})
    alone = _runs("x", 32, {1e-3: [(0.5, 50.0)]})  # no base at 32: no pair
    groups = summarize_groups(base + own + alone, FEW_SHOT)
    (paired,) = paired_by_trial(groups, [("x", "none"), ("none", "absent")], "test")
    # differences 2, 1, 3: mean 2, sd 1, half-width t(2) / sqrt(3)
    assert (paired.setting, paired.first, paired.second) == (8, "x", "none")
    assert paired.difference == (2.0, pytest.approx(T_975_2 / 3**0.5, rel=1e-6), 3)
    by_group = paired_by_trial(
        groups, [("x", "none")], lambda group: "dev" if group.method == "x" else "test"
    )
    assert by_group[0].difference.mean == pytest.approx(0.9 - 20.0)  # each group's own metric
