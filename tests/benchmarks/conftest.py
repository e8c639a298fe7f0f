"""The benchmarks are scripts run from their folder (``python benchmarks/NAME.py``): their tests import
them the same way, with ``benchmarks/`` first on the path."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def script(monkeypatch) -> Callable[[str], ModuleType]:
    """``script("name")``: the module of ``benchmarks/name.py``."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module
