"""Summary statistics of trials: mean and t-distribution confidence interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as _scipy_stats


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the ``confidence`` interval (Student t, ``n - 1`` dof).

    The half-width is 0 for a single value.

    Example:
        >>> mean_ci([1.0, 2.0, 3.0])  # (2.0, 2.484...)
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def excludes_zero(mean: float, half_width: float, n: int) -> bool:
    """Whether a difference's interval ``mean ± half_width`` over ``n`` pairs excludes 0 (the tables'
    bold, "resolved"); one pair has no interval, so never.

    Example:
        >>> excludes_zero(-5.5, 1.2, 3), excludes_zero(2.0, 3.0, 3), excludes_zero(2.0, 0.0, 1)
        (True, False, False)
    """
    return n > 1 and abs(mean) > half_width
