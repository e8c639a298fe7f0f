"""Summary statistics of trials: mean and t-distribution confidence interval, and the one paired
difference every table takes (:func:`paired_mean_ci`)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

from scipy import stats as _scipy_stats


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the ``confidence`` interval (Student t, ``n - 1`` dof).

    The half-width is 0 for a single value.

    Example:
        >>> mean_ci([1.0, 2.0, 3.0])  # the mean and the half-width of its 95% t interval
        (2.0, 2.484...)
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


class PairedDifference(NamedTuple):
    """Mean and ``confidence`` half-width of per-pair differences, over ``n`` pairs."""

    mean: float
    half_width: float
    n: int

    @property
    def resolved(self) -> bool:
        """Whether the interval excludes 0 (:func:`excludes_zero`)."""
        return excludes_zero(self.mean, self.half_width, self.n)


def paired_mean_ci(
    own: Mapping[Hashable, float], base: Mapping[Hashable, float], confidence: float = 0.95
) -> PairedDifference | None:
    """The paired difference ``own[k] - base[k]`` over the keys both have (trials, seeds), mean and
    Student-t half-width; ``None`` when they share none.

    Trials and seeds pair runs that saw the same sample or initialisation, so the difference is
    matched: the tables (``layerfusion plot``, ``layerfusion paired``, the MLM seeds and seq2seq
    summaries) all take it here.

    Example:
        >>> paired_mean_ci({0: 60.0, 1: 70.0, 2: 50.0}, {0: 50.0, 1: 60.0})
        PairedDifference(mean=10.0, half_width=0.0, n=2)
    """
    keys = sorted(set(own) & set(base))
    if not keys:
        return None
    return PairedDifference(*mean_ci([own[k] - base[k] for k in keys], confidence), len(keys))
