"""The default grids (standard library only, so that the ``--help`` texts quote them): the max-LR
grids per regime (:data:`DEFAULT_LR_GRIDS` for the few-shot tasks, :data:`DEFAULT_MLM_LR_GRIDS` for
``layerfusion mlm``; :func:`lr_grid` picks the given LRs or the regime's grid), and the sizes of the
NER grids ``layerfusion ner`` / ``sweep`` run by default.

Without ``--model``/``--data`` the offline demo runs :data:`DEMO_AXES` (each method at its own LRs);
with your data, :data:`USER_AXES`, a first comparison (168 runs under FE: 2 shot sizes x 3 trials x
4 methods x the 7 LRs of the FE grid, dev scored every 5 epochs); ``--paper-grid`` runs the paper's
:data:`PAPER_AXES` (5 shot sizes x 4 epoch budgets x 5 trials, dev every epoch: 2,800 runs with the
four default methods under FE). A flag or a YAML key overrides each value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# AdapterHub bottleneck adapters: their usual 1e-4..1e-3, extended up to 1e-2 for a new random head
# trained in ~50 steps at N = 8 (LoRA and BitFit peak at 1e-2 there); not measured here yet.
ADAPTER_LR_GRID: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2)
# Max-LR grids per regime: every cell trains each LR, selected on dev (see README, "Learning-rate
# selection", for the measurements behind them).
DEFAULT_LR_GRIDS: dict[str, tuple[float, ...]] = {
    "fe": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
    "lora": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
    "bitfit": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
    "ft": (3e-5, 1e-4, 3e-4, 1e-3),
    "adapter_seqbn": ADAPTER_LR_GRID,
    "adapter_double_seqbn": ADAPTER_LR_GRID,
}
# Max-LR grids of `layerfusion mlm` per regime: each LR is one run (minutes on CPU), the one with the
# lowest dev perplexity is selected. Short on purpose; the summary flags a selected LR at an edge.
DEFAULT_MLM_LR_GRIDS: dict[str, tuple[float, ...]] = {
    "fe": (1e-4, 3e-4, 1e-3, 3e-3),
    # not measured for the masked LM; from the NER evidence of a fresh head (LoRA / BitFit best at
    # 1e-2 after 50 steps, FT at 3e-4) and the FE MLM runs (every method selected 1e-3 or 3e-4)
    "lora": (1e-3, 3e-3, 1e-2),
    "bitfit": (1e-3, 3e-3, 1e-2),
    "ft": (1e-4, 3e-4, 1e-3),
}
# The max LR of a lone run (``lr`` not given, outside a sweep's grid)
FE_DEFAULT_LR = 1e-3  # frozen encoder: only fusion + head train, a larger LR is usual
FT_DEFAULT_LR = 5e-5  # the paper's max LR when the encoder trains
FULL_TRAIN = 0  # the shots of a cell trained on the whole train split (``--shots all``)

# eval_every: dev scored every k epochs (and after the last); scoring dev is most of a cached run's time
EVERY_EPOCH = 1  # the paper's protocol, and the default of the settings a script builds (TaskSettings)
DEFAULT_EVAL_EVERY = 5  # the command line's on your data (ner, sweep, classify); the demo has its own
DEMO_AXES: dict[str, Any] = {
    "shots": [2, 8],
    "epochs": [15],
    "trials": 3,
    "eval_every": 3,
    # each method's LRs, centred on the LRs it selects on WNUT-16 (the FE default grid has 7 for every
    # method: beyond a demo's time): with one grid of 1e-3 3e-3 1e-2 for all, R+1 selected 1e-3 and
    # the plain head 1e-2 (its best is 3e-2, flat up to 1e-1 at N = 2), each at an edge, Concat 1e-3
    # (3e-3 on other trials) and DWAtt 3e-3, then 1e-3 at N = 8 (the bottom of 1e-3 3e-3 1e-2: it got
    # 3e-4 below). The plain head's LRs train together at almost the cost of one: it gets five; Concat
    # and DWAtt train theirs stacked: four; R+1 trains its LRs one after another: three
    "lr": {
        "none": [3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
        "extra_layers": [3e-4, 1e-3, 3e-3],
        "concat": [3e-4, 1e-3, 3e-3, 1e-2],
        "dwatt": [3e-4, 1e-3, 3e-3, 1e-2],
    },
}
USER_AXES: dict[str, Any] = {"shots": [2, 8], "epochs": [25], "trials": 3, "eval_every": DEFAULT_EVAL_EVERY}
PAPER_AXES: dict[str, Any] = {
    "shots": [8, 16, 32, 64, 128],
    "epochs": [25, 50, 75, 100],
    "trials": 5,
    "eval_every": EVERY_EPOCH,
}


def describe_demo_lrs() -> str:
    """The demo's LRs per method, for the help texts.

    Example:
        >>> describe_demo_lrs()[:35]
        'none 0.003 0.01 0.03 0.1 0.3; extra'
    """
    per_method = DEMO_AXES["lr"].items()
    return "; ".join(f"{method} {' '.join(map('{:g}'.format, lrs))}" for method, lrs in per_method)


def describe_default(name: str) -> str:
    """The defaults of axis ``name`` for the help texts.

    Example:
        >>> describe_default("shots")
        'Default: 2 8 (demo: 2 8; --paper-grid: 8 16 32 64 128).'
    """

    def words(value: Any) -> str:
        return " ".join(map(str, value)) if isinstance(value, list) else str(value)

    return (
        f"Default: {words(USER_AXES[name])} (demo: {words(DEMO_AXES[name])}; "
        f"--paper-grid: {words(PAPER_AXES[name])})."
    )


def check_lr(value: float, option: str = "--lr") -> float:
    """``value`` as a float if it is a finite number > 0, else ``ValueError`` naming ``option``.

    Args:
        value: A learning rate.
        option: The option it came from, for the message.

    Example:
        >>> check_lr(1e-3)
        0.001
        >>> check_lr(float("nan"))
        Traceback (most recent call last):
        ValueError: --lr nan: must be a finite number > 0, e.g. --lr 1e-4 3e-4
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{option} {value!r}: must be a finite number > 0, e.g. {option} 1e-4 3e-4")
    return float(value)


def lr_grid(
    lr: float | Sequence[float] | None,
    defaults: Mapping[str, tuple[float, ...]],
    regime: str,
    option: str = "--lr",
) -> tuple[float, ...]:
    """The LRs to run, ascending and unique: the given values, else the regime's default grid.

    Args:
        lr: One LR or several; ``None``: ``defaults[regime]``.
        defaults: Default grid per regime (:data:`DEFAULT_LR_GRIDS`, :data:`DEFAULT_MLM_LR_GRIDS`).
        regime: The training regime.
        option: Where the values came from, for the message (:func:`check_lr`).

    Raises:
        ValueError: naming ``option`` and the value when one is not a finite number > 0, or when
            ``lr`` is empty.

    Example:
        >>> lr_grid([3e-3, 1e-3, 1e-3], DEFAULT_LR_GRIDS, "fe")
        (0.001, 0.003)
        >>> lr_grid(None, DEFAULT_LR_GRIDS, "ft") == DEFAULT_LR_GRIDS["ft"]
        True
    """
    if lr is None:
        return defaults[regime]
    values = [lr] if isinstance(lr, (int, float)) else list(lr)
    if not values:
        raise ValueError(f"{option}: give one or more finite numbers > 0, e.g. {option} 1e-4 3e-4")
    return tuple(sorted({check_lr(value, option) for value in values}))


# The one type of a task's ``lr`` (ner, classify, mlm, seq2seq): each method's max LRs, ascending and
# unique; a method it leaves out trains its regime's default grid
LrGrids = Mapping[str, tuple[float, ...]]


def lrs_by_method(
    lr: float | Sequence[float] | Mapping[str, float | Sequence[float]] | None,
    methods: Sequence[str],
    option: str = "--lr",
) -> dict[str, tuple[float, ...]]:
    """``lr`` as given (flags, YAML, a script) as :data:`LrGrids`: one LR or several give every one
    of ``methods`` the same grid, a mapping gives each method its own; ``None``: none (each method
    the regime's default grid).

    Args:
        lr: One LR, several, or ``{method: LRs}``.
        methods: Every method name (the registry's): what a grid for all of them covers.
        option: Where the values came from, for the messages.

    Raises:
        ValueError: naming ``option`` and the whole value when one is not a finite number > 0, a
            method's grid is empty, or a method is unknown.

    Example:
        >>> lrs_by_method([3e-3, 1e-3], ("none", "dwatt"))
        {'none': (0.001, 0.003), 'dwatt': (0.001, 0.003)}
        >>> lrs_by_method({"dwatt": 1e-3}, ("none", "dwatt")), lrs_by_method(None, ("none",))
        ({'dwatt': (0.001,)}, {})
    """
    if lr is None:
        return {}
    given = lr if isinstance(lr, Mapping) else dict.fromkeys(methods, lr)
    unknown = [method for method in given if method not in methods]
    if unknown:
        raise ValueError(f"{option}: unknown {unknown}; allowed: {', '.join(methods)}")
    try:
        given = {method: values for method, values in given.items() if values is not None}
        return {method: lr_grid(values, {}, "", option) for method, values in given.items()}
    except (ValueError, TypeError) as error:  # the whole value, as the YAML file or caller gave it
        name = option.lstrip("-")
        raise ValueError(f"{name} must be one or more finite numbers > 0, got {lr!r}") from error


def describe_lr_grids(grids: dict[str, tuple[float, ...]]) -> str:
    """The LR grids per regime in one line, for help texts.

    Example:
        >>> describe_lr_grids({"fe": (1e-3, 3e-3), "ft": (3e-5,)})
        'fe: 0.001 0.003; ft: 3e-05'
    """
    return "; ".join(f"{name}: {' '.join(map('{:g}'.format, lrs))}" for name, lrs in grids.items())
