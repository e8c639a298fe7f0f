"""The one paired difference every table takes."""

from __future__ import annotations

import pytest

from layerfusion_recipes.core.results.stats import mean_ci, paired_mean_ci


def test_the_paired_difference_is_over_the_keys_both_have():
    own = {0: 60.0, 1: 70.0, 2: 50.0, 5: 99.0}
    base = {2: 45.0, 1: 61.0, 0: 52.0, 3: 1.0}
    difference = paired_mean_ci(own, base)
    assert difference.n == 3 and difference.mean == pytest.approx((8.0 + 9.0 + 5.0) / 3)
    assert difference.half_width == pytest.approx(mean_ci([8.0, 9.0, 5.0])[1])
    assert difference.resolved  # 7.33 ± 5.2 excludes 0
    assert not paired_mean_ci({0: 1.0, 1: 3.0}, {0: 2.0, 1: 2.0}).resolved  # 0 ± 12.7
    assert not paired_mean_ci({0: 3.0}, {0: 1.0}).resolved  # one pair: no interval
    assert paired_mean_ci({0: 1.0}, {1: 1.0}) is None
