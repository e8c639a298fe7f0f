"""The sizes of the NER grids ``layerfusion ner`` / ``sweep`` run by default (standard library only,
so that the ``--help`` texts quote them).

Without ``--model``/``--data`` the offline demo runs :data:`DEMO_AXES` (each method at its own LRs);
with your data, :data:`USER_AXES`, a first comparison (168 runs under FE: 2 shot sizes x 3 trials x
4 methods x the 7 LRs of the FE grid, dev scored every 5 epochs); ``--paper-grid`` runs the paper's
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
    # each method's LRs, centred on the LRs it selects on WNUT-16 (the FE default grid has 7 for every
    # method: beyond a demo's time): with one grid of 1e-3 3e-3 1e-2 for all, R+1 selected 1e-3 and
    # the plain head 1e-2 (its best is 3e-2, flat up to 1e-1 at N = 2), each at an edge, Concat 1e-3
    # (3e-3 on other trials) and DWAtt 3e-3. The plain head's LRs train together at almost the cost
    # of one: it gets five; R+1 trains its LRs one after another: three
    "lr": {
        "none": [3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
        "extra_layers": [3e-4, 1e-3, 3e-3],
        "concat": [3e-4, 1e-3, 3e-3, 1e-2],
        "dwatt": [1e-3, 3e-3, 1e-2],
    },
}
USER_AXES: dict[str, Any] = {"shots": [2, 8], "epochs": [25], "trials": 3, "eval_every": 5}
PAPER_AXES: dict[str, Any] = {
    "shots": [8, 16, 32, 64, 128],
    "epochs": [25, 50, 75, 100],
    "trials": 5,
    "eval_every": 1,
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
