"""What the generated blocks of ``benchmarks/RESULTS.md`` are made of (the generator:
:mod:`layerfusion_recipes.reporting.results_md`): a block and its errors, and durations and sizes as
the cost lines of the summaries say them.
"""

from __future__ import annotations

from dataclasses import dataclass

Params = tuple[tuple[str, str], ...]  # a marker's key=value parameters, in their order


class MarkerError(ValueError):
    """A block that cannot be regenerated; the message names its marker."""


@dataclass(frozen=True)
class Block:
    """One generated block of the file.

    Args:
        spec: The marker's text after ``generated:`` (name and parameters).
        name: The summary's name (``benchmarks/summaries/<name>.json``), or a reserved name (``guard``).
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
