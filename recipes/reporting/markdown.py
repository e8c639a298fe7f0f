"""What the generated blocks of ``benchmarks/RESULTS.md`` are made of, whichever renders them (the
generator :mod:`layerfusion_recipes.reporting.results_md` for the grids, each task's ``results`` module
for its own block): a block and its errors, durations and sizes as the cost lines say them, and
command lines rebuilt from stored settings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Params = tuple[tuple[str, str], ...]  # a marker's key=value parameters, in their order


class MarkerError(ValueError):
    """A block that cannot be regenerated; the message names its marker."""


@dataclass(frozen=True)
class Block:
    """One generated block of the file.

    Args:
        spec: The marker's text after ``generated:`` (name and parameters).
        name: The grid's name (``benchmarks/grids/<name>.yaml``), or a task's reserved name (``mlm``).
        params: The marker's ``key=value`` parameters, in their order.
        start: Offset of the block's content (just after the begin marker).
        stop: Offset of the end marker (the content's end).
    """

    spec: str
    name: str
    params: Params
    start: int
    stop: int


def block_error(block: Block, message: str) -> MarkerError:
    """A :class:`MarkerError` naming ``block``'s marker."""
    return MarkerError(f"marker 'generated: {block.spec}': {message}")


def duration(seconds: float) -> str:
    """A wall time as the cost lines say it.

    Example:
        >>> duration(3727), duration(65), duration(7)
        ('1 h 02 min 07 s', '1 min 05 s', '7 s')
    """
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def memory(mb: float) -> str:
    """A size in MB as the cost lines say it: GB from 1 GB on."""
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def listed(values: list[int]) -> str:
    """``1/2``: the values a setting took (``?`` for none)."""
    return "/".join(map(str, values)) or "?"


def shown_path(path: str, root: Path) -> str:
    """A stored path as a command writes it: relative to ``root`` when under its parent folder."""
    base = root.resolve()
    if os.path.isabs(path) and Path(path).is_relative_to(base.parent):
        return os.path.relpath(path, base)
    return path


def option_defaults(add_arguments: Callable[[argparse.ArgumentParser], None]) -> dict[str, Any]:
    """Every option's default of a command's parser (``add_arguments``: the command table's)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {action.dest: action.default for action in parser._actions if action.dest != "help"}


def option_flags(
    values: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    always: Sequence[str] = (),
    shown: Callable[[Any], str] = str,
) -> list[str]:
    """The flags of a command line that give ``values``: each option not at its default (or in
    ``always``), ``--name`` then its value or values (a list), each as ``shown`` writes it.

    Example:
        >>> option_flags({"epochs": 3, "seeds": [0, 1], "seed": 0}, {"epochs": 1, "seed": 0})
        ['--epochs', '3', '--seeds', '0', '1']
    """
    flags = []
    for name, value in values.items():
        if name in always or defaults is None or value != defaults.get(name):
            listed = value if isinstance(value, list) else [value]
            flags += [f"--{name.replace('_', '-')}", *map(shown, listed)]
    return flags
