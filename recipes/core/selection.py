"""Learning-rate selection on dev, and the test score it reports.

A *cell* is (setup, method, regime, shots, max epochs); its records are one per (LR, trial).
The LR of a cell is the one with the highest mean over trials of each run's best-epoch dev F1
(ties to the smaller LR), over the trials that every LR of the cell has (all of them in a full
grid; the first ``select_trials`` with ``--select-trials``). The cell then reports, at that LR,
the test F1 of each run's best dev epoch (mean and 95% CI over its trials), with the best dev
F1 (the paper's optimistic number) beside it. A selected LR at the edge of a grid of two or
more is flagged: the best LR may lie outside it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CELL_FIELDS = ("setup", "regime", "epochs", "shots", "method")


def dev_f1(record: dict[str, Any]) -> float:
    """Best dev F1 of a record (``best_f1`` in files written before ``dev_f1`` existed)."""
    return record["dev_f1"] if "dev_f1" in record else record["best_f1"]


def cell_of(record: dict[str, Any]) -> tuple:
    """The cell a record belongs to: its :data:`CELL_FIELDS` (``setup`` "" in older files)."""
    return (record.get("setup", ""), record["regime"], record["epochs"], record["shots"], record["method"])


@dataclass
class Selection:
    """The LR chosen for one cell.

    Args:
        lr: The selected LR (``None`` for records without an ``lr``).
        lrs: Every LR the cell's records have, ascending.
        dev_means: Mean best dev F1 (0..1) per LR over the selection trials.
        trials: The trials the selection averaged over.
    """

    lr: float | None
    lrs: list[float | None]
    dev_means: dict[float | None, float]
    trials: list[int]

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


def select_lr(records: Sequence[dict[str, Any]]) -> Selection:
    """Select the LR of one cell's records (see the module docstring).

    Example:
        >>> runs = [{"lr": 1e-3, "trial": 0, "dev_f1": 0.2}, {"lr": 1e-2, "trial": 0, "dev_f1": 0.5}]
        >>> select_lr(runs).lr
        0.01
    """
    if not records:
        raise ValueError("select_lr needs at least one record")
    by_lr: dict[float | None, dict[int, float]] = defaultdict(dict)
    for record in records:
        by_lr[record.get("lr")].setdefault(record["trial"], dev_f1(record))
    lrs = sorted(by_lr, key=_lr_order)
    common = set.intersection(*(set(runs) for runs in by_lr.values()))
    dev_means = {}
    for lr in lrs:
        trials = [t for t in by_lr[lr] if t in common] or list(by_lr[lr])
        dev_means[lr] = sum(by_lr[lr][t] for t in trials) / len(trials)
    best = lrs[0]
    for lr in lrs[1:]:  # ascending: a tie keeps the smaller LR
        if dev_means[lr] > dev_means[best]:
            best = lr
    return Selection(best, lrs, dev_means, sorted(common) if common else sorted(by_lr[best]))


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Records grouped by :func:`cell_of`, one record per key (the first), in file order."""
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    seen: set[str] = set()
    for record in records:
        if record["key"] not in seen:
            seen.add(record["key"])
            grouped[cell_of(record)].append(record)
    return grouped
