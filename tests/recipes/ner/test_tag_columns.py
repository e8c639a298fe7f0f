"""Tasks from the tag columns of CoNLL-2003-style files (``--tag-column``): part of speech (a plain tag
set: token accuracy) and chunks (IOB2 spans: seqeval's F1), read, fingerprinted and scored, on a tiny
corpus the tests write (``token POS chunk NER`` lines)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import toy_dataset, write_folders, write_tiny_model
from seqeval.metrics import f1_score

from layerfusion_recipes.cli import build_parser
from layerfusion_recipes.core.errors import DataSourceError
from layerfusion_recipes.core.results.cells import Cell
from layerfusion_recipes.core.sweeps import true_few_shot
from layerfusion_recipes.data.gold import spread_to_words
from layerfusion_recipes.data.readers import DataFormatError, read_ner_file
from layerfusion_recipes.data.sources import NerColumnError, NerColumns, load_ner
from layerfusion_recipes.ner.experiment import NerExperiment, NerSettings
from layerfusion_recipes.ner.scoring import SentenceTokenCounts, TokenAccuracyScorer
from layerfusion_recipes.ner.settings import resolve

# the part of speech of each toy word (conftest.WORDS); every other word is a noun
POS = {"went": "VBD", "met": "VBD", "visited": "VBD", "works": "VBZ", "walks": "VBZ", "to": "TO", "the": "DT"}
POS |= {"at": "IN", "in": "IN", "with": "IN", "and": "CC", "alice": "NNP", "bob": "NNP", "paris": "NNP"}
POS |= {"london": "NNP", "acme": "NNP", "corp": "NNP"}
PHRASE = {"NN": "NP", "NNP": "NP", "DT": "NP", "VBD": "VP", "VBZ": "VP", "TO": "PP", "IN": "PP"}


def chunks(pos: list[str]) -> list[str]:
    """IOB2 chunks of a sentence: a run of one phrase type is one chunk (``CC`` is outside)."""
    tags, previous = [], None
    for tag in pos:
        phrase = PHRASE.get(tag)
        tags.append("O" if phrase is None else f"{'I' if phrase == previous else 'B'}-{phrase}")
        previous = phrase
    return tags


def write_conll(directory: Path, train: int = 40, dev: int = 12, test: int = 12) -> str:
    """The toy corpus as CoNLL-2003 files: ``-DOCSTART-``, then ``token POS chunk NER`` lines."""
    directory.mkdir(parents=True, exist_ok=True)
    data = toy_dataset(train, dev, test)
    for name, split in (("train", data.train), ("valid", data.dev), ("test", data.test)):
        blocks = ["-DOCSTART- -X- -X- O"]
        for sentence in split:
            pos = [POS.get(token, "NN") for token in sentence.tokens]
            rows = zip(sentence.tokens, pos, chunks(pos), sentence.tags, strict=True)
            blocks.append("\n".join(" ".join(row) for row in rows))
        (directory / f"{name}.txt").write_text("\n\n".join(blocks) + "\n")
    return str(directory)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(tmp_path_factory, model=write_tiny_model, conll=write_conll)


def experiment(paths, column: int | None, **options) -> NerExperiment:
    data = paths["conll"]
    return NerExperiment(
        NerSettings(model=paths["model"], data=data, tag_column=column, batch_size=4, **options)
    )


# ----------------------------------------------------------------------------- reading


def test_each_column_reads_its_tags(paths):
    file = Path(paths["conll"]) / "train.txt"
    by_column = {column: read_ner_file(file, column) for column in (1, 2, 3, None)}
    first = by_column[None][0]
    pos = [POS.get(token, "NN") for token in first.tokens]
    assert by_column[1][0].tags == tuple(pos) and by_column[1][0].tokens == first.tokens
    assert by_column[2][0].tags == tuple(chunks(pos))
    assert by_column[3] == by_column[None]  # the last column: named entities, as before


@pytest.mark.parametrize(
    ("text", "column", "problem"),
    [
        ("EU NNP B-NP B-ORG\n", 4, "--tag-column 4: its lines have 4 columns (0: the token, 1 to 3: tags); "
         "give 1 to 3 (default: the last)"),
        ("EU NNP B-NP B-ORG\n", 0, "--tag-column 0: its lines have 4 columns"),
        ("EU\tB-ORG\n", 2, "--tag-column 2: its lines have 2 columns (0: the token, 1: the tag); give 1 "
         "(default: the last)"),
        ("1\tEU\tNNP\tB-ORG\n2\tsays\tVBZ\tO\n", 1, "--tag-column 1: its lines have 4 columns (0: the "
         "word index, 1: the token, 2 to 3: tags); give 2 to 3"),
    ],
)  # fmt: skip
def test_a_column_the_file_lacks_is_one_line(tmp_path, text, column, problem):
    path = tmp_path / "train.txt"
    path.write_text(text)
    with pytest.raises(DataFormatError) as error:
        read_ner_file(path, column)
    assert str(error.value) == f"{path}: {problem}" or str(error.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(error.value)


def test_a_tag_of_the_other_kind_stops_at_its_line(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("EU NNP\nrejects VBZ\n\nGerman JJ\ncall B-NP\n")
    with pytest.raises(
        DataFormatError, match=r"line 5: tag 'B-NP' is a span tag among plain tags \(e.g. 'NNP'\)"
    ):
        read_ner_file(path)


def test_plain_tags_load_as_their_own_types_with_a_note(paths, capsys):
    data = load_ner(paths["conll"], columns=NerColumns(tag_column=1))
    tags = sorted({POS.get(t, "NN") for s in data.train for t in s.tokens})
    assert data.tag_kind == "plain" and "O" not in data.labels
    assert data.labels == sorted(
        {tag for split in (data.train, data.dev, data.test) for s in split for tag in s.tags}
    )
    assert data.train_entity_types == tags  # C of the N*C sample: every tag of train
    common = Counter(tag for s in data.train for tag in s.tags).most_common(3)
    example = ", ".join(repr(tag) for tag, _ in common)
    note = f"data: {data.name}: plain tags (e.g. {example}; no B-/I- spans): scored by token accuracy, "
    assert capsys.readouterr().err.startswith(note)
    chunked = load_ner(paths["conll"], columns=NerColumns(tag_column=2))
    assert chunked.tag_kind == "spans" and chunked.train_entity_types == ["NP", "PP", "VP"]


def test_column_options_of_the_other_format_are_one_line(paths, tmp_path):
    (tmp_path / "train.jsonl").write_text('{"tokens": ["EU"], "ner_tags": ["B-ORG"]}\n')
    with pytest.raises(
        NerColumnError,
        match=(
            r"--tag-column 1 numbers the columns of a text file's lines and this is a table: "
            r"name its tag column with --tags-column$"
        ),
    ):
        load_ner(str(tmp_path), columns=NerColumns(tag_column=1))
    with pytest.raises(
        NerColumnError,
        match=(
            r"--tags-column 'pos' names a table's column and this is a text file: give its tag "
            r"column by number, --tag-column K"
        ),
    ):
        load_ner(paths["conll"], columns=NerColumns(tags="pos"))


def test_splits_of_two_kinds_and_a_scheme_of_plain_tags_are_one_line(tmp_path):
    (tmp_path / "train.txt").write_text("EU NNP\nrejects VBZ\n")
    (tmp_path / "dev.txt").write_text("EU B-ORG\nrejects O\n")
    (tmp_path / "test.txt").write_text("EU NNP\n")
    with pytest.raises(
        DataSourceError,
        match=(
            r"the dev split's tags are spans \(e.g. 'B-ORG'\) and the train split's are plain "
            r"tags \(e.g. 'NNP'\); every split needs one tag set$"
        ),
    ):
        load_ner(str(tmp_path))
    (tmp_path / "dev.txt").write_text("EU NNP\n")
    with pytest.raises(
        NerColumnError,
        match=(
            r"--tag-scheme iob2: the tags of .* are plain tags \(no B-/I- spans\), which have "
            r"no scheme; leave --tag-scheme out$"
        ),
    ):
        load_ner(str(tmp_path), columns=NerColumns(tag_scheme="iob2"))


# ----------------------------------------------------------------------------- options, fingerprint


def test_the_option_reaches_the_settings_and_the_fingerprint(paths):
    parse = lambda *flags: resolve(build_parser().parse_args(["ner", "--data", paths["conll"], *flags]))[0]  # noqa: E731
    default, pos, chunk = parse(), parse("--tag-column", "1"), parse("--tag-column", "2")
    assert (default.tag_column, pos.tag_column, chunk.tag_column) == (None, 1, 2)
    assert len({default.setup(), pos.setup(), chunk.setup()}) == 3  # another column is another task
    assert "tag_column" not in default.setup_fields() and pos.setup_fields()["tag_column"] == 1
    assert parse("--tag-column", "3").setup() != default.setup()  # the last column, named: still its own key


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_a_bad_column_number_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["ner", "--data", "d", "--tag-column", value])
    assert stop.value.code == 2
    assert f"--tag-column: must be a column number, 0 or more, got '{value}'" in capsys.readouterr().err


def test_settings_refuse_a_bad_column_in_one_line():
    with pytest.raises(ValueError, match=r"^--tag-column '1': a column number, 0 or more \(0-based\)$"):
        NerSettings(model="m", data="d", tag_column="1")


# ----------------------------------------------------------------------------- scoring


def test_token_accuracy_is_a_hand_count_with_unseen_words_wrong():
    sentences = [
        {"word_labels": [0, 1, 2, 0], "labelled_words": [0, 1, 2]},  # the fourth word is past the cut
        {"word_labels": [2, 2]},
    ]
    scorer = TokenAccuracyScorer(sentences, {0: "NN", 1: "VBZ", 2: "."})
    predicted = torch.tensor([[0, 1, 0, 2, 1], [1, 1, 2, 2, 2]])  # right: 2 + 1 = 3; 2 + 2 = 4 of 6 words
    assert scorer.accuracies(predicted) == [3 / 6, 4 / 6]
    counts = scorer.sentence_counts(predicted[0])
    assert counts.tolist() == [[2.0, 4.0], [1.0, 2.0]]
    units = SentenceTokenCounts(scorer)
    assert float(units.score(units.stats(predicted[0]).sum(0))) == 3 / 6
    assert float(units.score(units.stats(predicted[0])[1])) == 1 / 2  # any subset of sentences


def random_predictions(experiment: NerExperiment, seed: int) -> torch.Tensor:
    positions = sum(label != -100 for feature in experiment.test for label in feature["labels"])
    return torch.randint(len(experiment.labels), (positions,), generator=torch.Generator().manual_seed(seed))


def predicted_words(experiment: NerExperiment, predicted: torch.Tensor, outside: str) -> list[list[str]]:
    """The predicted tag of every word of every test sentence (an unseen word gets ``outside``)."""
    tags, start = [], 0
    for feature in experiment.test:
        count = sum(label != -100 for label in feature["labels"])
        names = [experiment.id2label[int(i)] for i in predicted[start : start + count]]
        tags.append(spread_to_words(names, feature, outside))
        start += count
    return tags


def gold_words(experiment: NerExperiment) -> list[list[str]]:
    return [[experiment.id2label[i] for i in feature["word_labels"]] for feature in experiment.test]


def test_part_of_speech_is_scored_by_token_accuracy(paths):
    pos = experiment(paths, 1, max_length=8)  # long sentences lose words: they count as wrong
    assert pos.metric_name == "accuracy" and pos.scorer_of(pos.test).metrics == ("accuracy",)
    assert pos.test_reach.unit == "words" and pos.test_reach.out_of_reach > 0
    for seed in range(3):
        predicted = random_predictions(pos, seed)
        words = predicted_words(pos, predicted, outside="unseen")
        gold = gold_words(pos)
        right = sum(p == g for ps, gs in zip(words, gold, strict=True) for p, g in zip(ps, gs, strict=True))
        assert pos.test_score(predicted) == right / sum(map(len, gold))


def test_chunks_are_scored_by_seqeval_span_f1(paths):
    chunk = experiment(paths, 2, max_length=8)
    assert chunk.metric_name == "f1" and chunk.labels[0] == "O"
    unseen = sum(len(f["word_labels"]) - len(f["labelled_words"]) for f in chunk.test)
    assert unseen > 0  # words past the cut: predicted O, as seqeval sees them
    for seed in range(3):
        predicted = random_predictions(chunk, seed)
        want = f1_score(gold_words(chunk), predicted_words(chunk, predicted, outside="O"))
        assert chunk.test_score(predicted) == pytest.approx(want, abs=1e-12)


# ----------------------------------------------------------------------------- both protocols


def test_the_dev_protocol_records_name_token_accuracy(paths):
    pos = experiment(paths, 1, lr=[1e-2])
    record = pos.run(Cell("none", "fe", shots=1, epochs=2, trial=0))
    assert record["metric"] == "accuracy" and 0.0 <= record["test_accuracy"] <= 1.0
    assert record["dev_accuracy"] == max(point["dev_accuracy"] for point in record["curve"])
    assert record["train_sentences"] == len(pos.data.train_entity_types)  # N * C, C = the tags of train
    assert record["dev_examples"] == len(pos.dev) and record["test_words"] == sum(map(len, gold_words(pos)))
    assert "test_f1" not in record and "dev_entities" not in record


def test_the_true_few_shot_protocol_scores_token_accuracy(paths, tmp_path):
    pos = experiment(paths, 1)
    plan = true_few_shot.Plan(shots=(1,), trials=1, folds=2, save_adapters=False)
    summary = true_few_shot.run_true_few_shot(pos, plan, tmp_path)
    assert summary["metric"] == "accuracy"
    [cell] = summary["cells"]
    scores = {name: entry["test"][0] for name, entry in cell["methods"].items()}
    assert all(0.0 <= score <= 1.0 for score in scores.values())
    assert scores[true_few_shot.CEILING] >= scores["best_layer"]


def test_too_many_shots_for_the_tags_is_one_line(paths):
    pos = experiment(paths, 1)
    tags = len(pos.data.train_entity_types)
    with pytest.raises(
        ValueError,
        match=(
            rf"^--shots 9 asks for 9 x {tags} tags = {9 * tags} training sentences, the train "
            rf"split has 40; use --shots <= {40 // tags}$"
        ),
    ):
        pos.check_shots([9])
