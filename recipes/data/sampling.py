"""N-shot sampling of the few-shot protocol (METHODS.md, "Few-shot NER protocol")."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def sample_shots(sentences: Sequence[T], shots: int, num_types: int, seed: int) -> list[T]:
    """``shots * num_types`` sentences uniformly at random, without replacement, not stratified.

    Args:
        sentences: The train split.
        shots: ``N``.
        num_types: ``C``, the number of entity types (4 for CoNLL-03, 3 for WikiANN).
        seed: A new seed per trial gives a new sample.

    Returns:
        The sample (all sentences when ``N * C`` exceeds the split).

    Example:
        >>> sample = sample_shots(data.train, shots=8, num_types=len(data.train_entity_types), seed=0)
    """
    if shots < 1 or num_types < 1:
        raise ValueError(f"shots and num_types must be >= 1, got shots={shots}, num_types={num_types}")
    size = min(shots * num_types, len(sentences))
    return [sentences[i] for i in random.Random(seed).sample(range(len(sentences)), size)]
