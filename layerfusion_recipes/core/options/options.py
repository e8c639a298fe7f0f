"""What the options of every task share, standard library only (the command line imports it): the
default output folders, the feature cache's storage dtypes, the probes' default K, one-line checks
of names and counts that the flags and the YAML files both pass, and argparse's ``type`` of counts,
sizes, LRs and shots."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .grids import FULL_TRAIN, check_lr

RESULTS_ROOT = "layerfusion-results"  # the default output folders are its sub-folders, one per task

# integer options that must be >= 1 (checked by argparse for flags, by `resolve` for the YAML)
POSITIVE_INT_OPTIONS = (
    "max_length",
    "dev_limit",
    "test_limit",
    "train_sentences",
    "batch_size",
    "eval_every",
    "shots",
    "epochs",
    "trials",
    "workers",
    "threads",
    "select_trials",
    "probe_layers",
    "probe_fuse",
)
DEFAULT_CACHE_DTYPE = "float32"  # the feature cache's storage dtype by default: the encoder's own numbers
# storage dtypes of the feature cache (``--cache-dtype``): the exact default, then the two halves
CACHE_DTYPES = (DEFAULT_CACHE_DTYPE, "bfloat16", "float16")
PROBE_TOP = 3  # --probe-layers without a value: the best 3 layers


def default_output(task: str) -> str:
    """The output folder of a task when ``--output`` is not given: its own, so that two tasks never
    share a results file.

    Example:
        >>> default_output("classify")
        'layerfusion-results/classify'
    """
    return f"{RESULTS_ROOT}/{task}"


def check_names(option: str, values: Sequence[str] | None, allowed: Sequence[str]) -> None:
    """Raise ``ValueError`` naming ``option``, the unknown values and what is allowed.

    Example:
        >>> check_names("methods", ["dwat"], ("none", "dwatt"))
        Traceback (most recent call last):
        ValueError: --methods: unknown ['dwat']; allowed: none, dwatt
    """
    unknown = [value for value in values or () if value not in allowed]
    if unknown:
        raise ValueError(f"--{option}: unknown {unknown}; allowed: {', '.join(allowed)}")


def check_positive_ints(options: dict[str, Any], source: str) -> None:
    """Raise ``ValueError`` naming ``source`` and the option when a count option is not >= 1.

    Example:
        >>> check_positive_ints({"epochs": [25, 0]}, "grid.yaml")
        Traceback (most recent call last):
        ValueError: grid.yaml: epochs must be integers >= 1, got [25, 0]
    """
    for name in POSITIVE_INT_OPTIONS:
        value = options.get(name)
        values = value if isinstance(value, list) else [value]
        if name == "shots":  # `all` (the whole train split) is the task's to accept or refuse
            values = [v for v in values if v != "all"]
        if value is not None and not all(type(v) is int and v >= 1 for v in values):
            raise ValueError(f"{source}: {name} must be integers >= 1, got {value!r}")


def check_cache_dtype(name: str) -> str:
    """``name`` when it is a storage dtype of the feature cache (:data:`CACHE_DTYPES`), else a one-line
    ``ValueError`` naming it and the allowed ones: the one check of ``--cache-dtype``, whether it comes
    from a flag, a YAML file or the settings of a script.

    Example:
        >>> check_cache_dtype("bfloat16")
        'bfloat16'
        >>> check_cache_dtype("half")
        Traceback (most recent call last):
        ValueError: --cache-dtype 'half': allowed float32, bfloat16, float16
    """
    if name not in CACHE_DTYPES:
        raise ValueError(f"--cache-dtype {name!r}: allowed {', '.join(CACHE_DTYPES)}")
    return name


def positive_int(text: str) -> int:
    """argparse ``type`` of counts: an integer >= 1 (else a one-line usage error, exit code 2).

    Example:
        >>> positive_int("3")
        3
    """
    return _positive(text, int, "an integer >= 1")


def positive_float(text: str) -> float:
    """argparse ``type`` of sizes: a finite number > 0 (else a one-line usage error, exit code 2).

    Example:
        >>> positive_float("1.5")
        1.5
    """
    return _positive(text, float, "a number > 0")


def _positive(text: str, convert: type, what: str) -> int | float:
    """``convert(text)`` if it is finite and > 0, else argparse's usage error saying it must be ``what``."""
    try:
        value = convert(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def learning_rate(text: str) -> float:
    """argparse ``type`` of LRs: a finite number > 0 (else a one-line usage error, exit code 2).

    Example:
        >>> learning_rate("3e-4")
        0.0003
    """
    try:
        return check_lr(float(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from error


def shots_value(text: str) -> int:
    """argparse ``type`` of ``--shots``: an integer >= 1, or ``all`` (:data:`FULL_TRAIN`: the whole
    train split).

    Example:
        >>> shots_value("8"), shots_value("all")
        (8, 0)
    """
    return FULL_TRAIN if text.strip().lower() == "all" else positive_int(text)
