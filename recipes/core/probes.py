"""Layer probes: a linear head on each block output ``z_1 .. z_L`` at the positions a task reads,
trained on the feature cache; the LR selected on dev per layer, the test score of its best dev epoch.

The probe of layer ``n`` is ``logits = W z_n + b`` (``W`` ``(C, d)``, ``b`` ``(C,)``) on the state
``z_n`` (the output of block ``n``, as ``output_hidden_states[n]``) at the positions the task's head
reads (:meth:`~layerfusion_recipes.core.experiment.FewShotExperiment.probe_inputs`): every labelled
first sub-word for NER, the pooled position of a sentence classifier (its first or last token, or the
mean over the real tokens with mean pooling). It trains as a cell's run does
(:func:`~layerfusion_recipes.core.fitting.fit`: AdamW, the LR linear to zero over the max epochs, the
trial's sample and batches, the task's scorer on dev every k epochs, the test score of the best dev
epoch), its head drawn from ``seed + trial`` (the same draw for every layer and LR). The ``L x K``
probes of a trial (``K``: the LRs of the FE grid) train together in one pass over the cached states:
:class:`ProbeRunner`, a stacked runner whose candidates are the heads, each the run it would be alone.

Records (:func:`run_probes`): one per (shots, max epochs, trial, LR) in the probes file beside the
results file (:func:`probes_path`), keyed as every run is (:func:`~layerfusion_recipes.core.cells.record_key`
of the method ``probe`` under ``fe``), so a sweep resumes them; the scores of each layer are under
``layers``. :mod:`layerfusion_recipes.reporting.layers` selects, draws and tabulates them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .batches import collate
from .cells import Cell, record_key
from .fitting import RunResult, fit
from .models import PLAIN_HEAD
from .records import append_record, finished_keys, read_records
from .runner import StackedRunner

if TYPE_CHECKING:
    from .experiment import FewShotExperiment

PROBE = "probe"  # the method name of a probe record
PROBE_REGIME = "fe"  # probes read the frozen encoder's states

# (L, batch, seq, d) block outputs and the collated batch -> (read, L, d) probe inputs and (read,) labels
ProbeInputs = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def states_at(states: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """The block outputs at the read positions, row after row: ``(L, batch, seq, d)`` states and a
    ``(batch, seq)`` mask give ``(read, L, d)``.

    Example:
        >>> states_at(torch.zeros(4, 2, 5, 8), torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 0, 0]]).bool()).shape
        torch.Size([3, 4, 8])
    """
    return states.permute(1, 2, 0, 3)[read]  # (batch, seq, L, d) -> (read, L, d)


def probes_path(results: str | os.PathLike) -> Path:
    """The probes file beside a results file: ``results.jsonl`` -> ``results.probes.jsonl``.

    Example:
        >>> probes_path("out/results.jsonl")
        PosixPath('out/results.probes.jsonl')
    """
    results = Path(results)
    return results.with_name(f"{results.stem}.probes.jsonl")


class ProbeRunner(StackedRunner):
    """The linear probes of every layer at ``K`` LRs, trained together: candidate ``k * L + (n - 1)``
    is the head of layer ``n`` at the ``k``-th LR; ``logits`` returns ``(K * L, read, C)`` and the
    ``(read,)`` labels.

    Args:
        head: The head every probe starts from (``nn.Linear(d, C)``, drawn by the caller).
        num_blocks: ``L``.
        count: ``K``, the LRs.
        cache: The feature cache of the frozen encoder.
        inputs: The task's probe inputs (:meth:`FewShotExperiment.probe_inputs`).

    Example:
        >>> train = experiment.train_sample(2, 0)  # 2 shots x 3 entity types; the tiny BERT: L = 3, d = 32
        >>> cache = experiment.filled_cache(train)
        >>> runner = ProbeRunner(nn.Linear(32, len(experiment.labels)), 3, 4, cache, experiment.probe_inputs)
        >>> logits, labels = runner.logits(train[:4], torch.device("cpu"))
        >>> logits.shape, labels.shape  # (4 LRs x 3 layers, read, C), (read,): the labelled words
        (torch.Size([12, 22, 5]), torch.Size([22]))
    """

    def __init__(self, head: nn.Linear, num_blocks: int, count: int, cache, inputs: ProbeInputs) -> None:
        super().__init__(head, num_blocks * count, cache=cache)
        self.num_blocks, self.inputs = num_blocks, inputs
        self._read: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # evaluation batch -> its inputs

    def logits(self, features: Sequence[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits of every probe and the labels at the read positions of ``features``.

        An evaluation batch (the model in eval mode:
        :func:`~layerfusion_recipes.core.runner.predict_labelled`) keeps its inputs (the read
        positions only) for the next call with the same examples (the dev set is scored every
        ``eval_every`` epochs), for as long as this runner lives (one trial's probes); a training
        batch (shuffled) is read each time.
        """
        memo = not self.model.training
        key = tuple(tuple(feature["input_ids"]) for feature in features)
        if memo and key in self._read:
            inputs, labels = self._read[key]
        else:
            inputs, labels = self.read(features)
            if memo:
                self._read[key] = inputs, labels
        self.fused_count = len(labels)
        shape = (-1, self.num_blocks)  # (K, L)
        stacked = self.stacked(range(len(self.candidates)))  # the head's {weight, bias}, no copy
        weight = stacked["weight"].unflatten(0, shape)  # (K, L, C, d)
        bias = stacked["bias"].unflatten(0, shape)  # (K, L, C)
        logits = torch.einsum("nld,klcd->klnc", inputs.to(device), weight)  # (K, L, read, C)
        return (logits + bias.unsqueeze(2)).flatten(0, 1), labels.to(device)

    def read(self, features: Sequence[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """The probe inputs of ``features`` from the cache: ``(read, L, d)`` and their ``(read,)`` labels.

        The cache's batch is ``z_1 .. z_L`` at each sentence's own positions (zeros where it kept
        nothing: a cache of the head's positions only), so the task's read positions index it as they
        index ``output_hidden_states``.
        """
        states = self.cache.batch_states(features)  # (L, batch, seq, d): z_1 .. z_L (z_0 is not cached)
        return self.inputs(states, collate(features, self.pad_id))


def layer_entry(layer: int, result: RunResult) -> dict[str, Any]:
    """The scores of one layer's probe in a record: ``layer``, ``best_epoch``, ``dev_METRIC`` and
    ``test_METRIC`` of every metric (test ``None`` without a test split), ``curve``."""
    return {
        "layer": layer,
        "best_epoch": result.best_epoch,
        **result.split_scores(list(result.dev)),
        "curve": result.curve,
    }


def probe_records(
    experiment: FewShotExperiment, shots: int, epochs: int, trial: int, lrs: Sequence[float]
) -> Iterator[dict[str, Any]]:
    """Train the probes of every layer of one trial at each LR of ``lrs`` (in one pass) and yield one
    record per LR (see the module docstring).

    Example:
        >>> records = list(probe_records(experiment, 2, 2, 0, [1e-2, 3e-2]))  # 2 shots, 2 epochs, trial 0
        >>> [r["lr"] for r in records], [entry["layer"] for entry in records[0]["layers"]]
        ([0.01, 0.03], [1, 2, 3])
        >>> records[0]["key"], all(0 <= entry["test_f1"] <= 1 for entry in records[0]["layers"])
        ('probe|fe|2|2|0|lr=0.01|...', True)
    """
    cell = Cell(PROBE, PROBE_REGIME, shots, epochs, trial)
    train = experiment.train_sample(shots, trial)
    runner = probe_runner(experiment, train, trial, len(lrs))
    settings = experiment.train_settings(cell)
    layers = runner.num_blocks
    results = fit(
        runner,
        train,
        experiment.dev,
        settings,
        experiment.scorer_of,
        lrs=[lr for lr in lrs for _ in range(layers)],
        test=experiment.test or None,
    )
    for k, lr in enumerate(lrs):
        own = results[k * layers : (k + 1) * layers]
        yield {
            "key": record_key(cell, lr, experiment.setup),
            **asdict(cell),
            "lr": float(lr),
            "metric": own[0].metric,
            "metrics": list(own[0].dev),
            "layers": [layer_entry(n, result) for n, result in enumerate(own, start=1)],
            "train_examples": len(train),
            "seconds": own[0].seconds,
            "cached": True,
            **experiment.provenance(),
        }


def probe_runner(experiment: FewShotExperiment, train: Sequence[dict], trial: int, count: int) -> ProbeRunner:
    """The :class:`ProbeRunner` of a trial: the feature cache filled with ``train`` (nothing to compute
    after :meth:`~layerfusion_recipes.core.experiment.FewShotExperiment.prefill_cache`, whose encoder
    is gone), every head drawn from ``seed + trial``."""
    cache = experiment.filled_cache(train)  # the probes read the head's positions: any kept layout
    num_blocks = cache.num_blocks
    width = cache.batch_states(train[:1]).shape[-1]
    torch.manual_seed(experiment.settings.seed + trial)
    head = nn.Linear(width, len(experiment.labels))
    return ProbeRunner(head, num_blocks, count, cache, experiment.probe_inputs)


def probe_cells(grid: dict[str, Any]) -> list[Cell]:
    """The probes' trials of ``grid``, one :class:`~layerfusion_recipes.core.cells.Cell` of the method
    ``probe`` under ``fe`` per (max epochs, shots, trial): what they read of the feature cache (the
    dev and test sets, each trial's sample) is what an FE cell of the same shots and trial reads.

    Example:
        >>> probe_cells({"shots": [8], "epochs": [25], "trials": 2})
        [Cell(method='probe', regime='fe', shots=8, epochs=25, trial=0), Cell(method='probe', ...)]
    """
    return [
        Cell(PROBE, PROBE_REGIME, shots, epochs, trial)
        for epochs in grid["epochs"]
        for shots in grid["shots"]
        for trial in range(grid["trials"])
    ]


def missing_probes(experiment: FewShotExperiment, grid: dict[str, Any]) -> list[tuple[Cell, list[float]]]:
    """The probes' trials of ``grid`` (:func:`probe_cells`) with the LRs of the FE grid that the probes
    file does not hold yet (those whose every LR is there are left out).

    Example:
        >>> missing_probes(experiment, grid)  # all of them on a first run: 2 trials, the LRs of the FE grid
        [(Cell(method='probe', regime='fe', shots=2, epochs=2, trial=0), [0.01, 0.03]),
         (Cell(method='probe', regime='fe', shots=2, epochs=2, trial=1), [0.01, 0.03])]
    """
    lrs = experiment.settings.lr_grid(PROBE_REGIME, PLAIN_HEAD)  # a linear probe: the plain head's LRs
    done = finished_keys(probes_path(grid["results"]))
    return [
        (cell, missing)
        for cell in probe_cells(grid)
        if (missing := [lr for lr in lrs if record_key(cell, lr, experiment.setup) not in done])
    ]


def run_probes(
    experiment: FewShotExperiment, grid: dict[str, Any], progress: bool = True
) -> list[dict[str, Any]]:
    """The probes of every (shots, max epochs, trial) of ``grid`` at each LR of the FE grid, skipping
    the records already in the probes file (:func:`probes_path` of ``grid["results"]``); each record
    appended when its trial's probes are trained.

    Returns:
        Every record of these probes in the file (old and new), one per key.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # 2 trials x 2 LRs
        >>> len(records), len(open("out/results.probes.jsonl").readlines())
        (4, 4)
        >>> missing_probes(experiment, grid)  # a second run_probes trains none
        []
    """
    path = probes_path(grid["results"])
    todo = missing_probes(experiment, grid)
    for cell, missing in tqdm(todo, desc="layer probes", disable=not progress or not todo, file=sys.stderr):
        for record in probe_records(experiment, cell.shots, cell.epochs, cell.trial, missing):
            append_record(path, record)
    return saved_probes(experiment, grid)


def saved_probes(experiment: FewShotExperiment, grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of ``grid``'s probes that the probes file holds, one per key, none trained: what the
    other processes of a launched sweep read once the main process ran :func:`run_probes`.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # the main process
        >>> saved_probes(experiment, grid) == records  # another process: the same records, none trained
        True
    """
    lrs = experiment.settings.lr_grid(PROBE_REGIME, PLAIN_HEAD)  # a linear probe: the plain head's LRs
    wanted = {record_key(cell, lr, experiment.setup) for cell in probe_cells(grid) for lr in lrs}
    return [record for record in read_records(probes_path(grid["results"])) if record["key"] in wanted]


def best_single_layer(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The probe a user would pick for one trial: the (layer, LR) whose best dev score is highest among
    ``records`` (that trial's probe records, one per LR; ties to the smaller LR, then the lower
    layer), with its test scores: chosen on the training sample and dev only.

    Returns:
        ``{"layer", "lr", "dev", "test", "metric"}`` (``test`` ``None`` without a test split).

    Example:
        >>> def record(lr, scores):  # a trial's record at one LR, as probe_records writes it (no curves)
        ...     layers = [{"layer": n, "dev_f1": d, "test_f1": t} for n, (d, t) in enumerate(scores, 1)]
        ...     return {"lr": lr, "metric": "f1", "layers": layers}
        >>> records = [
        ...     record(1e-2, [(0.2, 0.3), (0.6, 0.5), (0.4, 0.4)]),  # (dev, test) of layers 1, 2, 3
        ...     record(3e-2, [(0.6, 0.7), (0.5, 0.5), (0.1, 0.2)]),
        ... ]
        >>> best_single_layer(records)  # dev 0.6 twice: the smaller LR
        {'layer': 2, 'lr': 0.01, 'dev': 0.6, 'test': 0.5, 'metric': 'f1'}
    """
    candidates = []
    for record in sorted(records, key=lambda r: r["lr"]):
        metric = record["metric"]
        for entry in record["layers"]:
            candidates.append((entry[f"dev_{metric}"], -record["lr"], -entry["layer"], record, entry))
    dev, _, _, record, entry = max(candidates, key=lambda c: c[:3])
    metric = record["metric"]
    test = entry[f"test_{metric}"]
    return {"layer": entry["layer"], "lr": record["lr"], "dev": dev, "test": test, "metric": metric}


def guarded(run_dev: float, run_test: float | None, best: dict[str, Any]) -> tuple[float | None, bool]:
    """A fusion run guarded by its trial's best single layer (:func:`best_single_layer`): the run's test
    score where its dev score is strictly above the layer's, else the layer's; and whether the run was
    kept. Dev alone decides (a tie keeps the layer: the fusion must earn its parameters).

    This is the last step of the probe-guided recipe: probe every block, start the mix on the best
    one (``--probe-start``), train it, and keep it only where dev says it beats that block.

    Example:
        >>> best = {"layer": 7, "lr": 0.1, "dev": 0.80, "test": 0.74, "metric": "accuracy"}
        >>> guarded(0.82, 0.71, best), guarded(0.80, 0.90, best)
        ((0.71, True), (0.74, False))
    """
    if run_dev > best["dev"]:
        return run_test, True
    return best["test"], False


def probe_starts(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], int]:
    """``{(shots, epochs, trial): block}``: each trial's :func:`best_single_layer` (``--probe-start``).

    Example:
        >>> probe_starts(run_probes(experiment, grid, progress=False))  # grid: 2 shots, 2 epochs, 2 trials
        {(2, 2, 0): ..., (2, 2, 1): ...}
    """
    trials: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for record in records:
        trials.setdefault((record["shots"], record["epochs"], record["trial"]), []).append(record)
    return {trial: best_single_layer(found)["layer"] for trial, found in trials.items()}
