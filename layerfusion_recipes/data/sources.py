"""NER data from anywhere ``datasets`` reads, as a
:class:`~layerfusion_recipes.data.readers.NerDataset` (IOB2).

``--data`` may name:

* a ``save_to_disk`` directory (``Dataset`` or ``DatasetDict``), read with ``datasets.load_from_disk``;
* a single ``.json``/``.jsonl``/``.csv``/``.parquet``/``.arrow`` file, read with
  ``datasets.load_dataset(<builder>, data_files=...)``, or an NER text file (see
  :func:`~layerfusion_recipes.data.readers.read_ner_file`);
* a directory of split files ``train``/``dev``/``test`` in any of those formats (the dev split
  may be named ``dev``, ``val``, ``valid`` or ``validation``), optionally under a ``language`` folder;
* a Hub name (``conll2003``, ``wikiann`` with ``--language``; online only).

Columns are found by convention: tokens in ``tokens`` (or ``words``), tags in ``ner_tags``,
``tags`` or ``labels``; ``--tokens-column``/``--tags-column`` name others (``--tag-column K``: the
0-based column of a text file's lines, e.g. CoNLL-2003's part of speech, 1, or chunks, 2). Tags may be
``ClassLabel`` ids (their names are used), strings, or integers with ``--label-names``.
Without a dev split, dev (and test, if missing) are cut from train with a fixed seed, and a
note says so; span tags are converted to IOB2 (:mod:`layerfusion_recipes.data.tags`), also with a note;
a plain tag set (part of speech) is kept as it is, and a note says it is scored by token accuracy.
Notes go to stderr once and to ``NerDataset.notes``.
"""

from __future__ import annotations

import ast
import io
import os
import sys
import tokenize
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import DataSourceError, UserError, first_line
from ..core.options.locations import TABULAR_BUILDERS, TEXT_SUFFIXES, looks_like_hub_name
from .readers import NerDataset, NerSentence, read_ner_file, split_sentences
from .tags import (
    PLAIN,
    SPANS,
    TAG_SCHEMES,
    foreign_tags,
    mixed_tag_problem,
    tag_set_kind,
    to_iob2,
)

SPLIT_ALIASES = {"train": ("train",), "dev": ("dev", "val", "valid", "validation"), "test": ("test",)}
TOKEN_COLUMNS = ("tokens", "words")
TAG_COLUMNS = ("ner_tags", "tags", "labels")
T = TypeVar("T")


class NerColumnError(UserError, ValueError):
    """A dataset whose token/tag columns cannot be found or read (names the source and what is there)."""


@dataclass(frozen=True)
class NerColumns:
    """How to read NER columns of a ``datasets`` table and which tag scheme the tags follow.

    Args:
        tokens: Token column (default: the first of :data:`TOKEN_COLUMNS` present).
        tags: Tag column (default: the first of :data:`TAG_COLUMNS` present).
        label_names: Names of integer tags (``label_names[i]`` is tag ``i``); default: the
            column's ``ClassLabel`` names.
        tag_scheme: One of :data:`~layerfusion_recipes.data.tags.TAG_SCHEMES` (``auto`` detects).
        tag_column: The 0-based column of the tags in text files (``None``: the last).

    Example:
        >>> NerColumns(tags="ner", label_names=("O", "B-PER", "I-PER"))
        NerColumns(tokens=None, tags='ner', label_names=('O', 'B-PER', 'I-PER'), tag_scheme='auto', ...)
    """

    tokens: str | None = None
    tags: str | None = None
    label_names: tuple[str, ...] | None = None
    tag_scheme: str = "auto"
    tag_column: int | None = None

    def __post_init__(self) -> None:
        if self.tag_scheme not in TAG_SCHEMES:
            raise ValueError(f"--tag-scheme {self.tag_scheme!r}: expected one of {', '.join(TAG_SCHEMES)}")
        blank = [name for name in self.label_names or () if not name or name.split() != [name]]
        if blank:
            raise ValueError(f"--label-names: {blank[:5]} are empty or hold a space; a tag is one word")
        foreign, other = foreign_tags(self.label_names or ())
        if foreign:
            raise ValueError(f"--label-names: {mixed_tag_problem(sorted(foreign)[0], other)}")
        if self.tag_column is not None and self.tag_column < 0:
            raise ValueError(f"--tag-column {self.tag_column}: a column number counts from 0")


# ----------------------------------------------------------------------------- datasets -> sentences


def _pick_column(
    names: Sequence[str], wanted: str | None, conventions: Sequence[str], flag: str, where: str
) -> str:
    if wanted is not None:
        if wanted not in names:
            raise NerColumnError(f"{where}: no column {wanted!r} ({flag}); columns: {list(names)}")
        return wanted
    for name in conventions:
        if name in names:
            return name
    raise NerColumnError(
        f"{where}: none of the columns {list(names)} is one of {list(conventions)}; name it with {flag}"
    )


def parse_list_cell(cell: Any) -> list:
    """A list stored in one cell: a list, a ``[...]`` literal (JSON, Python or NumPy repr) or words.

    CSV files hold lists as text: ``['EU', 'rejects']`` (pandas), ``['EU' 'rejects']`` (NumPy, as
    ``Dataset.to_csv`` writes), ``[1 0]`` or ``EU rejects``.

    Example:
        >>> parse_list_cell("['EU' 'rejects']"), parse_list_cell("[3, 0]"), parse_list_cell("B-ORG O")
        (['EU', 'rejects'], [3, 0], ['B-ORG', 'O'])
    """
    if not isinstance(cell, str):
        return list(cell)
    text = cell.strip()
    if not text.startswith("["):
        return text.split()
    items, sign = [], 1
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):  # literal by literal: no
            if token.type in (tokenize.STRING, tokenize.NUMBER):  # implicit concatenation of 'a' 'b'
                value = ast.literal_eval(token.string)
                items.append(sign * value if token.type == tokenize.NUMBER else value)
            elif token.type == tokenize.NAME:  # unquoted words inside brackets: [EU rejects]
                items.append(token.string)
            sign = -1 if token.string == "-" else 1
    except (tokenize.TokenError, SyntaxError) as error:
        raise ValueError(f"cannot read a list from {cell[:60]!r} ({error})") from None
    return items


def _tag_namer(feature: Any, column: str, label_names: tuple[str, ...] | None, where: str):
    """A function mapping one cell of the tag column to a list of tag strings."""
    inner = getattr(feature, "feature", None)  # List/Sequence(ClassLabel or Value)
    names = label_names or getattr(inner, "names", None)

    def name_tags(cell: Any) -> list[str]:
        tags = parse_list_cell(cell)
        if not all(isinstance(tag, int) and not isinstance(tag, bool) for tag in tags):
            return [str(tag) for tag in tags]
        if names is None:
            raise NerColumnError(
                f"{where}: column {column!r} holds integer tags without names; give --label-names "
                "(e.g. O B-PER I-PER) or store the column as a ClassLabel"
            )
        if tags and (min(tags) < 0 or max(tags) >= len(names)):
            shown = list(names) if len(names) <= 5 else [*names[:5], "..."]
            raise NerColumnError(
                f"{where}: tag ids {min(tags)}..{max(tags)} of column {column!r} outside the "
                f"{len(names)} label names {shown}"
            )
        return [names[tag] for tag in tags]

    return name_tags


def dataset_sentences(dataset: Any, columns: NerColumns, where: str) -> list[NerSentence]:
    """The sentences of one ``datasets.Dataset`` (rows with no token are skipped).

    Args:
        dataset: A ``datasets.Dataset`` with a token column and a tag column.
        columns: Which columns and label names (see :class:`NerColumns`).
        where: Names the data in error messages, e.g. ``data/ [validation]``.

    Raises:
        NerColumnError: A column is missing, a cell is no list, tags cannot be named, a row has more
            tokens than tags or fewer, or a tag is of the other kind than the data's others (a span tag
            among plain tags or the reverse); the message names ``where``, the row and the problem.

    Example:
        >>> from datasets import Dataset
        >>> dataset = Dataset.from_dict({"tokens": [["EU"]], "tags": [["B-ORG"]]})
        >>> dataset_sentences(dataset, NerColumns(), "x")
        [NerSentence(tokens=('EU',), tags=('B-ORG',))]
    """
    names = list(dataset.column_names)
    token_column = _pick_column(names, columns.tokens, TOKEN_COLUMNS, "--tokens-column", where)
    tag_column = _pick_column(names, columns.tags, TAG_COLUMNS, "--tags-column", where)
    name_tags = _tag_namer(dataset.features[tag_column], tag_column, columns.label_names, where)
    sentences, rows = [], []  # the sentences and the row of each
    for row, (token_cell, tag_cell) in enumerate(
        zip(dataset[token_column], dataset[tag_column], strict=True)
    ):
        try:
            tokens, tags = [str(t) for t in parse_list_cell(token_cell)], name_tags(tag_cell)
        except ValueError as error:
            if isinstance(error, NerColumnError):
                raise
            raise NerColumnError(f"{where}, row {row}: {error}") from error
        if len(tokens) != len(tags):
            raise NerColumnError(f"{where}, row {row}: {len(tokens)} tokens but {len(tags)} tags")
        blank = [tag for tag in tags if not tag or tag.split() != [tag]]
        if blank:
            raise NerColumnError(f"{where}, row {row}: tag {blank[0]!r} is empty or holds a space")
        if tokens:
            sentences.append(NerSentence(tuple(tokens), tuple(tags)))
            rows.append(row)
    foreign, other = foreign_tags(tag for sentence in sentences for tag in sentence.tags)
    for row, sentence in zip(rows, sentences, strict=True):
        odd = [tag for tag in sentence.tags if tag in foreign]
        if odd:
            raise NerColumnError(f"{where}, row {row}: {mixed_tag_problem(odd[0], other)}")
    return sentences


# ----------------------------------------------------------------------------- sources -> splits


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """No "Generating train split" progress bars while reading local files."""
    import datasets

    was_disabled = datasets.is_progress_bar_enabled() is False
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def canonical_split(name: str) -> str | None:
    """``train``, ``dev`` or ``test`` for a split name (``validation``, ``val``... are ``dev``).

    Example:
        >>> canonical_split("validation"), canonical_split("extra")
        ('dev', None)
    """
    return next((split for split, aliases in SPLIT_ALIASES.items() if name.lower() in aliases), None)


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a ``save_to_disk`` directory (``Dataset`` or ``DatasetDict``)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def load_saved(path: Path) -> Any:
    """``datasets.load_from_disk(path)``; a damaged directory stops with one line."""
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except Exception as error:
        raise DataSourceError(
            f"{path}: not a readable save_to_disk directory ({first_line(error)})"
        ) from error


def read_tabular(path: Path, columns: NerColumns, split: str = "train") -> list[NerSentence]:
    """Sentences of one json/jsonl/csv/parquet/arrow file (``datasets.load_dataset(builder, ...)``).

    Example:
        >>> _ = Path("train.jsonl").write_text('{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}\\n')
        >>> read_tabular(Path("train.jsonl"), NerColumns())[0].tokens
        ('EU', 'rejects')
    """
    import datasets

    builder = TABULAR_BUILDERS[path.suffix.lower()]
    try:
        with quiet_datasets():
            table = datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as error:  # pyarrow/json decode errors: unreadable as `builder`
        raise NerColumnError(
            f"{path}: not readable as {builder} ({type(error).__name__}: {first_line(error)})"
        ) from error
    return dataset_sentences(table, columns, str(path))


def read_split_file(path: Path, columns: NerColumns) -> list[NerSentence]:
    """One split file: tabular by suffix (:data:`TABULAR_BUILDERS`), otherwise NER text (its tags in
    ``columns.tag_column``). A table's column given by number, or a text file's by name, is one line.

    Example:
        >>> _ = Path("train.txt").write_text("EU NNP B-NP B-ORG\\nrejects VBZ B-VP O\\n")
        >>> read_split_file(Path("train.txt"), NerColumns(tag_column=1))[0].tags
        ('NNP', 'VBZ')
    """
    if path.suffix.lower() in TABULAR_BUILDERS:
        _check_no_tag_column(columns, str(path))
        return read_tabular(path, columns)
    if columns.tags is not None:
        raise NerColumnError(
            f"{path}: --tags-column {columns.tags!r} names a table's column and this is a text file: give "
            "its tag column by number, --tag-column K (0-based; CoNLL-2003: 1 part of speech, 2 chunks)"
        )
    return read_ner_file(path, columns.tag_column)


def _check_no_tag_column(columns: NerColumns, where: str) -> None:
    """``--tag-column`` numbers a text file's columns: a table's is named (``--tags-column``)."""
    if columns.tag_column is not None:
        raise NerColumnError(
            f"{where}: --tag-column {columns.tag_column} numbers the columns of a text file's lines and "
            "this is a table: name its tag column with --tags-column"
        )


def split_files(directory: Path) -> dict[str, Path]:
    """``{train|dev|test: file}`` of a directory; two files for one split are refused."""
    found: dict[str, list[Path]] = {}
    for path in sorted(directory.iterdir()):
        suffix = path.suffix.lower() if path.suffix.lower() in (*TABULAR_BUILDERS, *TEXT_SUFFIXES) else ""
        stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
        split = canonical_split(stem)
        if path.is_file() and split:
            found.setdefault(split, []).append(path)
    twice = {split: [p.name for p in paths] for split, paths in found.items() if len(paths) > 1}
    if twice:
        raise DataSourceError(f"{directory}: several files for one split {twice}; keep one per split")
    return {split: paths[0] for split, paths in found.items()}


def _dataset_splits(
    raw: Any, columns: NerColumns, where: str
) -> tuple[dict[str, list[NerSentence]], list[str]]:
    """Splits of a ``Dataset`` (one split, ``all``) or ``DatasetDict`` (named splits) and notes."""
    _check_no_tag_column(columns, where)
    if not hasattr(raw, "keys"):  # a single Dataset
        return {"all": dataset_sentences(raw, columns, where)}, []
    splits, ignored = {}, []
    for name in raw:
        split = canonical_split(name)
        if split is None or split in splits:
            ignored.append(name)
            continue
        splits[split] = dataset_sentences(raw[name], columns, f"{where} [{name}]")
    notes = (
        [f"{where}: split(s) {ignored} ignored (no train/dev/test alias, or a second one)"] if ignored else []
    )
    if not splits:
        raise DataSourceError(f"{where}: no split named train/dev/val/validation/test in {list(raw)}")
    return splits, notes


def hub_dataset(name: str, config: str | None = None) -> Any:
    """``datasets.load_dataset(name[, config])`` (needs a connection); one line when it fails.

    Raises:
        DataSourceError: ``--data NAME: no such file or directory, and not loadable from the Hub (why)``.
    """
    import datasets

    try:
        return datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
    except Exception as error:  # offline, unknown name...
        raise DataSourceError(
            f"--data {name!r}: no such file or directory, and not loadable from the Hugging Face Hub "
            f"({first_line(error)})"
        ) from error


def load_splits(
    source: str, language: str | None, columns: NerColumns
) -> tuple[dict[str, list[NerSentence]], str, list[str]]:
    """The sentences of each split found at ``source``, the data's name and notes
    (:func:`load_source` with the NER readers).

    Returns:
        ``({"train"|"dev"|"test"|"all": sentences}, name, notes)``; ``all`` for one unsplit file
        or ``Dataset``.

    Raises:
        DataSourceError: Nothing loadable at ``source``.
    """
    return load_source(
        source,
        lambda raw, where: _dataset_splits(raw, columns, where),
        lambda path: read_split_file(path, columns),
        language,
    )


def load_source(
    source: str,
    from_dataset: Callable[[Any, str], tuple[dict[str, T], list[str]]],
    from_file: Callable[[Path], T],
    config: str | None = None,
) -> tuple[dict[str, T], str, list[str]]:
    """What each split found at ``source`` holds, read by a task's readers, the data's name and notes.

    ``source`` may be a ``save_to_disk`` folder, a folder of split files (optionally under a
    ``config`` sub-folder, e.g. a WikiANN language), one file (split ``all``) or a Hub name
    (``config``: its configuration).

    Args:
        source: The ``--data`` value.
        from_dataset: A ``Dataset``/``DatasetDict`` and its name -> ``({split: read}, notes)``.
        from_file: A split file -> what it holds.
        config: A sub-folder or Hub configuration.

    Raises:
        DataSourceError: Nothing loadable at ``source``, or a folder without a train file.
    """
    path = Path(source)
    if path.is_dir() and config and (path / config).is_dir():
        path = path / config
    if path.is_dir() and is_saved_dataset(path):
        splits, notes = from_dataset(load_saved(path), str(path))
        return splits, str(path), notes
    if path.is_dir():
        files = split_files(path)
        if "train" not in files:
            raise DataSourceError(
                f"{path}: needs a train file (train.txt, train.csv, train.jsonl, ... or a save_to_disk "
                f"directory), found {sorted(os.listdir(path))}"
            )
        return {split: from_file(file) for split, file in files.items()}, str(path), []
    if path.is_file():
        return {"all": from_file(path)}, str(path), []
    if looks_like_hub_name(source):
        splits, notes = from_dataset(hub_dataset(source, config), source)
        return splits, source, notes
    raise DataSourceError(f"--data {source!r}: no such file or directory")


def cut_missing_splits(
    splits: Mapping[str, list[T]], name: str, split_seed: int = 0
) -> tuple[list[T], list[T], list[T], list[str]]:
    """Train, dev and test of the splits found (``train``/``dev``/``test``, or one split ``all``):
    a missing dev split (and a missing test split) is cut from train with ``split_seed``, 20% each,
    the rest trains; a note says so.

    Example:
        >>> train, dev, test, notes = cut_missing_splits({"train": list(range(10))}, "trec")
        >>> notes
        ['trec: no dev split: cut into train/dev/test 60/20/20 with seed 0']
    """
    notes: list[str] = []
    train = splits.get("train", splits.get("all", []))
    dev, test = splits.get("dev"), splits.get("test")
    if dev is None:
        test_share = 0.2 if test is None else 0.0
        train, dev, cut_test = split_sentences(train, seed=split_seed, dev=0.2, test=test_share)
        parts = "train/dev/test 60/20/20" if test is None else "train/dev 80/20"
        what = "one split only" if "all" in splits else "no dev split"
        notes.append(f"{name}: {what}: cut into {parts} with seed {split_seed}")
        test = cut_test if test is None else test
    return train, dev, test or [], notes


def assemble(
    splits: dict[str, list[NerSentence]], name: str, split_seed: int = 0, tag_scheme: str = "auto"
) -> NerDataset:
    """Train/dev/test from the splits found, tags in IOB2; notes say what was derived or converted.

    A missing dev split (and a missing test split) is cut from train (or from the one split
    ``all``) with ``split_seed``: 20% each, the rest trains.

    Example:
        >>> from layerfusion_recipes.data.readers import read_ner_file
        >>> data = assemble({"all": read_ner_file(f"{ner_data}/train.txt")}, "ner.jsonl")
        >>> data.notes
        ['ner.jsonl: one split only: cut into train/dev/test 60/20/20 with seed 0']
    """
    train, dev, test, notes = cut_missing_splits(splits, name, split_seed)
    if not train:
        raise DataSourceError(f"{name}: no training sentence found")
    if _tag_kind_of_splits({"train": train, "dev": dev, "test": test}, name) == PLAIN:
        if tag_scheme != "auto":
            raise NerColumnError(
                f"--tag-scheme {tag_scheme}: the tags of {name} are plain tags (no B-/I- spans), which "
                "have no scheme; leave --tag-scheme out"
            )
        common = Counter(tag for sentence in train for tag in sentence.tags).most_common(3)
        example = ", ".join(repr(tag) for tag, _ in common)
        notes.append(
            f"{name}: plain tags (e.g. {example}; no B-/I- spans): scored by token accuracy, "
            "each tag a type of the N-shot sample"
        )
        return NerDataset(train, dev, test, name=name, notes=notes)
    tags, note = to_iob2([s.tags for part in (train, dev, test) for s in part], tag_scheme)
    if note:
        notes.append(f"{name}: {note}")
        retagged = iter(tags)
        train, dev, test = (
            [NerSentence(s.tokens, next(retagged)) for s in part] for part in (train, dev, test)
        )
    return NerDataset(train, dev, test, name=name, notes=notes)


def _tag_kind_of_splits(splits: Mapping[str, list[NerSentence]], name: str) -> str:
    """``spans`` or ``plain``: the one kind of tag set of every split (a split of ``O`` alone fits both);
    splits of two kinds stop in one line, naming one tag of each."""
    found: dict[str, tuple[str, str]] = {}  # kind -> (split, one of its tags)
    for split, sentences in splits.items():
        tags = {tag for sentence in sentences for tag in sentence.tags}
        kind = tag_set_kind(tags)
        shown = sorted(tags - {"O"})
        if shown:
            found.setdefault(kind, (split, shown[0]))
    if len(found) > 1:
        (span_split, span_tag), (plain_split, plain_tag) = found[SPANS], found[PLAIN]
        raise DataSourceError(
            f"{name}: the {span_split} split's tags are spans (e.g. {span_tag!r}) and the {plain_split} "
            f"split's are plain tags (e.g. {plain_tag!r}); every split needs one tag set"
        )
    return next(iter(found), SPANS)


def load_ner(
    source: str, language: str | None = None, split_seed: int = 0, columns: NerColumns | None = None
) -> NerDataset:
    """Load NER data (IOB2 tags) from any supported source (see the module docstring); notes go to
    stderr once.

    Args:
        source: A ``save_to_disk`` directory; a directory with ``train``/``dev`` (``val``,
            ``valid``, ``validation``)/``test`` files (NER text, ``.jsonl``, ``.csv``,
            ``.parquet``, ``.arrow``), optionally under a ``language`` sub-folder; a single such
            file (split 60/20/20 with ``split_seed``); or a Hub name (online only).
        language: WikiANN language (sub-folder or Hub config).
        split_seed: Seed of the dev/test cut when there is no dev split.
        columns: Token/tag columns, label names and tag scheme of tabular data.

    Example:
        >>> data = load_ner(ner_data)  # a folder of train/dev/test files (token<TAB>tag)
        >>> data.labels, data.notes
        (['O', 'B-LOC', 'B-ORG', 'B-PER', 'I-ORG'], [])
    """
    columns = columns or NerColumns()
    splits, name, notes = load_splits(source, language, columns)
    try:
        dataset = assemble(splits, name, split_seed, columns.tag_scheme)
    except ValueError as error:  # tag scheme problems: name the data
        if isinstance(error, UserError):
            raise
        raise NerColumnError(f"{name}: {error}") from error
    dataset.notes[:0] = notes
    for note in dataset.notes:
        print(f"data: {note}", file=sys.stderr)
    return dataset
