"""Accuracy and macro-F1 of predicted label ids, ``K`` prediction sets at once.

Macro-F1 is the unweighted mean of the per-class F1 over the classes present in the gold labels or
in the predictions (``sklearn.metrics.f1_score(average="macro")``'s default), a class F1 being 0
when it has no true positive (``zero_division=0``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peft_layerfusion.few_shot import Accuracy

METRICS = ("accuracy", "macro_f1")


class ClassScorer:
    """The scores of predictions on one split's examples
    (a :class:`~layerfusion_recipes.core.engine.fitting.Scorer`).

    Args:
        features: Encoded examples, each with one label id (``labels``), in the order predicted.
        num_labels: Classes (ids ``0..C-1``).
        metric: The metric that chooses (listed first in :attr:`metrics`): ``accuracy`` or ``macro_f1``.

    Example:
        >>> dev = [{"labels": 0}, {"labels": 1}, {"labels": 1}]  # encoded examples: their gold label
        >>> scorer = ClassScorer(dev, num_labels=2)
        >>> scorer.scores(torch.tensor([[0, 1, 1], [1, 1, 1]]))  # two candidates
        [{'accuracy': 1.0, 'macro_f1': 1.0}, {'accuracy': 0.666..., 'macro_f1': 0.4}]
    """

    def __init__(self, features: Sequence[dict], num_labels: int, metric: str = "accuracy") -> None:
        if metric not in METRICS:
            raise ValueError(f"--metric {metric!r}: allowed {', '.join(METRICS)}")
        self.metrics = (metric, *(name for name in METRICS if name != metric))
        self.gold = torch.tensor([feature["labels"] for feature in features], dtype=torch.long)  # (N,)
        self.num_labels = num_labels

    def scores(self, predicted: torch.Tensor) -> list[dict[str, float]]:
        """Accuracy and macro-F1 (0..1) of each row of ``predicted`` ``(K, N)``."""
        predicted = predicted.to("cpu", torch.long)
        if predicted.dim() != 2 or predicted.shape[1] != len(self.gold):
            raise ValueError(
                f"predicted must be (candidates, {len(self.gold)}) label ids, "
                f"got shape {tuple(predicted.shape)}"
            )
        gold = self.gold.expand_as(predicted)  # (K, N)
        accuracy = (predicted == gold).double().mean(1)  # (K,)
        classes = torch.arange(self.num_labels).view(1, -1, 1)  # (1, C, 1)
        is_gold, is_predicted = gold.unsqueeze(1) == classes, predicted.unsqueeze(1) == classes  # (K, C, N)
        true_positive = (is_gold & is_predicted).sum(2).double()  # (K, C)
        gold_count, predicted_count = is_gold.sum(2).double(), is_predicted.sum(2).double()
        f1 = torch.where(true_positive > 0, 2 * true_positive / (gold_count + predicted_count), 0.0)  # (K, C)
        present = (gold_count + predicted_count) > 0  # (K, C)
        macro = (f1 * present).sum(1) / present.sum(1).clamp(min=1)  # (K,)
        return [
            {
                name: float(value)
                for name, value in zip(self.metrics, _ordered(self.metrics, a, m), strict=True)
            }
            for a, m in zip(accuracy.tolist(), macro.tolist(), strict=True)
        ]


def _ordered(metrics: Sequence[str], accuracy: float, macro_f1: float) -> list[float]:
    values = {"accuracy": accuracy, "macro_f1": macro_f1}
    return [values[name] for name in metrics]


class ClassCounts:
    """Accuracy or macro-F1 as a per-example scorer of the true few-shot protocol
    (:class:`peft_layerfusion.few_shot.Scorer`): each example's ``(correct, 1)``, or its one-hot
    ``(true positive, gold, predicted)`` per class, so that any set of examples scores from their sum.

    Args:
        labels: ``(n,)`` class ids.
        num_labels: ``C``.
        metric: ``accuracy`` or ``macro_f1``.

    Example:
        >>> scorer = ClassCounts(torch.tensor([0, 1, 1]), 2, "macro_f1")
        >>> round(float(scorer.score(scorer.stats(torch.tensor([0, 1, 0])).sum(0))), 4)  # as ClassScorer
        0.6667
    """

    def __init__(self, labels: torch.Tensor, num_labels: int, metric: str = "accuracy") -> None:
        if metric not in METRICS:
            raise ValueError(f"--metric {metric!r}: allowed {', '.join(METRICS)}")
        self.labels, self.num_labels, self.metric = labels, num_labels, metric
        self.accuracy = Accuracy(labels, torch.arange(len(labels)))  # an example per unit

    def stats(self, predicted: torch.Tensor) -> torch.Tensor:
        if self.metric == "accuracy":
            return self.accuracy.stats(predicted)  # (n, 2): correct, 1
        gold = torch.nn.functional.one_hot(self.labels, self.num_labels).double()  # (n, C)
        guess = torch.nn.functional.one_hot(predicted, self.num_labels).double()
        return torch.cat([gold * guess, gold, guess], 1)  # (n, 3 C)

    def score(self, totals: torch.Tensor) -> torch.Tensor:
        if self.metric == "accuracy":
            return self.accuracy.score(totals)
        true_positive, gold, predicted = totals.unflatten(-1, (3, self.num_labels)).unbind(-2)
        f1 = torch.where(true_positive > 0, 2 * true_positive / (gold + predicted).clamp_min(1.0), 0.0)
        present = (gold + predicted) > 0
        return (f1 * present).sum(-1) / present.sum(-1).clamp(min=1)
