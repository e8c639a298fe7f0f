"""``layerfusion methods``: every PEFT type peft_layerfusion registers, and what each is.

The rows come from :data:`layerfusion_recipes.core.options.names.METHOD_ROWS`, generated from the registry
(:mod:`~layerfusion_recipes.reporting.registry_names`): each type's name, PEFT type, whether it is
token-wise and seq2seq, and the first line of its module's docstring. Standard library only, so the
table prints at once (importing the registry would load torch, transformers and peft).
"""

from __future__ import annotations

import argparse

from ..core.options.names import METHOD_ROWS

COLUMNS = ("type", "PEFT type", "token-wise", "seq2seq", "what it is")


def list_methods(args: argparse.Namespace) -> int:
    """The ``layerfusion methods`` command: a table of
    :data:`~layerfusion_recipes.core.options.names.METHOD_ROWS`."""
    rows = [COLUMNS, *METHOD_ROWS]
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + row[-1])
    return 0
