"""``layerfusion methods``: every PEFT type peft_layerfusion registers, and what each is.

Read from the registry itself (:data:`~peft_layerfusion.registration.METHODS` and
:data:`~peft_layerfusion.registration.BASELINE_TYPES`): each type's name, PEFT type, whether it is
token-wise and seq2seq, and the first line of its module's docstring. Importing the registry is
this command's whole cost (peft, and with it torch and transformers: see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import sys

from peft_layerfusion.registration import BASELINE_TYPES, METHODS

from ..core.models import PLAIN_HEAD

COLUMNS = ("type", "PEFT type", "token-wise", "seq2seq", "what it is")


def summary_of(cls: type) -> str:
    """The first line of the docstring of ``cls``'s module (its formula's file), without the period."""
    doc = sys.modules[cls.__module__].__doc__ or ""
    return doc.strip().splitlines()[0].rstrip(".").replace("``", "") if doc.strip() else ""


def method_rows() -> list[tuple[str, ...]]:
    """One row per registered type: the fusion methods, then the baseline types (BitFit), then the
    recipes' plain head.

    Example:
        >>> method_rows()[0][:2]
        ('dwatt', 'DWATT')
    """
    rows = [
        (m.name, m.name.upper(), str(m.token_wise), str(m.seq2seq), summary_of(m.config_cls)) for m in METHODS
    ]
    rows += [(name, name.upper(), "-", "False", summary_of(config)) for name, config, _ in BASELINE_TYPES]
    rows.append((PLAIN_HEAD, "-", "True", "False", "the plain last-layer head, no fusion (recipes only)"))
    return rows


def list_methods(args: argparse.Namespace) -> int:
    """The ``layerfusion methods`` command: a table of :func:`method_rows`."""
    rows = [COLUMNS, *method_rows()]
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + row[-1])
    return 0
