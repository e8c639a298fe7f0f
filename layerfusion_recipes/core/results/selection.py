"""Learning-rate selection on dev, and the test score it reports: one rule for every task.

:func:`best_on_dev` is the rule (the best dev score, ties to the smaller LR, a diverged run last)
and :func:`select_then_repeat` the procedure (every LR on the first trial or seed, the LR selected
on dev, the other trials at it; test never chooses). The NER sweep runs the same procedure over
processes (``--select-trials``), ``layerfusion mlm`` over one seed and ``layerfusion seq2seq`` per
method over its seeds.

NER: a *cell* is (setup, method, regime, shots, max epochs); its records are one per (LR, trial).
The LR of a cell is the one with the highest mean over trials of each run's best-epoch dev F1
(ties to the smaller LR), over the trials that every LR of the cell has (all of them in a full
grid; the first ``select_trials`` with ``--select-trials``). The cell then reports, at that LR,
the test F1 of each run's best dev epoch (mean and 95% CI over its trials), with the best dev
F1 (the paper's optimistic number) beside it. A selected LR at the edge of a grid of two or
more is flagged: the best LR may lie outside it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CELL_FIELDS = ("setup", "regime", "epochs", "shots", "method")


def record_metric(record: dict[str, Any]) -> str:
    """The metric that selects a record's best epoch and LR: its ``metric`` field (``"accuracy"``,
    ``"macro_f1"`` for ``classify``), else ``"f1"`` (NER's micro-F1, whose records name none)."""
    return record.get("metric", "f1")


def dev_score(record: dict[str, Any], metric: str | None = None) -> float:
    """Best dev score of a record in ``metric`` (default: :func:`record_metric`): its ``dev_METRIC`` field.

    Example:
        >>> dev_score({"dev_f1": 0.5}), dev_score({"metric": "accuracy", "dev_accuracy": 0.8, "dev_f1": 0.1})
        (0.5, 0.8)
    """
    return record[f"dev_{metric or record_metric(record)}"]


DEV_SIZES = ("dev_examples", "dev_entities")  # what a dev score averages over: classify, NER


def dev_size(records: Sequence[dict[str, Any]]) -> int:
    """How many units the dev scores of ``records`` (one sweep's dev split) average over: their
    ``dev_examples`` (classification) or ``dev_entities`` (NER, gold entities).

    Example:
        >>> dev_size([{"dev_examples": 872}, {"dev_examples": 872}]), dev_size([{"dev_entities": 880}])
        (872, 880)
    """
    sizes = {record[name] for record in records for name in DEV_SIZES if name in record}
    if len(sizes) != 1:
        fields = ", ".join(DEV_SIZES)
        raise ValueError(f"one dev size expected over the records ({fields}), found {sorted(sizes)}")
    return sizes.pop()


def test_score(record: dict[str, Any], metric: str | None = None) -> float | None:
    """The test score of a record's best dev epoch in ``metric`` (default: :func:`record_metric`);
    ``None`` without one (no test split).

    Example:
        >>> test_score({"metric": "accuracy", "test_accuracy": 0.75, "test_macro_f1": 0.7}, "macro_f1")
        0.7
    """
    return record.get(f"test_{metric or record_metric(record)}")


def cell_of(record: dict[str, Any]) -> tuple:
    """The cell a record belongs to: its :data:`CELL_FIELDS`."""
    return tuple(record[field] for field in CELL_FIELDS)


@dataclass
class Selection:
    """The LR chosen for one cell.

    Args:
        lr: The selected LR (``None`` for records without an ``lr``).
        lrs: Every LR the cell's records have, ascending.
        dev_means: Mean dev score per LR over the selection trials (NER: best dev F1, 0..1); empty
            when nothing was selected on dev.
        trials: The trials the selection averaged over.
    """

    lr: float | None
    lrs: list[float | None]
    dev_means: dict[float | None, float]
    trials: list[Any]

    @property
    def at_edge(self) -> bool:
        """True when the grid has 2+ LRs and the selected one is its smallest or largest."""
        return at_grid_edge(self.lr, self.lrs)


def at_grid_edge(lr: float | None, lrs: Sequence[float | None]) -> bool:
    """Whether ``lr`` is the smallest or largest of ``lrs`` (ascending) and ``lrs`` has 2+ values.

    A selected LR there may not be the best: the best may lie outside the grid.

    Example:
        >>> at_grid_edge(1e-2, [1e-3, 3e-3, 1e-2]), at_grid_edge(3e-3, [1e-3, 3e-3, 1e-2])
        (True, False)
    """
    return len(lrs) > 1 and lr in (lrs[0], lrs[-1])


def _lr_order(lr: float | None) -> tuple[bool, float]:
    return (lr is None, lr or 0.0)


Score = float | tuple[float, ...]  # a dev score; a tuple is compared in order (e.g. exact match, then chrF)


def _rank(score: Score, lower_is_better: bool) -> Score:
    """``score`` as a rank to maximise: negated when lower is better, NaN (a diverged run) last."""
    if isinstance(score, tuple):
        return tuple(_rank(part, lower_is_better) for part in score)
    if math.isnan(score):
        return -math.inf
    return -score if lower_is_better else score


def best_on_dev(dev: Mapping[float | None, Score], lower_is_better: bool = False) -> float | None:
    """The LR with the best dev score; a tie goes to the smaller LR; NaN ranks last.

    Args:
        dev: The dev score of each LR (F1, a perplexity, a tuple of metrics).
        lower_is_better: True for a loss or a perplexity.

    Example:
        >>> best_on_dev({1e-3: 0.5, 3e-4: 0.5, 3e-3: 0.4}), best_on_dev({1e-3: 20.0, 3e-3: 25.0}, True)
        (0.0003, 0.001)
    """
    if not dev:
        raise ValueError("best_on_dev needs at least one LR")
    # max keeps the first of equals, and the LRs are ascending: a tie goes to the smaller
    return max(sorted(dev, key=_lr_order), key=lambda lr: _rank(dev[lr], lower_is_better))


def select_then_repeat(
    lrs: Sequence[float],
    seeds: Sequence[int],
    run: Callable[[float, int], dict[str, Any]],
    dev_score: Callable[[dict[str, Any]], Score],
    lower_is_better: bool = False,
) -> tuple[float, list[dict[str, Any]]]:
    """Every LR of the grid on the first seed, the LR selected on dev (:func:`best_on_dev`), then the
    other seeds at that LR only; a one-LR grid needs no dev score.

    Args:
        lrs: The grid.
        seeds: The trials; the first selects.
        run: One run's record (finished earlier or trained now: the caller resumes).
        dev_score: The dev score of a record.
        lower_is_better: As in :func:`best_on_dev`.

    Returns:
        ``(selected LR, records)``: the first seed's at each LR, then the other seeds'.

    Example:
        >>> def run(lr, seed):  # a run's record: here a dev F1 that peaks at 3e-3
        ...     return {"lr": lr, "seed": seed, "dev_f1": 50.0 if lr == 3e-3 else 40.0}
        >>> selected, records = select_then_repeat([1e-3, 3e-3], [0, 1], run, lambda r: r["dev_f1"])
        >>> selected, [(r["lr"], r["seed"]) for r in records]
        (0.003, [(0.001, 0), (0.003, 0), (0.003, 1)])
    """
    first = {lr: run(lr, seeds[0]) for lr in lrs}
    if len(lrs) == 1:
        selected = lrs[0]
    else:
        selected = best_on_dev({lr: dev_score(record) for lr, record in first.items()}, lower_is_better)
    return selected, [*first.values(), *(run(selected, seed) for seed in seeds[1:])]


def runs_by_lr(
    records: Sequence[dict[str, Any]], lr_field: str = "lr", trial_field: str = "trial"
) -> dict[float | None, dict[Any, dict[str, Any]]]:
    """The records by LR, then by trial: one run per (LR, trial), the first; the LRs ascending.

    A record without ``lr_field`` has the LR ``None`` (last), one without ``trial_field`` the trial ``None``.

    Example:
        >>> runs_by_lr([{"lr": 1e-2, "trial": 0}, {"lr": 1e-3, "trial": 0, "x": 1}, {"lr": 1e-3, "trial": 0}])
        {0.001: {0: {'lr': 0.001, 'trial': 0, 'x': 1}}, 0.01: {0: {'lr': 0.01, 'trial': 0}}}
    """
    grouped: dict[float | None, dict[Any, dict[str, Any]]] = defaultdict(dict)
    for record in records:
        grouped[record.get(lr_field)].setdefault(record.get(trial_field), record)
    return {lr: grouped[lr] for lr in sorted(grouped, key=_lr_order)}


def select_lr(
    records: Sequence[dict[str, Any]],
    dev: Callable[[dict[str, Any]], Score] | None = dev_score,
    lower_is_better: bool = False,
    lr_field: str = "lr",
    trial_field: str = "trial",
) -> Selection:
    """Select the LR of one cell's records (see the module docstring): the best mean dev score over
    the trials every LR has (:func:`best_on_dev`), one run per (LR, trial) (:func:`runs_by_lr`).

    Args:
        records: The cell's runs.
        dev: A run's dev score (default: :func:`dev_score`); ``None`` for runs at one LR (nothing to
            select: ``dev_means`` stays empty).
        lower_is_better: As in :func:`best_on_dev`.
        lr_field: The field of a run's LR.
        trial_field: The field of a run's trial (or seed).

    Example:
        >>> runs = [{"lr": 1e-3, "trial": 0, "dev_f1": 0.2}, {"lr": 1e-2, "trial": 0, "dev_f1": 0.5}]
        >>> select_lr(runs).lr
        0.01
    """
    if not records:
        raise ValueError("select_lr needs at least one record")
    by_lr = runs_by_lr(records, lr_field, trial_field)
    lrs = list(by_lr)
    common = set.intersection(*(set(runs) for runs in by_lr.values()))
    if dev is None:
        if len(lrs) > 1:
            raise ValueError(f"select_lr: LRs {lrs} and no dev score to select one of them by")
        return Selection(lrs[0], lrs, {}, sorted(common))
    dev_means = {}
    for lr in lrs:
        trials = [t for t in by_lr[lr] if t in common] or list(by_lr[lr])
        dev_means[lr] = sum(dev(by_lr[lr][t]) for t in trials) / len(trials)
    best = best_on_dev(dev_means, lower_is_better)
    return Selection(best, lrs, dev_means, sorted(common) if common else sorted(by_lr[best]))
