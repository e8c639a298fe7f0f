"""``layerfusion audit``: each method's new trainable parameters, on the meta device.

Command line::

    layerfusion audit roberta-large.json            # readable table
    layerfusion audit roberta-large.json --json     # {"dwatt": 26353152, "concat": ...}
    layerfusion audit DIR --regime lora --match dwatt  # budget-matched baselines, flags > 5%

The counting itself is :mod:`peft_layerfusion.comparison.audit`.
"""

from __future__ import annotations

import argparse
import json

from peft_layerfusion.comparison.audit import AUDITED_METHODS, audit, format_table, match_report
from peft_layerfusion.comparison.budget import DEFAULT_TOLERANCE
from peft_layerfusion.comparison.regimes import REGIME_NAMES
from peft_layerfusion.registration import METHODS

from ..core.models import peft_alias_quiet
from ..core.settings import check_names


def run(args: argparse.Namespace) -> int:
    """The ``layerfusion audit`` command."""
    with peft_alias_quiet():  # the audit builds every method's PeftModel (on the meta device)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check_names("regime", [args.regime], REGIME_NAMES)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if args.match:
        check_names("match", [args.match], AUDITED_METHODS)
        report = match_report(args.config, args.regime, args.match, tolerance)
        if args.json:
            print(json.dumps({name: row["total"] for name, row in report["rows"].items()}))
            return 0
        print(
            f"regime {args.regime}; baselines sized to {args.match} ({report['rows'][args.match]['total']:,})"
        )
        print(format_table(report["rows"], reference=args.match))
        for first, second, gap in report["flagged"]:
            print(f"FLAG: {first} and {second} differ by {gap:.1%} (> {tolerance:.0%})")
        return 0
    report = audit(args.config, args.regime)
    if args.json:
        print(json.dumps({method: entry["total"] for method, entry in report.items()}))
    else:
        print(format_table(report))
    return 0


def list_methods(args: argparse.Namespace) -> int:
    """The ``layerfusion methods`` command: every registered method, from the registry itself."""
    print(f"{'method':<16}{'PEFT type':<17}{'token-wise':<12}seq2seq")
    for method in METHODS:
        print(f"{method.name:<16}{method.name.upper():<17}{str(method.token_wise):<12}{method.seq2seq}")
    print("none            (the plain last-layer head; recipes only)")
    return 0
