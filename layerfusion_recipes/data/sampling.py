"""N-shot sampling of the few-shot protocol (METHODS.md, "Few-shot NER protocol")."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
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


def check_per_class(counts: Mapping[str, int], shots: int) -> dict[str, int]:
    """The classes with fewer than ``shots`` examples (``{class: count}``, smallest first): a sample of
    ``shots`` per class takes each of them whole (:func:`sample_per_class`).

    Raises:
        ValueError: ``shots`` exceeds even the largest class (the sample would be the whole train split:
            that is ``--shots all``), naming it, its count and the largest N.

    Example:
        >>> check_per_class({"DESC": 9, "ENTY:religion": 3, "NUM:ord": 5}, 4)
        {'ENTY:religion': 3}
        >>> check_per_class({"neg": 3, "pos": 5}, 6)
        Traceback (most recent call last):
        ValueError: --shots 6 asks for 6 examples of each class; the largest class, 'pos', has 5 in train: ...
    """
    largest = max(counts, key=counts.__getitem__)
    if shots > counts[largest]:
        raise ValueError(
            f"--shots {shots} asks for {shots} examples of each class; the largest class, {largest!r}, has "
            f"{counts[largest]} in train: use --shots <= {counts[largest]}, or --shots all for the whole "
            "train split"
        )
    short = {label: count for label, count in counts.items() if count < shots}
    return dict(sorted(short.items(), key=lambda item: item[1]))


def describe_short_classes(short: Mapping[str, int], shots: int, classes: int, shown: int = 6) -> str:
    """One line saying which classes a sample of ``shots`` per class takes whole, and its size.

    Example:
        >>> print(describe_short_classes({"ENTY:religion": 3, "NUM:ord": 5}, 8, 50))
        --shots 8: 2 classes have fewer train examples and are taken whole: 'ENTY:religion' (3),
        'NUM:ord' (5); a sample has 392 examples, not 8 x 50 = 400
    """
    named = ", ".join(f"{label!r} ({count})" for label, count in list(short.items())[:shown])
    more = f" and {len(short) - shown} more" if len(short) > shown else ""
    size = shots * classes - sum(shots - count for count in short.values())
    noun = (
        "class has fewer train examples and is"
        if len(short) == 1
        else "classes have fewer train examples and are"
    )
    return (
        f"--shots {shots}: {len(short)} {noun} taken whole: {named}{more}; "
        f"a sample has {size} examples, not {shots} x {classes} = {shots * classes}"
    )


def sample_per_class(
    examples: Sequence[T], shots: int, labels: Sequence[str], label_of: Callable[[T], str], seed: int
) -> list[T]:
    """``shots`` examples of every class of ``labels``, drawn without replacement (stratified: the
    few-shot protocol of sentence classification), class after class in ``labels`` order; a class with
    fewer than ``shots`` examples (a rare class of a long-tailed label set) is taken whole
    (:func:`check_per_class`).

    Raises:
        ValueError: ``shots`` exceeds even the largest class (naming it, its count and the largest N).

    Example:
        >>> examples = [{"text": f"t{i}", "label": "pos" if i % 3 else "neg"} for i in range(12)]
        >>> sample = sample_per_class(examples, 2, ["neg", "pos"], lambda e: e["label"], seed=0)  # 2 x C
        >>> sorted(e["label"] for e in sample)
        ['neg', 'neg', 'pos', 'pos']
        >>> len(sample_per_class(examples, 5, ["neg", "pos"], lambda e: e["label"], seed=0))  # 4 neg: all
        9
    """
    by_class: dict[str, list[int]] = {label: [] for label in labels}
    for index, example in enumerate(examples):
        by_class[label_of(example)].append(index)
    check_per_class({label: len(indices) for label, indices in by_class.items()}, shots)
    rng = random.Random(seed)
    picks = [i for label in labels for i in rng.sample(by_class[label], min(shots, len(by_class[label])))]
    return [examples[i] for i in picks]
