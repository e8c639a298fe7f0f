"""Scoring against the full gold: words past --max-length or with no sub-word count as missed."""

from __future__ import annotations

import pytest
import torch
from conftest import toy_dataset, write_tiny_model
from seqeval.metrics import f1_score
from torch import nn
from transformers import AutoTokenizer

from layerfusion_recipes.core.batches import collate
from layerfusion_recipes.core.engine.runner import labelled_predictions
from layerfusion_recipes.data.gold import gold_reach, spread_to_words, word_label_ids
from layerfusion_recipes.data.readers import NerDataset, NerSentence, encode_ner
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from layerfusion_recipes.ner.scoring import SpanScorer
from layerfusion_recipes.ner.training import TokenClassifierRunner, evaluate_f1

LABELS = ["O", "B-LOC", "B-ORG", "B-PER", "I-ORG"]
LABEL2ID = {label: i for i, label in enumerate(LABELS)}
ID2LABEL = dict(enumerate(LABELS))
ZERO_WIDTH_SPACE = "\u200b"  # a word the tokenizer turns into no sub-word at all
SENTENCES = [
    NerSentence(("alice", "met", "bob", "in", "paris"), ("B-PER", "O", "B-PER", "O", "B-LOC")),
    NerSentence(("bob", ZERO_WIDTH_SPACE, "works"), ("B-PER", "B-ORG", "O")),
    NerSentence(("acme", "corp", "and", "alice"), ("B-ORG", "I-ORG", "O", "B-PER")),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(write_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


class OracleRunner(TokenClassifierRunner):
    """Predicts the gold label at every position the model sees (a perfect model)."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(1, 1).eval())

    def logits(self, features, device):
        labels = collate(features)["labels"]  # (batch, seq)
        return nn.functional.one_hot(labels.clamp(min=0), len(LABELS)).float(), labels


def test_features_keep_every_words_gold_and_where_the_model_sees_it(tokenizer):
    # [CLS] alice met bob [SEP]: "in" and "paris" are cut; the zero-width space has no sub-word
    first, second, _ = encode_ner(tokenizer, SENTENCES, LABEL2ID, max_length=5)
    assert first["word_labels"] == [3, 0, 3, 0, 1] and first["labelled_words"] == [0, 1, 2]
    assert second["word_labels"] == [3, 2, 0] and second["labelled_words"] == [0, 2]


@pytest.mark.parametrize("max_length", [5, 6, 128])
def test_a_perfect_model_scores_seqeval_on_the_full_gold(tokenizer, max_length):
    features = encode_ner(tokenizer, SENTENCES, LABEL2ID, max_length)
    f1 = evaluate_f1(OracleRunner(), features, ID2LABEL, batch_size=2, device=torch.device("cpu"))
    # what seqeval says on the full gold when every word the model sees is right, the rest O
    gold = [list(s.tags) for s in SENTENCES]
    seen = [set(f["labelled_words"]) for f in features]
    predicted = [[t if i in s else "O" for i, t in enumerate(g)] for g, s in zip(gold, seen, strict=True)]
    expected = f1_score(gold, predicted, average="micro", zero_division=0)
    assert f1 == expected
    reach = gold_reach(features, ID2LABEL)
    assert reach.entities == 7
    # out of reach at 5: paris, the zero-width space's ORG, the last alice; at 128: that ORG only
    assert reach.out_of_reach == {5: 3, 6: 2, 128: 1}[max_length]
    assert f1 == pytest.approx(reach.best_f1)  # a perfect model reaches exactly the ceiling
    assert f1 < 1.0  # scoring the truncated features alone said 1.0


def test_predicted_tags_are_spread_on_the_words_of_the_gold(tokenizer):
    features = encode_ner(tokenizer, SENTENCES[:2], LABEL2ID, max_length=5)
    logits, labels = OracleRunner().logits(features, None)
    ids = labelled_predictions(logits, labels).tolist()  # the labelled positions, sentence after sentence
    tags = [ID2LABEL[i] for i in ids]
    assert [tags[:3], tags[3:]] == [["B-PER", "O", "B-PER"], ["B-PER", "O"]]
    spread = [spread_to_words(tags[:3], features[0]), spread_to_words(tags[3:], features[1])]
    assert spread == [["B-PER", "O", "B-PER", "O", "O"], ["B-PER", "O", "O"]]
    gold = [[ID2LABEL[label] for label in word_label_ids(f)] for f in features]
    assert gold == [list(s.tags) for s in SENTENCES[:2]]
    assert f1_score(gold, spread, average="micro", zero_division=0) == pytest.approx(2 * 0.6 / 1.6)
    assert SpanScorer(features, ID2LABEL).f1(torch.tensor(ids)) == pytest.approx(2 * 0.6 / 1.6)


def _dataset(dev: list[NerSentence]) -> NerDataset:
    return NerDataset(toy_dataset(train=20).train, dev, [], name="cut")


def test_experiment_says_how_many_dev_entities_are_out_of_reach_and_records_it(tokenizer, capsys):
    model = tokenizer.name_or_path
    settings = NerSettings(model=model, data="cut", max_length=5, lr=3e-2, batch_size=4)
    experiment = NerExperiment(settings, _dataset(SENTENCES))
    err = capsys.readouterr().err
    assert "dev: 3 of 7 gold entities (42.9%) are out of the model's reach" in err and "--max-length 5" in err
    record = experiment.run(Cell("none", "fe", shots=2, epochs=2, trial=0))
    assert (record["dev_entities"], record["dev_entities_out_of_reach"]) == (7, 3)
    assert record["best_f1"] <= experiment.dev_reach.best_f1 + 1e-12


def test_a_max_length_that_leaves_no_entity_in_reach_is_refused(tokenizer):
    settings = NerSettings(model=tokenizer.name_or_path, data="cut", max_length=2)
    with pytest.raises(ValueError, match="--max-length 2 leaves no room for a word"):
        NerExperiment(settings, _dataset(SENTENCES))
    late = [NerSentence(("went", "to", "the", "paris"), ("O", "O", "O", "B-LOC"))]
    settings = NerSettings(model=tokenizer.name_or_path, data="cut", max_length=4)
    with pytest.raises(ValueError, match="none of the 1 dev gold entities is within the model's reach"):
        NerExperiment(settings, _dataset(late))
