"""The ``layerfusion`` command: one sub-command per module, found by name.

Each module in :data:`SUBCOMMANDS` exposes ``add_parser(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, str] = {
    "audit": "layerfusion_recipes.audit",
    "ner": "layerfusion_recipes.ner",
    "mlm": "layerfusion_recipes.mlm",
    "sweep": "layerfusion_recipes.sweep",
    "plot": "layerfusion_recipes.plot",
    "seq2seq": "layerfusion_recipes.seq2seq",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerfusion",
        description="Layer fusion for PEFT: parameter audits and the paper's experiments.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # sub-command not available in this installation
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
