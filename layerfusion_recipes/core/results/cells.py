"""The grid of a few-shot task: its cells, their runs' keys, and the order sweeps run them in.

A *cell* is one point of a grid, method x regime x shots x max epochs x trial; a *run* is a cell
trained at one max LR, stored under :func:`record_key` (the cell, its LR and the fingerprint of the
settings that change a result, never the grid it ran in, and of a fusion method's config defaults:
:func:`defaults_key`). Every task over
the shared core (``ner``, ``classify``) has the same grid, so everything here serves them all.

Seeds: trial ``t`` draws its training sample from :func:`sample_seed` ``(shots, t)`` (every method
sees the same sample in a trial: the comparisons are paired) and initialises the head and the
fusion module from ``seed + t``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peft_layerfusion.names import PLAIN_HEAD
from peft_layerfusion.registration import METHODS, method_named

from ..options.grids import FULL_TRAIN
from .records import LAYERS, START, fingerprint, unit_key


@dataclass(frozen=True)
class Cell:
    """One point of the grid; ``key`` identifies it in a results file."""

    method: str
    regime: str
    shots: int
    epochs: int
    trial: int

    @property
    def key(self) -> str:
        """The cell's place in the grid (a record key adds its LR and setup: :func:`record_key`)."""
        return f"{self.method}|{self.regime}|{self.shots}|{self.epochs}|{self.trial}"


Unit = tuple[Cell, tuple[float, ...]]  # a cell and the LRs it still has to run


class GridSettings(Protocol):
    """What the grid functions read of a task's settings."""

    use_cache: bool

    def setup(self) -> str: ...

    def lr_grid(self, regime: str, method: str) -> tuple[float, ...]: ...

    def run_key(self, cell: Cell, lr: float, setup: str, plan: Any) -> str: ...


def record_key(
    cell: Cell, lr: float, setup: str, start: int | None = None, layers: Sequence[int] | None = None
) -> str:
    """Key of the record of ``cell`` trained at max LR ``lr`` under settings ``setup``; a run started
    one-hot on block ``start`` (``--probe-start``), or fusing the probed blocks ``layers``
    (``--probe-fuse``), says it: blocks chosen again (other probes) make another run, never the old
    record.

    Example:
        >>> record_key(Cell("none", "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b")  # the plain head: no defaults
        'none|fe|8|25|0|lr=0.001|3f2a9c0d1e4b'
        >>> record_key(Cell("layer_mix", "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b", start=7)
        'layer_mix|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|defaults=...|start=7'
        >>> record_key(Cell("average", "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b", layers=[3, 4])
        'average|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|defaults=...|layers=3,4'
    """
    key = with_defaults(unit_key(cell.key, lr, setup), cell.method)
    if start is not None:
        key += f"{START}{start}"
    if layers is not None:
        key += LAYERS + ",".join(str(layer) for layer in layers)
    return key


def with_defaults(key: str, method: str) -> str:
    """``key`` (a run of ``method``) with ``|defaults=...`` where :func:`defaults_key` gives one.

    Example:
        >>> with_defaults("dwatt|fe|0|lr=0.001|3f2a9c0d1e4b", "dwatt") == (
        ...     f"dwatt|fe|0|lr=0.001|3f2a9c0d1e4b|defaults={defaults_key('dwatt')}")
        True
    """
    return key + defaults_suffix(defaults_key(method))


def defaults_suffix(defaults: str | None) -> str:
    """What a key ends in for the defaults fingerprint ``defaults``: ``|defaults=...``, or nothing.

    Example:
        >>> defaults_suffix("3f2a9c0d1e4b"), defaults_suffix(None)
        ('|defaults=3f2a9c0d1e4b', '')
    """
    return "" if defaults is None else f"|defaults={defaults}"


def config_defaults(config_cls: type) -> dict[str, Any]:
    """The defaults of the options a fusion config declares in this library (peft's own fields left
    out: another peft version must not change a key).

    Example:
        >>> config_defaults(method_named("scalar_mix").config_cls)["state_norm"]
        'none'
    """
    own: set[str] = set()
    for klass in config_cls.__mro__:
        if klass.__module__.startswith("peft_layerfusion"):
            own |= set(inspect.get_annotations(klass))
    return {
        field.name: field.default if field.default is not dataclasses.MISSING else field.default_factory()
        for field in dataclasses.fields(config_cls)
        if field.name in own
    }


def defaults_key(method: str) -> str | None:
    """The :func:`~layerfusion_recipes.core.results.records.fingerprint` of a fusion ``method``'s config
    defaults (its keys end in ``|defaults=...``: a record is never served for other defaults), or
    ``None`` for the plain head or a probe, which have no config.

    Example:
        >>> len(defaults_key("dwatt")), defaults_key(PLAIN_HEAD) is None
        (12, True)
    """
    if method not in {registered.name for registered in METHODS}:
        return None
    registered = method_named(method)
    preset = registered.config_cls.PRESETS[registered.preset].values if registered.preset else {}
    return fingerprint({**config_defaults(registered.config_cls), **preset})


def sample_seed(shots: int, trial: int) -> int:
    """Seed of the N-shot sample of a trial (stable across processes and Python versions)."""
    return int(hashlib.sha1(f"{shots}|{trial}".encode()).hexdigest()[:8], 16)


def lrs_train_together(cell: Cell, use_cache: bool) -> bool:
    """Whether a cell's LRs train together in one pass: on the feature cache (FE) with the plain
    head or a token-wise fusion method (the registry's flag); R+n's extra block has no vmap batching
    rule for CPU attention (4 LRs stacked measured at 8x one LR; one after another they cost 4x).

    Example:
        >>> lrs_train_together(Cell("extra_layers", "fe", 8, 25, 0), use_cache=True)
        False
    """
    if not (use_cache and cell.regime == "fe"):
        return False
    return reads_head_positions_only(cell.method)


def reads_head_positions_only(method: str) -> bool:
    """Whether a run of ``method`` reads the encoder's states only at the positions the task's head
    reads: the plain head and the token-wise fusion methods (the registry's flag); R+n attends over
    every position.

    Example:
        >>> reads_head_positions_only("dwatt"), reads_head_positions_only("extra_layers")
        (True, False)
    """
    return method == PLAIN_HEAD or method_named(method).token_wise


def grid_cells(grid: dict[str, Any]) -> list[Cell]:
    """Every cell of ``grid`` (keys methods, regimes, shots, epochs, trials), trials innermost.

    Example:
        >>> grid = {"methods": ["dwatt"], "regimes": ["fe"], "shots": [8, 16], "epochs": [25], "trials": 5}
        >>> len(grid_cells(grid))
        10
    """
    return [
        Cell(method, regime, shots, epochs, trial)
        for epochs, shots, regime, method, trial in itertools.product(
            grid["epochs"], grid["shots"], grid["regimes"], grid["methods"], range(grid["trials"])
        )
    ]


def grid_keys(cells: Iterable[Cell], settings: GridSettings, plan: Any) -> set[str]:
    """Every key the runs of ``cells`` can have under a sweep's ``plan``
    (:class:`~layerfusion_recipes.core.engine.plan.SweepPlan`; the empty one leaves the probes' choices
    out): each cell at each LR of its grid (its method's under its regime).

    Example:
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> settings = NerSettings(model="m", data="d", lr=[1e-3, 3e-3, 1e-2, 3e-2, 1e-1])
        >>> grid = {"methods": ["dwatt"], "regimes": ["fe"], "shots": [8, 16], "epochs": [25], "trials": 5}
        >>> from layerfusion_recipes.core.engine.plan import SweepPlan
        >>> len(grid_keys(grid_cells(grid), settings, SweepPlan()))  # 10 cells x 5 LRs
        50
    """
    setup = settings.setup()
    return {
        settings.run_key(cell, lr, setup, plan)
        for cell in cells
        for lr in settings.lr_grid(cell.regime, cell.method)
    }


def planned_runs(cells: Iterable[Cell], settings: GridSettings, select_trials: int | None = None) -> int:
    """How many runs a sweep makes for ``cells`` from scratch: every LR of a cell's grid, or with
    ``select_trials`` every LR on the selection trials and the selected one on the others.

    Example:
        >>> lora = {"methods": ["none"], "regimes": ["lora"], "shots": [8], "epochs": [25], "trials": 3}
        >>> from layerfusion_recipes.ner.experiment import NerSettings
        >>> settings = NerSettings(model="m", data="d", lr=[1e-3, 3e-3, 1e-2, 3e-2])
        >>> planned_runs(grid_cells(lora), settings, select_trials=1)  # 4 LRs on trial 0, then 1 + 1
        6
    """
    return sum(
        len(settings.lr_grid(cell.regime, cell.method))
        if select_trials is None or cell.trial < select_trials
        else 1
        for cell in cells
    )


def longest_first(cells: Iterable[Cell]) -> list[Cell]:
    """``cells`` by decreasing training steps (epochs x shots, the full train set first; stable
    otherwise), so that parallel workers do not end with one long cell running alone.

    Example:
        >>> [c.shots for c in longest_first([Cell("none", "fe", 8, 25, 0), Cell("none", "fe", 128, 25, 0)])]
        [128, 8]
    """
    return sorted(cells, key=lambda cell: cell.epochs * shots_size(cell.shots), reverse=True)


def shots_size(shots: int) -> float:
    """A cell's shots as a size: N, or infinity for the full train set (:data:`FULL_TRAIN`)."""
    return math.inf if shots == FULL_TRAIN else shots


def longest_first_units(units: Iterable[Unit]) -> list[Unit]:
    """``units`` (a cell and its LRs) ordered by :func:`longest_first` of their cells."""
    lrs_of = dict(units)
    return [(cell, lrs_of[cell]) for cell in longest_first(lrs_of)]
