"""Sentence and sentence-pair classification data as users have it, as a :class:`TextDataset`.

``--data`` may name:

* a ``save_to_disk`` directory (``Dataset`` or ``DatasetDict``);
* a directory of split files ``train``/``dev``/``test`` (the dev split may be named ``dev``,
  ``val``, ``valid`` or ``validation``), or a single file (cut 60/20/20), each one CSV (``.csv``),
  TSV (``.tsv``, ``.txt``; GLUE's layout: a header line, fields never quoted), JSON lines
  (``.jsonl``, or ``.json`` with one object a line or one array of objects), Parquet or Arrow;
* a Hub name (online only; offline it fails in one line).

Columns are found by convention or named. The label: ``--label-column``, else a column named
``label``, ``labels``, ``class``, ``category`` or ``target`` (any case), else the one column whose
name ends in ``label``. The text: ``--text-column`` (and ``--text-pair-column``), else a pair of
columns by convention (:data:`PAIR_COLUMNS`: ``premise``/``hypothesis``, ``sentence1``/``sentence2``,
``question``/``sentence``, ``title``/``body``...), else one text column (:data:`TEXT_COLUMNS`:
``text``, ``sentence``...). Labels may be ids or names: the label set is taken from train, in a
stable order (a ``ClassLabel``'s own order; integers ascending; names sorted), and a ``ClassLabel``
id reads as its name. A dev or test label unseen in train, an empty text, a missing label or a line
that cannot be read stops with one line naming the file, the line (or row) and the cause. Without a
dev split, dev (and test, if missing) are cut from train with seed 0; a note on stderr says so.

Example:
    >>> data = load_texts(text_data, TextColumns())  # a folder of train/dev/test CSV files
    >>> data.labels, data.train[0]
    (['loc', 'org', 'per'], TextExample(text='with and corp alice works in', pair=None, label='per'))
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import DataSourceError, first_line
from ..core.options.locations import TABULAR_BUILDERS
from .readers import DataFormatError, _decoded_lines
from .sources import canonical_split, cut_missing_splits, load_source, quiet_datasets

LABEL_COLUMNS = ("label", "labels", "class", "category", "target")
TEXT_COLUMNS = ("text", "sentence", "content", "review", "document", "question", "body", "tweet", "utterance")
PAIR_COLUMNS = (
    ("premise", "hypothesis"),
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("question", "passage"),
    ("question", "context"),
    ("text_a", "text_b"),
    ("text1", "text2"),
    ("title", "body"),
    ("title", "content"),
    ("title", "text"),
    ("title", "description"),
    ("headline", "body"),
)
MISSING_CLASS_ID = -1  # a ClassLabel's "no label" (GLUE test splits)


@dataclass(frozen=True)
class TextExample:
    """One example: its text, the second text of a pair (``None`` for one sentence), its label name."""

    text: str
    pair: str | None
    label: str


@dataclass
class TextDataset:
    """Train/dev/test examples, the label set (from train, in a stable order) and how it was read.

    Args:
        train, dev, test: The examples of each split (``test`` empty without one).
        labels: The label names, in id order.
        name: The data's name (its path or Hub name).
        columns: The columns read: ``{"text", "pair", "label"}`` (``pair`` ``None`` for single texts).
        notes: What loading derived (a dev cut, a split dropped).
    """

    train: list[TextExample]
    dev: list[TextExample]
    test: list[TextExample]
    labels: list[str]
    name: str = ""
    columns: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TextColumns:
    """Which columns hold the text, the second text of a pair and the label (``None``: by convention).

    Example:
        >>> TextColumns(text="title", pair="body", label="stars")
        TextColumns(text='title', pair='body', label='stars')
    """

    text: str | None = None
    pair: str | None = None
    label: str | None = None


@dataclass
class Table:
    """The rows of one split as read, and how to name a row in a message.

    Args:
        where: The file or dataset (and split) the rows come from.
        columns: The column names, in order.
        rows: One mapping column -> value per row.
        lines: Where each row starts in its file (``None``: no lines, rows are counted from 0).
        class_names: The ``ClassLabel`` names of each column that has them.
    """

    where: str
    columns: list[str]
    rows: list[dict[str, Any]]
    lines: list[int] | None = None
    class_names: dict[str, list[str]] = field(default_factory=dict)

    def at(self, index: int) -> str:
        """``FILE, line N`` or ``DATA [split], row N`` of row ``index``."""
        return f"{self.where}, line {self.lines[index]}" if self.lines else f"{self.where}, row {index}"


# ----------------------------------------------------------------------------- files -> tables


def read_delimited(path: Path, delimiter: str) -> Table:
    """A CSV (``,``; quoted fields as Excel and pandas write them) or TSV (TAB; GLUE's layout, no
    quoting: a ``"`` is text) file with a header line; every row must have the header's fields.

    Example:
        >>> _ = Path("train.tsv").write_text("sentence\\tlabel\\na stirring , funny film\\t1\\n")
        >>> read_delimited(Path("train.tsv"), "\\t").rows[0]
        {'sentence': 'a stirring , funny film', 'label': '1'}
    """
    text = "\n".join(_decoded_lines(path))
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    lines = text.splitlines(keepends=True) if quoting == csv.QUOTE_MINIMAL else text.split("\n")
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
    try:
        header = next(reader)
    except StopIteration:
        raise DataFormatError(path, 0, "empty file: expected a header line naming the columns") from None
    except csv.Error as error:
        raise DataFormatError(path, 1, f"not readable as {_kind(delimiter)} ({error})") from None
    header = [name.strip() for name in header]
    if len(header) < 2:
        kind = _kind(delimiter)
        problem = (
            f"the header has 1 column {header}: expected a {kind} header naming the text and label columns"
        )
        raise DataFormatError(path, 1, problem)
    rows, lines, start = [], [], reader.line_num + 1
    try:
        for fields in reader:
            if not fields or fields == [""]:  # a blank line
                start = reader.line_num + 1
                continue
            if len(fields) != len(header):
                raise DataFormatError(
                    path,
                    start,
                    f"{len(fields)} fields where the header has {len(header)} ({', '.join(header)})",
                )
            rows.append(dict(zip(header, fields, strict=True)))
            lines.append(start)
            start = reader.line_num + 1
    except csv.Error as error:
        raise DataFormatError(
            path, reader.line_num, f"not readable as {_kind(delimiter)} ({error})"
        ) from None
    return Table(str(path), header, rows, lines)


def _kind(delimiter: str) -> str:
    return "CSV" if delimiter == "," else "TSV"


def read_json(path: Path) -> Table:
    """JSON lines (one object a line), or one JSON array of objects (rows counted from 0).

    Example:
        >>> _ = Path("train.jsonl").write_text('{"text": "How far is it ?", "coarse_label": "NUM"}\\n')
        >>> read_json(Path("train.jsonl")).rows[0]["coarse_label"]
        'NUM'
    """
    lines = _decoded_lines(path)
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("["):  # one array
        try:
            rows = json.loads("\n".join(lines))
        except json.JSONDecodeError as error:
            raise DataFormatError(path, error.lineno, f"not valid JSON ({error.msg})") from None
        if not isinstance(rows, list) or not rows:
            raise DataFormatError(path, 0, "expected JSON lines or a non-empty array of objects")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataFormatError(
                    path, 0, f"item {index} of the array is not an object: {str(row)[:60]!r}"
                )
        return Table(f"{path} (array)", _columns(rows), rows)
    rows, numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, number, f"not a JSON object ({error.msg})") from None
        if not isinstance(row, dict):
            raise DataFormatError(path, number, f"not a JSON object: {line.strip()[:60]!r}")
        rows.append(row)
        numbers.append(number)
    if not rows:
        raise DataFormatError(path, 0, "no example found (empty file?)")
    return Table(str(path), _columns(rows), rows, numbers)


def _columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def dataset_table(dataset: Any, where: str) -> Table:
    """A ``datasets.Dataset`` as a :class:`Table` (rows counted from 0, ``ClassLabel`` names kept)."""
    names = {
        column: list(feature.names)
        for column, feature in dataset.features.items()
        if getattr(feature, "names", None) is not None
    }
    return Table(where, list(dataset.column_names), dataset.to_list(), None, names)


def read_table(path: Path) -> Table:
    """One split file by its suffix: ``.csv``; ``.tsv``/``.txt``/none (TAB); ``.jsonl``/``.json``;
    ``.parquet``/``.arrow`` (through ``datasets``)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return read_delimited(path, ",")
    if suffix in (".jsonl", ".json"):
        return read_json(path)
    if suffix in TABULAR_BUILDERS:  # parquet, arrow
        import datasets

        try:
            with quiet_datasets():
                table = datasets.load_dataset(
                    TABULAR_BUILDERS[suffix], data_files={"train": str(path)}, split="train"
                )
        except Exception as error:
            raise DataFormatError(path, 0, f"not readable as {suffix[1:]} ({first_line(error)})") from error
        return dataset_table(table, str(path))
    return read_delimited(path, "\t")


def dataset_tables(raw: Any, where: str) -> tuple[dict[str, Table], list[str]]:
    """The tables of a ``Dataset`` (one split, ``all``) or ``DatasetDict`` (named splits), and notes."""
    if not hasattr(raw, "keys"):
        return {"all": dataset_table(raw, where)}, []
    tables, ignored = {}, []
    for name in raw:
        split = canonical_split(name)
        if split is None or split in tables:
            ignored.append(name)
            continue
        tables[split] = dataset_table(raw[name], f"{where} [{name}]")
    if not tables:
        raise DataSourceError(f"{where}: no split named train/dev/val/validation/test in {list(raw)}")
    notes = (
        [f"{where}: split(s) {ignored} ignored (no train/dev/test alias, or a second one)"] if ignored else []
    )
    return tables, notes


def load_tables(source: str) -> tuple[dict[str, Table], str, list[str]]:
    """The table of each split found at ``source``, the data's name and notes
    (:func:`~layerfusion_recipes.data.sources.load_source` with the tables' readers).

    Raises:
        DataSourceError: Nothing loadable at ``source``.
    """
    return load_source(source, dataset_tables, read_table)


# ----------------------------------------------------------------------------- tables -> examples


def _find(columns: Sequence[str], name: str) -> str | None:
    """The column called ``name``, exactly or in another case."""
    if name in columns:
        return name
    return next((column for column in columns if column.lower() == name.lower()), None)


def _named(table: Table, name: str, flag: str) -> str:
    if name not in table.columns:
        raise DataSourceError(f"{table.where}: no column {name!r} ({flag}); columns: {table.columns}")
    return name


def resolve_columns(table: Table, columns: TextColumns) -> dict[str, str | None]:
    """``{"text", "pair", "label"}``: the columns of ``table`` to read (see the module docstring).

    Raises:
        DataSourceError: A named column is missing, or none / several fit a convention; the message
            names the data, the columns there and the option that names one.

    Example:
        >>> resolve_columns(Table("x.csv", ["premise", "hypothesis", "label"], []), TextColumns())
        {'text': 'premise', 'pair': 'hypothesis', 'label': 'label'}
    """
    where, names = table.where, table.columns
    if columns.label:
        label = _named(table, columns.label, "--label-column")
    else:
        label = next((found for name in LABEL_COLUMNS if (found := _find(names, name))), None)
        ending = [name for name in names if name.lower().endswith("label")]
        if label is None and len(ending) == 1:
            label = ending[0]
        if label is None:
            hint = f" (several could be: {ending})" if ending else ""
            raise DataSourceError(
                f"{where}: no label column among {names}{hint}; name it with --label-column"
            )
    if columns.text:
        text = _named(table, columns.text, "--text-column")
        pair = _named(table, columns.pair, "--text-pair-column") if columns.pair else None
        return {"text": text, "pair": pair, "label": label}
    if columns.pair:
        pair = _named(table, columns.pair, "--text-pair-column")
        text = _single_text(table, label, exclude=pair)
        return {"text": text, "pair": pair, "label": label}
    for first, second in PAIR_COLUMNS:
        text, pair = _find(names, first), _find(names, second)
        if text and pair and label not in (text, pair):
            return {"text": text, "pair": pair, "label": label}
    return {"text": _single_text(table, label), "pair": None, "label": label}


def _single_text(table: Table, label: str, exclude: str | None = None) -> str:
    found = [_find(table.columns, name) for name in TEXT_COLUMNS]
    text = next((name for name in found if name and name not in (label, exclude)), None)
    if text is None:
        raise DataSourceError(
            f"{table.where}: no text column among {table.columns} (looked for {', '.join(TEXT_COLUMNS)} "
            "and the pairs premise/hypothesis, sentence1/sentence2, title/body...); name it with "
            "--text-column "
            "(and --text-pair-column)"
        )
    return text


def _text(value: Any, table: Table, index: int, column: str) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        raise DataSourceError(f"{table.at(index)}: no value in the text column {column!r}")
    if not isinstance(value, str):
        raise DataSourceError(
            f"{table.at(index)}: the text column {column!r} holds {type(value).__name__} "
            f"{str(value)[:40]!r}, not text; name the text with --text-column"
        )
    if not value.strip():
        raise DataSourceError(f"{table.at(index)}: empty text in column {column!r}")
    return value


def label_key(value: str) -> tuple[int, int | str]:
    """Sort key of label names: integers ascending (``2`` before ``10``), then names sorted."""
    try:
        return 0, int(value)
    except ValueError:
        return 1, value


def _label(value: Any, table: Table, index: int, column: str) -> str | None:
    """The label name of a cell: a ``ClassLabel`` id as its name, an integer (or integral float) as its
    digits, a boolean as JSON writes it (``false``, ``true``), a name as it is; ``None`` for a
    ``ClassLabel``'s missing label (-1)."""
    names = table.class_names.get(column)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or (isinstance(value, float) and value != value):
        raise DataSourceError(f"{table.at(index)}: no label in column {column!r} (got {value!r})")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if names is not None and isinstance(value, int):
        if value == MISSING_CLASS_ID:
            return None
        if not 0 <= value < len(names):
            raise DataSourceError(
                f"{table.at(index)}: label id {value} of column {column!r} outside its "
                f"{len(names)} class names"
            )
        return names[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise DataSourceError(
        f"{table.at(index)}: label {value!r} of column {column!r} is not a class name or id"
    )


def table_examples(table: Table, columns: dict[str, str | None]) -> list[TextExample]:
    """The examples of one table; rows whose ``ClassLabel`` label is missing (-1) are left out.

    Raises:
        DataSourceError: A row lacks a column, has an empty text or no label: file and line named.
    """
    examples = []
    text_column, pair_column, label_column = columns["text"], columns["pair"], columns["label"]
    for index, row in enumerate(table.rows):
        missing = [name for name in (text_column, pair_column, label_column) if name and name not in row]
        if missing:
            raise DataSourceError(f"{table.at(index)}: no value for column(s) {missing}")
        label = _label(row[label_column], table, index, label_column)
        if label is None:
            continue
        text = _text(row[text_column], table, index, text_column)
        pair = _text(row[pair_column], table, index, pair_column) if pair_column else None
        examples.append(TextExample(text, pair, label))
    return examples


def label_set(table: Table, column: str, examples: Sequence[TextExample]) -> list[str]:
    """The labels of the train examples in a stable order: a ``ClassLabel``'s own, else :func:`label_key`."""
    present = {example.label for example in examples}
    names = table.class_names.get(column)
    if names is not None:
        return [name for name in names if name in present]
    return sorted(present, key=label_key)


def check_known_labels(
    split: str, table: Table, column: str, examples: Sequence[TextExample], labels: Sequence[str]
) -> None:
    """Refuse a dev/test label that train does not have (the model could never predict it)."""
    known = set(labels)
    for index, example in enumerate(examples):
        if example.label not in known:
            shown = labels if len(labels) <= 10 else [*labels[:10], "..."]
            raise DataSourceError(
                f"{table.at(_row_of(table, column, index))}: {split} label {example.label!r} does not occur "
                f"in train (its labels: {', '.join(shown)}); the model could never predict it"
            )


def _row_of(table: Table, column: str, index: int) -> int:
    """The row of the ``index``-th example of ``table`` (rows with a missing ClassLabel skipped)."""
    names = table.class_names.get(column)
    if names is None:
        return index
    kept = [i for i, row in enumerate(table.rows) if row[column] != MISSING_CLASS_ID]
    return kept[index]


def load_texts(
    source: str, columns: TextColumns | None = None, split_seed: int = 0, stream: Any = None
) -> TextDataset:
    """Load classification data from any supported source (see the module docstring); notes go to
    stderr once.

    Args:
        source: A ``save_to_disk`` directory; a directory of split files; a single file (cut
            60/20/20 with ``split_seed``); or a Hub name (online only).
        columns: The text, pair and label columns (``None`` fields: by convention).
        split_seed: Seed of the dev/test cut when there is no dev split.
        stream: Where the notes go (default: stderr).

    Example:
        >>> data = load_texts(text_data, TextColumns(label="label"))  # train.csv, dev.csv, test.csv
        >>> data.labels
        ['loc', 'org', 'per']
    """
    columns = columns or TextColumns()
    tables, name, notes = load_tables(source)
    first = tables.get("train", tables.get("all"))
    if first is None:
        raise DataSourceError(f"{name}: no train split (found {sorted(tables)})")
    chosen = resolve_columns(first, columns)
    examples: dict[str, list[TextExample]] = {}
    for split, table in tables.items():
        resolve_columns(
            table, TextColumns(chosen["text"], chosen["pair"], chosen["label"])
        )  # every split has them
        examples[split] = table_examples(table, chosen)
        if not examples[split]:
            if split in ("train", "all"):
                raise DataSourceError(f"{table.where}: no labelled example")
            notes.append(f"{table.where}: no labelled example (every label missing): split left out")
            del examples[split]
    labels = label_set(first, chosen["label"], examples.get("train", examples.get("all", [])))
    for split in ("dev", "test"):
        if split in examples:
            check_known_labels(split, tables[split], chosen["label"], examples[split], labels)
    train, dev, test, cut = cut_missing_splits(examples, name, split_seed)
    if "all" in examples or "dev" not in examples:  # the label set of what trains now
        labels = [label for label in labels if any(e.label == label for e in train)]
        _check_cut(dev + test, labels, name)
    dataset = TextDataset(train, dev, test, labels, name, chosen, notes + cut)
    for note in dataset.notes:
        print(f"data: {note}", file=stream or sys.stderr)
    return dataset


def _check_cut(examples: Sequence[TextExample], labels: Sequence[str], name: str) -> None:
    """After a cut from train: a class left in dev/test only (too rare to reach train) is one line."""
    unseen = sorted({e.label for e in examples} - set(labels), key=label_key)
    if unseen:
        raise DataSourceError(
            f"{name}: class(es) {unseen} have too few examples to reach the train part of the cut "
            "(seed 0); give a dev split, or remove them"
        )


def label_counts(examples: Iterable[TextExample], labels: Sequence[str]) -> dict[str, int]:
    """How many examples of each label, in label order."""
    counts = dict.fromkeys(labels, 0)
    for example in examples:
        counts[example.label] += 1
    return counts
