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
per candidate under the same linear schedule, in the one loop (:func:`~layerfusion_recipes.ner.training.fit`).
``tests/recipes/ner/test_lr_selection.py`` checks the records
against lone runs.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, vmap

from ..core.loop import restore
from ..core.processes import process_state
from .scoring import SpanScorer
from .training import TokenClassifierRunner


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

    def candidate_parameters(self) -> list[list[torch.Tensor]]:
        """Every candidate's parameters, moved to this process's device (before the optimizer holds them)."""
        self.to(process_state().device)
        return self.candidates

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The candidates' cross-entropies of ``(K, batch, seq, labels)`` logits, summed: each
        candidate gets its own gradient."""
        return torch.stack([super(StackedRunner, self).loss(candidate, labels) for candidate in logits]).sum()

    def scores(self, scorer: SpanScorer, predicted: torch.Tensor) -> list[float]:
        """Every candidate's micro-F1 from ``(K, positions)`` predictions, in one batched parse."""
        return scorer.f1s(predicted)

    def load_candidate(self, index: int) -> None:
        """Copy candidate ``index``'s parameters into the model (e.g. to inspect it alone)."""
        named = dict(self.model.named_parameters())
        restore([named[name] for name in self.names], self.candidates[index])

