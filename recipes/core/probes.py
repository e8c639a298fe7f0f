"""Layer probes: a linear head on each block output ``z_1 .. z_L`` at the positions a task reads,
trained on the feature cache; the LR selected on dev per layer, the test score of its best dev epoch.

The probe of layer ``n`` is ``logits = W x_n + b`` (``W`` ``(C, d)``, ``b`` ``(C,)``) on a feature
``x_n`` of the state ``z_n`` (the output of block ``n``, as ``output_hidden_states[n]``): ``z_n`` as it
is (``raw``) or ``z_n / rms(z_n)`` per position (``rms``: every position at RMS 1, as a mix with
``state_norm="rms"`` reads it, so one LR fits every depth however large the stream grew). Both kinds
are probed and the bar takes whichever dev prefers: neither wins on every task and model. The states
are read at the positions the task's head reads
(:meth:`~layerfusion_recipes.core.experiment.FewShotExperiment.probe_inputs`): every labelled first
sub-word for NER, the pooled position of a sentence classifier (its first or last token, or the
mean over the real tokens with mean pooling). It trains as a cell's run does
(:func:`~layerfusion_recipes.core.fitting.fit`: AdamW, the LR linear to zero over the max epochs, the
trial's sample and batches, the task's scorer on dev every k epochs, the test score of the best dev
epoch), its head drawn from ``seed + trial`` (the same draw for every layer and LR). The ``L x K``
probes of a trial (``K``: the LRs of the FE grid) train together in one pass over the cached states:
:class:`ProbeRunner`, a stacked runner whose candidates are the heads, each the run it would be alone.

The LRs: the plain head's FE grid for each kind, grown one step (the ratio of its two largest, or two
smallest, LRs) past an end wherever a trial's best probe of that kind sits on that end, up to
:data:`GROW_STEPS` steps each way (:func:`probe_plan`): a bar whose LR sits at a grid edge may be
under-tuned. The grown LRs follow from the scores alone, so a sweep that resumes grows the same way.

Records (:func:`run_probes`): one per (shots, max epochs, trial, feature kind, LR) in the probes file
beside the results file (:func:`probes_path`), keyed as every run is
(:func:`~layerfusion_recipes.core.cells.record_key` of the method ``probe`` under ``fe``, with
``|features=rms`` for the unit-RMS kind: :func:`probe_key`), so a sweep resumes them; the scores of
each layer are under ``layers``, the kind under ``features`` (``raw`` where a record has none: those
written before the kinds). :mod:`layerfusion_recipes.reporting.layers` selects, draws and tabulates them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from peft_layerfusion.fusion import unit_rms
from peft_layerfusion.probing import keep_fusion

from .batches import collate
from .cells import Cell, record_key
from .fitting import RunResult, fit
from .models import PLAIN_HEAD
from .records import append_record, read_records, without_probe_choice
from .runner import StackedRunner

if TYPE_CHECKING:
    from .experiment import FewShotExperiment

PROBE = "probe"  # the method name of a probe record
PROBE_REGIME = "fe"  # probes read the frozen encoder's states
RAW, UNIT_RMS = "raw", "rms"  # what a probe reads of z_n: z_n itself; z_n / rms(z_n) per position
FEATURES = (RAW, UNIT_RMS)  # every probe trial reads both kinds
GROW_STEPS = 4  # LRs a kind's grid may grow past each of its ends (the step: its end LRs' ratio)

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
        features: What the probes read of each state: :data:`RAW` or :data:`UNIT_RMS`.

    Example:
        >>> train = experiment.train_sample(2, 0)  # 2 shots x 3 entity types; the tiny BERT: L = 3, d = 32
        >>> cache = experiment.filled_cache(train)
        >>> runner = ProbeRunner(nn.Linear(32, len(experiment.labels)), 3, 4, cache, experiment.probe_inputs)
        >>> logits, labels = runner.logits(train[:4], torch.device("cpu"))
        >>> logits.shape, labels.shape  # (4 LRs x 3 layers, read, C), (read,): the labelled words
        (torch.Size([12, 22, 5]), torch.Size([22]))
    """

    def __init__(
        self, head: nn.Linear, num_blocks: int, count: int, cache, inputs: ProbeInputs, features: str = RAW
    ) -> None:
        super().__init__(head, num_blocks * count, cache=cache)
        self.num_blocks, self.inputs = num_blocks, inputs
        self.features = check_features(features)
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
        index ``output_hidden_states``. The unit-RMS kind divides each read state by its RMS.
        """
        states = self.cache.batch_states(features)  # (L, batch, seq, d): z_1 .. z_L (z_0 is not cached)
        inputs, labels = self.inputs(states, collate(features, self.pad_id))  # (read, L, d), (read,)
        return (unit_rms(inputs) if self.features == UNIT_RMS else inputs), labels


def check_features(features: str) -> str:
    """``features`` where it is a probe's feature kind (:data:`FEATURES`), else a one-line error.

    Example:
        >>> check_features("rms")
        'rms'
        >>> check_features("norm")
        Traceback (most recent call last):
        ValueError: features must be one of ['raw', 'rms'], got 'norm'
    """
    if features not in FEATURES:
        raise ValueError(f"features must be one of {list(FEATURES)}, got {features!r}")
    return features


def features_of(record: dict[str, Any]) -> str:
    """A probe record's feature kind (:data:`RAW` for a record written before the kinds).

    Example:
        >>> features_of({"features": "rms"}), features_of({})
        ('rms', 'raw')
    """
    return record.get("features", RAW)


def probe_key(cell: Cell, lr: float, setup: str, features: str = RAW) -> str:
    """The key of a probe record: :func:`~layerfusion_recipes.core.cells.record_key`, with the kind
    where it is not raw (the raw probes keep the keys they had before the kinds).

    Example:
        >>> cell = Cell(PROBE, PROBE_REGIME, 8, 25, 0)
        >>> probe_key(cell, 0.1, "3f2a9c0d1e4b"), probe_key(cell, 0.1, "3f2a9c0d1e4b", UNIT_RMS)
        ('probe|fe|8|25|0|lr=0.1|3f2a9c0d1e4b', 'probe|fe|8|25|0|lr=0.1|3f2a9c0d1e4b|features=rms')
    """
    key = record_key(cell, lr, setup)
    return key if check_features(features) == RAW else f"{key}|features={features}"


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
    experiment: FewShotExperiment,
    shots: int,
    epochs: int,
    trial: int,
    lrs: Sequence[float],
    features: str = RAW,
) -> Iterator[dict[str, Any]]:
    """Train the probes of every layer of one trial at each LR of ``lrs`` (in one pass) on the feature
    kind ``features`` and yield one record per LR (see the module docstring).

    Example:
        >>> records = list(probe_records(experiment, 2, 2, 0, [1e-2, 3e-2]))  # 2 shots, 2 epochs, trial 0
        >>> [r["lr"] for r in records], [entry["layer"] for entry in records[0]["layers"]]
        ([0.01, 0.03], [1, 2, 3])
        >>> records[0]["key"], all(0 <= entry["test_f1"] <= 1 for entry in records[0]["layers"])
        ('probe|fe|2|2|0|lr=0.01|...', True)
    """
    cell = Cell(PROBE, PROBE_REGIME, shots, epochs, trial)
    train = experiment.train_sample(shots, trial)
    runner = probe_runner(experiment, train, trial, len(lrs), features)
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
            "key": probe_key(cell, lr, experiment.setup, features),
            **asdict(cell),
            "lr": float(lr),
            "features": features,
            "metric": own[0].metric,
            "metrics": list(own[0].dev),
            "layers": [layer_entry(n, result) for n, result in enumerate(own, start=1)],
            "train_examples": len(train),
            "seconds": own[0].seconds,
            "cached": True,
            **experiment.provenance(),
        }


def probe_runner(
    experiment: FewShotExperiment, train: Sequence[dict], trial: int, count: int, features: str = RAW
) -> ProbeRunner:
    """The :class:`ProbeRunner` of a trial: the feature cache filled with ``train`` (nothing to compute
    after :meth:`~layerfusion_recipes.core.experiment.FewShotExperiment.prefill_cache`, whose encoder
    is gone), every head drawn from ``seed + trial`` (the same draw for both feature kinds)."""
    cache = experiment.filled_cache(train)  # the probes read the head's positions: any kept layout
    num_blocks = cache.num_blocks
    width = cache.batch_states(train[:1]).shape[-1]
    torch.manual_seed(experiment.settings.seed + trial)
    head = nn.Linear(width, len(experiment.labels))
    return ProbeRunner(head, num_blocks, count, cache, experiment.probe_inputs, features)


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


ProbeUnit = tuple[Cell, str, list[float]]  # a probe trial, its feature kind and the LRs it still needs


def probe_plan(
    experiment: FewShotExperiment, grid: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[ProbeUnit]]:
    """The probe records of ``grid`` the bar reads and the probes still to train: each trial's
    :func:`trial_plan` over the probes file, from the plain head's FE grid.

    Returns:
        ``(records, missing)``: the records (one per key) and ``(cell, kind, LRs)`` to train.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 1, "results": "out/results.jsonl"}
        >>> records, missing = probe_plan(experiment, grid)  # nothing trained yet: each kind's grid
        >>> records, [(cell.trial, kind, lrs) for cell, kind, lrs in missing]
        ([], [(0, 'raw', [0.01, 0.03]), (0, 'rms', [0.01, 0.03])])
    """
    base = experiment.settings.lr_grid(PROBE_REGIME, PLAIN_HEAD)  # a linear probe: the plain head's LRs
    found = {record["key"]: record for record in read_records(probes_path(grid["results"]))}
    plan: list[dict[str, Any]] = []
    missing: list[ProbeUnit] = []
    for cell in probe_cells(grid):
        records, absent = trial_plan(found, cell, base, experiment.setup)
        plan += records
        missing += absent
    return plan, missing


def trial_plan(
    found: Mapping[str, dict[str, Any]], cell: Cell, base: Sequence[float], setup: str
) -> tuple[list[dict[str, Any]], list[ProbeUnit]]:
    """One trial's probes: per feature kind, the LRs of ``base`` (sorted), grown one LR past an end
    while the trial's best probe of that kind (:func:`best_single_layer`) sits on it (:func:`grown_lr`,
    at most :data:`GROW_STEPS` each way). A kind waits for all its LRs so far to be in ``found`` (the
    probes file's records by key) before it may grow; what is not there is returned to train, and the
    plan is made again once it is (:func:`run_probes`). The plan depends on the trial's own scores only.

    Returns:
        ``(records, missing)``: the trial's records in the plan that ``found`` has, and ``(cell, kind,
        LRs)`` for each kind with LRs still to train.

    Example:
        >>> cell = Cell(PROBE, PROBE_REGIME, 8, 25, 0)
        >>> trial_plan({}, cell, [0.01, 0.1], "3f2a9c0d1e4b")[1]  # nothing found: each kind's grid
        [(Cell(method='probe', ...), 'raw', [0.01, 0.1]), (Cell(method='probe', ...), 'rms', [0.01, 0.1])]
    """
    base = sorted(base)
    plan: list[dict[str, Any]] = []
    missing: list[ProbeUnit] = []
    for kind in FEATURES:
        lrs = list(base)
        while True:
            keys = [probe_key(cell, lr, setup, kind) for lr in lrs]
            plan_of_kind = [found[key] for key in keys if key in found]
            absent = [lr for lr, key in zip(lrs, keys, strict=True) if key not in found]
            step = None if absent else grown_lr(plan_of_kind, base)
            if step is None:
                plan += plan_of_kind
                if absent:
                    missing.append((cell, kind, absent))
                break
            lrs = sorted({*lrs, step})
    return plan, missing


def grown_lr(records: Sequence[dict[str, Any]], base: Sequence[float]) -> float | None:
    """The LR one step past an end of ``records``' LRs (one trial's probes of one kind) where its best
    probe sits on that end; ``None`` where it does not, or that end has grown :data:`GROW_STEPS` steps
    past ``base`` (the plain head's grid, ascending) already, or ``base`` has one LR (the user's choice:
    no edge). A step is the ratio of the base grid's two LRs at that end.

    Example:
        >>> def record(lr, dev):  # one layer
        ...     return {"lr": lr, "metric": "f1", "layers": [{"layer": 1, "dev_f1": dev, "test_f1": dev}]}
        >>> grown_lr([record(0.1, 0.5), record(1.0, 0.6)], [0.1, 1.0])  # the best sits on the top end
        10.0
        >>> grown_lr([record(0.1, 0.5), record(1.0, 0.4)], [0.1, 1.0])  # the bottom end: one step down
        0.01
        >>> grown_lr([record(0.1, 0.5), record(1.0, 0.6), record(10.0, 0.5)], [0.1, 1.0])  # inside
    """
    if len(base) < 2:
        return None
    lrs = sorted({record["lr"] for record in records})
    best = best_single_layer(records)["lr"]
    up, down = base[-1] / base[-2], base[1] / base[0]
    if best == lrs[-1] and lrs[-1] < base[-1] * up**GROW_STEPS * (1 - 1e-9):
        return float(f"{lrs[-1] * up:.12g}")
    if best == lrs[0] and lrs[0] > base[0] / down**GROW_STEPS * (1 + 1e-9):
        return float(f"{lrs[0] / down:.12g}")
    return None


def current_runs(runs: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` (a results file's records, in file order) without the probe-guided ones that no longer
    read what their trial's probes say: a run with a ``start_layer`` (``--probe-start``) is kept only
    where that block is its trial's best probe, a run with ``probe_layers`` (``--probe-fuse``) only where
    they are its trial's best blocks (:func:`ranked_layers` of :func:`trial_plan` of ``probes``, the
    probes file's records, from the grid its record names: :func:`probe_grid`), and of several such runs
    of one cell and LR, the newest. A trial with no probes in ``probes`` keeps its newest run. A sweep
    whose new probes moved a choice appends the run from the new blocks; a reader shows only that one.

    Example:
        >>> old = {"key": "layer_mix|fe|8|25|0|lr=0.01|s", "start_layer": 3, "shots": 8, "epochs": 25,
        ...        "trial": 0, "setup": "s", "settings": {"probe_start": [0.01]}}
        >>> new = {**old, "key": old["key"] + "|start=5", "start_layer": 5}
        >>> [run["start_layer"] for run in current_runs([old, new], [])]  # no probes: the newest
        [5]
    """
    found = {record["key"]: record for record in probes}
    ranks: dict[tuple, list[int] | None] = {}
    newest: dict[str, int] = {}
    kept = []
    for index, run in enumerate(runs):
        if "start_layer" not in run and "probe_layers" not in run:
            kept.append(index)
            continue
        trial = (run["setup"], run["shots"], run["epochs"], run["trial"])
        if trial not in ranks:
            cell = Cell(PROBE, PROBE_REGIME, run["shots"], run["epochs"], run["trial"])
            records, _ = trial_plan(found, cell, probe_grid(run["settings"]), run["setup"])
            ranks[trial] = ranked_layers(records) if records else None
        if reads_ranked(run, ranks[trial]):
            newest[without_probe_choice(run["key"])] = index
    return [runs[index] for index in sorted([*kept, *newest.values()])]


def reads_ranked(run: dict[str, Any], ranked: Sequence[int] | None) -> bool:
    """Whether a probe-guided ``run`` reads what its trial's blocks ranked by their probes (best first;
    ``None``: no probes, any) say: its ``start_layer`` the first, its ``probe_layers`` the first K.

    Example:
        >>> reads_ranked({"start_layer": 5}, [5, 4, 6]), reads_ranked({"probe_layers": [4, 5]}, [5, 4, 6])
        (True, True)
        >>> reads_ranked({"probe_layers": [5, 6]}, [5, 4, 6]), reads_ranked({"start_layer": 3}, None)
        (False, True)
    """
    if ranked is None:
        return True
    start, layers = run.get("start_layer"), run.get("probe_layers")
    starts_there = start is None or start == ranked[0]
    return starts_there and (layers is None or layers == sorted(ranked[: len(layers)]))


def probe_grid(settings: Mapping[str, Any]) -> list[float]:
    """The FE LR grid a run's probes select over, as its record's ``settings`` name it (``probe_start``
    or ``probe_fuse``: :meth:`~layerfusion_recipes.core.experiment.TaskSettings.setup_fields`).

    Example:
        >>> probe_grid({"probe_fuse": [0.01, 0.1]}), probe_grid({})
        ([0.01, 0.1], [])
    """
    return list(settings.get("probe_start") or settings.get("probe_fuse") or [])


def current_probes(probes: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probe records a report of ``runs`` reads (``probes``: a probes file's): those of a setup some
    run has (with no runs, all; records written before setups count as one). A probe of another setup
    read other data, another model or other settings: it is stale, and a bar drawn from it would be too.

    Example:
        >>> probes = [{"setup": "old"}, {"setup": "gone"}, {"setup": "new"}]
        >>> [p["setup"] for p in current_probes(probes, [{"setup": "new"}, {"setup": "old"}])]
        ['old', 'new']
    """
    setups = {run.get("setup") for run in runs} or {record.get("setup") for record in probes}
    return [record for record in probes if record.get("setup") in setups]


def missing_probes(experiment: FewShotExperiment, grid: dict[str, Any]) -> list[ProbeUnit]:
    """The probes of ``grid`` still to train now (:func:`probe_plan`): ``(cell, kind, LRs)`` per trial.

    Example:
        >>> [(cell.trial, kind, lrs) for cell, kind, lrs in missing_probes(experiment, grid)]  # a first run
        [(0, 'raw', [0.01, 0.03]), (0, 'rms', [0.01, 0.03]),
         (1, 'raw', [0.01, 0.03]), (1, 'rms', [0.01, 0.03])]
    """
    return probe_plan(experiment, grid)[1]


def run_probes(
    experiment: FewShotExperiment, grid: dict[str, Any], progress: bool = True
) -> list[dict[str, Any]]:
    """The probes of every (shots, max epochs, trial) of ``grid``, both feature kinds, at each LR of
    their plan (:func:`probe_plan`: the FE grid, grown where a best probe sits on an end), skipping the
    records already in the probes file (:func:`probes_path` of ``grid["results"]``); each record
    appended when its trial's probes are trained.

    Returns:
        The records of these probes the bar reads (old and new), one per key.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # 2 trials x 2 kinds x 2+ LRs
        >>> len(records) >= 8, len(records) == len(open("out/results.probes.jsonl").readlines())
        (True, True)
        >>> missing_probes(experiment, grid)  # a second run_probes trains none
        []
    """
    path = probes_path(grid["results"])
    while todo := missing_probes(experiment, grid):
        for cell, kind, lrs in tqdm(todo, desc="layer probes", disable=not progress, file=sys.stderr):
            for record in probe_records(experiment, cell.shots, cell.epochs, cell.trial, lrs, kind):
                append_record(path, record)
    return saved_probes(experiment, grid)


def saved_probes(experiment: FewShotExperiment, grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of ``grid``'s probes that the probes file holds and the bar reads
    (:func:`probe_plan`), none trained: what the other processes of a launched sweep read once the main
    process ran :func:`run_probes`.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # the main process
        >>> saved_probes(experiment, grid) == records  # another process: the same records, none trained
        True
    """
    return probe_plan(experiment, grid)[0]


def best_single_layer(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The probe a user would pick for one trial: the (layer, feature kind, LR) whose best dev score is
    highest among ``records`` (that trial's probe records, one per kind and LR; ties to the raw kind,
    then the smaller LR, then the lower layer), with its test scores: chosen on the training sample and
    dev only.

    Returns:
        ``{"layer", "lr", "dev", "test", "metric", "features"}`` (``test`` ``None`` without a test split).

    Example:
        >>> def record(lr, scores):  # a trial's record at one LR, as probe_records writes it (no curves)
        ...     layers = [{"layer": n, "dev_f1": d, "test_f1": t} for n, (d, t) in enumerate(scores, 1)]
        ...     return {"lr": lr, "metric": "f1", "layers": layers}
        >>> records = [
        ...     record(1e-2, [(0.2, 0.3), (0.6, 0.5), (0.4, 0.4)]),  # (dev, test) of layers 1, 2, 3
        ...     record(3e-2, [(0.6, 0.7), (0.5, 0.5), (0.1, 0.2)]),
        ... ]
        >>> best_single_layer(records)  # dev 0.6 twice: the smaller LR
        {'layer': 2, 'lr': 0.01, 'dev': 0.6, 'test': 0.5, 'metric': 'f1', 'features': 'raw'}
    """
    dev, _, _, _, record, entry = max(probe_candidates(records), key=lambda c: c[:4])
    metric = record["metric"]
    return {
        "layer": entry["layer"],
        "lr": record["lr"],
        "dev": dev,
        "test": entry[f"test_{metric}"],
        "metric": metric,
        "features": features_of(record),
    }


def probe_candidates(records: Sequence[dict[str, Any]]) -> list[tuple]:
    """Every probe of ``records`` (one trial's) as ``(dev, raw kind, -lr, -layer, record, entry)``: the
    larger the first four, the better the probe (:func:`best_single_layer`, :func:`ranked_layers`)."""
    candidates = []
    for record in records:
        metric, raw = record["metric"], features_of(record) == RAW
        for entry in record["layers"]:
            candidates.append((entry[f"dev_{metric}"], raw, -record["lr"], -entry["layer"], record, entry))
    return candidates


def ranked_layers(records: Sequence[dict[str, Any]]) -> list[int]:
    """The blocks of one trial's probe records, best first: each by its best probe (over feature kinds
    and LRs, ordered as :func:`best_single_layer` orders them), so the first is that trial's best single
    layer. Dev only.

    Example:
        >>> def record(lr, devs):
        ...     layers = [{"layer": n, "dev_f1": d, "test_f1": 0.0} for n, d in enumerate(devs, 1)]
        ...     return {"lr": lr, "metric": "f1", "layers": layers}
        >>> ranked_layers([record(1e-2, [0.2, 0.6, 0.4]), record(1e-1, [0.5, 0.1, 0.1])])
        [2, 1, 3]
    """
    best: dict[int, tuple] = {}
    for candidate in probe_candidates(records):
        layer = candidate[5]["layer"]
        if layer not in best or candidate[:4] > best[layer][:4]:
            best[layer] = candidate
    return [layer for layer, _ in sorted(best.items(), key=lambda item: item[1][:4], reverse=True)]


def guarded(
    run_dev: float, run_test: float | None, best: dict[str, Any], dev_size: int
) -> tuple[float | None, bool]:
    """A fusion run guarded by its trial's best single layer (:func:`best_single_layer`): the run's test
    score where :func:`~peft_layerfusion.probing.keep_fusion` keeps it (its dev score beats the layer's
    by more than one standard error over ``dev_size`` dev units), else the layer's; and whether the run
    was kept. Dev alone decides: the fusion must earn its parameters. Scores are fractions.

    This is the last step of the probe-guided recipe: probe every block, start the mix on the best
    one (``--probe-start``), train it, and keep it only where dev says it beats that block.

    Example:
        >>> best = {"layer": 7, "lr": 0.1, "dev": 0.80, "test": 0.74, "metric": "accuracy"}
        >>> guarded(0.82, 0.71, best, 1000), guarded(0.81, 0.90, best, 1000)  # one SE: 0.0126
        ((0.71, True), (0.74, False))
    """
    if keep_fusion(run_dev, best["dev"], dev_size):
        return run_test, True
    return best["test"], False


def best_per_trial(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], dict[str, Any]]:
    """``{(shots, epochs, trial): best_single_layer(...)}`` of probe records, each trial's own (of its
    :func:`newest_setup`).

    Example:
        >>> layers = [{"layer": n, "dev_f1": dev, "test_f1": dev} for n, dev in ((1, 0.4), (2, 0.6))]
        >>> record = {"shots": 8, "epochs": 5, "trial": 0, "lr": 0.1, "metric": "f1", "layers": layers}
        >>> best_per_trial([record])[8, 5, 0]["layer"]
        2
    """
    return {trial: best_single_layer(found) for trial, found in probe_trials(records).items()}


def probe_trials(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], list[dict[str, Any]]]:
    """Probe records by ``(shots, epochs, trial)``, each trial's of its :func:`newest_setup`.

    Example:
        >>> records = [{"shots": 8, "epochs": 5, "trial": 0, "setup": setup} for setup in "ab"]
        >>> [r["setup"] for r in probe_trials(records)[8, 5, 0]]
        ['b']
    """
    trials: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for record in records:
        trials.setdefault((record["shots"], record["epochs"], record["trial"]), []).append(record)
    return {trial: newest_setup(found) for trial, found in trials.items()}


def newest_setup(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``records`` (one trial's probes, in file order) of the last setup among them: two
    setups' probes of one trial read different data, models or settings, and the newer is the one a
    sweep resumes (records without a setup count as one).

    Example:
        >>> [r["lr"] for r in newest_setup([{"setup": "a", "lr": 1}, {"setup": "b", "lr": 2}])]
        [2]
    """
    last = records[-1].get("setup") if records else None
    return [record for record in records if record.get("setup") == last]


def probe_ranks(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], list[int]]:
    """``{(shots, epochs, trial): blocks}``: each trial's :func:`ranked_layers`, best first, of its
    :func:`newest_setup` (``--probe-fuse`` fuses the first K).

    Example:
        >>> records = run_probes(experiment, grid, progress=False)  # grid: 2 shots, 2 epochs, 2 trials
        >>> ranks = probe_ranks(records)
        >>> {trial: blocks[0] for trial, blocks in ranks.items()} == probe_starts(records)  # best first
        True
    """
    return {trial: ranked_layers(found) for trial, found in probe_trials(records).items()}


def probe_starts(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], int]:
    """``{(shots, epochs, trial): block}``: each trial's :func:`best_single_layer` (``--probe-start``).

    Example:
        >>> probe_starts(run_probes(experiment, grid, progress=False))  # grid: 2 shots, 2 epochs, 2 trials
        {(2, 2, 0): ..., (2, 2, 1): ...}
    """
    return {trial: best["layer"] for trial, best in best_per_trial(records).items()}
