"""The settings of ``layerfusion ner`` and ``layerfusion sweep``: flags over YAML over defaults.

The options themselves are defined in :mod:`layerfusion_recipes.arguments`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.demo import DEMO_DEV_LIMIT, DEMO_GRID, GRID_METHODS, demo_data_path, demo_model_path
from ..core.feature_cache import storage_dtype
from ..core.grids import PAPER_AXES, USER_AXES
from ..core.models import METHOD_NAMES, NER_REGIME_NAMES, check_adapter_grid
from ..core.settings import check_names, load_config, option, results_path
from .experiment import ExperimentSettings, cache_positions_for

GRID_KEYS = ("methods", "regimes", "shots", "epochs", "trials")
# your --data: a first comparison (2 shot sizes, 25 epochs, 3 trials, dev every 5 epochs, each regime's LRs)
USER_GRID: dict[str, Any] = {"methods": GRID_METHODS, "regimes": ["fe"], **USER_AXES}
# --paper-grid: shots 8 .. 128 x epochs 25 .. 100 x 5 trials (2,800 runs under FE)
PAPER_GRID: dict[str, Any] = {"methods": GRID_METHODS, "regimes": ["fe"], **PAPER_AXES}
DEFAULTS: dict[str, Any] = {
    "max_length": 128,
    "batch_size": 16,
    "seed": 0,
    "no_cache": False,
    "fixed_sample": False,
    "head_modules": ["classifier"],
    "output": "layerfusion-results",
    "workers": 1,
    "quiet": False,
}


def resolve(args: argparse.Namespace) -> tuple[ExperimentSettings, dict[str, Any]]:
    """Settings, grid and run options: a flag wins over the YAML ``--config``, which wins over defaults.

    Grid defaults: :data:`PAPER_GRID` with ``--paper-grid``, else
    :data:`~layerfusion_recipes.core.demo.DEMO_GRID` without --model/--data, else :data:`USER_GRID`.

    Returns:
        ``(settings, grid)``; ``grid`` also carries output, results, workers, quiet and threads.

    Example:
        >>> settings, grid = resolve(parser.parse_args(["--shots", "8"]))
    """
    loaded = load_config(args)
    defaults = dict(DEFAULTS)

    def pick(name: str) -> Any:
        return option(args, loaded, name, defaults.get(name))

    demo = pick("model") is None and pick("data") is None
    defaults.update(PAPER_GRID if pick("paper_grid") else DEMO_GRID if demo else USER_GRID)
    settings = ExperimentSettings(
        model=pick("model") or demo_model_path(),
        data=pick("data") or demo_data_path(),
        language=pick("language"),
        tokens_column=pick("tokens_column"),
        tags_column=pick("tags_column"),
        label_names=tuple(pick("label_names")) if pick("label_names") else None,
        tag_scheme=pick("tag_scheme") or "auto",
        max_length=pick("max_length"),
        lr=pick("lr"),
        batch_size=pick("batch_size"),
        eval_every=pick("eval_every"),
        seed=pick("seed"),
        use_cache=not pick("no_cache"),
        cache_dir=pick("cache_dir"),
        head_modules=tuple(pick("head_modules")),
        dev_limit=pick("dev_limit") or (DEMO_DEV_LIMIT if demo else None),
        test_limit=pick("test_limit"),
        train_sentences=pick("train_sentences"),
        fixed_sample=bool(pick("fixed_sample")),
        method_options=dict(loaded.get("method_options", {})),
        cache_dtype=pick("cache_dtype") or "float32",
    )
    run_keys = ("output", "results", "workers", "quiet", "threads", "select_trials", "dry_run")
    grid = {key: pick(key) for key in (*GRID_KEYS, *run_keys)}
    grid["results"] = results_path(grid["output"], grid["results"])
    check_names("methods", grid["methods"], METHOD_NAMES)
    storage_dtype(settings.cache_dtype)  # a bad value in the YAML stops here, naming the allowed ones
    settings.cache_positions = cache_positions_for(grid["methods"] or ())  # what every method reads
    check_names("regimes", grid["regimes"], NER_REGIME_NAMES)
    check_adapter_grid(grid["methods"] or (), grid["regimes"] or (), settings.method_options)
    for regime in grid["regimes"] or ():
        settings.lr_grid(regime)  # a bad --lr / lr: stops here, naming the values
    return settings, grid
