"""Several learning rates of a NER cell trained together: one pass over the cached features for all
candidates (:class:`~layerfusion_recipes.core.engine.runner.StackedRunner` in the one loop,
:func:`~layerfusion_recipes.ner.training.fit`). One dev pass predicts for all candidates, and one
batched parse (:class:`~layerfusion_recipes.ner.scoring.SpanScorer`) scores them.

Each candidate is the run it would be alone (:func:`~layerfusion_recipes.ner.training.train_token_classifier`
with that LR); ``tests/recipes/ner/test_lr_selection.py`` checks the records against lone runs.
"""

from __future__ import annotations

import torch

from ..core.engine.runner import StackedRunner as CoreStackedRunner
from ..core.engine.runner import labelled_positions


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
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> model, located = experiment.build(Cell("dwatt", "fe", 2, 2, 0))  # DWAtt + head, tiny BERT
        >>> runner = StackedRunner(model, 4, located, cache)  # cache: the dev and test sets filled
        >>> logits, labels = runner.logits(experiment.dev[:4], torch.device("cpu"))
        >>> logits.shape, labels.shape  # (4, batch, seq, C), (batch, seq)
        (torch.Size([4, 4, 6, 5]), torch.Size([4, 6]))
    """

    def __init__(self, model: torch.nn.Module, count: int, located=None, cache=None) -> None:
        super().__init__(model, count, located, cache, positions=labelled_positions)
