"""Data for the recipes: NER readers, label alignment to sub-words, plain text for MLM.

NER text formats (one token a line, a blank line between sentences, the tag last, or in the column
``tag_column`` names: CoNLL-2003's part of speech is column 1, its chunks column 2):

* CoNLL-2003 columns: ``token POS chunk TAG`` separated by spaces, ``-DOCSTART-`` lines skipped;
* WikiANN: ``lang:token<TAB>TAG`` (the prefix is stripped when every token of the file has it);
* plain: ``token<TAB>TAG``; with an index column: ``1<TAB>token<TAB>TAG`` (CoNLL-U style).

``datasets`` formats (``save_to_disk`` directories, json/jsonl/csv/parquet/arrow files, Hub
names online) are read by :mod:`layerfusion_recipes.data.sources`, which :func:`load_ner` uses.
A malformed file stops with :class:`DataFormatError` naming file, line and problem.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..core.batches import IGNORE_INDEX
from ..core.errors import UserError
from .tags import PLAIN, foreign_tags, mixed_tag_problem, tag_set_kind

T = TypeVar("T")
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}:(?=.)")


class DataFormatError(UserError, ValueError):
    """A data file that cannot be read, with the file, the line (0: the whole file) and the problem."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str) -> None:
        super().__init__(f"{path}, line {line}: {problem}" if line else f"{path}: {problem}")
        self.path, self.line, self.problem = str(path), line, problem

    def __reduce__(self):  # picklable (sweep workers hand errors to the parent)
        return type(self), (self.path, self.line, self.problem)


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
    notes: list[str] = field(default_factory=list)  # what loading derived or converted (dev cut, IOB1...)

    @property
    def labels(self) -> list[str]:
        """The sorted tags of every split, ``O`` first (always there for spans: what no span is)."""
        tags = self._tags()
        if self.tag_kind == PLAIN:
            return sorted(tags, key=lambda tag: (tag != "O", tag))
        return ["O", *sorted(tags - {"O"})]

    @property
    def tag_kind(self) -> str:
        """``spans`` (IOB tags: span F1) or ``plain`` (e.g. part of speech: token accuracy), from the tags
        of every split (:func:`~layerfusion_recipes.data.tags.tag_set_kind`)."""
        return tag_set_kind(self._tags())

    def _tags(self) -> set[str]:
        return {tag for split in (self.train, self.dev, self.test) for s in split for tag in s.tags}

    @property
    def entity_types(self) -> list[str]:
        """Entity types of every split (``PER`` for ``B-PER``/``I-PER``; every tag of a plain tag set)."""
        return self._types_of(self.labels)

    @property
    def train_entity_types(self) -> list[str]:
        """Entity types of the train split: the ``C`` of the N-shot protocol (``N * C`` sentences), so
        that the training sample never depends on the dev or test labels. Each tag of a plain tag set
        (a part of speech) is a type of its own."""
        return self._types_of({tag for sentence in self.train for tag in sentence.tags})

    def _types_of(self, tags) -> list[str]:
        if self.tag_kind == PLAIN:
            return sorted(set(tags))
        return sorted({tag.split("-", 1)[1] for tag in tags if "-" in tag})


# suffixes of files read as text whatever their content: undecodable bytes there are their encoding's
TEXT_FILE_SUFFIXES = (".csv", ".tsv", ".txt", ".json", ".jsonl", ".conll", ".conllu", ".bio", ".iob")


def _decoded_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 file (a leading BOM dropped); undecodable bytes stop with file, line and
    byte offset, naming the cause: the file's encoding (a file without a text suffix may also be a
    binary table read as text)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - data.rfind(b"\n", 0, error.start)
        advice = "its encoding is not UTF-8 (e.g. Latin-1 or cp1252): convert it (`iconv -f latin1 -t utf-8`)"
        if Path(path).suffix.lower() not in TEXT_FILE_SUFFIXES:
            advice += "; a Parquet or Arrow table needs its .parquet/.arrow suffix"
        raise DataFormatError(
            path,
            line,
            f"not UTF-8 text (byte 0x{data[error.start]:02x} at column {column}, byte offset {error.start}): "
            + advice,
        ) from None
    return [line.rstrip("\r") for line in text.split("\n")]


@dataclass(frozen=True)
class _Block:
    """The lines of one sentence; they are consecutive in the file, the first is line ``start``."""

    start: int
    lines: list[str]

    def without_comments(self) -> _Block:
        """Without the ``#`` lines that open it (CoNLL-U ``# sent_id = 1``, ``# text = ...``)."""
        skip = next((i for i, line in enumerate(self.lines) if not line.startswith("#")), len(self.lines))
        return _Block(self.start + skip, self.lines[skip:])


def _sentence_blocks(lines: Sequence[str]) -> list[_Block]:
    """Non-blank lines grouped by sentence (blank lines and ``-DOCSTART-`` lines end one)."""
    blocks: list[_Block] = []
    current: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        if line and not (line.startswith("-DOCSTART-") and line.split(maxsplit=1)[0] == "-DOCSTART-"):
            if not current:
                blocks.append(_Block(number, current))
            current.append(line)
        elif current:
            current = []
    return blocks


def _is_index_column(blocks: Sequence[_Block], tab: bool) -> bool:
    """Whether the first field counts the words of each sentence (``1 EU B-ORG``, CoNLL-U style)."""
    for block in blocks:
        first = [line.split("\t" if tab else None, 1)[0] for line in block.lines]
        if not all(f.isdigit() for f in first):
            return False
        start = int(first[0])
        if start not in (0, 1) or [int(f) for f in first] != list(range(start, start + len(first))):
            return False
    return True


def _column_layout(blocks: list[_Block]) -> tuple[bool, int, list[_Block], int]:
    """``(tab, width, blocks, token_column)``: one separator and one column count per file.

    A file whose lines mostly contain a TAB is TAB-separated (a token may contain spaces, e.g.
    ``New York<TAB>B-LOC``); otherwise any whitespace separates columns (a stray TAB in a CoNLL
    line is a separator). ``#`` lines opening a sentence are CoNLL-U comments if the other lines
    start with a word index (``1<TAB>EU<TAB>B-ORG``); the token is then the second column.
    """
    tabbed = sum("\t" in line for block in blocks for line in block.lines)
    tab = 2 * tabbed >= sum(len(block.lines) for block in blocks)
    count = (lambda line: line.count("\t") + 1) if tab else (lambda line: len(line.split()))
    candidates = [blocks]
    if any(block.lines[0].startswith("#") for block in blocks):
        uncommented = [block.without_comments() for block in blocks]
        candidates.insert(0, [block for block in uncommented if block.lines])
    for candidate in candidates:  # the last one is `blocks`
        width = Counter(count(line) for block in candidate for line in block.lines).most_common(1)[0][0]
        if width >= 3 and _is_index_column(candidate, tab):
            return tab, width, candidate, 1
    return tab, width, blocks, 0


def _strip_wikiann_prefix(sentences: list[NerSentence]) -> list[NerSentence]:
    """Drop the ``lang:`` prefix of WikiANN tokens, only if every token of the file has the same one."""
    first = _LANG_PREFIX.match(sentences[0].tokens[0])
    prefix = first.group() if first else None
    if prefix is None or not all(
        token.startswith(prefix) and len(token) > len(prefix) for s in sentences for token in s.tokens
    ):
        return sentences
    return [NerSentence(tuple(token[len(prefix) :] for token in s.tokens), s.tags) for s in sentences]


def _line_problem(fields: list[str], tab: bool, width: int) -> str:
    """What is wrong with the fields of a line that does not fit the file's layout."""
    if width < 2:
        return "expected `token tag` columns (TAB- or space-separated)"
    if tab and len(fields) == 1:
        return "expected `token<TAB>tag` like the file's other lines, found no TAB"
    hint = "a stray TAB?" if tab else "a token with a space? TAB-separate the columns"
    kind = "TAB" if tab else "space"
    return f"{len(fields)} {kind}-separated fields where the file's lines have {width} ({hint})"


def tag_column_of(path: str | os.PathLike, tag_column: int | None, width: int, token_column: int) -> int:
    """The column that holds the tags: ``tag_column``, or the last one (``None``); a column that is no
    tag column of the file (past its last, or the token or the word index before it) stops in one line.

    Example:
        >>> tag_column_of("train.txt", None, 4, 0), tag_column_of("train.txt", 1, 4, 0)
        (3, 1)
        >>> tag_column_of("train.txt", 4, 4, 0)
        Traceback (most recent call last):
        layerfusion_recipes.data.readers.DataFormatError: train.txt: --tag-column 4: its lines have 4 ...
    """
    if tag_column is None:
        return width - 1
    if token_column < tag_column < width:
        return tag_column
    lead = "0: the token" if token_column == 0 else "0: the word index, 1: the token"
    first = token_column + 1
    tags = f"{first}: the tag" if first == width - 1 else f"{first} to {width - 1}: tags"
    choice = f"give {first}" if first == width - 1 else f"give {first} to {width - 1}"
    columns = f"its lines have {width} columns ({lead}, {tags})"
    raise DataFormatError(path, 0, f"--tag-column {tag_column}: {columns}; {choice} (default: the last)")


def read_ner_file(path: str | os.PathLike, tag_column: int | None = None) -> list[NerSentence]:
    """Read one NER text file: one token a line, a blank line between sentences, the tag last (or in
    column ``tag_column``).

    Columns: ``token<TAB>tag``; CoNLL-2003 ``token POS chunk tag`` (space-separated,
    ``-DOCSTART-`` lines skipped); ``index<TAB>token<TAB>tag`` (CoNLL-U style, ``#`` comments
    skipped); WikiANN ``lang:token<TAB>tag`` (the prefix is stripped when every token has it).
    Tags are IOB/BIOES spans (``O``, ``B-PER``) or plain tags (``NN``: token accuracy), never both.
    Nothing is edited silently: an undecodable byte, a line with another separator or column
    count, a tag column the file lacks, or a tag of the other kind than the file's others stops with
    :class:`DataFormatError` (file, line, cause).

    Args:
        path: The file (UTF-8, a BOM is allowed).
        tag_column: The 0-based column of the tags (CoNLL-2003: 1 part of speech, 2 chunks, 3 named
            entities); ``None``: the last.

    Returns:
        The sentences, in file order.

    Example:
        >>> sentences = read_ner_file(f"{ner_data}/dev.txt")  # token<TAB>tag lines
        >>> sentences[0].tokens[:2], sentences[0].tags[:2]
        (('in', 'went'), ('O', 'O'))
    """
    blocks = _sentence_blocks(_decoded_lines(path))
    if not blocks:
        raise DataFormatError(path, 0, "no sentence found (empty file?)")
    tab, width, blocks, token_column = _column_layout(blocks)
    separator = "\t" if tab else None
    column = tag_column_of(path, tag_column, width, token_column) if width >= 2 else width - 1
    sentences = []
    for block in blocks:
        tokens, tags = [], []
        for offset, line in enumerate(block.lines):
            fields = line.split(separator)
            if len(fields) != width or width < 2:
                raise DataFormatError(path, block.start + offset, _line_problem(fields, tab, width))
            tokens.append(fields[token_column])
            tags.append(fields[column])
        sentences.append(NerSentence(tuple(tokens), tuple(tags)))
    _check_one_tag_kind(path, blocks, sentences)
    return _strip_wikiann_prefix(sentences)


def _check_one_tag_kind(path: str | os.PathLike, blocks: list[_Block], sentences: list[NerSentence]) -> None:
    """Stop at the first line whose tag is of the rarer kind where the file mixes spans and plain tags."""
    foreign, other = foreign_tags(tag for sentence in sentences for tag in sentence.tags)
    for block, sentence in zip(blocks, sentences, strict=True):
        for offset, tag in enumerate(sentence.tags):
            if tag in foreign:
                raise DataFormatError(path, block.start + offset, mixed_tag_problem(tag, other))


def split_sentences(
    sentences: Sequence[T], seed: int = 0, dev: float = 0.2, test: float = 0.2
) -> tuple[list[T], list[T], list[T]]:
    """Shuffle with a fixed seed and cut into train/dev/test (for single-split corpora); any
    examples (NER sentences, classification examples).

    Example:
        >>> train, dev, test = split_sentences(list(range(10)), seed=0)
        >>> len(train), len(dev), len(test)
        (6, 2, 2)
    """
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    n_dev, n_test = round(dev * len(order)), round(test * len(order))
    pick = [sentences[i] for i in order]
    return pick[n_dev + n_test :], pick[:n_dev], pick[n_dev : n_dev + n_test]


def read_text(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a plain-text file (WikiText: one paragraph a line, headings kept).

    Example:
        >>> _ = open("valid.txt", "w").write(" = Heading = \\n\\n A paragraph .\\n")
        >>> read_text("valid.txt")
        ['= Heading =', 'A paragraph .']
    """
    lines = [line.strip() for line in _decoded_lines(path)]
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


PROBE_WORDS = ("Hello", "world", ".")  # a running text whose pre-split tokens must match


def word_separator(tokenizer) -> str:
    """What goes before each word but the first so that the pre-split words tokenize as the running
    text does: ``""`` where the tokenizer splits on spaces itself (BERT's WordPiece), ``" "`` where a
    word's start is part of its first token (SentencePiece and byte-level BPE: Gemma's ``▁world``,
    Llama 3's ``Ġworld``), which pre-split words would otherwise lose (``world`` mid-word pieces a
    decoder never saw at a word start). Found by comparing both with the text ``Hello world .``;
    ``""`` when neither matches.

    Example:
        >>> word_separator(tokenizer)  # a BERT WordPiece tokenizer; Gemma's gives ' '
        ''
    """
    text = tokenizer(" ".join(PROBE_WORDS))["input_ids"]
    for separator in ("", " "):
        words = [PROBE_WORDS[0], *(separator + word for word in PROBE_WORDS[1:])]
        if tokenizer(words, is_split_into_words=True)["input_ids"] == text:
            return separator
    return ""


def encode_ner(
    tokenizer, sentences: Sequence[NerSentence], label2id: dict[str, int], max_length: int = 128
) -> list[dict[str, list[int]]]:
    """Tokenize pre-split sentences (fast tokenizer, ``is_split_into_words``) and align labels.

    Words are given as the running text tokenizes them (:func:`word_separator`: a space before each
    word but the first where the tokenizer marks word starts inside its tokens, as decoders' do).

    Returns one dict per sentence with ``input_ids``, ``attention_mask``, ``labels`` (what the
    model sees, truncated to ``max_length``), and the full gold for scoring: ``word_labels`` (the
    label id of every word of the sentence, also words past ``max_length`` or with no sub-word)
    and ``labelled_words`` (the word index of each labelled position, in order).

    Example:
        >>> sentences = [NerSentence(("paris", "walks"), ("B-LOC", "O"))]
        >>> features = encode_ner(tokenizer, sentences, {"O": 0, "B-LOC": 1, "I-LOC": 2})
        >>> features[0]["labels"][:4]  # [CLS] paris walks [SEP]: the special tokens are ignored (-100)
        [-100, 1, 0, -100]
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Label alignment needs a fast tokenizer (word_ids); got a slow one.")
    separator = word_separator(tokenizer)
    words = [[word if i == 0 else separator + word for i, word in enumerate(s.tokens)] for s in sentences]
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
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
