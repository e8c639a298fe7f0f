"""What every task's settings share: options read as a flag over a YAML file over a default, and
one-line errors naming an option, its bad values and what is allowed.

Each task builds its settings dataclass from the parsed options (``ner``:
:func:`layerfusion_recipes.ner.settings.resolve`; ``mlm``: ``MlmSettings.from_args``; ``seq2seq``:
``Seq2SeqSettings.from_args``); nothing below that passes the argparse namespace on.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

from ..arguments import check_positive_ints


def load_config(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the YAML file ``args.config`` (empty without one), checked: a mapping of known
    options (``method_options`` besides the flags) with counts >= 1.

    Raises:
        ValueError: Naming the file and what is wrong.

    Example:
        >>> load_config(parser.parse_args(["--config", "benchmarks/grids/conll_fe_lr.yaml"]))["output"]
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


def option(args: argparse.Namespace, loaded: dict[str, Any], name: str, default: Any = None) -> Any:
    """One option: the flag when given, else the YAML's (``loaded``: :func:`load_config`), else ``default``.

    Example:
        >>> option(parser.parse_args(["--workers", "2"]), {"workers": 1, "trials": 3}, "workers")
        2
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


def check_names(option: str, values: list[str] | None, allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming ``option``, the unknown values and what is allowed.

    Example:
        >>> check_names("methods", ["dwat"], ("none", "dwatt"))
        Traceback (most recent call last):
        ValueError: --methods: unknown ['dwat']; allowed: none, dwatt
    """
    unknown = [value for value in values or () if value not in allowed]
    if unknown:
        raise ValueError(f"--{option}: unknown {unknown}; allowed: {', '.join(allowed)}")
