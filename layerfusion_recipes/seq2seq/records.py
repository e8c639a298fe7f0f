"""The records of ``layerfusion seq2seq``: one per finished (method, seed, learning rate) run, in
``OUTPUT/results.jsonl`` (:mod:`layerfusion_recipes.core.results.records`).

Key (:func:`run_key`): ``METHOD|SEED|lr=LR|SETUP``, ``SETUP`` the fingerprint of the comparison's
settings (every option but the seed and the learning rate) and its training and test files
(:func:`comparison_setup`), then ``|defaults=...``: the fingerprint of a variant's options
(:func:`~layerfusion_recipes.seq2seq.variants.variant_key`). A run whose key is in the file is not run
again; changed settings, files or variant options make new records beside the old ones.

``OUTPUT/results.json`` is the comparison's summary, written when it completes (its settings, the
runs it used, the selected learning rates, the copy baseline, the summary table's numbers and what
it cost; :func:`~layerfusion_recipes.seq2seq.results.seq2seq_summary` makes a summary of it).
"""

from __future__ import annotations

from typing import Any

from ..core.results.cells import defaults_suffix
from ..core.results.records import fingerprint, unit_key
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
    with ``|defaults=...``, the fingerprint of the variant's options
    (:func:`~layerfusion_recipes.seq2seq.variants.variant_key`; the plain model has none).

    Example:
        >>> run_key("none", 0, 3e-3, "3f2a9c0d1e4b"), run_key("surface_hard", 0, 3e-3, "3f2a9c0d1e4b")
        ('none|0|lr=0.003|3f2a9c0d1e4b', 'surface_hard|0|lr=0.003|3f2a9c0d1e4b|defaults=...')
    """
    return unit_key(f"{method}|{seed}", learning_rate, setup) + defaults_suffix(variant_key(method))
