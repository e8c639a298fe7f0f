"""User errors: one line on stderr and exit code 2 instead of a traceback.

A *user error* is a problem with what the user gave: a missing path, a file in a format the
recipes cannot read, a bad option value. :class:`UserError` marks those raised by the recipes;
``ValueError`` (the convention for bad input in this code base), ``OSError`` (missing or
unreadable paths; transformers' "not a local folder and not a valid model identifier") and YAML
syntax errors count as well. :func:`run_command` runs a sub-command and turns them into
``layerfusion ner: error: <what and where>`` and exit code 2 (as ``argparse`` does for bad flags);
``--debug`` re-raises them with the full traceback.

A long command stopped with Ctrl-C (SIGINT) ends in one line, ``layerfusion ner: stopped by SIGINT
(Ctrl-C)``, with exit code 130 (128 + SIGINT, what a shell reports), after its ``finally`` blocks ran
(a sweep logs its line). One stopped with SIGTERM (``kill``, a scheduler's time limit) ends like
Ctrl-C where it runs inside :func:`sigterm_raises`: :class:`Terminated` is raised in the main
thread, and :func:`run_command` returns 143 (128 + SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

USER_EXIT_CODE = 2  # argparse's exit code for bad command lines
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process killed by SIGTERM
SIGINT_EXIT_CODE = 128 + signal.SIGINT  # ... and for one stopped by Ctrl-C


class Terminated(BaseException):
    """SIGTERM arrived inside :func:`sigterm_raises`. A ``BaseException`` like ``KeyboardInterrupt``,
    so ``except Exception`` handlers let it through.

    Example:
        >>> raise Terminated("SIGTERM")
        Traceback (most recent call last):
        ...
        layerfusion_recipes.core.errors.Terminated: SIGTERM
    """


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread instead of ending the
    process at once; the previous handler is restored on exit. Off the main thread (where Python
    cannot set handlers) the block runs unchanged.

    Example:
        >>> import signal
        >>> try:
        ...     with sigterm_raises():  # around a sweep: `kill PID` still runs its finally blocks
        ...         signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # what `kill PID` calls
        ... except Terminated as stop:
        ...     print(f"stopped by {stop}")
        stopped by SIGTERM
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class UserError(Exception):
    """An error in the user's input (path, file format, option value), shown as one line.

    Example:
        >>> raise UserError("--data nowhere/: no such file or directory")
        Traceback (most recent call last):
        ...
        layerfusion_recipes.core.errors.UserError: --data nowhere/: no such file or directory
    """


class DataSourceError(UserError, FileNotFoundError):
    """``--data`` names nothing that can be loaded (no such path; a Hub name that cannot be reached).

    A ``FileNotFoundError`` too, so ``except FileNotFoundError`` keeps working.

    Example:
        >>> raise DataSourceError("--data 'nowhere.jsonl': no such file or directory")
        Traceback (most recent call last):
        ...
        layerfusion_recipes.core.errors.DataSourceError: --data 'nowhere.jsonl': no such file or directory
    """

    def __str__(self) -> str:  # OSError's __str__ would print the args tuple for several args
        return str(self.args[0]) if self.args else ""


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is the user's (shown as one line) rather than a bug (shown with a traceback).

    Example:
        >>> is_user_error(ValueError("--epochs 0: must be at least 1")), is_user_error(KeyError("x"))
        (True, False)
    """
    if isinstance(error, (UserError, ValueError, OSError)):  # OSError: paths, also transformers' model ones
        return True
    yaml = sys.modules.get("yaml")  # only loaded if a YAML config was read
    return yaml is not None and isinstance(error, yaml.YAMLError)


def one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (YAML and Hub errors span several).

    Example:
        >>> one_line(ValueError("bad value\\n  in line 3"))
        'bad value / in line 3'
    """
    parts = [part.strip() for part in str(error).splitlines() if part.strip()]
    return " / ".join(parts) or type(error).__name__


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type name if empty), for messages that wrap it.

    Example:
        >>> first_line(ConnectionError("Couldn't reach 'x' on the Hub\\nRetrying in 1s"))
        "Couldn't reach 'x' on the Hub"
    """
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def run_command(
    func: Callable[[argparse.Namespace], int | None],
    args: argparse.Namespace,
    debug: bool = False,
    prog: str = "layerfusion",
    stream: TextIO | None = None,
) -> int:
    """Run ``func(args)``; a user error prints ``PROG: error: MESSAGE`` and returns 2.

    Args:
        func: The sub-command (returns an exit code or ``None`` for 0).
        args: Its parsed arguments.
        debug: Re-raise user errors (full traceback) instead of printing one line.
        prog: Program name of the message, e.g. ``layerfusion ner``.
        stream: Where the message goes (default: ``sys.stderr``).

    Returns:
        The exit code: ``func``'s, 2 after a user error, 130 after Ctrl-C (one line ``PROG: stopped by
        SIGINT (Ctrl-C)``; with ``debug`` the traceback instead), 143 after :class:`Terminated` (one
        line ``PROG: stopped by SIGTERM``). Other exceptions (bugs) propagate.

    Example:
        >>> def ner(args):  # a sub-command that meets a bad --data
        ...     raise DataSourceError("--data 'missing/': no such file or directory")
        >>> run_command(ner, None, prog="layerfusion ner", stream=sys.stdout)  # the CLI: sys.exit(...)
        layerfusion ner: error: --data 'missing/': no such file or directory
        2
    """
    try:
        return int(func(args) or 0)
    except Terminated as stop:
        print(f"{prog}: stopped by {stop}", file=stream or sys.stderr)
        return SIGTERM_EXIT_CODE
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: stopped by SIGINT (Ctrl-C)", file=stream or sys.stderr)
        return SIGINT_EXIT_CODE
    except Exception as error:
        if debug or not is_user_error(error):
            raise
        print(f"{prog}: error: {one_line(error)}", file=stream or sys.stderr)
        return USER_EXIT_CODE
