"""One run of a few-shot task: AdamW, LR linear from max to zero, dev scores every k epochs, and the
test scores of the best dev epoch's checkpoint; one LR, or ``K`` LR candidates in one pass.

The optimisation core is :class:`~layerfusion_recipes.core.engine.loop.TrainingLoop` (device and mixed
precision from accelerate, but one run is trained by one process: no data parallelism, the full
batch): under ``accelerate launch`` the processes share out a sweep's runs
(:mod:`layerfusion_recipes.core.engine.processes`), and a run's numbers do not depend on how many there are.

:func:`fit` is the one loop of every task. What a task brings: its runner (which positions its loss
reads, its padding), and its :class:`Scorer` (seqeval micro-F1 for NER; accuracy and macro-F1 for a
classifier): the first metric a scorer names is the one that picks the best dev epoch. With a
:class:`~layerfusion_recipes.core.engine.runner.StackedRunner` every candidate is the run it would be alone
(same initial parameters, batches, dropout masks, loss per candidate, one AdamW param group per
candidate under the same linear schedule); ``tests/recipes/ner/test_lr_selection.py`` checks that.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from ..memory import release_freed_memory, resident_above
from ..options.grids import EVERY_EPOCH
from .loop import TrainingLoop, restore, snapshot
from .runner import Runner, Scorer, predict_labelled


@dataclass
class TrainSettings:
    """Optimisation settings of one run.

    Args:
        epochs: Max epochs; the LR decays linearly from its max (given to :func:`fit`, one per
            candidate) to zero over them.
        batch_size: Examples per step (16 for NER in the paper).
        eval_every: Evaluate on dev every ``k`` epochs (and after the last one).
        weight_decay: AdamW weight decay.
        seed: Seed of the shuffling and of dropout (the model's init is seeded by the caller).
        eval_batch_size: Examples per evaluation batch.
        release_above: Resident bytes above which the heap's freed pages are given back after a
            training step or evaluation batch too, not only after every epoch's steps and evaluation
            (:func:`~layerfusion_recipes.core.memory.resident_above`,
            :func:`~layerfusion_recipes.core.memory.release_freed_memory`): ``0``, after every one (set
            by ``--train-memory``); ``None``, never. A lower peak for more time (the next step faults
            the pages in again). Numbers do not change.

    Raises:
        ValueError: ``epochs``, ``batch_size``, ``eval_every`` or ``eval_batch_size`` below 1.
    """

    epochs: int = 20
    batch_size: int = 16
    eval_every: int = EVERY_EPOCH
    weight_decay: float = 0.0
    seed: int = 0
    eval_batch_size: int = 64
    release_above: int | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainSettings.{name} must be an integer >= 1, got {value!r}")


@dataclass
class RunResult:
    """One run's outcome.

    Args:
        metric: The metric that chose the best dev epoch (a scorer's first).
        best_score: Its best dev score (0..1; -1 before any evaluation).
        best_epoch: The epoch it was reached (the first, on ties).
        curve: ``[{"epoch", "step", "dev_METRIC", ...}]``, one entry per evaluation, every metric.
        seconds: Wall time of the run (of the whole pass for stacked candidates).
        dev: Every dev metric at the best epoch.
        test: Every test metric of the best dev epoch's checkpoint (``None`` without a test split).
    """

    metric: str
    best_score: float = -1.0
    best_epoch: int = 0
    curve: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    dev: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] | None = None

    def split_scores(self, metrics: Sequence[str]) -> dict[str, float | None]:
        """``dev_METRIC`` and ``test_METRIC`` of every metric (test ``None`` without a test split).

        Example:
            >>> RunResult("f1", 0.5, 2, dev={"f1": 0.5}, test={"f1": 0.4}).split_scores(["f1"])
            {'dev_f1': 0.5, 'test_f1': 0.4}
        """
        fields: dict[str, float | None] = {}
        for name in metrics:
            fields[f"dev_{name}"] = self.dev.get(name)
            fields[f"test_{name}"] = None if self.test is None else self.test[name]
        return fields


def lr_groups(params: Sequence[torch.Tensor], lr: float, scales: Sequence[float]) -> list[dict]:
    """AdamW parameter groups of one candidate: ``params`` at ``lr``, or split by their LR multiplier
    ``scales`` (one group per distinct multiplier, ``lr * multiplier``; one group when all are 1, as
    runs without a multiplier always had).

    Example:
        >>> [g["lr"] for g in lr_groups([torch.zeros(1), torch.zeros(2)], 0.01, [1.0, 10.0])]
        [0.01, 0.1]
    """
    grouped: dict[float, list[torch.Tensor]] = {}
    for param, scale in zip(params, scales, strict=True):
        grouped.setdefault(scale, []).append(param)
    return [{"params": group, "lr": lr * scale} for scale, group in grouped.items()]


def shuffled_batches(size: int, settings: TrainSettings) -> DataLoader:
    """Index batches of a training set of ``size`` examples, shuffled each epoch from ``settings.seed``."""
    return DataLoader(
        list(range(size)),
        batch_size=settings.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(settings.seed),
        collate_fn=lambda idx: idx,
    )


def evaluates_at(epoch: int, settings: TrainSettings) -> bool:
    """Whether dev is scored after ``epoch``: every ``eval_every`` epochs and after the last."""
    return epoch % settings.eval_every == 0 or epoch == settings.epochs


def evaluate(
    runner: Runner,
    features: Sequence[dict],
    scorer: Scorer,
    batch_size: int,
    device: torch.device,
    release_above: int | None = None,
) -> list[dict[str, float]]:
    """Every candidate's scores on ``features`` (one for a lone runner, K for a stacked one), from
    one forward pass (eval mode during the call); ``release_above``: see :func:`predict_labelled`.

    Example:
        >>> from layerfusion_recipes.ner.training import TokenClassifierRunner, span_scorer
        >>> scorer = span_scorer(id2label)(ner_dev)  # micro-F1 of the toy NER dev set
        >>> evaluate(TokenClassifierRunner(model), ner_dev, scorer, 64, torch.device("cpu"))
        [{'f1': ...}]
    """
    return runner.scores(scorer, predict_labelled(runner, features, batch_size, device, release_above))


def fit(
    runner: Runner,
    train: Sequence[dict],
    dev: Sequence[dict],
    settings: TrainSettings,
    scorer_of: Callable[[Sequence[dict]], Scorer],
    lrs: Sequence[float],
    test: Sequence[dict] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> list[RunResult]:
    """The one training loop of every few-shot task: each candidate of ``runner`` at its max LR
    ``lrs[k]`` (one for a :class:`~layerfusion_recipes.core.engine.runner.Runner`, K for a
    :class:`~layerfusion_recipes.core.engine.runner.StackedRunner`), dev scores every ``eval_every``
    epochs, the best dev epoch's parameters kept and scored on ``test``.

    Frozen sub-trees of the model (e.g. the encoder in FE) stay in eval mode (no dropout). With
    ``test``, the trainable parameters of the best dev epoch (the first, on ties) are scored on
    ``test`` after training; each candidate then ends in that state. Without it, in its last state.

    Args:
        runner: The runner; it supplies its candidates' parameters, their loss and their scores.
        train: Encoded training examples.
        dev: Encoded dev examples.
        settings: See :class:`TrainSettings`.
        scorer_of: Builds the :class:`~layerfusion_recipes.core.engine.runner.Scorer` of a split's examples.
        lrs: One max LR per candidate (``[lr]`` for a lone run).
        test: Encoded test examples, scored at each run's best dev epoch (``None``: no test score).
        on_epoch: Called with the epoch number after each epoch (tests, progress).

    Returns:
        One :class:`RunResult` per candidate; ``seconds`` is the time of the whole pass.

    Example:
        >>> from layerfusion_recipes.ner.training import TokenClassifierRunner, span_scorer
        >>> runner = TokenClassifierRunner(model)
        >>> [result] = fit(runner, ner_train, ner_dev, TrainSettings(epochs=2), span_scorer(id2label), [1e-2])
        >>> len(result.curve), result.best_score >= 0.0
        (2, True)
    """
    start = time.perf_counter()
    loader = shuffled_batches(len(train), settings)
    candidates = runner.candidate_parameters()  # (a stacked runner moves them to the device first)
    if len(lrs) != len(candidates):
        raise ValueError(f"lrs has {len(lrs)} values for {len(candidates)} candidates")
    scales = runner.lr_scales()  # the mixing parameters' LR multiplier (mixing_lr_multiplier), else 1
    groups = [
        group for params, lr in zip(candidates, lrs, strict=True) for group in lr_groups(params, lr, scales)
    ]
    # one seed: the dropout draws of a lone run, shared by every candidate
    loop = TrainingLoop(
        runner.model, groups, settings.epochs * len(loader), settings.seed, settings.weight_decay
    )
    runner = copy.copy(runner)
    runner.model = loop.model
    scorer = scorer_of(dev)
    results = [RunResult(scorer.metrics[0]) for _ in lrs]
    best_states: list[list[torch.Tensor] | None] = [None] * len(lrs)
    limit = settings.release_above  # trims after a step or evaluation batch above it too
    for epoch in range(1, settings.epochs + 1):
        for indices in loader:
            loop.step(runner.loss(*runner.logits([train[i] for i in indices], loop.device)))
            if resident_above(limit):  # what the step freed: the next one's tensors have other sizes
                release_freed_memory()
        release_freed_memory()  # what the epoch's steps freed, before an evaluation's tensors fill it
        if evaluates_at(epoch, settings):
            scores = evaluate(runner, dev, scorer, settings.eval_batch_size, loop.device, limit)
            for k, (result, score) in enumerate(zip(results, scores, strict=True)):
                result.curve.append({"epoch": epoch, "step": loop.steps, **_prefixed("dev", score)})
                if score[result.metric] > result.best_score:
                    result.best_score, result.best_epoch, result.dev = score[result.metric], epoch, score
                    best_states[k] = snapshot(candidates[k]) if test else None
        if on_epoch is not None:
            on_epoch(epoch)
    if test:
        for parameters, saved in zip(candidates, best_states, strict=True):
            if saved is not None:
                restore(parameters, saved)
        scores = evaluate(runner, test, scorer_of(test), settings.eval_batch_size, loop.device, limit)
        for result, score in zip(results, scores, strict=True):
            result.test = score
    release_freed_memory()
    seconds = time.perf_counter() - start
    for result in results:
        result.seconds = seconds
    return results


def _prefixed(split: str, scores: dict[str, float]) -> dict[str, float]:
    return {f"{split}_{name}": value for name, value in scores.items()}
