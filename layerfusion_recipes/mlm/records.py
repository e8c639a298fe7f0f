"""The records of ``layerfusion mlm``: one per finished (method, regime, seed, LR) run, in
``OUTPUT/results.jsonl`` (:mod:`layerfusion_recipes.core.results.records`), and the LR selection over them.

Key (:func:`run_key`): ``METHOD|REGIME|SEED|lr=LR|SETUP``, ``SETUP`` the fingerprint of the run's
``settings`` but the LR (``MlmSettings.run_settings``: the options that change a result, the model
and data by real path, and the method's config defaults). A run whose key is in the file is not run
again; changed settings make new records beside the old ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.results.cells import with_defaults
from ..core.results.records import fingerprint, read_records, unit_key
from ..core.results.summary import Layout, fields, summarize_groups
from ..core.sweeps.tasks import is_mlm_record

RESULTS_FILE = "results.jsonl"
SELECTION_RULE = "lowest dev perplexity (held-out split), ties to the smaller LR; test perplexity not used"


def lr_label(lr: float) -> str:
    """The LR as written in output and commands: Python's shortest exact form.

    Example:
        >>> lr_label(1e-3), lr_label(3e-5)
        ('0.001', '3e-05')
    """
    return repr(float(lr))


def results_file(output: str | Path) -> Path:
    """The results file of a ``layerfusion mlm --output`` folder."""
    return Path(output) / RESULTS_FILE


def setup_of(settings: dict[str, Any]) -> str:
    """The fingerprint of a run's stored ``settings`` but its LR: equal for the runs of one grid.

    Example:
        >>> setup_of({"epochs": 1, "lr": 1e-3}) == setup_of({"epochs": 1, "lr": 3e-3})
        True
    """
    return fingerprint({name: value for name, value in settings.items() if name != "lr"})


def run_key(settings: dict[str, Any]) -> str:
    """The key of the run of ``settings`` (``MlmSettings.run_settings(lr)``, as stored in its record).

    Example:
        >>> run_key({"method": "dwatt", "regime": "fe", "seed": 0, "lr": 1e-3, "epochs": 1})
        'dwatt|fe|0|lr=0.001|...'
    """
    cell = f"{settings['method']}|{settings['regime']}|{settings['seed']}"
    return with_defaults(unit_key(cell, settings["lr"], setup_of(settings)), settings["method"])


def read_mlm_records(folder: Path) -> list[dict[str, Any]]:
    """Every finished run of a ``layerfusion mlm --output`` folder (its ``results.jsonl``), one per key,
    oldest first.

    Example:
        >>> read_mlm_records(Path("no-such-folder"))
        []
    """
    return [record for record in read_records(results_file(folder)) if is_mlm_record(record)]


# one grid of `layerfusion mlm`: its runs by LR (one seed), selected on dev perplexity, lower is better
MLM_LAYOUT = Layout(
    setting=lambda record: record["regime"],
    dev=lambda record: record["dev_ppl"],
    lower_is_better=True,
    metrics=fields("dev_ppl", "test_ppl"),
)


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one (method, regime) grid: the LR selected on dev and the test perplexity there
    (the one summariser, :func:`~layerfusion_recipes.core.results.summary.summarize_groups`, with
    :data:`MLM_LAYOUT`).

    Args:
        records: One run record per LR (same settings but the LR), each with ``lr``, ``dev_ppl``,
            ``test_ppl``, ``method``, ``regime``, ``model``, ``data`` and ``settings``.

    Returns:
        ``method``, ``regime``, ``model``, ``selected_lr``; ``dev_ppl`` and ``test_ppl`` at it; ``at_edge``
        (the selected LR is the smallest or largest of 2+); ``lrs``; ``runs`` (``lr``, ``dev_ppl``,
        ``test_ppl`` per LR, ascending); ``selection`` (the rule); ``data`` (where the splits came from);
        ``settings`` (the runs' settings but the LR).

    Example:
        >>> runs = [
        ...     {"lr": lr, "dev_ppl": dev, "test_ppl": test, "method": "dwatt", "regime": "fe",
        ...      "model": "m", "data": "d", "settings": {"epochs": 1}}
        ...     for lr, dev, test in [(1e-3, 20.0, 22.0), (3e-3, 21.0, 19.0)]
        ... ]
        >>> summarize(runs)["selected_lr"]  # the lowest dev_ppl's, whatever test_ppl says
        0.001
    """
    if not records:
        raise ValueError("summarize needs at least one run record")
    groups = summarize_groups(records, MLM_LAYOUT)
    if len(groups) > 1:
        raise ValueError(f"summarize: the runs of one (method, regime) grid, got {[k[::-1] for k in groups]}")
    (group,) = groups.values()
    (chosen,) = group.runs.values()
    runs = [
        {"lr": lr, "dev_ppl": group.by_lr["dev_ppl"][lr], "test_ppl": group.by_lr["test_ppl"][lr]}
        for lr in group.lrs
    ]
    return {
        "method": group.method,
        "regime": chosen["regime"],
        "model": chosen["model"],
        "selected_lr": group.lr,
        "dev_ppl": chosen["dev_ppl"],
        "test_ppl": chosen["test_ppl"],
        "at_edge": group.at_edge,
        "lrs": group.lrs,
        "runs": runs,
        "selection": SELECTION_RULE,
        "data": chosen["data"],
        "settings": {name: value for name, value in chosen["settings"].items() if name != "lr"},
    }


def folder_grids(
    records: Sequence[dict[str, Any]],
) -> tuple[dict[tuple[str, str], list[dict[str, Any]]], dict[tuple[str, str], int]]:
    """The runs of each (method, regime) of a folder's records that make its grid: those under the
    settings of its last record (a folder may hold older runs under other settings).

    Returns:
        The grids' runs by (method, regime), in record order; and per (method, regime), how many runs
        under other settings were left out (only where some were).

    Example:
        >>> def run(lr, epochs):
        ...     return {"method": "dwatt", "regime": "fe", "lr": lr, "settings": {"lr": lr, "epochs": epochs}}
        >>> grids, left_out = folder_grids([run(1e-3, 1), run(1e-3, 2), run(3e-3, 2)])  # the last: 2 epochs
        >>> [r["lr"] for r in grids["dwatt", "fe"]], left_out
        ([0.001, 0.003], {('dwatt', 'fe'): 1})
    """
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        cells.setdefault((record["method"], record["regime"]), []).append(record)
    grids, left_out = {}, {}
    for cell, runs in cells.items():
        setup = setup_of(runs[-1]["settings"])
        grids[cell] = [run for run in runs if setup_of(run["settings"]) == setup]
        if len(grids[cell]) < len(runs):
            left_out[cell] = len(runs) - len(grids[cell])
    return grids, left_out
