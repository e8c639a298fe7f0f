"""Classification data as users have it: every format, the column conventions, labels as ids or names,
the dev cut, and one line naming file, line and cause for what cannot be read."""

from __future__ import annotations

import json
import re

import pytest

from layerfusion_recipes.core.errors import DataSourceError
from layerfusion_recipes.data.readers import DataFormatError
from layerfusion_recipes.data.sampling import check_per_class, describe_short_classes, sample_per_class
from layerfusion_recipes.data.texts import TextColumns, TextExample, load_texts

ROWS = [("good film", "pos"), ("bad film", "neg"), ("great plot", "pos"), ("dull plot", "neg")]


def write_csv(path, header, rows, delimiter=","):
    path.write_text("\n".join([delimiter.join(header), *(delimiter.join(map(str, r)) for r in rows)]) + "\n")
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def splits(tmp_path, writer, suffix, rows=ROWS, **kwargs):
    for name in ("train", "validation", "test"):
        writer(tmp_path / f"{name}{suffix}", rows, **kwargs)
    return tmp_path


EXPECTED = [TextExample(text, None, label) for text, label in ROWS]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json-array", "parquet", "save_to_disk"])
def test_every_format_reads_the_same_examples(tmp_path, fmt):
    if fmt in ("csv", "tsv"):
        delimiter, suffix = ("," if fmt == "csv" else "\t"), f".{fmt}"
        splits(tmp_path, lambda p, r: write_csv(p, ["sentence", "label"], r, delimiter), suffix)
    elif fmt == "jsonl":
        splits(tmp_path, lambda p, r: write_jsonl(p, [{"text": t, "label": x} for t, x in r]), ".jsonl")
    elif fmt == "json-array":
        splits(
            tmp_path, lambda p, r: p.write_text(json.dumps([{"text": t, "label": x} for t, x in r])), ".json"
        )
    else:
        import datasets

        parts = {
            name: datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": [x for _, x in ROWS]})
            for name in ("train", "validation", "test")
        }
        if fmt == "parquet":
            for name, part in parts.items():
                part.to_parquet(str(tmp_path / f"{name}.parquet"))
        else:
            datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "saved"))
            tmp_path = tmp_path / "saved"
    data = load_texts(str(tmp_path))
    assert data.train == data.dev == data.test == EXPECTED
    assert data.labels == ["neg", "pos"] and data.notes == []


def test_class_label_ids_read_as_names_in_their_order_and_missing_labels_dropped(tmp_path, capsys):
    import datasets

    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["positive", "negative"])}
    )
    train = datasets.Dataset.from_dict({"sentence": ["a", "b", "c"], "label": [1, 0, 1]}, features=features)
    test = datasets.Dataset.from_dict({"sentence": ["d", "e"], "label": [-1, -1]}, features=features)  # GLUE
    datasets.DatasetDict({"train": train, "validation": train, "test": test}).save_to_disk(str(tmp_path))
    data = load_texts(str(tmp_path))
    assert data.labels == ["positive", "negative"]  # the ClassLabel's order, not sorted
    assert [e.label for e in data.train] == ["negative", "positive", "negative"]
    assert data.test == [] and "no labelled example" in capsys.readouterr().err


def test_integer_labels_sort_as_numbers_and_names_as_text(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"text": f"t{i}", "label": i} for i in (10, 2, 1, 2.0)])
    write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "label": 2}])
    assert load_texts(str(tmp_path)).labels == ["1", "2", "10"]
    write_jsonl(
        tmp_path / "train.jsonl", [{"text": f"t{i}", "label": n} for i, n in enumerate(["b", "a", "C"])]
    )
    write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "label": "a"}])
    assert load_texts(str(tmp_path)).labels == ["C", "a", "b"]


def test_json_boolean_labels_are_labels(tmp_path):
    """`"label": true` (a yes/no task written by a JSON tool) is a label, named as JSON writes it."""
    write_jsonl(tmp_path / "train.jsonl", [{"text": f"t{i}", "label": i % 2 == 0} for i in range(4)])
    write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "label": False}])
    data = load_texts(str(tmp_path))
    assert data.labels == ["false", "true"] and [e.label for e in data.train] == ["true", "false"] * 2
    assert [e.label for e in data.dev] == ["false"]


def test_a_latin1_csv_names_its_encoding_and_the_byte_offset_not_a_suffix(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes("text,label\ngood,pos\nK\u00f6ln,neg\n".encode("latin-1"))
    with pytest.raises(DataFormatError) as caught:
        load_texts(str(tmp_path))
    assert str(caught.value) == (
        f"{path}, line 3: not UTF-8 text (byte 0xf6 at column 2, byte offset 21): its encoding is not UTF-8 "
        "(e.g. Latin-1 or cp1252): convert it (`iconv -f latin1 -t utf-8`)"
    )


@pytest.mark.parametrize(
    ("header", "columns", "text", "pair", "label"),
    [
        (["premise", "hypothesis", "label"], TextColumns(), "premise", "hypothesis", "label"),
        (["sentence1", "sentence2", "Label"], TextColumns(), "sentence1", "sentence2", "Label"),
        (["Title", "Body", "Category"], TextColumns(), "Title", "Body", "Category"),  # title and body fields
        (["Text", "sentiment_label"], TextColumns(), "Text", None, "sentiment_label"),  # one column *label
        (["id", "review", "stars"], TextColumns(label="stars"), "review", None, "stars"),
        (["a", "b", "y"], TextColumns(text="a", pair="b", label="y"), "a", "b", "y"),
        (["premise", "hypothesis", "label"], TextColumns(text="hypothesis"), "hypothesis", None, "label"),
    ],
)
def test_columns_by_convention_or_named(tmp_path, header, columns, text, pair, label):
    row = [f"{name}-value" for name in header[:-1]] + ["yes"]
    write_csv(tmp_path / "train.csv", header, [row, [*row[:-1], "no"]])
    write_csv(tmp_path / "dev.csv", header, [row])
    data = load_texts(str(tmp_path), columns)
    assert data.columns == {"text": text, "pair": pair, "label": label}
    assert data.dev == [TextExample(f"{text}-value", f"{pair}-value" if pair else None, "yes")]


def test_dev_cut_from_train_when_missing_said_on_stderr(tmp_path, capsys):
    rows = [{"text": f"q{i}", "coarse_label": "AB"[i % 2], "fine_label": "x"} for i in range(50)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", rows[:4])
    with pytest.raises(
        DataSourceError, match=r"train.jsonl: no label column .* \(several could be: \['coarse_label'"
    ):
        load_texts(str(tmp_path))
    data = load_texts(str(tmp_path), TextColumns(label="coarse_label"))
    assert (len(data.train), len(data.dev), len(data.test)) == (40, 10, 4)
    assert not set(data.dev) & set(data.train) and len(set(data.train + data.dev)) == 50
    assert "no dev split: cut into train/dev 80/20 with seed 0" in capsys.readouterr().err
    single = load_texts(str(tmp_path / "train.jsonl"), TextColumns(label="coarse_label"))
    assert (len(single.train), len(single.dev), len(single.test)) == (30, 10, 10)


@pytest.mark.parametrize(
    ("name", "content", "message"),  # message: what the error says after the file's name
    [
        ("train.csv", "text,label\ngood,pos\nbad,neg,extra\n", r", line 3: 3 fields where the header has 2"),
        ("train.csv", 'text,label\n"never closed,pos\n', r", line \d+: "),
        ("train.tsv", "text\tlabel\ngood\tpos\n\t neg\n", r", line 3: empty text in column 'text'"),
        ("train.tsv", "text\tlabel\ngood\tpos\nbad\t\n", r", line 3: label '' of column 'label'"),
        ("train.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n', r", line 2: not a JSON"),
        ("train.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n', r", line 2: no value for column"),
        ("train.jsonl", '{"text": 3, "label": "x"}\n', r", line 1: the text column 'text' holds int"),
        ("train.jsonl", '{"text": "a", "label": null}\n', r", line 1: no label in column 'label'"),
        ("train.csv", "just_one\nvalue\n", r", line 1: the header has 1 column"),
        ("train.csv", "", r": empty file"),
    ],
)  # fmt: skip
def test_bad_files_and_values_are_one_line_with_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises((DataSourceError, DataFormatError), match=re.escape(name) + message) as caught:
        load_texts(str(tmp_path))
    assert "\n" not in str(caught.value)


def test_dev_label_unseen_in_train_names_the_line(tmp_path):
    write_csv(tmp_path / "train.csv", ["text", "label"], [("a", "pos"), ("b", "neg")])
    write_csv(tmp_path / "dev.csv", ["text", "label"], [("c", "pos"), ("d", "maybe")])
    with pytest.raises(DataSourceError, match=r"dev.csv, line 3: dev label 'maybe' does not occur in train"):
        load_texts(str(tmp_path))


def test_named_column_missing_and_no_source(tmp_path):
    write_csv(tmp_path / "train.csv", ["text", "label"], [("a", "pos")])
    with pytest.raises(
        DataSourceError, match=r"no column 'body' \(--text-column\); columns: \['text', 'label'\]"
    ):
        load_texts(str(tmp_path), TextColumns(text="body"))
    with pytest.raises(DataSourceError, match="no such file or directory"):
        load_texts(str(tmp_path / "nowhere.csv"))


def test_hub_name_online_and_offline(monkeypatch):
    import datasets

    calls = []
    online = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [0, 1]})}
    )

    def load_dataset(*args, **kwargs):
        calls.append(args)
        if args[0] == "someone/set":
            return online
        raise ConnectionError("Couldn't reach 'someone/no-set' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert load_texts("someone/set").labels == ["0", "1"]
    with pytest.raises(DataSourceError) as error:
        load_texts("someone/no-set")
    assert str(error.value) == (
        "--data 'someone/no-set': no such file or directory, and not loadable from the Hugging Face Hub "
        "(Couldn't reach 'someone/no-set' on the Hub (LocalEntryNotFoundError))"
    )
    assert calls == [("someone/set",), ("someone/no-set",)]


def test_sample_per_class_is_stratified_seeded_takes_a_small_class_whole_and_refuses_too_many():
    examples = [TextExample(f"t{i}", None, "ab"[i % 3 == 0]) for i in range(30)]  # 10 'b', 20 'a'
    sample = sample_per_class(examples, 4, ["a", "b"], lambda e: e.label, seed=7)
    assert [e.label for e in sample] == ["a"] * 4 + ["b"] * 4 and len(set(sample)) == 8
    assert sample == sample_per_class(examples, 4, ["a", "b"], lambda e: e.label, seed=7)
    assert sample != sample_per_class(examples, 4, ["a", "b"], lambda e: e.label, seed=8)
    larger = sample_per_class(examples, 11, ["a", "b"], lambda e: e.label, seed=0)  # 'b' has 10: all of it
    assert [e.label for e in larger] == ["a"] * 11 + ["b"] * 10 and len(set(larger)) == 21
    assert {e for e in larger if e.label == "b"} == {e for e in examples if e.label == "b"}
    with pytest.raises(ValueError) as error:
        sample_per_class(examples, 21, ["a", "b"], lambda e: e.label, seed=0)
    assert str(error.value) == (
        "--shots 21 asks for 21 examples of each class; the largest class, 'a', has 20 in train: use "
        "--shots <= 20, or --shots all for the whole train split"
    )


def test_the_classes_taken_whole_are_said_in_one_line():
    short = check_per_class({"x": 9, "r": 3, "o": 5, "t": 8}, 8)
    assert short == {"r": 3, "o": 5}  # smallest first; 't' has 8: enough
    assert describe_short_classes(short, 8, 4) == (
        "--shots 8: 2 classes have fewer train examples and are taken whole: 'r' (3), 'o' (5); a sample "
        "has 24 examples, not 8 x 4 = 32"
    )
    many = {f"c{i}": 1 for i in range(8)}
    assert describe_short_classes(many, 2, 9).endswith(
        "'c5' (1) and 2 more; a sample has 10 examples, not 2 x 9 = 18"
    )
