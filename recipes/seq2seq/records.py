"""The records of ``layerfusion seq2seq``: one per finished (method, seed, learning rate) run, in
``OUTPUT/results.jsonl`` (:mod:`layerfusion_recipes.core.records`).

Key (:func:`run_key`): ``METHOD|SEED|lr=LR|SETUP``, ``SETUP`` the fingerprint of the comparison's
settings (every option but the seed and the learning rate) and its training and test files
(:func:`comparison_setup`), then ``|defaults=...`` where a variant's options changed since keys began to
carry them (:func:`~layerfusion_recipes.seq2seq.variants.variant_key`). A run whose key is in the file
is not run again; changed settings, files or variant options make new records beside the old ones.

``OUTPUT/results.json`` is the comparison's summary, written when it completes (its settings, the
runs it used, the selected learning rates, the copy baseline, the summary table's numbers and what
it cost; ``layerfusion report`` shows it). Before the shared results file it was also the runs' only
record, rewritten after every run (``complete`` false until the end): :func:`legacy_records` reads
its runs as records under the key its stored settings give, so a folder written then is resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.cells import defaults_suffix
from ..core.records import fingerprint, unit_key
from .variants import variant_key

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "results.json"
SETUP_FIELDS = ("settings", "train_file", "test_file")  # what a run's result depends on but its cell


def comparison_setup(header: dict[str, Any]) -> str:
    """The fingerprint of a comparison's :data:`SETUP_FIELDS` (as ``results.json`` stores them: the
    settings but the seed and the learning rate, the files as given).

    Example:
        >>> comparison_setup({"settings": {"epochs": 3}, "train_file": "v.txt", "test_file": "t.txt"})
        '...'
    """
    return fingerprint({name: header[name] for name in SETUP_FIELDS})


def run_key(method: str, seed: int, learning_rate: float, setup: str) -> str:
    """The key of the run of ``method`` at ``seed`` and ``learning_rate`` in the comparison ``setup``,
    with ``|defaults=...`` where the variant's options changed since keys began to carry them
    (:func:`~layerfusion_recipes.seq2seq.variants.variant_key`).

    Example:
        >>> run_key("vanilla", 0, 3e-3, "3f2a9c0d1e4b"), run_key("surface_hard", 0, 3e-3, "3f2a9c0d1e4b")
        ('vanilla|0|lr=0.003|3f2a9c0d1e4b', 'surface_hard|0|lr=0.003|3f2a9c0d1e4b')
    """
    return unit_key(f"{method}|{seed}", learning_rate, setup) + defaults_suffix(variant_key(method))


def legacy_records(output: Path) -> list[dict[str, Any]]:
    """The runs of ``output``'s ``results.json`` as records with their keys (module docstring); none
    when it is missing, unreadable or lacks its settings.

    Example:
        >>> legacy_records(Path("benchmarks/results/seq2seq"))[0]["key"]
        'vanilla|0|lr=0.003|...'
    """
    try:
        saved = json.loads((output / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(saved, dict) or not all(name in saved for name in SETUP_FIELDS):
        return []
    setup = comparison_setup(saved)
    return [
        {**run, "key": run_key(run["method"], run["seed"], run["learning_rate"], setup)}
        for run in saved.get("runs", [])
    ]
