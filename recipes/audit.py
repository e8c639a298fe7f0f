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


def run(args: argparse.Namespace) -> int:
    """The ``layerfusion audit`` command."""
    if args.match:
        report = match_report(args.config, args.regime, args.match, args.tolerance)
        if args.json:
            print(json.dumps({name: row["total"] for name, row in report["rows"].items()}))
            return 0
        print(
            f"regime {args.regime}; baselines sized to {args.match} ({report['rows'][args.match]['total']:,})"
        )
        print(format_table(report["rows"], reference=args.match))
        for first, second, gap in report["flagged"]:
            print(f"FLAG: {first} and {second} differ by {gap:.1%} (> {args.tolerance:.0%})")
        return 0
    report = audit(args.config, args.regime)
    if args.json:
        print(json.dumps({method: entry["total"] for method, entry in report.items()}))
    else:
        print(format_table(report))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``audit`` sub-command."""
    parser = subparsers.add_parser(
        "audit",
        help="Count each method's new trainable parameters (meta device, no weights).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config", metavar="CONFIG", help="config.json path, model directory or cached Hub name"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object {method: params}")
    parser.add_argument("--regime", default="fe", choices=REGIME_NAMES, help="training regime (default: fe)")
    parser.add_argument("--match", choices=AUDITED_METHODS, help="size LoRA / R+n / adapters to this method")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="flag pairs further apart")
    parser.set_defaults(func=run)
