"""A benchmark script's printed report, also kept as a JSON file that ``layerfusion report`` shows.

The benchmarks under ``benchmarks/`` print their results (Markdown tables and a few lines around
them). With ``--output FILE.json`` they also save exactly what they printed, with the command line,
the time, the load on the machine and the torch version, so that ``RESULTS.md`` shows the run
itself instead of a hand copy::

    report = Report("benchmarks/cache_speed.py", argv)
    report.print("| method | s/run |")
    ...
    report.save(args.output)  # no-op when None

The file holds ``command``, ``date`` (UTC, ISO), ``load_1min``, ``cpu_count``, ``torch`` and
``lines`` (the printed lines, in order).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from peft_layerfusion.utils import atomic_write_json

REPORT_KEYS = ("command", "date", "load_1min", "cpu_count", "torch", "lines")


class Report:
    """What a benchmark prints, kept to be saved.

    Args:
        script: The script as a user runs it, e.g. ``benchmarks/overhead.py``.
        argv: Its arguments (``sys.argv[1:]``), for the command line stored with the report.

    Example:
        >>> report = Report("benchmarks/overhead.py", ["--rounds", "3"])
        >>> report.print("| dwatt | 1.1x |")
        | dwatt | 1.1x |
        >>> report.save("benchmarks/results/perf/overhead.json")
    """

    def __init__(self, script: str, argv: Sequence[str]) -> None:
        self.command = shlex.join(["python", script, *argv])
        self.load_1min = os.getloadavg()[0]  # at the start: what the run shared the machine with
        self.lines: list[str] = []

    def print(self, line: str = "") -> None:
        """Print ``line`` (flushed) and keep it."""
        print(line, flush=True)
        self.lines.append(line)

    def save(self, path: str | os.PathLike | None) -> None:
        """Write the report to ``path`` atomically (JSON, :data:`REPORT_KEYS`); nothing when ``None``."""
        if path is None:
            return
        atomic_write_json(
            path,
            {
                "command": self.command,
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "load_1min": round(self.load_1min, 2),
                "cpu_count": os.cpu_count(),
                "torch": torch.__version__,
                "lines": self.lines,
            },
        )


def read_report(path: str | os.PathLike) -> dict[str, Any]:
    """A report saved by :meth:`Report.save`.

    Raises:
        ValueError: naming the file when it is not JSON or lacks one of :data:`REPORT_KEYS`.
    """
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a benchmark report (JSON): {error}") from error
    missing = [key for key in REPORT_KEYS if not isinstance(report, dict) or key not in report]
    if missing:
        raise ValueError(f"{path}: not a benchmark report: no {', '.join(missing)}")
    return report
