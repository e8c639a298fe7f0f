"""The ``layerfusion`` command: one sub-command per module, found by name.

Each module in :data:`SUBCOMMANDS` exposes ``add_parser(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import run_command

SUBCOMMANDS: dict[str, str] = {
    "audit": "layerfusion_recipes.audit",
    "ner": "layerfusion_recipes.ner",
    "mlm": "layerfusion_recipes.mlm",
    "sweep": "layerfusion_recipes.sweep",
    "plot": "layerfusion_recipes.plot",
    "seq2seq": "layerfusion_recipes.seq2seq",
}
DEBUG_HELP = "Show the full traceback of a user error (bad path, data or value) instead of one line."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerfusion",
        description="Layer fusion for PEFT: parameter audits and the paper's experiments.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # sub-command not available in this installation
        module.add_parser(subparsers)
    for subparser in subparsers.choices.values():  # `layerfusion ner ... --debug` works too
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args, debug=args.debug, prog=f"layerfusion {args.command}")


if __name__ == "__main__":
    sys.exit(main())
