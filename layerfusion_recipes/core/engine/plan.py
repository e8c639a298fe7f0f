"""What a sweep learns at run time, apart from what the user gave: a :class:`SweepPlan`.

A task's settings (:class:`~layerfusion_recipes.core.engine.experiment.TaskSettings`) hold the
options as given (flags, YAML, defaults) and never change. What the sweep finds out on its way (the
positions its feature cache keeps, from the methods of its grid; the resident limit of its memory
line; the blocks its layer probes chose in each trial) is a plan, built by the sweep
(:mod:`~layerfusion_recipes.core.sweeps.sweep`) and passed as an argument to the experiment and the
functions that read it (``make_experiment(plan)``, ``run_key(cell, lr, setup, plan)``). None of it
is part of a record's setup fingerprint: the positions and the limit change no number, and the
probes' choices are in each run's own key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# a trial of the grid, as the probes' choices are indexed: (shots, epochs, trial)
Trial = tuple[int, int, int]


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep learns before its runs; the empty plan (the default) is a lone run's.

    Args:
        cache_positions: Positions the feature cache keeps: ``all``, or the task's
            ``READ_POSITIONS`` (only those its head reads; every cached method must read no other:
            :func:`~layerfusion_recipes.core.engine.experiment.cache_positions_for`, from the grid's
            methods). The same records either way.
        resident_limit: Resident bytes above which a run gives the heap's freed pages back after a
            training step or evaluation batch
            (:class:`~layerfusion_recipes.core.engine.fitting.TrainSettings` ``release_above``): what
            the sweep's memory line says one process holds
            (:func:`~layerfusion_recipes.core.cache.feature_cache.resident_limit`); ``None``: only after
            every epoch and evaluation. The same records either way.
        probe_starts: ``{(shots, epochs, trial): block}`` from the sweep's layer probes
            (:func:`~layerfusion_recipes.core.probes.probes.probe_starts`; ``--probe-start``); ``None``:
            the probes not run (yet).
        probe_ranks: ``{(shots, epochs, trial): blocks}``, best first, from the sweep's layer probes
            (:func:`~layerfusion_recipes.core.probes.probes.probe_ranks`; ``--probe-fuse``); ``None``:
            the probes not run (yet).

    A sweep fills it in as it learns (``dataclasses.replace(plan, ...)``: a new plan each time).

    Example:
        >>> from dataclasses import replace
        >>> plan = SweepPlan(cache_positions="labelled")
        >>> replace(plan, probe_starts={(8, 25, 0): 4}).probe_starts, plan.probe_starts
        ({(8, 25, 0): 4}, None)
    """

    cache_positions: str = "all"
    resident_limit: int | None = None
    probe_starts: Mapping[Trial, int] | None = None
    probe_ranks: Mapping[Trial, Sequence[int]] | None = None
