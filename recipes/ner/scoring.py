"""seqeval's entity-level micro-F1 of label-id predictions, vectorised with torch.

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
(:mod:`layerfusion_recipes.data.gold`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from seqeval.metrics.sequence_labeling import end_of_chunk, start_of_chunk

from ..data.gold import word_label_ids


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
        >>> from layerfusion_recipes.data.readers import encode_ner, read_ner_file
        >>> labels = ["O", "B-LOC", "B-ORG", "B-PER", "I-ORG"]
        >>> id2label = dict(enumerate(labels))
        >>> label2id = {tag: i for i, tag in id2label.items()}
        >>> dev = encode_ner(tokenizer, read_ner_file(f"{ner_data}/dev.txt"), label2id)
        >>> scorer = SpanScorer(dev, id2label)
        >>> gold = torch.tensor([label for feature in dev for label in feature["labels"] if label != -100])
        >>> scorer.f1s(torch.stack([gold, torch.zeros_like(gold)]))  # 2 candidates: all right, all "O"
        [1.0, 0.0]
    """

    metrics = ("f1",)  # a core.fitting.Scorer: the one metric, micro-F1

    def __init__(self, features: Sequence[dict], id2label: dict[int, str]) -> None:
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(f"id2label must have the ids 0..{len(id2label) - 1}, got {sorted(id2label)}")
        self.table = TagTable([id2label[i] for i in range(len(id2label))])
        gold: list[int] = []  # every word of every sentence, each sentence followed by "O"
        where: list[int] = []  # the joined index of every labelled position, in order
        for feature in features:
            words = word_label_ids(feature)
            where += [len(gold) + word for word in feature.get("labelled_words", range(len(words)))]
            gold += words + [self.table.outside]
        self.where = torch.tensor(where, dtype=torch.long)
        self.length = len(gold)
        # the sentence of every joined word (each sentence's words and the "O" after them)
        self.sentences = len(features)
        self.sentence_of = torch.repeat_interleave(
            torch.arange(len(features)),
            torch.tensor([len(word_label_ids(f)) + 1 for f in features], dtype=torch.long),
        )
        self.gold = self.table.spans(torch.tensor([gold], dtype=torch.long))
        self.gold_count = int(self.gold.ends.sum())

    def f1s(self, predicted: torch.Tensor) -> list[float]:
        """Micro-F1 (0..1) of each row of ``predicted`` ``(K, positions)``: label ids of the
        labelled positions, sentence after sentence
        (see :func:`~layerfusion_recipes.core.runner.labelled_predictions`)."""
        if predicted.dim() != 2 or predicted.shape[1] != len(self.where):
            raise ValueError(
                f"predicted must be (candidates, {len(self.where)}) label ids (one per labelled "
                f"position of the scored sentences), got shape {tuple(predicted.shape)}"
            )
        ids = torch.full((predicted.shape[0], self.length), self.table.outside, dtype=torch.long)
        ids[:, self.where] = predicted.to("cpu", torch.long)  # unseen words stay "O"
        spans, gold = self.table.spans(ids), self.gold
        shared = spans.ends & gold.ends & (spans.begins == gold.begins) & (spans.types == gold.types)
        return [
            f1_from_counts(correct, found, self.gold_count)
            for correct, found in zip(shared.sum(1).tolist(), spans.ends.sum(1).tolist(), strict=True)
        ]

    def sentence_counts(self, predicted: torch.Tensor) -> torch.Tensor:
        """Per sentence, ``(correct, predicted, gold)`` entity counts of one prediction set ``(positions,)``:
        ``(sentences, 3)``; summed over any sentences, :func:`f1_from_counts` of the sums is their
        micro-F1."""
        ids = torch.full((1, self.length), self.table.outside, dtype=torch.long)
        ids[0, self.where] = predicted.to("cpu", torch.long)
        spans, gold = self.table.spans(ids), self.gold
        shared = (
            spans.ends & gold.ends & (spans.begins == gold.begins) & (spans.types == gold.types)
        )  # (1, L)
        counts = [
            torch.bincount(self.sentence_of[mask[0]], minlength=self.sentences)
            for mask in (shared, spans.ends, gold.ends)
        ]
        return torch.stack(counts, 1).to(torch.float64)

    def scores(self, predicted: torch.Tensor) -> list[dict[str, float]]:
        """:meth:`f1s` as :class:`~layerfusion_recipes.core.fitting.Scorer` scores: ``[{"f1": F}, ...]``."""
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
