"""seqeval's entity-level micro-F1 of label-id predictions, vectorised with torch; token accuracy for a
plain tag set (part of speech, :class:`TokenAccuracyScorer`).

``seqeval.metrics.f1_score`` parses tag strings one at a time in Python (``get_entities``);
scoring ``K`` LR candidates on a dev set parses ``K`` copies of it. Here the predictions stay
label-id tensors, ``(K, N)`` (one id per labelled position of every sentence, all candidates
at once), and the parse is a few tensor look-ups:

* seqeval's decision at each word depends only on the previous and the current tag, so its own
  ``end_of_chunk`` / ``start_of_chunk`` are tabulated once per pair of labels (:class:`TagTable`);
* sentences are joined as seqeval joins them (each followed by ``"O"``, one more ``"O"`` at the
  end); a chunk ends at word ``e`` when ``ends[x[e], x[e+1]]``, has the type of ``x[e]`` and
  begins at the latest ``s <= e`` with ``starts[x[s-1], x[s]]`` (a running maximum);
* one chunk at most ends at a given word, so the entities two parses share are the words where
  both end a chunk with the same beginning and type: an elementwise comparison, no sets.

The numbers equal ``f1_score(gold, predicted)`` (default mode, micro, ``zero_division=0``)
bitwise, whatever the labels (IOB2, IOBES, seqeval's lenient reading of an ``I-X`` after ``O``
or after another type): ``tests/recipes/ner/test_scoring.py`` compares them on random prediction sets.
Gold is every word of every sentence; words the model cannot see count as predicted ``O``
(:mod:`layerfusion_recipes.data.gold`), and as wrong in token accuracy.

A tag set that is not IOB/BIOES spans (``NN``, ``VBZ``: every tag is a class of its own; seqeval would
read ``NN`` as a tag ``N`` of type ``N``) is scored by token accuracy: :func:`scorer_for` picks the
scorer from the label names (:func:`~layerfusion_recipes.data.tags.tag_set_kind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from seqeval.metrics.sequence_labeling import end_of_chunk, start_of_chunk

from ..data.gold import word_label_ids
from ..data.tags import SPANS, tag_set_kind


def parse_label(label: str) -> tuple[str, str]:
    """seqeval's reading of a tag (default, prefix mode): ``(tag letter, entity type)``.

    Example:
        >>> parse_label("I-ORG"), parse_label("O"), parse_label("B-MISC-X")
        (('I', 'ORG'), ('O', '_'), ('B', 'MISC-X'))
    """
    return label[0], label[1:].split("-", maxsplit=1)[-1] or "_"


def f1_from_counts(correct: int, predicted: int, gold: int) -> float:
    """seqeval's micro-F1 arithmetic (``zero_division=0``): P, R, then ``F = 2PR / (P + R)``.

    Example:
        >>> f1_from_counts(correct=2, predicted=4, gold=3)
        0.5714285714285715
    """
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    denominator = precision + recall
    return 2.0 * precision * recall / (denominator if denominator else 1.0)


class Spans(NamedTuple):
    """Chunks of joined label-id sequences, indexed by the word where each one ends.

    ``ends`` ``(K, L)`` bool: a chunk ends at this word; ``begins`` ``(K, L)``: where the chunk
    ending here begins; ``types`` ``(K, L)``: its type id (read only where ``ends``).
    """

    ends: torch.Tensor
    begins: torch.Tensor
    types: torch.Tensor


class TagTable:
    """seqeval's chunk decisions for every pair of labels, with ids ``0..C-1`` for ``labels``.

    Two more ids: :attr:`outside`, the ``"O"`` seqeval puts after each sentence (also the
    prediction of a word the model cannot see), and :attr:`first`, the state before the first
    word (tag ``O``, type ``""``), used as a previous label only.

    Args:
        labels: The label names, in id order.

    Example:
        >>> table = TagTable(["O", "B-PER", "I-PER"])
        >>> spans = table.spans(torch.tensor([[1, 2, 0, 2, table.outside]]))  # B-PER I-PER O I-PER
        >>> spans.ends.nonzero()[:, 1].tolist(), spans.begins[0, [1, 3]].tolist()
        ([1, 3], [0, 3])
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self.outside, self.first = len(labels), len(labels) + 1
        parsed = [parse_label(label) for label in labels] + [parse_label("O"), ("O", "")]
        type_ids: dict[str, int] = {}
        self.types = torch.tensor([type_ids.setdefault(kind, len(type_ids)) for _, kind in parsed])
        pairs = [(before, now) for before in parsed for now in parsed]
        shape = (len(parsed), len(parsed))  # (previous label, label)
        self.ends = torch.tensor([end_of_chunk(*before_now(b, n)) for b, n in pairs]).view(shape)
        self.starts = torch.tensor([start_of_chunk(*before_now(b, n)) for b, n in pairs]).view(shape)

    def spans(self, ids: torch.Tensor) -> Spans:
        """The chunks of ``ids`` ``(K, L)``: joined sentences, each followed by :attr:`outside`."""
        count, length = ids.shape
        following = torch.cat([ids[:, 1:], ids.new_full((count, 1), self.outside)], dim=1)  # (K, L)
        previous = torch.cat([ids.new_full((count, 1), self.first), ids[:, :-1]], dim=1)  # (K, L)
        positions = torch.arange(length).expand(count, length)  # (K, L)
        starts_here = torch.where(self.starts[previous, ids], positions, 0)
        begins = starts_here.cummax(dim=1).values  # the latest start so far (seqeval's begin_offset)
        return Spans(self.ends[ids, following], begins, self.types[ids])


def before_now(before: tuple[str, str], now: tuple[str, str]) -> tuple[str, str, str, str]:
    """The ``(prev_tag, tag, prev_type, type_)`` arguments of seqeval's chunk functions."""
    return before[0], now[0], before[1], now[1]


class JoinedWords:
    """Every word of encoded sentences in one sequence, each sentence followed by one ``outside`` id
    (seqeval's joined ``O``), and where each labelled position goes in it.

    Args:
        features: Encoded sentences (see :class:`SpanScorer`).
        outside: The id after each sentence, also the prediction of a word the model cannot see.

    Example:
        >>> words = JoinedWords([{"word_labels": [1, 0, 2], "labelled_words": [0, 2]}], outside=9)
        >>> words.gold.tolist(), words.place(torch.tensor([[5, 6]])).tolist()
        ([1, 0, 2, 9], [[5, 9, 6, 9]])
    """

    def __init__(self, features: Sequence[dict], outside: int) -> None:
        gold: list[int] = []  # every word of every sentence, each sentence followed by `outside`
        where: list[int] = []  # the joined index of every labelled position, in order
        for feature in features:
            words = word_label_ids(feature)
            where += [len(gold) + word for word in feature.get("labelled_words", range(len(words)))]
            gold += words + [outside]
        self.outside = outside
        self.gold = torch.tensor(gold, dtype=torch.long)  # (length,)
        self.where = torch.tensor(where, dtype=torch.long)  # (positions,)
        self.length = len(gold)
        self.sentences = len(features)
        # the sentence of every joined word (each sentence's words and the separator after them)
        self.sentence_of = torch.repeat_interleave(
            torch.arange(len(features)),
            torch.tensor([len(word_label_ids(f)) + 1 for f in features], dtype=torch.long),
        )
        self.is_word = self.gold != outside  # (length,): the separators are no words

    def place(self, predicted: torch.Tensor) -> torch.Tensor:
        """``predicted`` ``(K, positions)`` placed on their words, ``(K, length)``; every other word and
        every separator is :attr:`outside`."""
        if predicted.dim() != 2 or predicted.shape[1] != len(self.where):
            raise ValueError(
                f"predicted must be (candidates, {len(self.where)}) label ids (one per labelled "
                f"position of the scored sentences), got shape {tuple(predicted.shape)}"
            )
        ids = torch.full((predicted.shape[0], self.length), self.outside, dtype=torch.long)
        ids[:, self.where] = predicted.to("cpu", torch.long)  # unseen words stay `outside`
        return ids

    def per_sentence(self, mask: torch.Tensor) -> torch.Tensor:
        """How many joined words of each sentence ``mask`` ``(length,)`` marks: ``(sentences,)``."""
        return torch.bincount(self.sentence_of[mask], minlength=self.sentences)


class SpanScorer:
    """seqeval's micro-F1 of label-id predictions of encoded sentences against their full gold.

    Built once per split: the gold chunks and where each labelled position of each sentence goes
    in the joined word sequence. :meth:`f1s` then scores ``K`` prediction sets at once.

    Args:
        features: Encoded sentences (:func:`~layerfusion_recipes.data.readers.encode_ner`; without
            ``word_labels``/``labelled_words``, their labelled positions are their words).
        id2label: Label names, ids ``0..C-1``.

    Raises:
        ValueError: ``id2label``'s ids are not ``0..C-1``.

    Example:
        >>> scorer = SpanScorer(ner_dev, id2label)
        >>> gold = torch.tensor([tag for feature in ner_dev for tag in feature["labels"] if tag != -100])
        >>> scorer.f1s(torch.stack([gold, torch.zeros_like(gold)]))  # 2 candidates: all right, all "O"
        [1.0, 0.0]
    """

    metrics = ("f1",)  # a core.engine.fitting.Scorer: the one metric, micro-F1

    def __init__(self, features: Sequence[dict], id2label: dict[int, str]) -> None:
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(f"id2label must have the ids 0..{len(id2label) - 1}, got {sorted(id2label)}")
        self.table = TagTable([id2label[i] for i in range(len(id2label))])
        self.words = JoinedWords(features, self.table.outside)
        self.gold = self.table.spans(self.words.gold.unsqueeze(0))
        self.gold_count = int(self.gold.ends.sum())

    def f1s(self, predicted: torch.Tensor) -> list[float]:
        """Micro-F1 (0..1) of each row of ``predicted`` ``(K, positions)``: label ids of the
        labelled positions, sentence after sentence
        (see :func:`~layerfusion_recipes.core.engine.runner.labelled_predictions`)."""
        spans, gold = self.table.spans(self.words.place(predicted)), self.gold
        shared = spans.ends & gold.ends & (spans.begins == gold.begins) & (spans.types == gold.types)
        return [
            f1_from_counts(correct, found, self.gold_count)
            for correct, found in zip(shared.sum(1).tolist(), spans.ends.sum(1).tolist(), strict=True)
        ]

    def sentence_counts(self, predicted: torch.Tensor) -> torch.Tensor:
        """Per sentence, ``(correct, predicted, gold)`` entity counts of one prediction set ``(positions,)``:
        ``(sentences, 3)``; summed over any sentences, :func:`f1_from_counts` of the sums is their
        micro-F1."""
        spans, gold = self.table.spans(self.words.place(predicted.unsqueeze(0))), self.gold
        shared = (
            spans.ends & gold.ends & (spans.begins == gold.begins) & (spans.types == gold.types)
        )  # (1, L)
        counts = [self.words.per_sentence(mask[0]) for mask in (shared, spans.ends, gold.ends)]
        return torch.stack(counts, 1).to(torch.float64)

    def scores(self, predicted: torch.Tensor) -> list[dict[str, float]]:
        """:meth:`f1s` as :class:`~layerfusion_recipes.core.engine.fitting.Scorer` scores: ``[{"f1": F},
        ...]``."""
        return [{"f1": f1} for f1 in self.f1s(predicted)]

    def f1(self, predicted: torch.Tensor) -> float:
        """Micro-F1 (0..1) of one prediction set ``(positions,)``."""
        return self.f1s(predicted.unsqueeze(0))[0]


class SentenceSpanCounts:
    """Micro-F1 as a per-sentence scorer of the true few-shot protocol
    (:class:`peft_layerfusion.few_shot.Scorer`): each sentence's ``(correct, predicted, gold)`` counts.

    Args:
        scorer: The :class:`SpanScorer` of the sentences, in the order of their rows.
    """

    def __init__(self, scorer: SpanScorer) -> None:
        self.scorer = scorer

    def stats(self, predicted: torch.Tensor) -> torch.Tensor:
        return self.scorer.sentence_counts(predicted)

    def score(self, totals: torch.Tensor) -> torch.Tensor:
        """``2 c / (p + g)`` (seqeval's ``2PR / (P + R)``; 0 where nothing is predicted or gold)."""
        correct, predicted, gold = totals.unbind(-1)
        return torch.where(predicted + gold > 0, 2 * correct / (predicted + gold).clamp_min(1), 0.0)


class TokenAccuracyScorer:
    """Token accuracy of label-id predictions of encoded sentences against their full gold: the share of
    every word of every sentence whose tag is predicted right (a word the model cannot see is wrong);
    the score of a plain tag set (part of speech), where a tag is a class, not a span. The same
    interface as :class:`SpanScorer`.

    Args:
        features: Encoded sentences (as :class:`SpanScorer`'s).
        id2label: Label names, ids ``0..C-1``.

    Example:
        >>> sentences = [{"word_labels": [0, 1, 2], "labelled_words": [0, 1]}, {"word_labels": [2]}]
        >>> scorer = TokenAccuracyScorer(sentences, {0: "NN", 1: "VBZ", 2: "."})
        >>> scorer.scores(torch.tensor([[0, 1, 2], [0, 0, 0]]))  # the third word of sentence 1 is unseen
        [{'accuracy': 0.75}, {'accuracy': 0.25}]
    """

    metrics = ("accuracy",)  # a core.engine.fitting.Scorer: the one metric

    def __init__(self, features: Sequence[dict], id2label: dict[int, str]) -> None:
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(f"id2label must have the ids 0..{len(id2label) - 1}, got {sorted(id2label)}")
        self.words = JoinedWords(features, outside=len(id2label))
        self.word_count = int(self.words.is_word.sum())

    def correct(self, predicted: torch.Tensor) -> torch.Tensor:
        """``(K, length)``: where each row of ``predicted`` ``(K, positions)`` tags a word right."""
        return (self.words.place(predicted) == self.words.gold) & self.words.is_word

    def accuracies(self, predicted: torch.Tensor) -> list[float]:
        """Token accuracy (0..1; 0 without a word) of each row of ``predicted`` ``(K, positions)``."""
        return (self.correct(predicted).sum(1).double() / max(self.word_count, 1)).tolist()

    def sentence_counts(self, predicted: torch.Tensor) -> torch.Tensor:
        """Per sentence, ``(correct, words)`` of one prediction set ``(positions,)``: ``(sentences, 2)``."""
        right = self.correct(predicted.unsqueeze(0))[0]
        counts = [self.words.per_sentence(mask) for mask in (right, self.words.is_word)]
        return torch.stack(counts, 1).to(torch.float64)

    def scores(self, predicted: torch.Tensor) -> list[dict[str, float]]:
        """:meth:`accuracies` as :class:`~layerfusion_recipes.core.engine.fitting.Scorer` scores."""
        return [{"accuracy": accuracy} for accuracy in self.accuracies(predicted)]


class SentenceTokenCounts:
    """Token accuracy as a per-sentence scorer of the true few-shot protocol
    (:class:`peft_layerfusion.few_shot.Scorer`): each sentence's ``(correct, words)``.

    Args:
        scorer: The :class:`TokenAccuracyScorer` of the sentences, in the order of their rows.
    """

    def __init__(self, scorer: TokenAccuracyScorer) -> None:
        self.scorer = scorer

    def stats(self, predicted: torch.Tensor) -> torch.Tensor:
        return self.scorer.sentence_counts(predicted)

    def score(self, totals: torch.Tensor) -> torch.Tensor:
        """``correct / words`` (0 without a word)."""
        correct, words = totals.unbind(-1)
        return correct / words.clamp_min(1)


def scorer_for(features: Sequence[dict], id2label: dict[int, str]) -> SpanScorer | TokenAccuracyScorer:
    """The scorer of a tag set: seqeval's span micro-F1 for spans (``O``, ``B-``/``I-``...), token
    accuracy for any other tags (:func:`~layerfusion_recipes.data.tags.tag_set_kind`).

    Example:
        >>> type(scorer_for([], {0: "O", 1: "B-NP"})).__name__, type(scorer_for([], {0: "NN"})).__name__
        ('SpanScorer', 'TokenAccuracyScorer')
    """
    if tag_set_kind(id2label.values()) == SPANS:
        return SpanScorer(features, id2label)
    return TokenAccuracyScorer(features, id2label)


def unit_counts(scorer: SpanScorer | TokenAccuracyScorer) -> SentenceSpanCounts | SentenceTokenCounts:
    """The per-sentence scorer of the true few-shot protocol over ``scorer``'s sentences."""
    if isinstance(scorer, SpanScorer):
        return SentenceSpanCounts(scorer)
    return SentenceTokenCounts(scorer)
