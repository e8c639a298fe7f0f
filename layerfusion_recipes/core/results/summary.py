"""One summariser for every task: run records grouped into cells, the LR of each selected on dev, the
test metrics over trials at that LR, and the paired per-trial differences between methods.

A *group* is (setting, method): the setting is the cell without its method (NER and ``classify``:
setup, regime, max epochs, shots; the masked LM: the regime; seq2seq: none). Its runs are one per
(LR, trial), the first of each (:func:`~layerfusion_recipes.core.results.selection.runs_by_lr`). Its LR is
the one with the best mean dev score over the trials every LR has, ties to the smaller, NaN last
(:func:`~layerfusion_recipes.core.results.selection.select_lr`); runs already at one LR need no dev score.
At that LR each metric is the mean ± 95% t-CI over trials
(:func:`~layerfusion_recipes.core.results.stats.mean_ci`)
and two methods of one setting are compared by :func:`~layerfusion_recipes.core.results.stats.paired_mean_ci`
over the trials both have. The tasks' summaries are thin adapters: ``layerfusion plot``'s
``summarize`` and ``paired_differences``, ``layerfusion mlm``'s ``summarize`` (one grid) and
``layerfusion seq2seq``'s (methods over seeds, paired to the plain model).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .selection import Score, Selection, runs_by_lr, select_lr
from .stats import PairedDifference, mean_ci, paired_mean_ci

Record = dict[str, Any]
Value = Callable[[Record], Any]


def _no_setting(record: Record) -> tuple:
    return ()


def fields(*names: str) -> dict[str, Value]:
    """Metrics read from record fields of these names (``None`` where a record has none).

    Example:
        >>> fields("dev_ppl", "test_ppl")["test_ppl"]({"test_ppl": 21.5})
        21.5
    """
    return {name: (lambda record, name=name: record.get(name)) for name in names}


@dataclass(frozen=True)
class Layout:
    """How to read a task's run records.

    Args:
        setting: The cell of a record without its method, e.g. ``(setup, regime, epochs, shots)``;
            default: one setting, ``()``.
        method: The field naming a record's method.
        trial: The field of its trial or seed (missing: trial ``None``).
        lr: The field of its LR (missing: LR ``None``).
        dev: Its dev score (a number, or a tuple compared in order); ``None`` when each group's runs
            are at one LR already (nothing to select).
        lower_is_better: For ``dev`` (a perplexity, a loss).
        metrics: Name -> a record's value (``None`` where it has none), e.g. :func:`fields`.

    Example:
        >>> layout = Layout(dev=lambda r: r["dev_ppl"], lower_is_better=True, metrics=fields("test_ppl"))
        >>> layout.dev({"dev_ppl": 20.5}), sorted(layout.metrics)
        (20.5, ['test_ppl'])
    """

    setting: Callable[[Record], Hashable] = _no_setting
    method: str = "method"
    trial: str = "trial"
    lr: str = "lr"
    dev: Callable[[Record], Score] | None = None
    lower_is_better: bool = False
    metrics: Mapping[str, Value] = field(default_factory=dict)


class MeanCI(NamedTuple):
    """Mean and 95% t half-width over ``n`` trials."""

    mean: float
    half_width: float
    n: int


@dataclass(frozen=True)
class GroupSummary:
    """One (setting, method) group at the LR selected on dev.

    Args:
        setting: The group's setting (:attr:`Layout.setting`).
        method: Its method.
        selection: The LR selected, the grid (ascending), the mean dev score per LR and the trials
            it averaged over (:class:`~layerfusion_recipes.core.results.selection.Selection`).
        runs: The runs at the selected LR by trial, in record order.
        values: Per metric, each trial's value at the selected LR (what :func:`paired_by_trial` pairs).
        stats: Per metric, mean ± CI over those trials (``None`` where one has no value).
        by_lr: Per metric and LR, the mean over that LR's runs (``None`` where one has no value).
    """

    setting: Hashable
    method: str
    selection: Selection
    runs: dict[Any, Record]
    values: dict[str, dict[Any, Any]]
    stats: dict[str, MeanCI | None]
    by_lr: dict[str, dict[float | None, float | None]]

    @property
    def lr(self) -> float | None:
        """The LR selected on dev."""
        return self.selection.lr

    @property
    def lrs(self) -> list[float | None]:
        """The grid, ascending."""
        return self.selection.lrs

    @property
    def dev_by_lr(self) -> dict[float | None, Any]:
        """The mean dev score of each LR over the selection trials (empty: nothing selected)."""
        return self.selection.dev_means

    @property
    def at_edge(self) -> bool:
        """Whether the selected LR is the smallest or largest of a grid of 2+ (widen the grid)."""
        return self.selection.at_edge


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of ``values``; ``None`` when one is missing."""
    return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]


def _mean_ci(values: Sequence[float | None]) -> MeanCI | None:
    """:func:`~layerfusion_recipes.core.results.stats.mean_ci` of ``values`` with their count; ``None`` when
    one is missing or there are none."""
    if not values or any(v is None for v in values):
        return None
    return MeanCI(*mean_ci(values), len(values))  # type: ignore[arg-type]


def summarize_group(
    setting: Hashable, method: str, records: Sequence[Record], layout: Layout
) -> GroupSummary:
    """The summary of one group's records (see the module docstring).

    Example:
        >>> runs = [{"lr": lr, "trial": 0, "dev": d, "test": t} for lr, d, t in [(1e-3, 5, 4), (1e-2, 6, 3)]]
        >>> summarize_group((), "dwatt", runs, Layout(dev=lambda r: r["dev"], metrics=fields("test"))).lr
        0.01
    """
    selection = select_lr(records, layout.dev, layout.lower_is_better, layout.lr, layout.trial)
    grid = runs_by_lr(records, layout.lr, layout.trial)
    runs = grid[selection.lr]  # {trial: run}
    values = {
        name: {trial: value(run) for trial, run in runs.items()} for name, value in layout.metrics.items()
    }
    stats = {name: _mean_ci(list(by_trial.values())) for name, by_trial in values.items()}
    by_lr = {
        name: {lr: _mean([value(run) for run in grid[lr].values()]) for lr in selection.lrs}
        for name, value in layout.metrics.items()
    }
    return GroupSummary(setting, method, selection, runs, values, stats, by_lr)


def summarize_groups(records: Sequence[Record], layout: Layout) -> dict[tuple, GroupSummary]:
    """Every (setting, method) group of ``records``, in the order they first appear, summarised.

    Args:
        records: Run records of one or more groups.
        layout: How to read them.

    Returns:
        ``{(setting, method): GroupSummary}``.

    Example:
        >>> layout = Layout(trial="seed", metrics=fields("bleu"))  # runs at one LR: nothing to select
        >>> runs = [{"method": "m", "seed": s, "bleu": b} for s, b in [(0, 1.0), (1, 3.0)]]
        >>> groups = summarize_groups(runs, layout)
        >>> groups[(), "m"].stats["bleu"]
        MeanCI(mean=2.0, half_width=12.706..., n=2)
    """
    grouped: dict[tuple, list[Record]] = defaultdict(list)
    for record in records:
        grouped[layout.setting(record), record[layout.method]].append(record)
    return {key: summarize_group(*key, runs, layout) for key, runs in grouped.items()}


class Paired(NamedTuple):
    """``first - second`` in one setting: their
    :class:`~layerfusion_recipes.core.results.stats.PairedDifference`."""

    setting: Hashable
    first: str
    second: str
    difference: PairedDifference


def paired_by_trial(
    groups: Mapping[tuple, GroupSummary],
    pairs: Sequence[tuple[str, str]],
    metric: str | Callable[[GroupSummary], str],
) -> list[Paired]:
    """Per setting (in the groups' order) and pair ``(first, second)`` of methods that both have it:
    the per-trial differences of ``metric`` at each method's own selected LR, mean ± 95% t-CI over the
    trials both have (:func:`~layerfusion_recipes.core.results.stats.paired_mean_ci`).

    Args:
        groups: :func:`summarize_groups`'s.
        pairs: The method pairs, in the order wanted.
        metric: A metric of the layout, or a group's metric (e.g. test where it has test scores).

    Example:
        >>> layout = Layout(dev=lambda r: r["dev"], trial="seed", metrics=fields("exact_match"))
        >>> runs = [
        ...     {"method": m, "seed": s, "lr": 1e-3, "dev": 1.0, "exact_match": v}
        ...     for m, s, v in [("x", 0, 3.0), ("x", 1, 4.0), ("x", 2, 5.0)]
        ...     + [("none", s, 2.0) for s in range(3)]
        ... ]
        >>> groups = summarize_groups(runs, layout)
        >>> paired_by_trial(groups, [("x", "none")], "exact_match")[0].difference
        PairedDifference(mean=2.0, half_width=2.48..., n=3)
    """
    name = metric if callable(metric) else (lambda group: metric)
    out = []
    for setting in dict.fromkeys(setting for setting, _ in groups):
        for first, second in pairs:
            a, b = groups.get((setting, first)), groups.get((setting, second))
            if a is None or b is None:
                continue
            difference = paired_mean_ci(a.values[name(a)], b.values[name(b)])
            if difference is not None:
                out.append(Paired(setting, first, second, difference))
    return out
