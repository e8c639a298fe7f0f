"""Data for the recipes: NER readers, label alignment to sub-words, plain text for MLM.

Local formats (one token a line, a blank line between sentences):

* CoNLL-2003 columns: ``token POS chunk TAG`` separated by spaces, ``-DOCSTART-`` lines skipped;
* WikiANN: ``lang:token<TAB>TAG`` (the ``lang:`` prefix is stripped);
* plain: ``token<TAB>TAG``.

Hub names (``conll2003``, ``wikiann``) are loaded with ``datasets`` and only work online.
A malformed file stops with :class:`DataFormatError` naming file, line and problem.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

IGNORE_INDEX = -100  # label of sub-tokens after the first and of special tokens
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}:")
_SPLIT_NAMES = {"train": ("train",), "dev": ("dev", "valid", "validation"), "test": ("test",)}
_FILE_SUFFIXES = ("", ".txt", ".conll", ".tsv")


class DataFormatError(ValueError):
    """A data file that cannot be read, with the file, the line and the problem."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str) -> None:
        super().__init__(f"{path}, line {line}: {problem}")
        self.path, self.line, self.problem = str(path), line, problem


@dataclass(frozen=True)
class NerSentence:
    """One sentence: its words and their BIO tags (same length)."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]


@dataclass
class NerDataset:
    """Train/dev/test splits and the sorted label list (``O`` first)."""

    train: list[NerSentence]
    dev: list[NerSentence]
    test: list[NerSentence]
    name: str = ""

    @property
    def labels(self) -> list[str]:
        tags = {tag for split in (self.train, self.dev, self.test) for s in split for tag in s.tags}
        return ["O", *sorted(tags - {"O"})]

    @property
    def entity_types(self) -> list[str]:
        """Entity types ``C`` (``PER`` for ``B-PER``/``I-PER``), the ``C`` of the N-shot protocol."""
        return sorted({label.split("-", 1)[1] for label in self.labels if "-" in label})


def _parse_line(line: str) -> tuple[str, str] | str:
    """``(token, tag)`` of one non-blank line, or a string describing the problem."""
    if "\t" in line:
        fields = line.split("\t")
        if len(fields) != 2:
            return f"expected `token<TAB>tag`, found {len(fields)} TAB-separated fields"
        token, tag = fields
        token = (
            _LANG_PREFIX.sub("", token, count=1) if _LANG_PREFIX.match(token) and len(token) > 3 else token
        )
    else:
        fields = line.split()
        if len(fields) < 2:
            return "expected `token tag` (TAB-separated) or CoNLL columns `token POS chunk tag`"
        token, tag = fields[0], fields[-1]
    if tag != "O" and not re.fullmatch(r"[BIES]-\S+", tag):
        return f"tag {tag!r} is not O or B-/I-/E-/S-<type>"
    return token, tag


def read_ner_file(path: str | os.PathLike) -> list[NerSentence]:
    """Read one NER file in any of the supported column formats (detected per line).

    Args:
        path: The file.

    Returns:
        The sentences, in file order.

    Example:
        >>> sentences = read_ner_file("conll2003/valid.txt")
        >>> sentences[0].tokens[:2], sentences[0].tags[:2]
    """
    sentences: list[NerSentence] = []
    tokens: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if tokens:
            sentences.append(NerSentence(tuple(tokens), tuple(tags)))
            tokens.clear()
            tags.clear()

    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            if line.startswith("-DOCSTART-"):
                continue
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                raise DataFormatError(path, number, parsed)
            tokens.append(parsed[0])
            tags.append(parsed[1])
    flush()
    if not sentences:
        raise DataFormatError(path, 0, "no sentence found (empty file?)")
    return sentences


def split_sentences(
    sentences: Sequence[NerSentence], seed: int = 0, dev: float = 0.2, test: float = 0.2
) -> tuple[list[NerSentence], list[NerSentence], list[NerSentence]]:
    """Shuffle with a fixed seed and cut into train/dev/test (for single-split corpora).

    Example:
        >>> train, dev, test = split_sentences(read_ner_file("ner.txt"), seed=0)
    """
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    n_dev, n_test = round(dev * len(order)), round(test * len(order))
    pick = [sentences[i] for i in order]
    return pick[n_dev + n_test :], pick[:n_dev], pick[n_dev : n_dev + n_test]


def _find_split(directory: Path, split: str) -> Path | None:
    for name in _SPLIT_NAMES[split]:
        for suffix in _FILE_SUFFIXES:
            if (directory / f"{name}{suffix}").is_file():
                return directory / f"{name}{suffix}"
    return None


def load_ner(source: str, language: str | None = None, split_seed: int = 0) -> NerDataset:
    """Load an NER dataset from a directory, a single file, or a Hub name (online only).

    Args:
        source: A directory with ``train``/``dev`` (or ``valid``)/``test`` files (``.txt``,
            ``.conll``, ``.tsv`` or no suffix), optionally under a ``language`` sub-folder; a single
            file (split 60/20/20 with ``split_seed``); or ``conll2003`` / ``wikiann``.
        language: WikiANN language (sub-folder or Hub config).
        split_seed: Seed of the split of a single file.

    Example:
        >>> data = load_ner("../shared/data/wikiann", language="de")
        >>> len(data.train), data.entity_types
    """
    path = Path(source)
    if path.is_dir() and language and (path / language).is_dir():
        path = path / language
    if path.is_dir():
        found = {split: _find_split(path, split) for split in _SPLIT_NAMES}
        if found["train"] is None or found["dev"] is None:
            raise FileNotFoundError(
                f"{path}: needs a train and a dev (or valid) file, found {sorted(os.listdir(path))}"
            )
        test = read_ner_file(found["test"]) if found["test"] else []
        return NerDataset(read_ner_file(found["train"]), read_ner_file(found["dev"]), test, name=str(path))
    if path.is_file():
        return NerDataset(*split_sentences(read_ner_file(path), seed=split_seed), name=str(path))
    return load_hub_ner(source, language)


def load_hub_ner(name: str, language: str | None = None) -> NerDataset:
    """``conll2003`` or ``wikiann`` (+ language) from the Hugging Face Hub (needs a connection)."""
    import datasets

    try:
        raw = datasets.load_dataset(name, language) if language else datasets.load_dataset(name)
    except Exception as error:  # offline, unknown name...
        raise FileNotFoundError(
            f"{name!r} is neither a local file/directory nor a loadable Hub dataset ({error})"
        ) from error
    names = raw["train"].features["ner_tags"].feature.names

    def convert(split: str) -> list[NerSentence]:
        rows = raw[split]
        return [
            NerSentence(tuple(r["tokens"]), tuple(names[t] for t in r["ner_tags"]))
            for r in rows
            if r["tokens"]
        ]

    return NerDataset(convert("train"), convert("validation"), convert("test"), name=name)


def read_text(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a plain-text file (WikiText: one paragraph a line, headings kept).

    Example:
        >>> paragraphs = read_text("wikitext-2/valid.txt")
    """
    with open(path, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle]
    lines = [line for line in lines if line]
    if not lines:
        raise DataFormatError(path, 0, "no text found (empty file?)")
    return lines


# ----------------------------------------------------------------------------- tokenization


def align_labels(word_ids: Sequence[int | None], word_labels: Sequence[int]) -> list[int]:
    """Labels per sub-token: the first sub-token of a word gets its label, the rest ``-100``.

    Args:
        word_ids: ``encoding.word_ids()`` of a fast tokenizer (``None`` for special tokens).
        word_labels: One label id per word.

    Example:
        >>> align_labels([None, 0, 0, 1, None], [3, 5])
        [-100, 3, -100, 5, -100]
    """
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def encode_ner(
    tokenizer, sentences: Sequence[NerSentence], label2id: dict[str, int], max_length: int = 128
) -> list[dict[str, list[int]]]:
    """Tokenize pre-split sentences (fast tokenizer, ``is_split_into_words``) and align labels.

    Returns one dict per sentence with ``input_ids``, ``attention_mask``, ``labels`` (what the
    model sees, truncated to ``max_length``), and the full gold for scoring: ``word_labels`` (the
    label id of every word of the sentence, also words past ``max_length`` or with no sub-word)
    and ``labelled_words`` (the word index of each labelled position, in order).

    Example:
        >>> features = encode_ner(tokenizer, data.train, {"O": 0, "B-PER": 1, "I-PER": 2})
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Label alignment needs a fast tokenizer (word_ids); got a slow one.")
    encoded = tokenizer(
        [list(s.tokens) for s in sentences], is_split_into_words=True, truncation=True, max_length=max_length
    )
    features = []
    for index, sentence in enumerate(sentences):
        word_labels = [label2id[tag] for tag in sentence.tags]
        word_ids = encoded.word_ids(index)
        labels = align_labels(word_ids, word_labels)
        labelled_words = [w for w, label in zip(word_ids, labels, strict=True) if label != IGNORE_INDEX]
        features.append(
            {
                "input_ids": encoded["input_ids"][index],
                "attention_mask": encoded["attention_mask"][index],
                "labels": labels,
                "word_labels": word_labels,
                "labelled_words": labelled_words,
            }
        )
    return features


def collate(features: Sequence[dict[str, list[int]]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a list of encoded sentences to the longest one: ``(batch, seq)`` tensors."""
    width = max(len(f["input_ids"]) for f in features)
    pads = {"input_ids": pad_id, "attention_mask": 0, "labels": IGNORE_INDEX}
    return {
        key: torch.tensor([f[key] + [pad] * (width - len(f[key])) for f in features])
        for key, pad in pads.items()
        if key in features[0]
    }
