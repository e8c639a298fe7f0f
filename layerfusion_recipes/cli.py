"""The ``layerfusion`` command (the entry point): one sub-command per experiment, found in the command
table :data:`~layerfusion_recipes.commands.COMMANDS`.

Each :class:`~layerfusion_recipes.commands.Command` names its options (a task's ``options.py``, or
:mod:`layerfusion_recipes.arguments`; either imports only the standard library) and its handler as
``"module:function"``. The handler's module, and with it torch, transformers and peft, is imported
only when the command runs, so ``layerfusion --help`` and ``layerfusion COMMAND --help`` answer at
once. A user error (missing path, unreadable data, bad value) prints one line and exits with 2;
``--debug`` shows the traceback instead. Nothing imports this module but the entry point.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .commands import COMMANDS, Command
from .core.errors import run_command

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

# a warning bitsandbytes (the `integrations` extra) logs at `import peft` on CPUs with AVX512-BF16: it
# asks for the `kernels` package, which downloads from the Hub; its 4-bit CPU path works without it
QUIET_LOGGERS = ("bitsandbytes.backends.cpu.ops",)
DEBUG_HELP = "Show the full traceback of a user error (bad path, data or value) instead of one line."


def build_parser() -> argparse.ArgumentParser:
    """The ``layerfusion`` parser with every sub-command (builds nothing heavy)."""
    parser = argparse.ArgumentParser(
        prog="layerfusion",
        description="Layer fusion for PEFT: parameter audits and the paper's experiments.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        subparser = subparsers.add_parser(
            name,
            help=command.help,
            description=command.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(subparser)
        # `layerfusion ner ... --debug` works too
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def quiet_third_party_warnings() -> None:
    """Raise :data:`QUIET_LOGGERS` to errors only: a command's output starts with its own lines."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_third_party_warnings()  # before the command imports peft
    command = COMMANDS[args.command]
    return run_command(command.run, args, debug=args.debug, prog=f"layerfusion {args.command}")


if __name__ == "__main__":
    sys.exit(main())
