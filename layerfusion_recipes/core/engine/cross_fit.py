"""A trained fusion under the true few-shot protocol: its LR and epoch chosen by k-fold cross-validation on
the trial's training sample, then trained on the whole sample.

Per trial and method (:func:`cross_fit`), with the folds of the read-outs' cross-validation
(:func:`example_folds`, one fold per example: a sentence's tokens never split):

1. for each fold ``f``, the method trains on the other folds at every LR of its grid (stacked in one pass
   where they can) and is scored on fold ``f`` every ``eval_every`` epochs;
2. ``(LR, epoch)`` is the pair with the best mean score over the folds (ties: the middle of the
   plateau, :func:`_best`); where the LR sits on an end of the grid, the grid grows one step past it
   (the ratio of its two end values), :data:`GROW_STEPS` times at most, so that a choice is never on an
   edge only because the grid stopped there;
3. the method trains on the whole sample at that LR for that many epochs (its LR schedule over those
   epochs) and is scored once on test.

LayerMix and the other methods with ``start_layer`` start on the block the trial's selection chose
(:attr:`peft_layerfusion.few_shot.Trial.best_block`), as the large-dev protocol's ``--probe-start`` does.
No dev split is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from peft_layerfusion import few_shot

from ..results.cells import Cell
from .experiment import FewShotExperiment

GROW_STEPS = 2  # how many LRs a grid may grow past either end
REGIME = "fe"  # a trained fusion under the protocol reads the frozen model's states, as the read-outs


def example_folds(
    labels: torch.Tensor, example: torch.Tensor, count: int, folds: int, seed: int
) -> list[int]:
    """The fold of each of ``count`` examples: the folds :func:`peft_layerfusion.few_shot.choose` deals
    for the same rows and seed (one per unit: an example), ``-1`` for an example with no labelled row (it
    always trains).

    Args:
        labels: ``(rows,)`` the rows' class ids.
        example: ``(rows,)`` each row's example, ``0 .. count - 1``.
        count: The examples of the sample.
        folds: ``k``.
        seed: The trial's seed of the folds.

    Example:
        >>> example_folds(torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 2, 3]), 5, folds=2, seed=0)
        [0, 1, 1, 0, -1]
    """
    cv = few_shot.make_cv(labels, folds, seed, example)
    fold = [-1] * count
    for unit, index in enumerate(torch.unique(example).tolist()):
        fold[index] = int(cv.of_unit[unit])
    return fold


def _grown(lrs: Sequence[float], chosen: float) -> float | None:
    """The LR one step past the end of ``lrs`` (sorted) that ``chosen`` sits on; ``None`` inside."""
    if len(lrs) < 2 or lrs[0] < chosen < lrs[-1]:
        return None
    return lrs[0] * lrs[0] / lrs[1] if chosen == lrs[0] else lrs[-1] * lrs[-1] / lrs[-2]


def _best(scores: dict[tuple[float, int], list[float]]) -> tuple[float, int]:
    """The ``(lr, epoch)`` of the best mean fold score. A few held-out examples tie often: then the middle
    of the tied LRs, and the middle of that LR's tied epochs (the lower of two middles), never an end of
    a plateau only because it is an end.

    Example:
        >>> _best({(1e-3, 5): [0.5], (1e-2, 5): [0.5], (1e-1, 5): [0.5], (1e-2, 10): [0.5]})
        (0.01, 5)
        >>> _best({(1e-3, 5): [0.5, 0.75], (1e-2, 5): [0.5, 0.5]})
        (0.001, 5)
    """
    means = {key: sum(values) / len(values) for key, values in scores.items()}
    top = max(means.values())
    tied = sorted(key for key, mean in means.items() if mean >= top - 1e-12)  # (lr, epoch), ascending
    lrs = sorted({lr for lr, _ in tied})
    lr = lrs[(len(lrs) - 1) // 2]
    epochs = [epoch for rate, epoch in tied if rate == lr]
    return lr, epochs[(len(epochs) - 1) // 2]


def cross_fit(
    experiment: FewShotExperiment,
    method: str,
    sample: Sequence[dict],
    folds_of: Sequence[int],
    shots: int,
    trial: int,
    epochs: int,
    start_layer: int | None = None,
) -> dict[str, Any]:
    """``method`` on one trial: LR and epoch by cross-validation on ``sample``, then trained on all of it
    and scored on the experiment's test set.

    Args:
        experiment: The task's experiment (its ``test``; its dev split is never read).
        method: A trained method of the registry.
        sample: The trial's encoded training examples.
        folds_of: The fold of each example (:func:`example_folds`).
        shots: The trial's N (a record's cell).
        trial: The trial (its seed).
        epochs: The most epochs tried.
        start_layer: The block a method with ``start_layer`` starts on.

    Returns:
        ``{"lr", "epoch", "lr_grid", "lr_on_edge", "cv", "test"}``: the chosen pair, the LRs tried, whether
        the choice still sits on an end after the grid grew, its mean fold score and the test score.
    """
    lrs = sorted(experiment.settings.lr_grid(REGIME, method))
    cell = Cell(method, REGIME, shots, epochs, trial)
    count = max(folds_of) + 1
    scores: dict[tuple[float, int], list[float]] = {}

    def score_lrs(new: Sequence[float]) -> None:
        for fold in range(count):
            train = [e for e, f in zip(sample, folds_of, strict=True) if f != fold]
            held = [e for e, f in zip(sample, folds_of, strict=True) if f == fold]
            for lr, result in zip(
                new, experiment.fit_sample(cell, new, train, held, None, start_layer), strict=True
            ):
                for point in result.curve:  # {"epoch", "dev_<metric>", ...} every eval_every epochs
                    scores.setdefault((lr, point["epoch"]), []).append(point[f"dev_{result.metric}"])

    score_lrs(lrs)
    for _ in range(GROW_STEPS):
        grown = _grown(lrs, _best(scores)[0])
        if grown is None:
            break
        lrs = sorted([*lrs, grown])
        score_lrs([grown])
    lr, epoch = _best(scores)
    final = Cell(method, REGIME, shots, epoch, trial)
    [result] = experiment.fit_sample(
        final, [lr], sample, sample, experiment.test, start_layer, eval_every=epoch
    )
    return {
        "lr": lr,
        "epoch": epoch,
        "lr_grid": lrs,
        "lr_on_edge": _grown(lrs, lr) is not None,
        "cv": sum(scores[lr, epoch]) / len(scores[lr, epoch]),
        "test": result.test[result.metric],
    }
