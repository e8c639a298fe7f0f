"""Readers, malformed files, sub-word label alignment."""

from __future__ import annotations

import pytest
from conftest import write_tiny_model

from layerfusion_recipes.core.batches import IGNORE_INDEX, collate
from layerfusion_recipes.data.readers import (
    DataFormatError,
    NerSentence,
    align_labels,
    encode_ner,
    read_ner_file,
    read_text,
    split_sentences,
)
from layerfusion_recipes.data.sources import load_ner


def test_conll_columns_skip_docstart(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    sentences = read_ner_file(path)
    assert sentences == [NerSentence(("EU", "rejects"), ("B-ORG", "O")), NerSentence(("Peter",), ("B-PER",))]


def test_wikiann_prefix_stripped_when_every_token_has_it(tmp_path):
    path = tmp_path / "dev"
    path.write_text("en:Sioux\tB-ORG\nen:Falls\tI-ORG\n\nen:http://x.y\tO\nen:Paris\tB-LOC\n\n\n")
    sentences = read_ner_file(path)
    assert sentences[0] == NerSentence(("Sioux", "Falls"), ("B-ORG", "I-ORG"))
    assert sentences[1] == NerSentence(("http://x.y", "Paris"), ("O", "B-LOC"))


@pytest.mark.parametrize(
    "text",
    ["re:Invent\tB-MISC\nis\tO\n", "de:Berlin\tB-LOC\nen:Paris\tB-LOC\n", "fr:Paris\tB-LOC\nParis\tB-LOC\n"],
)
def test_lang_prefix_kept_outside_wikiann(tmp_path, text):
    path = tmp_path / "ner.txt"
    path.write_text(text)
    expected = tuple(line.split("\t")[0] for line in text.splitlines())
    assert read_ner_file(path)[0].tokens == expected


def test_bom_before_docstart_is_not_a_sentence(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n", encoding="utf-8")
    assert read_ner_file(path) == [NerSentence(("EU", "rejects"), ("B-ORG", "O"))]


def test_stray_tab_in_conll_line_separates_columns(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP\tB-MISC\ncall NN I-NP O\n")
    (sentence,) = read_ner_file(path)
    assert sentence.tokens == ("EU", "rejects", "German", "call")
    assert sentence.tags == ("B-ORG", "O", "B-MISC", "O")


def test_space_inside_tab_separated_token_is_kept(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("I\tO\nlove\tO\nNew York\tB-LOC\n")
    assert read_ner_file(path)[0].tokens == ("I", "love", "New York")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("I O\nlove O\nNew York B-LOC\n", "3 space-separated fields where the file's lines have 2"),
        (
            "EU NNP B-NP B-ORG\nNew York NNP B-NP B-LOC\n",
            "5 space-separated fields where the file's lines have 4",
        ),
        ("I\tO\nlove\tO\nNew York B-LOC\n", "found no TAB"),
    ],
)
def test_multi_word_token_without_tab_stops_at_its_line(tmp_path, text, problem):
    path = tmp_path / "train.txt"
    path.write_text(text)
    with pytest.raises(DataFormatError) as error:
        read_ner_file(path)
    assert error.value.line == len(text.splitlines()) and problem in str(error.value)


def test_latin1_file_stops_with_file_line_and_byte(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes("EU\tB-ORG\n\nK\u00f6ln\tB-LOC\n".encode("latin-1"))
    with pytest.raises(DataFormatError) as error:
        read_ner_file(path)
    assert error.value.line == 3
    assert str(error.value) == (
        f"{path}, line 3: not UTF-8 text (byte 0xf6 at column 2, byte offset 11): its encoding is not UTF-8 "
        "(e.g. Latin-1 or cp1252): convert it (`iconv -f latin1 -t utf-8`)"
    )
    bare = tmp_path / "train"  # no suffix: perhaps a binary table read as text
    bare.write_bytes(b"PAR1\x15\x04\xff\x00")
    with pytest.raises(DataFormatError, match=r"needs its \.parquet/\.arrow suffix$"):
        read_ner_file(bare)


def test_index_token_tag_columns_and_conllu_comments(tmp_path):
    path = tmp_path / "train.conllu"
    path.write_text("# sent_id = 1\n# text = EU rejects\n1\tEU\tB-ORG\n2\trejects\tO\n\n1\tPeter\tB-PER\n")
    assert read_ner_file(path) == [
        NerSentence(("EU", "rejects"), ("B-ORG", "O")),
        NerSentence(("Peter",), ("B-PER",)),
    ]


def test_numbers_as_tokens_are_not_an_index_column(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("1 CD B-NP O\n2 CD I-NP O\n\n7 CD B-NP O\n")
    assert [s.tokens for s in read_ner_file(path)] == [("1", "2"), ("7",)]


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("a\tO\nb\tO\tX\n", 2, "3 TAB-separated fields"),
        ("a\tO\n\nlonely\n", 3, "expected `token<TAB>tag`"),
        ("a\nb\n", 1, "expected `token tag` columns"),
        ("a\tB-PER\nb\tI-PER\n\nc\tPERSON\n", 4, "tag 'PERSON' is not O or B-/I-<type>"),
        ("\n\n", 0, "no sentence"),
    ],
)
def test_malformed_file_names_file_line_problem(tmp_path, text, line, problem):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(DataFormatError) as error:
        read_ner_file(path)
    assert error.value.line == line
    message = str(error.value)
    assert str(path) in message and (f"line {line}" in message) == (line > 0) and problem in message


def test_load_directory_with_valid_and_language(tmp_path):
    folder = tmp_path / "wikiann" / "de"
    folder.mkdir(parents=True)
    for name in ("train", "valid", "test"):
        (folder / name).write_text("de:Berlin\tB-LOC\nde:ist\tO\n")
    data = load_ner(str(tmp_path / "wikiann"), language="de")
    assert (len(data.train), len(data.dev), len(data.test)) == (1, 1, 1)
    assert data.labels == ["O", "B-LOC"] and data.entity_types == ["LOC"]


def test_single_file_split_is_fixed_and_disjoint(tmp_path):
    sentences = [NerSentence((f"w{i}",), ("O",)) for i in range(50)]
    train, dev, test = split_sentences(sentences, seed=0)
    assert (len(train), len(dev), len(test)) == (30, 10, 10)
    assert len({s.tokens for s in train + dev + test}) == 50
    assert split_sentences(sentences, seed=0) == (train, dev, test)
    assert split_sentences(sentences, seed=1)[1] != dev


def test_align_labels_first_subtoken_only():
    assert align_labels([None, 0, 0, 1, 2, 2, 2, None], [3, 5, 7]) == [-100, 3, -100, 5, 7, -100, -100, -100]


def test_encode_ner_with_fast_tokenizer_and_pre_split_words(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(write_tiny_model(tmp_path / "tiny"))
    sentence = NerSentence(("alice", "walks", "to", "paris"), ("B-PER", "O", "O", "B-LOC"))
    (feature,) = encode_ner(tokenizer, [sentence], {"O": 0, "B-PER": 1, "B-LOC": 2})
    tokens = tokenizer.convert_ids_to_tokens(feature["input_ids"])
    assert tokens == ["[CLS]", "alice", "w", "##a", "##l", "##k", "##s", "to", "paris", "[SEP]"]
    assert feature["labels"] == [-100, 1, 0, -100, -100, -100, -100, 0, 2, -100]
    batch = collate([feature, {k: v[:3] for k, v in feature.items()}])
    assert batch["labels"].shape == (2, 10) and batch["labels"][1, 3:].eq(IGNORE_INDEX).all()
    assert batch["attention_mask"].sum().item() == 13


def test_read_text_drops_blank_lines(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_text(" = Heading = \n\n Some text .\n")
    assert read_text(path) == ["= Heading =", "Some text ."]


def test_read_text_undecodable_stops_with_line(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_bytes(b" = Heading = \n caf\xe9\n")
    with pytest.raises(DataFormatError, match=r"valid.txt, line 2: not UTF-8 text \(byte 0xe9"):
        read_text(path)


def test_data_format_error_survives_pickling():
    import pickle

    error = pickle.loads(pickle.dumps(DataFormatError("a.txt", 3, "bad tag")))
    assert (error.path, error.line, error.problem, str(error)) == (
        "a.txt",
        3,
        "bad tag",
        "a.txt, line 3: bad tag",
    )
