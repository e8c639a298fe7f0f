"""NER data through `datasets`: saved datasets, json/csv/parquet/arrow, split names, columns, tag schemes."""

from __future__ import annotations

import json
import re

import datasets
import pytest

from layerfusion_recipes.core.errors import DataSourceError
from layerfusion_recipes.core.options.locations import looks_like_hub_name
from layerfusion_recipes.data.readers import NerSentence
from layerfusion_recipes.data.sources import (
    NerColumnError,
    NerColumns,
    load_ner,
    parse_list_cell,
)
from layerfusion_recipes.data.tags import bioes_to_iob2, count_iob1_starts, iob1_to_iob2, to_iob2

NAMES = ["O", "B-ORG", "I-ORG", "B-PER"]
ROWS = {  # split -> (tokens, ner_tags ids)
    "train": [(["EU", "rejects", "Acme", "Corp"], [1, 0, 1, 2]), (["Peter", "runs"], [3, 0])],
    "validation": [(["Bob"], [3])],
    "test": [(["Acme", "wins"], [1, 0]), (["Ann"], [3])],
}
FEATURES = datasets.Features(
    {
        "tokens": datasets.List(datasets.Value("string")),
        "ner_tags": datasets.List(datasets.ClassLabel(names=NAMES)),
    }
)


def _table(rows, features=FEATURES, tags="ner_tags", tokens="tokens") -> datasets.Dataset:
    names = features[tags].feature.names if hasattr(features[tags].feature, "names") else None
    return datasets.Dataset.from_dict(
        {tokens: [r[0] for r in rows], tags: [r[1] if names else [NAMES[t] for t in r[1]] for r in rows]},
        features=features,
    )


def _sentences(split):
    return [NerSentence(tuple(tokens), tuple(NAMES[t] for t in tags)) for tokens, tags in ROWS[split]]


def _expected(data):
    assert data.train == _sentences("train") and data.dev == _sentences("validation")
    assert data.test == _sentences("test") and data.labels == ["O", "B-ORG", "B-PER", "I-ORG"]


@pytest.mark.parametrize("dev_name", ["validation", "val", "dev", "valid"])
def test_save_to_disk_dataset_dict_with_classlabel_and_dev_aliases(tmp_path, dev_name):
    splits = {"train": "train", dev_name: "validation", "test": "test"}
    datasets.DatasetDict({name: _table(ROWS[split]) for name, split in splits.items()}).save_to_disk(tmp_path)
    data = load_ner(str(tmp_path))
    _expected(data)
    assert data.notes == []


def test_save_to_disk_single_dataset_is_split_with_fixed_seed(tmp_path, capsys):
    rows = [([f"w{i}", "Bob"], [0, 3]) for i in range(10)]
    _table(rows).save_to_disk(tmp_path)
    data = load_ner(str(tmp_path), split_seed=1)
    assert (len(data.train), len(data.dev), len(data.test)) == (6, 2, 2)
    assert {s.tokens[0] for s in data.train + data.dev + data.test} == {f"w{i}" for i in range(10)}
    assert data.dev == load_ner(str(tmp_path), split_seed=1).dev != load_ner(str(tmp_path), split_seed=2).dev
    note = f"{tmp_path}: one split only: cut into train/dev/test 60/20/20 with seed 1"
    assert data.notes == [note] and capsys.readouterr().err.count(note) == 2  # once per load


def _write(table: datasets.Dataset, path, kind: str) -> None:
    {"jsonl": table.to_json, "csv": table.to_csv, "parquet": table.to_parquet}[kind](str(path))


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("string_tags", [False, True])
def test_split_directory_of_tabular_files(tmp_path, kind, string_tags):
    features = FEATURES
    if string_tags:
        features = datasets.Features({**FEATURES, "ner_tags": datasets.List(datasets.Value("string"))})
    for name, split in (("train", "train"), ("val", "validation"), ("test", "test")):
        _write(_table(ROWS[split], features), tmp_path / f"{name}.{kind}", kind)
    names = None if string_tags or kind == "parquet" else tuple(NAMES)  # json/csv lose the ClassLabel
    _expected(load_ner(str(tmp_path), columns=NerColumns(label_names=names)))


def test_arrow_files_of_save_to_disk_as_split_files(tmp_path):
    for split in ("train", "validation"):
        _table(ROWS[split]).save_to_disk(tmp_path / "saved" / split)
        (tmp_path / "saved" / split / "data-00000-of-00001.arrow").rename(tmp_path / f"{split}.arrow")
    data = load_ner(str(tmp_path))
    assert data.train == _sentences("train") and data.dev == _sentences("validation")


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "csv"])
def test_single_tabular_file_is_split(tmp_path, kind):
    rows = [([f"w{i}", "Acme"], [0, 1]) for i in range(10)]
    path = tmp_path / f"ner.{kind}"
    _write(_table(rows), path, kind)
    data = load_ner(str(path), columns=NerColumns(label_names=tuple(NAMES)))
    assert (len(data.train), len(data.dev), len(data.test)) == (6, 2, 2)
    assert all(s.tags == ("O", "B-ORG") for s in data.train) and data.entity_types == ["ORG"]


def test_integer_tags_need_label_names(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"tokens": ["EU"], "ner_tags": [1]}) + "\n")
    (tmp_path / "dev.jsonl").write_text(json.dumps({"tokens": ["Bob"], "ner_tags": [3]}) + "\n")
    with pytest.raises(NerColumnError, match="dev.jsonl: column 'ner_tags' holds integer tags without names"):
        load_ner(str(tmp_path))
    data = load_ner(str(tmp_path), columns=NerColumns(label_names=tuple(NAMES)))
    assert data.train == [NerSentence(("EU",), ("B-ORG",))] and data.dev == [
        NerSentence(("Bob",), ("B-PER",))
    ]
    outside = r"dev.jsonl: tag ids 3\.\.3 of column 'ner_tags' outside the 1 label names \['O'\]$"
    with pytest.raises(NerColumnError, match=outside):
        load_ner(str(tmp_path), columns=NerColumns(label_names=("O",)))


def test_columns_by_convention_and_by_flag(tmp_path):
    row = {"id": 0, "words": ["Bob", "runs"], "labels": ["B-PER", "O"], "ner": ["I-PER", "O"]}
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "validation.jsonl").write_text(json.dumps(row) + "\n")
    assert load_ner(str(tmp_path)).train[0] == NerSentence(("Bob", "runs"), ("B-PER", "O"))
    flagged = load_ner(str(tmp_path), columns=NerColumns(tokens="words", tags="ner", tag_scheme="iob2"))
    assert flagged.train[0].tags == ("I-PER", "O")  # iob2: nothing converted
    with pytest.raises(
        NerColumnError, match=r"no column 'toks' \(--tokens-column\); columns: \['id', 'words'"
    ):
        load_ner(str(tmp_path), columns=NerColumns(tokens="toks"))
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": ["Bob"], "labels": ["O"]}) + "\n")
    with pytest.raises(NerColumnError, match=r"none of the columns \['text', 'labels'\].*--tokens-column"):
        load_ner(str(tmp_path))


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"tokens": ["EU", "x"], "ner_tags": ["B-ORG"]}, "row 1: 2 tokens but 1 tags"),
        ({"tokens": ["EU"], "ner_tags": ["ORG"]}, "row 1: tag 'ORG' is not O or B-/I-<type>"),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, row, problem):
    good = {"tokens": ["Bob"], "ner_tags": ["B-PER"]}
    path = tmp_path / "ner.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(NerColumnError, match=f"{path}, {problem}"):
        load_ner(str(path))


def test_text_split_files_with_val_name_and_no_dev_split(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("\n\n".join(f"w{i}\tO\nBob\tB-PER" for i in range(10)) + "\n")
    (tmp_path / "test.txt").write_text("Ann\tB-PER\n")
    data = load_ner(str(tmp_path))
    assert (len(data.train), len(data.dev), data.test) == (8, 2, [NerSentence(("Ann",), ("B-PER",))])
    assert data.notes == [f"{tmp_path}: no dev split: cut into train/dev 80/20 with seed 0"]
    (tmp_path / "val.conll").write_text("Bob\tB-PER\n")
    assert load_ner(str(tmp_path)).dev == [NerSentence(("Bob",), ("B-PER",))]
    (tmp_path / "dev.jsonl").write_text(json.dumps({"tokens": ["x"], "tags": ["O"]}) + "\n")
    with pytest.raises(
        DataSourceError, match=r"several files for one split \{'dev': \['dev.jsonl', 'val.conll'\]\}"
    ):
        load_ner(str(tmp_path))


def test_iob1_normalised_to_iob2_and_said_once(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("EU I-ORG\nAcme I-ORG\nCorp I-ORG\nBob I-PER\n\nx O\n")
    (tmp_path / "dev.txt").write_text("Ann I-PER\nBen B-PER\n")
    data = load_ner(str(tmp_path))
    assert data.train[0].tags == ("B-ORG", "I-ORG", "I-ORG", "B-PER")
    assert data.dev[0].tags == ("B-PER", "B-PER") and data.labels == ["O", "B-ORG", "B-PER", "I-ORG"]
    note = "IOB1 tags normalised to IOB2: 3 entities opened by I- now open with B-"
    assert data.notes == [f"{tmp_path}: {note}"] and capsys.readouterr().err.count(note) == 1


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        (["S-PER", "O", "B-LOC", "I-LOC", "E-LOC"], ("B-PER", "O", "B-LOC", "I-LOC", "I-LOC")),
        (["U-PER", "O", "B-LOC", "L-LOC"], ("B-PER", "O", "B-LOC", "I-LOC")),
    ],
)
def test_bioes_and_bilou_converted(tmp_path, tags, expected):
    path = tmp_path / "ner.jsonl"
    path.write_text(json.dumps({"tokens": [f"w{i}" for i in range(len(tags))], "ner_tags": tags}) + "\n")
    data = load_ner(str(path), split_seed=0)
    assert (data.train + data.dev + data.test)[0].tags == expected
    scheme = "BIOES" if "S-PER" in tags else "BILOU"
    assert data.notes[-1] == f"{path}: {scheme} tags converted to IOB2 (S-/U- to B-, E-/L- to I-)"


@pytest.mark.parametrize(
    ("tags", "scheme", "problem"),
    [
        (["S-PER", "U-LOC"], "auto", "tags mix BIOES (E-/S-) and BILOU (L-/U-) prefixes"),
        (["S-PER", "O"], "iob2", "--tag-scheme iob2: tags ['S-PER'] do not belong to IOB2"),
        (["L-PER", "O"], "bioes", "--tag-scheme bioes: tags ['L-PER'] do not belong to BIOES"),
    ],
)
def test_tag_scheme_conflicts_refused(tmp_path, tags, scheme, problem):
    path = tmp_path / "ner.jsonl"
    path.write_text(json.dumps({"tokens": ["a", "b"], "ner_tags": tags}) + "\n")
    with pytest.raises(NerColumnError, match=f"^{re.escape(str(path))}: {re.escape(problem)}"):
        load_ner(str(path), columns=NerColumns(tag_scheme=scheme))


def test_tag_conversions():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC"]) == (
        "B-PER",
        "I-PER",
        "B-PER",
        "B-LOC",
        "O",
        "B-LOC",
    )
    assert bioes_to_iob2(["S-A", "B-A", "E-A", "U-B", "L-B"]) == ("B-A", "B-A", "I-A", "B-B", "I-B")
    assert count_iob1_starts([["B-A", "I-A", "O", "I-B"], ["I-A"]]) == 2
    assert to_iob2([["B-A", "I-A"]]) == ([("B-A", "I-A")], "")
    with pytest.raises(
        ValueError, match="--tag-scheme 'bio': expected one of auto, iob1, iob2, bioes, bilou"
    ):
        to_iob2([["O"]], "bio")


def test_list_cells_of_csv_are_parsed_literal_by_literal():
    assert parse_list_cell("['EU' 'rejects']") == ["EU", "rejects"]  # NumPy repr: no 'EUrejects'
    assert parse_list_cell("['New York', \"it's\"]") == ["New York", "it's"]
    assert parse_list_cell("[1 0 -2]") == [1, 0, -2]
    assert parse_list_cell("B-ORG O") == ["B-ORG", "O"]


def test_missing_path_and_offline_hub_name(tmp_path, monkeypatch):
    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("Couldn't reach 'conll2003' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    missing = tmp_path / "missing" / "train.jsonl"
    with pytest.raises(DataSourceError, match=f"^--data '{missing}': no such file or directory$"):
        load_ner(str(missing))
    assert calls == []  # a path is never sent to the Hub
    with pytest.raises(DataSourceError) as error:
        load_ner("conll2003")
    assert str(error.value) == (
        "--data 'conll2003': no such file or directory, and not loadable from the Hugging Face Hub "
        "(Couldn't reach 'conll2003' on the Hub (LocalEntryNotFoundError))"
    )
    assert isinstance(error.value, FileNotFoundError) and calls == [("conll2003",)]
    assert (
        looks_like_hub_name("user/ner-data")
        and not looks_like_hub_name("./ner")
        and not looks_like_hub_name("a/b/c")
    )


def test_directory_without_train_lists_what_it_found(tmp_path):
    (tmp_path / "dev.txt").write_text("a\tO\n")
    with pytest.raises(DataSourceError, match=r"needs a train file .* found \['dev.txt'\]"):
        load_ner(str(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"tag_scheme": "bio"}, "--tag-scheme 'bio': expected one of"),
        ({"label_names": ("O", "B-PER", "PER")}, r"--label-names: tag 'PER' is not O or B-/I-<type>"),
        ({"label_names": ("O", "B PER")}, r"--label-names: \['B PER'\] are empty or hold a space"),
        ({"tag_column": -1}, "--tag-column -1: a column number counts from 0"),
    ],
)
def test_bad_column_options(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        NerColumns(**kwargs)


def test_unreadable_list_cell_names_file_and_row(tmp_path):
    path = tmp_path / "ner.jsonl"
    rows = [{"tokens": "Bob runs", "ner_tags": "B-PER O"}, {"tokens": "['EU", "ner_tags": "B-ORG"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(
        NerColumnError, match=f'^{re.escape(str(path))}, row 1: cannot read a list from "\\[\'EU"'
    ):
        load_ner(str(path))


def test_cli_reads_a_saved_dataset_with_named_columns(tmp_path, capsys):
    from conftest import toy_dataset, write_tiny_model

    from layerfusion_recipes.cli import main
    from layerfusion_recipes.core.results.records import read_records

    toy = toy_dataset(train=12, dev=4, test=0)
    names = sorted({tag for s in toy.train + toy.dev for tag in s.tags})

    def table(sentences):
        return datasets.Dataset.from_dict(
            {
                "words": [list(s.tokens) for s in sentences],
                "ner": [[names.index(t) for t in s.tags] for s in sentences],
            }
        )

    datasets.DatasetDict(train=table(toy.train), val=table(toy.dev)).save_to_disk(tmp_path / "data")
    argv = ["ner", "--model", write_tiny_model(tmp_path / "model"), "--data", str(tmp_path / "data")]
    argv += ["--tokens-column", "words", "--tags-column", "ner", "--methods", "none", "--quiet"]
    argv += ["--shots", "1", "--epochs", "1", "--trials", "1", "--lr", "1e-3"]
    assert main([*argv, "--label-names", *names, "--output", str(tmp_path / "out")]) == 0
    (record,) = read_records(tmp_path / "out" / "results.jsonl")
    assert record["data"] == str(tmp_path / "data") and 0 <= record["best_f1"] <= 1
    assert record["train_sentences"] == 3  # 1 shot x C = 3 entity types (PER, LOC, ORG)
    assert main([*argv, "--output", str(tmp_path / "o2")]) == 2  # integer tags, no names
    assert "holds integer tags without names; give --label-names" in capsys.readouterr().err


def test_unreadable_tabular_file_is_one_error(tmp_path):
    path = tmp_path / "ner.parquet"
    path.write_text("EU\tB-ORG\n")
    with pytest.raises(NerColumnError, match=f"^{re.escape(str(path))}: not readable as parquet \\("):
        load_ner(str(path))


def test_other_splits_of_a_dataset_dict_are_ignored_and_said(tmp_path):
    splits = {"train": "train", "validation": "validation", "val": "test", "extra": "test"}
    datasets.DatasetDict({name: _table(ROWS[split]) for name, split in splits.items()}).save_to_disk(tmp_path)
    data = load_ner(str(tmp_path))
    assert data.dev == _sentences("validation") and data.test == []
    assert data.notes == [
        f"{tmp_path}: split(s) ['val', 'extra'] ignored (no train/dev/test alias, or a second one)"
    ]
