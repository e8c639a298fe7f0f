"""NER training: the shared loop (:func:`~layerfusion_recipes.core.engine.fitting.fit`) scored with seqeval's
micro-F1 (:class:`~layerfusion_recipes.ner.scoring.SpanScorer`), the loss read at the labelled
positions (the first sub-word of each word).

:func:`train_token_classifier` is one run, :func:`fit` one run per candidate of a runner (a
:class:`~layerfusion_recipes.ner.candidates.StackedRunner` trains several LRs in one pass on the
feature cache). Their results keep NER's names (``best_f1``, ``test_f1``, ``dev_f1`` in the curve).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.cache.feature_cache import FeatureCache
from ..core.engine import fitting
from ..core.engine.fitting import TrainSettings
from ..core.engine.runner import Runner, labelled_positions
from .scoring import SpanScorer

__all__ = ["RunResult", "TokenClassifierRunner", "TrainSettings", "evaluate", "evaluate_f1", "fit"]


@dataclass
class RunResult(fitting.RunResult):
    """A run's :class:`~layerfusion_recipes.core.engine.fitting.RunResult` under NER's names: ``best_f1``
    (best dev micro-F1), ``test_f1`` (test micro-F1 of the best dev epoch; ``None`` without a test
    split)."""

    @classmethod
    def of(cls, result: fitting.RunResult) -> RunResult:
        return cls(**vars(result))

    @property
    def best_f1(self) -> float:
        return self.best_score

    @property
    def test_f1(self) -> float | None:
        return None if self.test is None else self.test["f1"]

    def to_dict(self) -> dict[str, Any]:
        """The fields of a NER record: ``best_f1``, ``best_epoch``, ``curve``, ``seconds``, ``test_f1``."""
        return {
            "best_f1": self.best_f1,
            "best_epoch": self.best_epoch,
            "curve": self.curve,
            "seconds": self.seconds,
            "test_f1": self.test_f1,
        }


class TokenClassifierRunner(Runner):
    """A :class:`~layerfusion_recipes.core.engine.runner.Runner` of a token classifier: token-wise fusion runs
    on the labelled positions only (the loss and seqeval read nothing else; same numbers there, about
    a quarter of the fusion work on CoNLL-2003).

    Args:
        model: The model (already wrapped by its regime).
        located: Its encoder blocks (needed with ``cache``).
        cache: A :class:`FeatureCache` of the same frozen encoder, or ``None``.
    """

    def __init__(self, model: nn.Module, located=None, cache: FeatureCache | None = None) -> None:
        super().__init__(model, located, cache, positions=labelled_positions)


def span_scorer(id2label: dict[int, str]) -> Callable[[Sequence[dict]], SpanScorer]:
    """The scorer factory of :func:`~layerfusion_recipes.core.engine.fitting.fit` for NER splits."""
    return lambda features: SpanScorer(features, id2label)


def evaluate(
    runner: Runner,
    features: Sequence[dict],
    id2label: dict[int, str],
    batch_size: int,
    device: torch.device,
    scorer: SpanScorer | None = None,
) -> list[float]:
    """Micro-F1 of each candidate of ``runner`` (one for a lone runner, K for a stacked one) on
    ``features``, from one forward pass (eval mode during the call), against the full gold.

    Every word of every sentence is scored: words the model cannot see count as predicted ``O``.
    The number is seqeval's ``f1_score`` (:mod:`layerfusion_recipes.ner.scoring`); all candidates
    are scored in one batched parse. ``scorer``: a
    :class:`~layerfusion_recipes.ner.scoring.SpanScorer` of ``features`` (made once per run; built
    here if omitted).

    Example:
        >>> f1s = evaluate(TokenClassifierRunner(model), ner_dev, id2label, 64, torch.device("cpu"))
        >>> len(f1s)  # one micro-F1 per candidate: here the one model
        1
    """
    scorer = scorer or SpanScorer(features, id2label)
    return [scores["f1"] for scores in fitting.evaluate(runner, features, scorer, batch_size, device)]


def evaluate_f1(
    runner: Runner, features: Sequence[dict], id2label: dict[int, str], batch_size: int, device
) -> float:
    """Micro-F1 of a lone runner's model (:func:`evaluate`'s one score).

    Example:
        >>> f1 = evaluate_f1(TokenClassifierRunner(model), ner_dev, id2label, 64, torch.device("cpu"))
        >>> 0.0 <= f1 <= 100.0
        True
    """
    (f1,) = evaluate(runner, features, id2label, batch_size, device)
    return f1


def train_token_classifier(
    runner: TokenClassifierRunner,
    train: Sequence[dict],
    dev: Sequence[dict],
    id2label: dict[int, str],
    settings: TrainSettings,
    lr: float,
    on_epoch: Callable[[int], None] | None = None,
    test: Sequence[dict] | None = None,
) -> RunResult:
    """Train ``runner.model`` on ``train``; dev F1 every ``eval_every`` epochs; best score kept.

    With ``test``, the trainable parameters of the best dev epoch (the first, on ties) are scored on
    ``test`` (``RunResult.test_f1``) and the model ends in that state; without it, in its last state.

    Args:
        runner: Model (+ optional feature cache).
        train: Encoded training sentences (see ``data.encode_ner``).
        dev: Encoded dev sentences.
        id2label: Label names.
        settings: See :class:`TrainSettings`.
        lr: Max learning rate of AdamW (linear to zero over the run).
        on_epoch: Called with the epoch number after each epoch (tests, progress).
        test: Encoded test sentences, scored at the best dev epoch (``None``: no test score).

    Example:
        >>> from layerfusion_recipes.core.engine.fitting import TrainSettings
        >>> runner, settings = TokenClassifierRunner(model), TrainSettings(epochs=2)
        >>> result = train_token_classifier(runner, ner_train, ner_dev, id2label, settings, 1e-2)
        >>> len(result.curve), result.best_f1 >= 0.0
        (2, True)
    """
    return fit(runner, train, dev, id2label, settings, [lr], test, on_epoch)[0]


def fit(
    runner: Runner,
    train: Sequence[dict],
    dev: Sequence[dict],
    id2label: dict[int, str],
    settings: TrainSettings,
    lrs: Sequence[float],
    test: Sequence[dict] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> list[RunResult]:
    """The shared loop (:func:`~layerfusion_recipes.core.engine.fitting.fit`) scored with micro-F1: each
    candidate of ``runner`` at its max LR ``lrs[k]`` (one for a :class:`TokenClassifierRunner`, K for
    a stacked one).

    Returns:
        One :class:`RunResult` per candidate; ``seconds`` is the time of the whole pass.

    Example:
        >>> from layerfusion_recipes.core.engine.fitting import TrainSettings
        >>> settings = TrainSettings(epochs=2)
        >>> results = fit(TokenClassifierRunner(model), ner_train, ner_dev, id2label, settings, [1e-2])
        >>> len(results), len(results[0].curve)  # one result per LR (a StackedRunner trains several)
        (1, 2)
    """
    results = fitting.fit(runner, train, dev, settings, span_scorer(id2label), lrs, test, on_epoch)
    return [RunResult.of(result) for result in results]
