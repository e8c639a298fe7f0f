"""``layerfusion audit``: each method's new trainable parameters, on the meta device.

Command line::

    layerfusion audit roberta-large.json            # readable table
    layerfusion audit roberta-large.json --json     # {"dwatt": 26353152, "concat": ...}
    layerfusion audit DIR --regime lora --match dwatt  # budget-matched baselines, flags > 5%
    layerfusion audit gemma3-270m                   # the offline decoder (`llm` extra), or a .gguf file
    layerfusion audit llama-3.1-8b                  # a published LLM shape (no weights at all)

The counting itself is :mod:`peft_layerfusion.comparison.audit`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from peft_layerfusion.comparison.audit import (
    AUDITED_METHODS,
    REFERENCE_METHODS,
    audit,
    format_table,
    match_report,
)
from peft_layerfusion.comparison.budget import DEFAULT_TOLERANCE
from peft_layerfusion.names import REGIME_NAMES

from ..core.models.gemma import resolve_config
from ..core.models.models import peft_alias_quiet
from ..core.options.options import check_names

# A sized baseline's knob -> (the baseline, its smallest size), for the flag of a budget it cannot reach.
SMALLEST_SIZE = {"num_extra_layers": ("R+n", "one extra block"), "lora_r": ("LoRA", "rank 1")}


def run(args: argparse.Namespace) -> int:
    """The ``layerfusion audit`` command."""
    with peft_alias_quiet():  # the audit builds every method's PeftModel (on the meta device)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check_names("regime", [args.regime], REGIME_NAMES)
    config = resolve_config(args.config)  # gemma3-270m, a .gguf file: the config in its header
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if args.match:
        check_names("match", [args.match], AUDITED_METHODS)
        report = match_report(config, args.regime, args.match, tolerance)
        if args.json:
            print(json.dumps({name: row["total"] for name, row in report["rows"].items()}))
            return 0
        print(
            f"regime {args.regime}; baselines sized to {args.match} ({report['rows'][args.match]['total']:,})"
        )
        print(format_table(report["rows"], reference=args.match))
        print("\n".join(budget_lines(report["rows"], args.match, tolerance)))
        return 0
    report = audit(config, args.regime)
    if args.json:
        print(json.dumps({method: entry["total"] for method, entry in report.items()}))
    else:
        print(format_table(report))
    return 0


def budget_lines(rows: dict[str, dict[str, Any]], match: str, tolerance: float) -> list[str]:
    """What ``--match`` says under its table: a ``FLAG`` for each baseline it sized (a row with a
    ``knob``) further than ``tolerance`` from ``match``'s budget, saying when the smallest size of the
    knob (R+n's one block, LoRA's rank 1) is already above it; then one note naming the methods shown
    at their own default size that are further apart (never sized here, so never flagged); else one
    line saying every sized baseline is within ``tolerance``.

    Args:
        rows: The ``rows`` of :func:`~peft_layerfusion.comparison.audit.match_report`, each with its
            ``vs_target`` (sized rows also with ``knob`` and ``value``).
        match: The method whose budget the baselines were sized to.
        tolerance: The largest relative gap that is not flagged.

    Example:
        >>> from peft_layerfusion.comparison.audit import match_report
        >>> for line in budget_lines(match_report(base_model.config, "fe", "dwatt")["rows"], "dwatt", 0.05):
        ...     print(line)
        FLAG: +extra_layers (n=1) is +38.8% from dwatt's budget (> 5%): R+n cannot reach it (...)
        note: shown at their own default size, not sized here: concat -42.6%, extra_layers +38.8%... from ...
    """
    lines = []
    for name, row in rows.items():
        gap = row["vs_target"]
        if "knob" not in row or abs(gap) <= tolerance:
            continue
        line = f"FLAG: {name} is {gap:+.1%} from {match}'s budget (> {tolerance:.0%})"
        if gap > 0 and row["knob"] in SMALLEST_SIZE and row["value"] == 1:
            baseline, smallest = SMALLEST_SIZE[row["knob"]]
            line += f": {baseline} cannot reach it ({smallest} is its smallest size)"
        lines.append(line)
    unsized = [
        f"{name} {row['vs_target']:+.1%}"
        for name, row in rows.items()
        if "knob" not in row and name not in (match, *REFERENCE_METHODS) and abs(row["vs_target"]) > tolerance
    ]
    if unsized:
        shown = ", ".join(unsized)
        lines.append(f"note: shown at their own default size, not sized here: {shown} from {match}'s budget")
    if not lines:
        lines.append(f"every baseline sized here is within {tolerance:.0%} of {match}'s budget")
    return lines
