"""The sizes of the NER grids ``layerfusion ner`` / ``sweep`` run by default (standard library only,
so that the ``--help`` texts quote them).

Without ``--model``/``--data`` the offline demo runs :data:`DEMO_AXES`; with your data,
:data:`USER_AXES`, a first comparison (168 runs under FE: 2 shot sizes x 3 trials x 4 methods x the
7 LRs of the FE grid, dev scored every 5 epochs); ``--paper-grid`` runs the paper's
:data:`PAPER_AXES` (5 shot sizes x 4 epoch budgets x 5 trials, dev every epoch: 2,800 runs with the
four default methods under FE). A flag or a YAML key overrides each value.
"""

from __future__ import annotations

from typing import Any

# eval_every: dev F1 every k epochs (and after the last); scoring dev is most of a cached run's time
DEMO_AXES: dict[str, Any] = {
    "shots": [2, 8],
    "epochs": [15],
    "trials": 3,
    "eval_every": 3,
    # LR selection over 3 LRs (the FE default grid has 7: a demo-time budget); measured on a
    # one-trial slice: R+1 and Concat select 1e-3 and the head 1e-2 or 3e-2 on WNUT-16
    "lr": [1e-3, 3e-3, 1e-2],
}
USER_AXES: dict[str, Any] = {"shots": [2, 8], "epochs": [25], "trials": 3, "eval_every": 5}
PAPER_AXES: dict[str, Any] = {
    "shots": [8, 16, 32, 64, 128],
    "epochs": [25, 50, 75, 100],
    "trials": 5,
    "eval_every": 1,
}


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
