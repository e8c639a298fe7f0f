"""The full gold of encoded NER sentences, and which gold entities the model cannot reach.

The model sees a sentence through its sub-words, truncated to ``max_length``: words past the
cut, and words with no sub-word at all (e.g. a lone zero-width space), have no position.
Scoring must still use every word's gold tag; the unseen words count as predicted ``O``
(:func:`spread_to_words`). A gold entity with an unseen word can never be predicted right
(:func:`gold_reach` counts them); nor can an unseen word of a plain tag set (part of speech, scored by
token accuracy: :func:`gold_reach` with ``spans=False`` counts words).

Features come from :func:`~layerfusion_recipes.data.readers.encode_ner` (keys ``word_labels`` and
``labelled_words``); features without them (built by hand) are scored on their labelled
positions only, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqeval.metrics.sequence_labeling import get_entities

from ..core.batches import IGNORE_INDEX


def word_label_ids(feature: dict) -> list[int]:
    """Gold label id of every word of the sentence (labelled positions only for hand-made features)."""
    if "word_labels" in feature:
        return list(feature["word_labels"])
    return [label for label in feature["labels"] if label != IGNORE_INDEX]


def spread_to_words(tags: Sequence[str], feature: dict, outside: str = "O") -> list[str]:
    """Predicted tags of the labelled positions, placed on their words; unseen words get ``outside``.

    Example:
        >>> spread_to_words(["B-PER"], {"word_labels": [1, 0, 3], "labelled_words": [0]})
        ['B-PER', 'O', 'O']
    """
    if "labelled_words" not in feature:
        return list(tags)
    words = [outside] * len(feature["word_labels"])
    for word, tag in zip(feature["labelled_words"], tags, strict=True):
        words[word] = tag
    return words


@dataclass(frozen=True)
class GoldReach:
    """Gold entities of a split (or words, ``unit="words"``, for a plain tag set) and how many of them
    the model cannot see entirely.

    ``best`` is the highest score reachable: micro-F1 (every visible entity found, nothing spurious),
    or token accuracy (every visible word right).
    """

    entities: int
    out_of_reach: int
    unit: str = "entities"

    @property
    def best(self) -> float:
        if not self.entities:
            return 0.0
        recall = (self.entities - self.out_of_reach) / self.entities
        return recall if self.unit == "words" else 2 * recall / (1 + recall)

    @property
    def best_f1(self) -> float:
        """:attr:`best` of entities."""
        return self.best

    def message(self, split: str, max_length: int) -> str:
        """One line for the log, e.g. ``dev: 3 of 120 gold entities (2.5%) are out of reach ...``."""
        metric = "accuracy" if self.unit == "words" else "F1"
        return (
            f"{split}: {self.out_of_reach} of {self.entities} gold {self.unit} "
            f"({100 * self.out_of_reach / max(self.entities, 1):.1f}%) are out of the model's reach (a word "
            f"past --max-length {max_length} sub-words, or with no sub-word); they count as missed "
            f"(best reachable {metric} {100 * self.best:.1f})"
        )


def gold_reach(features: Sequence[dict], id2label: dict[int, str], spans: bool = True) -> GoldReach:
    """Count the gold entities of ``features`` and those with a word the model does not see (the words
    and the unseen ones where ``spans`` is false: a plain tag set).

    Example:
        >>> from layerfusion_recipes.data.readers import NerSentence, encode_ner
        >>> labels = ["O", "B-LOC", "I-LOC"]
        >>> sentences = [NerSentence(("walks", "paris"), ("O", "B-LOC"))]
        >>> features = encode_ner(tokenizer, sentences, {t: i for i, t in enumerate(labels)}, max_length=3)
        >>> reach = gold_reach(features, dict(enumerate(labels)))
        >>> reach.entities, reach.out_of_reach  # 3 tokens: [CLS] walks [SEP], "paris" is cut off
        (1, 1)
    """
    if not spans:
        words = sum(len(word_label_ids(feature)) for feature in features)
        seen = sum(len(feature.get("labelled_words", word_label_ids(feature))) for feature in features)
        return GoldReach(words, words - seen, "words")
    entities = out_of_reach = 0
    for feature in features:
        found = get_entities([id2label[label] for label in word_label_ids(feature)])  # [(type, start, end)]
        seen = set(feature.get("labelled_words", range(len(word_label_ids(feature)))))
        entities += len(found)
        out_of_reach += sum(
            1 for _, start, end in found if any(word not in seen for word in range(start, end + 1))
        )
    return GoldReach(entities, out_of_reach)
