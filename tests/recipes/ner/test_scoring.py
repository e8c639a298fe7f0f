"""The vectorised scorer equals seqeval bitwise: entity spans, micro-F1, unseen words as O."""

from __future__ import annotations

import random

import pytest
import torch
from seqeval.metrics import f1_score
from seqeval.metrics.sequence_labeling import get_entities

from layerfusion_recipes.core.engine.runner import labelled_predictions
from layerfusion_recipes.data.gold import spread_to_words
from layerfusion_recipes.ner.scoring import SentenceSpanCounts, SpanScorer, TagTable, f1_from_counts

IOB2 = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
ID2LABEL = dict(enumerate(IOB2))


def seqeval_f1(gold: list[list[str]], predicted: list[list[str]]) -> float:
    return float(f1_score(gold, predicted, average="micro", zero_division=0))


def random_features(rng: random.Random, sentences: int, labels: int) -> list[dict]:
    """Sentences of 0..9 words; some words unseen (no labelled position), as encode_ner makes them."""
    features = []
    for _ in range(sentences):
        words = [rng.randrange(labels) for _ in range(rng.randint(0, 9))]
        seen = [w for w in range(len(words)) if rng.random() < 0.8]
        features.append({"word_labels": words, "labelled_words": seen})
    return features


def seqeval_of_ids(features: list[dict], predicted: list[int], names: list[str]) -> float:
    """seqeval on the strings: predicted labelled positions spread on the words, unseen words O."""
    gold, rows, at = [], [], 0
    for feature in features:
        count = len(feature["labelled_words"])
        tags = [names[i] for i in predicted[at : at + count]]
        rows.append(spread_to_words(tags, feature))
        gold.append([names[i] for i in feature["word_labels"]])
        at += count
    return seqeval_f1(gold, rows)


def test_spans_are_seqevals_entities():
    rng = random.Random(1)
    table = TagTable(IOB2)
    for _ in range(50):
        sentences = [[rng.randrange(len(IOB2)) for _ in range(rng.randint(0, 6))] for _ in range(4)]
        joined = [i for row in sentences for i in row + [table.outside]]
        spans = table.spans(torch.tensor([joined]))
        ends = spans.ends[0].nonzero()[:, 0].tolist()
        got = [(spans.types[0, e].item(), spans.begins[0, e].item(), e) for e in ends]
        want = get_entities([[IOB2[i] for i in row] for row in sentences])
        assert [(b, e) for _, b, e in got] == [(b, e) for _, b, e in want]
        # the table's type ids are its own: compare through the B- label of each type
        assert [table.types[IOB2.index("B-" + t)].item() for t, _, _ in want] == [t for t, _, _ in got]


@pytest.mark.parametrize("labels", [IOB2, ["O", "B-A", "I-A", "E-A", "S-A", "I-B", "B-B"]])
def test_scorer_equals_seqeval_bitwise_on_random_predictions(labels):
    rng = random.Random(0)
    id2label = dict(enumerate(labels))
    features = random_features(rng, 120, len(labels))
    features[3] = {"word_labels": [], "labelled_words": []}  # an empty sentence
    features[4] = {"word_labels": [1, 2, 2], "labelled_words": [0]}  # an entity partly out of reach
    scorer = SpanScorer(features, id2label)
    positions = sum(len(f["labelled_words"]) for f in features)
    gold_at_positions = [f["word_labels"][w] for f in features for w in f["labelled_words"]]
    prediction_sets = [
        [rng.randrange(len(labels)) for _ in range(positions)],  # I- without B-, type switches
        [0] * positions,  # all O
        gold_at_positions,  # right wherever the model sees
        *(
            [g if rng.random() < 0.7 else rng.randrange(len(labels)) for g in gold_at_positions]
            for _ in range(30)
        ),
    ]
    got = scorer.f1s(torch.tensor(prediction_sets))
    want = [seqeval_of_ids(features, predicted, labels) for predicted in prediction_sets]
    assert got == want  # bitwise
    assert want[1] == 0.0 and 0.0 < want[2] < 1.0  # the unseen gold words cost recall
    assert len(set(want)) > 10
    assert scorer.f1(torch.tensor(prediction_sets[5])) == want[5]


def test_lenient_reading_and_edge_cases():
    # I-PER after O opens an entity, I-LOC after B-PER opens another, B- always opens one
    features = [{"word_labels": [2, 2, 4, 1, 1], "labelled_words": [0, 1, 2, 3, 4]}]
    scorer = SpanScorer(features, ID2LABEL)
    assert get_entities(["I-PER", "I-PER", "I-LOC", "B-PER", "B-PER"]) == [
        ("PER", 0, 1), ("LOC", 2, 2), ("PER", 3, 3), ("PER", 4, 4)
    ]  # fmt: skip
    assert scorer.f1(torch.tensor([2, 2, 4, 1, 1])) == 1.0
    assert scorer.f1(torch.tensor([1, 2, 4, 1, 2])) == seqeval_f1(
        [["I-PER", "I-PER", "I-LOC", "B-PER", "B-PER"]], [["B-PER", "I-PER", "I-LOC", "B-PER", "I-PER"]]
    ) == pytest.approx(4 / 7)  # fmt: skip  # PER 0-1 and LOC 2 right, PER 3-4 wrong: P 2/3, R 2/4
    nothing = SpanScorer([{"word_labels": [0, 0], "labelled_words": [0, 1]}], ID2LABEL)
    assert nothing.f1(torch.tensor([0, 0])) == 0.0 == nothing.f1(torch.tensor([1, 0]))
    assert SpanScorer([], ID2LABEL).f1s(torch.zeros(2, 0, dtype=torch.long)) == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"predicted must be \(candidates, 5\)"):
        scorer.f1s(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="id2label must have the ids 0..1"):
        SpanScorer(features, {0: "O", 2: "B-PER"})


def test_hand_made_features_are_scored_on_their_labelled_positions():
    features = [{"labels": [-100, 1, 2, -100, 0, -100]}]  # no word_labels: the labelled positions
    logits = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2, 0, 3, 0]]), len(IOB2)).float()
    predicted = labelled_predictions(logits, torch.tensor([features[0]["labels"]]))
    assert predicted.tolist() == [1, 2, 3]
    want = seqeval_f1([["B-PER", "I-PER", "O"]], [["B-PER", "I-PER", "B-LOC"]])
    assert SpanScorer(features, ID2LABEL).f1(predicted) == want == pytest.approx(2 / 3)
    stacked = labelled_predictions(torch.stack([logits, -logits]), torch.tensor([features[0]["labels"]]))
    assert stacked.shape == (2, 3) and stacked[0].tolist() == [1, 2, 3]


def test_sentence_counts_sum_to_seqevals_f1_over_any_sentences():
    rng = random.Random(2)
    features = random_features(rng, 40, len(IOB2))
    scorer = SpanScorer(features, ID2LABEL)
    gold = [f["word_labels"][w] for f in features for w in f["labelled_words"]]
    predicted = [g if rng.random() < 0.6 else rng.randrange(len(IOB2)) for g in gold]
    counts = scorer.sentence_counts(torch.tensor(predicted))  # (40, 3)
    assert counts.shape == (40, 3)
    assert f1_from_counts(*counts.sum(0).tolist()) == scorer.f1(torch.tensor(predicted))  # all sentences
    some = list(range(0, 40, 3))  # a subset of sentences, scored alone by seqeval
    at = [0, *torch.tensor([len(f["labelled_words"]) for f in features]).cumsum(0).tolist()]
    subset = [features[i] for i in some]
    subset_predicted = [p for i in some for p in predicted[at[i] : at[i + 1]]]
    want = seqeval_of_ids(subset, subset_predicted, IOB2)
    assert f1_from_counts(*counts[some].sum(0).tolist()) == pytest.approx(want, abs=1e-12)
    unit = SentenceSpanCounts(scorer)
    assert float(unit.score(counts[some].sum(0))) == pytest.approx(want, abs=1e-12)
    assert 0.2 < want < 0.9
