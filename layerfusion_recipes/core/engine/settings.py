"""What every task's settings share: options read as a flag over a YAML file over a default, and
one-line errors naming an option, its bad values and what is allowed.

Each task builds its settings dataclass from the parsed options (``ner``:
:func:`layerfusion_recipes.ner.settings.resolve`; ``mlm``: ``MlmSettings.from_args``; ``seq2seq``:
``Seq2SeqSettings.from_args``); nothing below that passes the argparse namespace on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from peft_layerfusion.names import METHOD_NAMES, TRAINED_NAMES

from ..models.models import check_adapter_grid
from ..options.grids import FULL_TRAIN
from ..options.options import DEFAULT_CACHE_DTYPE, PROBE_TOP, check_names, check_positive_ints

GRID_KEYS = ("methods", "regimes", "shots", "epochs", "trials")
RUN_KEYS = (
    "output",
    "results",
    "workers",
    "quiet",
    "threads",
    "select_trials",
    "dry_run",
    "probe_layers",
    "selection",
    "folds",
)


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the YAML file ``args.config`` (empty without one), checked: a mapping of known
    options (``method_options`` besides the flags) with counts >= 1.

    Raises:
        ValueError: Naming the file and what is wrong.

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> args = build_parser().parse_args(["sweep", "--config", "benchmarks/grids/conll_fe_lr.yaml"])
        >>> load_config(args)["output"]
        'benchmarks/results/conll_fe_lr'
    """
    if not getattr(args, "config", None):
        return {}
    loaded = yaml.safe_load(Path(args.config).read_text()) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{args.config}: expected a mapping of options, got {type(loaded).__name__}")
    unknown = set(loaded) - set(vars(args)) - {"method_options"}
    if unknown:
        raise ValueError(f"{args.config}: unknown option(s) {sorted(unknown)}")
    check_positive_ints(loaded, args.config)
    return loaded


def field_defaults(settings_class: type, names: tuple[str, ...]) -> dict[str, Any]:
    """The defaults of the fields ``names`` of the dataclass ``settings_class``: what a command's
    defaults take from the settings a script builds, so each is written once.

    Example:
        >>> from layerfusion_recipes.classify.experiment import ClassifySettings
        >>> field_defaults(ClassifySettings, ("max_length", "batch_size", "seed"))
        {'max_length': 128, 'batch_size': 8, 'seed': 0}
    """
    fields = {field.name: field for field in dataclasses.fields(settings_class)}
    return {name: fields[name].default for name in names}


def option(args: argparse.Namespace, loaded: dict[str, Any], name: str, default: Any = None) -> Any:
    """One option: the flag when given, else the YAML's (``loaded``: :func:`load_config`), else ``default``.

    Example:
        >>> from argparse import Namespace
        >>> option(Namespace(workers=2, trials=None), {"workers": 1, "trials": 3}, "workers")
        2
        >>> option(Namespace(workers=2, trials=None), {"workers": 1, "trials": 3}, "trials")
        3
    """
    value = getattr(args, name, None)
    if value is not None:
        return value
    return loaded.get(name, default)


def results_path(output: str | os.PathLike, results: str | os.PathLike | None = None) -> str:
    """The results file of a sweep: ``results`` when given, else ``results.jsonl`` in ``output``.

    Example:
        >>> results_path("benchmarks/results/conll_fe_lr")
        'benchmarks/results/conll_fe_lr/results.jsonl'
    """
    return str(results) if results else str(Path(output) / "results.jsonl")


class Picker:
    """A task's options as the user gave them: ``picker(name)`` is the flag, else the YAML's (of
    ``--config``: :func:`load_config`), else ``defaults[name]`` (:func:`option`).

    Example:
        >>> from argparse import Namespace
        >>> pick = Picker(Namespace(config=None, workers=2, trials=None), {"trials": 3})
        >>> pick("workers"), pick("trials")
        (2, 3)
    """

    def __init__(self, args: argparse.Namespace, defaults: dict[str, Any]) -> None:
        self.args = args
        self.defaults = dict(defaults)  # a task may fill in more before it picks (NER: its grid's)
        self.loaded = load_config(args)

    def __call__(self, name: str) -> Any:
        return option(self.args, self.loaded, name, self.defaults.get(name))

    def task_fields(self) -> dict[str, Any]:
        """:func:`task_fields` of these options."""
        return task_fields(self, self.loaded)

    def grid(self, settings: Any, regimes: tuple[str, ...]) -> dict[str, Any]:
        """:func:`grid_options` of these options for ``settings`` (trained methods named or not:
        :func:`asks_for_training`; the methods the user named, for ``--selection cv``)."""
        named = option(self.args, self.loaded, "methods")
        return grid_options(self, settings, regimes, asks_for_training(self.args, self.loaded), named)


def task_fields(pick, loaded: dict[str, Any]) -> dict[str, Any]:
    """The options of the fields every few-shot task's settings share
    (:class:`~layerfusion_recipes.core.engine.experiment.TaskSettings`, model and data aside).

    Args:
        pick: ``name -> value``: the flag, else the YAML's, else the task's default (:func:`option`).
        loaded: The YAML options (:func:`load_config`; its ``method_options``).

    Example:
        >>> task_fields(lambda name: {"seed": 1}.get(name), {})["seed"]
        1
    """
    head = pick("head_modules")
    return {
        "max_length": pick("max_length"),
        "lr": pick("lr"),
        "batch_size": pick("batch_size"),
        "eval_every": pick("eval_every"),
        "seed": pick("seed"),
        "use_cache": not pick("no_cache"),
        "cache_dir": pick("cache_dir"),
        "cache_dtype": pick("cache_dtype") or DEFAULT_CACHE_DTYPE,
        "train_memory": pick("train_memory"),
        "head_modules": tuple(head) if head else None,
        "dev_limit": pick("dev_limit"),
        "test_limit": pick("test_limit"),
        "fixed_sample": bool(pick("fixed_sample")),
        "probe_start": bool(pick("probe_start")),
        "probe_fuse": pick("probe_fuse"),
        "method_options": dict(loaded.get("method_options", {})),
    }


# options that ask for trained methods chosen on a dev split: given without --selection, they select dev
TRAINED_OPTIONS = ("methods", "regimes", "lr", "epochs", "paper_grid", "select_trials")


def asks_for_training(args: argparse.Namespace, loaded: dict[str, Any]) -> bool:
    """Whether the flags or the YAML name trained methods or their grid (:data:`TRAINED_OPTIONS`).

    Example:
        >>> from argparse import Namespace
        >>> given = Namespace(methods=["dwatt"])
        >>> asks_for_training(Namespace(methods=None), {}), asks_for_training(given, {})
        (False, True)
    """
    return any(option(args, loaded, name) is not None for name in TRAINED_OPTIONS)


def grid_options(
    pick, settings: Any, regimes: tuple[str, ...], trained: bool = False, named: Sequence[str] | None = None
) -> dict[str, Any]:
    """The grid and run options of a few-shot task (:data:`GRID_KEYS`, :data:`RUN_KEYS`), checked.

    Args:
        pick: ``name -> value``: the flag, else the YAML's, else the task's default (:func:`option`).
        settings: The task's settings (their method options are checked against the regimes).
        regimes: The regimes the task trains.
        trained: Whether the user named trained methods or their grid (then ``--selection`` defaults to
            ``dev``).
        named: The methods the user named: under ``--selection cv`` those that train (all but ``none``)
            run beside the read-outs, each chosen by cross-validation (``trained`` in the result).

    Returns:
        ``{methods, regimes, shots, epochs, trials, output, results, workers, quiet, threads,
        select_trials, dry_run, probe_layers}``; ``results`` is the results file (:func:`results_path`), a
        YAML ``shots`` value ``all`` is :data:`~layerfusion_recipes.core.options.grids.FULL_TRAIN`;
        ``probe_layers``
        is ``None`` (no probes) or the K of ``--probe-layers``.

    Raises:
        ValueError: An unknown method or regime, an AdapterHub regime with a fusion method (a bad LR
            stops the settings themselves: :class:`~layerfusion_recipes.core.engine.experiment.TaskSettings`).

    Example:
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> settings = NerSettings(model="m", data="d")
        >>> defaults = {"output": "layerfusion-results/ner", "methods": ["dwatt"], "regimes": ["fe"]}
        >>> grid_options(lambda name: defaults.get(name), settings, ("fe", "ft", "lora", "bitfit"))["results"]
        'layerfusion-results/ner/results.jsonl'
    """
    grid = {key: pick(key) for key in (*GRID_KEYS, *RUN_KEYS)}
    if (settings.probe_start or settings.probe_fuse) and not grid["probe_layers"]:  # they need the probes
        grid["probe_layers"] = PROBE_TOP
    grid["results"] = results_path(grid["output"], grid["results"])
    # the true few-shot protocol, unless asked otherwise: --selection dev, or trained methods named
    grid["selection"] = grid["selection"] or ("dev" if trained else "cv")
    grid["folds"] = grid["folds"] or 4
    grid["shots"] = [FULL_TRAIN if value == "all" else value for value in grid["shots"] or ()]
    check_names("methods", grid["methods"], METHOD_NAMES)
    grid["trained"] = [m for m in named or () if m != "none"] if grid["selection"] == "cv" else []
    fitted = [m for m in grid["trained"] if m not in TRAINED_NAMES]
    trainable = ", ".join(m for m in TRAINED_NAMES if m != "none")
    if fitted:  # --selection cv: the read-outs always run; what is named trains beside them
        raise ValueError(
            f"--methods {' '.join(fitted)}: under --selection cv every read-out fitted in closed form runs "
            f"anyway; name the trained fusions to run beside them: {trainable}"
        )
    check_names("regimes", grid["regimes"], regimes)
    check_adapter_grid(grid["methods"] or (), grid["regimes"] or (), settings.method_options)
    return grid
