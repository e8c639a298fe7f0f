"""``layerfusion methods``: every PEFT type peft_layerfusion registers, and what each is.

The rows come from the registry's names (:mod:`peft_layerfusion.names`, standard library only, loaded
without the package: see ``layerfusion_recipes/__init__.py``): each type's name, PEFT type, whether it is
token-wise and seq2seq, and its one line; so the table prints at once (importing the registry would load
torch, transformers and peft).
"""

from __future__ import annotations

import argparse

from peft_layerfusion.names import BASELINE_ENTRIES, ENTRIES, PLAIN_HEAD, Entry

COLUMNS = ("type", "PEFT type", "token-wise", "seq2seq", "what it is")
PLAIN_HEAD_SUMMARY = "the plain last-layer head, no fusion (recipes only)"


def method_row(entry: Entry, token_wise: str | None = None) -> tuple[str, ...]:
    """The row of one registered type; ``token_wise``: the column's text when it is not the entry's."""
    mark = "recommended: " if entry.recommended else ""
    wise = str(entry.token_wise) if token_wise is None else token_wise
    return (entry.name, entry.peft_type, wise, str(entry.seq2seq), mark + entry.summary)


def method_rows() -> tuple[tuple[str, ...], ...]:
    """One row per registered type: the fusion methods, then the baseline types (BitFit, no fusion:
    token-wise ``-``), then the recipes' plain head.

    Example:
        >>> method_rows()[0][:2], method_rows()[-1][:2]
        (('dwatt', 'DWATT'), ('none', '-'))
    """
    rows = [method_row(entry) for entry in ENTRIES] + [method_row(entry, "-") for entry in BASELINE_ENTRIES]
    return (*rows, (PLAIN_HEAD, "-", "True", "False", PLAIN_HEAD_SUMMARY))


def list_methods(args: argparse.Namespace) -> int:
    """The ``layerfusion methods`` command: a table of :func:`method_rows`."""
    rows = [COLUMNS, *method_rows()]
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + row[-1])
    return 0
