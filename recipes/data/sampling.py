"""N-shot sampling of the few-shot protocol (METHODS.md, "Few-shot NER protocol")."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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
        >>> from layerfusion_recipes.data.readers import read_ner_file
        >>> train = read_ner_file(f"{ner_data}/train.txt")
        >>> sample = sample_shots(train, shots=2, num_types=3, seed=0)  # 2 sentences per entity type
        >>> len(sample)
        6
    """
    if shots < 1 or num_types < 1:
        raise ValueError(f"shots and num_types must be >= 1, got shots={shots}, num_types={num_types}")
    size = min(shots * num_types, len(sentences))
    return [sentences[i] for i in random.Random(seed).sample(range(len(sentences)), size)]


def sample_per_class(
    examples: Sequence[T], shots: int, labels: Sequence[str], label_of: Callable[[T], str], seed: int
) -> list[T]:
    """``shots`` examples of every class of ``labels``, drawn without replacement (stratified: the
    few-shot protocol of sentence classification), class after class in ``labels`` order.

    Raises:
        ValueError: A class has fewer than ``shots`` examples (naming it, its count and the largest N).

    Example:
        >>> examples = [{"text": f"t{i}", "label": "pos" if i % 3 else "neg"} for i in range(12)]
        >>> sample = sample_per_class(examples, 2, ["neg", "pos"], lambda e: e["label"], seed=0)  # 2 x C
        >>> sorted(e["label"] for e in sample)
        ['neg', 'neg', 'pos', 'pos']
    """
    by_class: dict[str, list[int]] = {label: [] for label in labels}
    for index, example in enumerate(examples):
        by_class[label_of(example)].append(index)
    smallest = min(by_class, key=lambda label: len(by_class[label]))
    if len(by_class[smallest]) < shots:
        raise ValueError(
            f"--shots {shots} asks for {shots} examples of each class; class {smallest!r} has "
            f"{len(by_class[smallest])} in train: use --shots <= {len(by_class[smallest])} (or --shots all)"
        )
    rng = random.Random(seed)
    return [examples[i] for label in labels for i in rng.sample(by_class[label], shots)]
