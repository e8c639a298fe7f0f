"""NER training: AdamW, LR linear from max to zero, dev F1 per epoch, test F1 at the best dev epoch.

The optimisation core is :class:`~layerfusion_recipes.core.loop.TrainingLoop` (device and mixed precision
from accelerate, but one run is trained by one process: no data parallelism, the full batch): under
``accelerate launch -m layerfusion_recipes.cli ner ...`` the processes share out the sweep's runs
(:mod:`layerfusion_recipes.core.processes`), and a run's numbers do not depend on how many there are.
On one CPU it is a plain torch loop.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from peft_layerfusion.layer import fused_positions
from peft_layerfusion.utils import eval_mode

from ..core.feature_cache import FeatureCache
from ..core.loop import TrainingLoop, restore, snapshot
from ..core.models import trainable_parameters
from ..data.readers import IGNORE_INDEX, collate
from .scoring import SpanScorer, labelled_predictions


@dataclass
class TrainSettings:
    """Optimisation settings of one run.

    Args:
        epochs: Max epochs; the LR decays linearly from ``lr`` to zero over them.
        lr: Max learning rate of AdamW.
        batch_size: Sentences per step (16 for NER in the paper).
        eval_every: Evaluate on dev every ``k`` epochs (and after the last one).
        weight_decay: AdamW weight decay.
        seed: Seed of the shuffling and of dropout (the model's init is seeded by the caller).
        eval_batch_size: Sentences per evaluation batch.

    Raises:
        ValueError: ``epochs``, ``batch_size``, ``eval_every`` or ``eval_batch_size`` below 1.
    """

    epochs: int = 20
    lr: float = 1e-3
    batch_size: int = 16
    eval_every: int = 1
    weight_decay: float = 0.0
    seed: int = 0
    eval_batch_size: int = 64

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainSettings.{name} must be an integer >= 1, got {value!r}")


@dataclass
class RunResult:
    """Best dev score, its epoch, the curve ``[{"epoch", "step", "dev_f1"}, ...]`` and the test
    score of the best dev epoch's checkpoint (``test_f1``; ``None`` without a test split)."""

    best_f1: float
    best_epoch: int
    curve: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    test_f1: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class TokenClassifierRunner:
    """Forward passes of a token classifier, through a feature cache or not.

    Only the labelled positions (first sub-words) are read, by the loss and by seqeval, so
    token-wise fusion modules run on those alone (:func:`~peft_layerfusion.fused_positions`):
    same numbers there, about a quarter of the fusion work on CoNLL-2003.

    Args:
        model: The model (already wrapped by its regime).
        located: Its encoder blocks (needed with ``cache``).
        cache: A :class:`FeatureCache` of the same frozen encoder, or ``None``.
    """

    def __init__(self, model: nn.Module, located=None, cache: FeatureCache | None = None) -> None:
        self.model, self.located, self.cache = model, located, cache

    def logits(self, features: Sequence[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(batch, seq, labels)`` logits and ``(batch, seq)`` labels of a list of features."""
        batch = {k: v.to(device) for k, v in collate(features).items()}
        replay = (
            self.cache.replay(self.located, self.cache.batch_states(features))
            if self.cache
            else nullcontext()
        )
        with replay, fused_positions(self.model, batch["labels"] != IGNORE_INDEX):
            logits = self.forward(batch)
        return logits, batch["labels"]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's ``(batch, seq, labels)`` logits of a collated batch (replay already set up)."""
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    # What the one training loop (:func:`fit`) asks of a runner: its candidates' parameters, their
    # loss and their scores. One candidate here; ``candidates.StackedRunner`` trains K together.
    def candidate_parameters(self) -> list[list[nn.Parameter]]:
        """The trainable parameters of each candidate (one: the model's), before the optimizer exists."""
        return [trainable_parameters(self.model)]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``(batch, seq, labels)`` logits at the labelled positions."""
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)

    def scores(self, scorer: SpanScorer, predicted: torch.Tensor) -> list[float]:
        """Micro-F1 of each candidate's predictions (:func:`predict_labelled`)."""
        return [scorer.f1(predicted)]


@torch.no_grad()
def predict_labelled(
    runner: TokenClassifierRunner, features: Sequence[dict], batch_size: int, device: torch.device
) -> torch.Tensor:
    """Label ids ``runner`` predicts at the labelled positions of ``features`` (eval mode during the
    call), sentence after sentence: ``(positions,)``, or ``(K, positions)`` for a runner whose
    logits have a leading candidate dimension.

    Example:
        >>> predict_labelled(runner, dev, 64, torch.device("cpu"))  # tensor([0, 3, 0, ...])
    """
    predicted = []
    with eval_mode(runner.model):
        for start in range(0, len(features), batch_size):
            logits, labels = runner.logits(features[start : start + batch_size], device)
            predicted.append(labelled_predictions(logits, labels))  # (..., batch positions)
    return torch.cat(predicted, dim=-1)


def evaluate(
    runner: TokenClassifierRunner,
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
        >>> evaluate(TokenClassifierRunner(model), dev, id2label, 64, torch.device("cpu"))  # [0.42]
    """
    scorer = scorer or SpanScorer(features, id2label)
    return runner.scores(scorer, predict_labelled(runner, features, batch_size, device))


def evaluate_f1(
    runner: TokenClassifierRunner, features: Sequence[dict], id2label: dict[int, str], batch_size: int, device
) -> float:
    """Micro-F1 of a lone runner's model (:func:`evaluate`'s one score).

    Example:
        >>> evaluate_f1(TokenClassifierRunner(model), dev, id2label, 64, torch.device("cpu"))  # 0.42
    """
    (f1,) = evaluate(runner, features, id2label, batch_size, device)
    return f1


def shuffled_batches(size: int, settings: TrainSettings) -> DataLoader:
    """Index batches of a training set of ``size`` sentences, shuffled each epoch from ``settings.seed``."""
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


def train_token_classifier(
    runner: TokenClassifierRunner,
    train: Sequence[dict],
    dev: Sequence[dict],
    id2label: dict[int, str],
    settings: TrainSettings,
    on_epoch: Callable[[int], None] | None = None,
    test: Sequence[dict] | None = None,
) -> RunResult:
    """Train ``runner.model`` on ``train``; dev F1 every ``eval_every`` epochs; best score kept.

    Frozen sub-trees of the model (e.g. the encoder in FE) stay in eval mode (no dropout).
    With ``test``, the trainable parameters of the best dev epoch (the first, on ties) are kept
    and scored on ``test`` after training (``RunResult.test_f1``); the model then ends in that
    best-dev-epoch state. Without it, the model ends in its last state.

    Args:
        runner: Model (+ optional feature cache).
        train: Encoded training sentences (see ``data.encode_ner``).
        dev: Encoded dev sentences.
        id2label: Label names.
        settings: See :class:`TrainSettings`.
        on_epoch: Called with the epoch number after each epoch (tests, progress).
        test: Encoded test sentences, scored at the best dev epoch (``None``: no test score).

    Example:
        >>> runner = TokenClassifierRunner(model)
        >>> result = train_token_classifier(runner, train, dev, id2label, TrainSettings())
        >>> result.best_f1, result.curve[-1]
    """
    return fit(runner, train, dev, id2label, settings, [settings.lr], test, on_epoch)[0]


def fit(
    runner: TokenClassifierRunner,
    train: Sequence[dict],
    dev: Sequence[dict],
    id2label: dict[int, str],
    settings: TrainSettings,
    lrs: Sequence[float],
    test: Sequence[dict] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> list[RunResult]:
    """The one NER training loop: each candidate of ``runner`` at its max LR ``lrs[k]`` (one for a
    :class:`TokenClassifierRunner`, K for a stacked one), dev F1 every ``eval_every`` epochs, the
    best dev epoch's parameters kept and scored on ``test``.

    Returns:
        One :class:`RunResult` per candidate; ``seconds`` is the time of the whole pass.

    Example:
        >>> fit(TokenClassifierRunner(model), train, dev, id2label, TrainSettings(), [1e-3])[0].best_f1
    """
    start = time.perf_counter()
    loader = shuffled_batches(len(train), settings)
    candidates = runner.candidate_parameters()  # (a stacked runner moves them to the device first)
    if len(lrs) != len(candidates):
        raise ValueError(f"lrs has {len(lrs)} values for {len(candidates)} candidates")
    groups = [{"params": params, "lr": lr} for params, lr in zip(candidates, lrs, strict=True)]
    # one seed: the dropout draws of a lone run, shared by every candidate
    loop = TrainingLoop(
        runner.model, groups, settings.epochs * len(loader), settings.seed, settings.weight_decay
    )
    runner = copy.copy(runner)
    runner.model = loop.model
    scorer = SpanScorer(dev, id2label)
    results = [RunResult(best_f1=-1.0, best_epoch=0) for _ in lrs]
    best_states: list[list[torch.Tensor] | None] = [None] * len(lrs)
    for epoch in range(1, settings.epochs + 1):
        for indices in loader:
            loop.step(runner.loss(*runner.logits([train[i] for i in indices], loop.device)))
        if evaluates_at(epoch, settings):
            scores = evaluate(runner, dev, id2label, settings.eval_batch_size, loop.device, scorer)
            for k, (result, f1) in enumerate(zip(results, scores, strict=True)):
                result.curve.append({"epoch": epoch, "step": loop.steps, "dev_f1": f1})
                if f1 > result.best_f1:
                    result.best_f1, result.best_epoch = f1, epoch
                    best_states[k] = snapshot(candidates[k]) if test else None
        if on_epoch is not None:
            on_epoch(epoch)
    if test:
        for parameters, saved in zip(candidates, best_states, strict=True):
            if saved is not None:
                restore(parameters, saved)
        scores = evaluate(runner, test, id2label, settings.eval_batch_size, loop.device)
        for result, f1 in zip(results, scores, strict=True):
            result.test_f1 = f1
    seconds = time.perf_counter() - start
    for result in results:
        result.seconds = seconds
    return results
