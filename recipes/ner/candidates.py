"""Several learning rates trained together: one pass over the cached features for all candidates.

On the feature-cache path the frozen encoder costs nothing per step, and the trainable part
(fusion module + head) of a few-shot run is small: a step is mostly fixed per-call overhead
(embeddings, hooks, padding, Python), not arithmetic. So the ``K`` LR candidates of a cell
share one forward: each candidate has its own copy of the trainable parameters, and
``torch.func.vmap`` over :func:`torch.func.functional_call` runs the model once with the
parameters stacked along a new leading dimension. Everything that does not depend on them
(embeddings, replayed block outputs, position selection) is computed once, unbatched; the
fusion module and the head run batched. One dev pass predicts for all candidates, and one
batched parse (:class:`~layerfusion_recipes.ner.scoring.SpanScorer`) scores them.

Each candidate is the run it would be alone (:func:`~layerfusion_recipes.ner.training.train_token_classifier`
with that LR): same initial parameters (copies of one built model), same batches (same
shuffling seed), same dropout masks (``randomness="same"`` draws one mask per call, exactly
as a lone run does, since the draws depend only on the seed and the shapes), the same loss per
candidate (the summed loss gives each candidate its own gradient) and one AdamW param group
per candidate under the same linear schedule. ``tests/test_lr_selection.py`` checks the records
against lone runs.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from ..core.loop import TrainingLoop, restore, snapshot
from ..core.processes import process_state
from ..data.readers import IGNORE_INDEX
from .scoring import SpanScorer
from .training import (
    RunResult,
    TokenClassifierRunner,
    TrainSettings,
    evaluates_at,
    predict_labelled,
    shuffled_batches,
)


class StackedRunner(TokenClassifierRunner):
    """A :class:`TokenClassifierRunner` whose forward runs ``K`` parameter sets at once.

    ``logits`` returns ``(K, batch, seq, labels)`` logits (and the ``(batch, seq)`` labels).

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
        super().__init__(model, located, cache)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        self.candidates: list[list[torch.Tensor]] = [
            [p.detach().clone().requires_grad_(True) for _, p in named] for _ in range(count)
        ]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        stacked = {
            name: torch.stack([candidate[i] for candidate in self.candidates])  # (K, *shape)
            for i, name in enumerate(self.names)
        }
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

        def one(parameters: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(self.model, parameters, (), inputs).logits

        return vmap(one, randomness="same")(stacked)  # (K, batch, seq, labels)

    def to(self, device: torch.device) -> None:
        """Move the model and every candidate's parameters to ``device`` (before building an optimizer)."""
        self.model.to(device)
        self.candidates = [
            [p.detach().to(device).requires_grad_(True) for p in candidate] for candidate in self.candidates
        ]

    def load_candidate(self, index: int) -> None:
        """Copy candidate ``index``'s parameters into the model (e.g. to inspect it alone)."""
        named = dict(self.model.named_parameters())
        restore([named[name] for name in self.names], self.candidates[index])


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
    return scorer.f1s(predict_labelled(runner, features, batch_size, device))  # (K, positions) -> K


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
    ``replace(settings, lr=lrs[k])`` on copies of the model (see the module docstring).
    Each candidate ends in its best-dev-epoch state with ``test``, else in its last state.

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
    if len(lrs) != len(runner.candidates):
        raise ValueError(f"lrs has {len(lrs)} values for {len(runner.candidates)} candidates")
    start = time.perf_counter()
    loader = shuffled_batches(len(train), settings)
    runner.to(process_state().device)  # new candidate tensors: before the optimizer holds them
    groups = [{"params": params, "lr": lr} for params, lr in zip(runner.candidates, lrs, strict=True)]
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
            logits, labels = runner.logits([train[i] for i in indices], loop.device)  # (K, b, s, C)
            losses = [
                F.cross_entropy(candidate.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
                for candidate in logits
            ]
            loop.step(torch.stack(losses).sum())  # each candidate gets its own gradient
        if evaluates_at(epoch, settings):
            scores = evaluate_candidates(runner, dev, id2label, settings.eval_batch_size, loop.device, scorer)
            for k, (result, f1) in enumerate(zip(results, scores, strict=True)):
                result.curve.append({"epoch": epoch, "step": loop.steps, "dev_f1": f1})
                if f1 > result.best_f1:
                    result.best_f1, result.best_epoch = f1, epoch
                    best_states[k] = snapshot(runner.candidates[k]) if test else None
    if test:
        for candidate, saved in zip(runner.candidates, best_states, strict=True):
            if saved is not None:
                restore(candidate, saved)
        scores = evaluate_candidates(runner, test, id2label, settings.eval_batch_size, loop.device)
        for result, f1 in zip(results, scores, strict=True):
            result.test_f1 = f1
    seconds = time.perf_counter() - start
    for result in results:
        result.seconds = seconds
    return results
