"""Several learning rates of a NER cell trained together: one pass over the cached features for all
candidates (:class:`~layerfusion_recipes.core.runner.StackedRunner`, the shared loop
:func:`~layerfusion_recipes.core.fitting.fit`). One dev pass predicts for all candidates, and one
batched parse (:class:`~layerfusion_recipes.ner.scoring.SpanScorer`) scores them.

Each candidate is the run it would be alone (:func:`~layerfusion_recipes.ner.training.train_token_classifier`
with that LR); ``tests/recipes/ner/test_lr_selection.py`` checks the records against lone runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.fitting import evaluate, fit
from ..core.runner import StackedRunner as CoreStackedRunner
from ..core.runner import labelled_positions
from .scoring import SpanScorer
from .training import RunResult, TrainSettings, span_scorer


class StackedRunner(CoreStackedRunner):
    """A :class:`~layerfusion_recipes.ner.training.TokenClassifierRunner` whose forward runs ``K``
    parameter sets at once: ``logits`` returns ``(K, batch, seq, labels)`` logits (and the
    ``(batch, seq)`` labels).

    Args:
        model: The model (already wrapped by its regime); its trainable parameters give the
            names and the initial values of every candidate.
        count: ``K``, the number of candidates.
        located: Its encoder blocks (needed with ``cache``).
        cache: The feature cache (or ``None``: every candidate then also shares the encoder's
            forward, which does not depend on the trainable parameters only in FE).

    Example:
        >>> runner = StackedRunner(model, 4, located, cache)
        >>> logits, labels = runner.logits(batch_features, torch.device("cpu"))  # (4, batch, seq, C)
    """

    def __init__(self, model: torch.nn.Module, count: int, located=None, cache=None) -> None:
        super().__init__(model, count, located, cache, positions=labelled_positions)


def evaluate_candidates(
    runner: StackedRunner,
    features: Sequence[dict],
    id2label: dict[int, str],
    batch_size: int,
    device: torch.device,
    scorer: SpanScorer | None = None,
) -> list[float]:
    """Micro-F1 of every candidate of ``runner`` on ``features``, from one forward pass over them.

    Each score is :func:`~layerfusion_recipes.ner.training.evaluate_f1`'s (same batches, same
    predictions); all candidates are scored in one batched parse (:class:`SpanScorer`).

    Example:
        >>> evaluate_candidates(runner, dev, id2label, 64, torch.device("cpu"))  # [0.41, 0.55, ...]
    """
    scorer = scorer or SpanScorer(features, id2label)
    return [scores["f1"] for scores in evaluate(runner, features, scorer, batch_size, device)]


def train_candidates(
    runner: StackedRunner,
    train: Sequence[dict],
    dev: Sequence[dict],
    id2label: dict[int, str],
    settings: TrainSettings,
    lrs: Sequence[float],
    test: Sequence[dict] | None = None,
) -> list[RunResult]:
    """Train every candidate of ``runner`` with its own max LR (``lrs[k]``), in one pass.

    Equals ``K`` calls of :func:`~layerfusion_recipes.ner.training.train_token_classifier` with
    ``replace(settings, lr=lrs[k])`` on copies of the model. Each candidate ends in its
    best-dev-epoch state with ``test``, else in its last state.

    Args:
        runner: A :class:`StackedRunner` with ``len(lrs)`` candidates.
        train: Encoded training sentences.
        dev: Encoded dev sentences.
        id2label: Label names.
        settings: Everything but the LR (``settings.lr`` is ignored).
        lrs: One max LR per candidate.
        test: Encoded test sentences, scored at each candidate's best dev epoch.

    Returns:
        One :class:`RunResult` per candidate; ``seconds`` is the time of the whole pass.

    Example:
        >>> runner = StackedRunner(model, 4, located, cache)
        >>> results = train_candidates(runner, train, dev, id2label, TrainSettings(), [1e-3, 1e-2])
    """
    results = fit(runner, train, dev, settings, span_scorer(id2label), lrs=lrs, test=test)
    return [RunResult.of(result) for result in results]
