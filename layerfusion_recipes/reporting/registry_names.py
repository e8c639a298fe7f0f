"""Writes :mod:`layerfusion_recipes.core.options.names`, the registry's names and labels as plain data, so
that the
command line checks method and regime names and prints ``layerfusion methods`` without importing
torch, transformers or peft.

The registry (:data:`~peft_layerfusion.registration.METHODS`, the regimes of
:mod:`peft_layerfusion.comparison.regimes`) stays the one source of truth: ``core/options/names.py`` is
generated
from it by ``python -m layerfusion_recipes.reporting.registry_names`` and never edited by hand;
tests/recipes/reporting/test_methods_command.py fails while it differs from :func:`names_source`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from peft_layerfusion.comparison.regimes import (
    ADAPTER_REGIME_NAMES,
    METHOD_NAMES,
    PLAIN_HEAD_LABEL,
    REGIME_LABELS,
    REGIME_NAMES,
)
from peft_layerfusion.registration import BASELINE_TYPES, METHODS, Method

from ..core.options import names

PLAIN_HEAD = METHOD_NAMES[0]
HEADER = '''"""The registry's names and labels as plain data (standard library only), for the command line.

GENERATED from peft_layerfusion's registry by ``python -m layerfusion_recipes.reporting.registry_names``:
do not edit (tests/recipes/reporting/test_methods_command.py fails while it is out of date).
"""

# ruff: noqa: E501
# fmt: off
'''


def summary_of(cls: type) -> str:
    """The first line of the docstring of ``cls``'s module (its formula's file), without the period."""
    doc = sys.modules[cls.__module__].__doc__ or ""
    return doc.strip().splitlines()[0].rstrip(".").replace("``", "") if doc.strip() else ""


def recommended_mark(method: Method) -> str:
    """``"recommended: "`` before the summary of the one method we recommend, else nothing."""
    return "recommended: " if method.recommended else ""


def method_rows() -> tuple[tuple[str, ...], ...]:
    """One row of ``layerfusion methods`` per registered type: the fusion methods, then the baseline
    types (BitFit), then the recipes' plain head (type, PEFT type, token-wise, seq2seq, what it is).

    Example:
        >>> method_rows()[0][:2]
        ('dwatt', 'DWATT')
    """
    rows = [
        (m.name, m.peft_type, str(m.token_wise), str(m.seq2seq), recommended_mark(m) + m.summary)
        for m in METHODS
    ]  # fmt: skip
    rows += [(name, name.upper(), "-", "False", summary_of(config)) for name, config, _ in BASELINE_TYPES]
    rows.append((PLAIN_HEAD, "-", "True", "False", "the plain last-layer head, no fusion (recipes only)"))
    return tuple(rows)


def registry_names() -> dict[str, Any]:
    """What :mod:`layerfusion_recipes.core.options.names` holds, read from the registry."""
    return {
        "PLAIN_HEAD": PLAIN_HEAD,
        "METHOD_NAMES": tuple(METHOD_NAMES),
        "REGIME_NAMES": tuple(REGIME_NAMES),
        "ADAPTER_REGIME_NAMES": tuple(ADAPTER_REGIME_NAMES),
        "METHOD_LABELS": {PLAIN_HEAD: PLAIN_HEAD_LABEL, **{m.name: m.label for m in METHODS}},
        "REGIME_LABELS": dict(REGIME_LABELS),
        "METHOD_ROWS": method_rows(),
    }


def _literal(value: Any, indent: str = "") -> str:
    """``value`` (strings, tuples, dicts of them) as Python source, one item per line."""
    inner = indent + "    "
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid Python string literal too
    if isinstance(value, dict):
        items = "".join(f"{inner}{_literal(k)}: {_literal(v, inner)},\n" for k, v in value.items())
        return "{\n" + items + indent + "}"
    if all(isinstance(item, str) for item in value):
        return "(" + ", ".join(map(_literal, value)) + ("," if len(value) == 1 else "") + ")"
    return "(\n" + "".join(f"{inner}{_literal(item, inner)},\n" for item in value) + indent + ")"


def names_source() -> str:
    """The text ``core/options/names.py`` must have: :func:`registry_names` as Python source."""
    body = "".join(f"{name} = {_literal(value)}\n" for name, value in registry_names().items())
    return f"{HEADER}\n{body}"


def main() -> int:
    """Write ``core/options/names.py`` (``--check``: exit 1 when it is out of date instead)."""
    path = Path(names.__file__)
    current = path.read_text(encoding="utf-8") == names_source()
    if "--check" in sys.argv[1:]:
        print(f"{path}: {'up to date' if current else 'out of date'}")
        return 0 if current else 1
    if not current:
        path.write_text(names_source(), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
