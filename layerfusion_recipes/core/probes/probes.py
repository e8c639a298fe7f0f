"""Layer probes: the library's probe (:mod:`peft_layerfusion.probing`) on each block output ``z_1 .. z_L``
at the positions a task reads, from the feature cache; its penalty chosen on the trial's sample alone.

The probe of layer ``n`` is the L2-regularised ridge probe (class scores ``W x_n + b``) of
:func:`~peft_layerfusion.probing.layer_probes` on a feature ``x_n`` of the state ``z_n`` (the output of
block ``n``, as ``output_hidden_states[n]``): ``z_n`` as it is (``none``) or ``z_n / rms(z_n)`` per
position (``rms``, as a mix with ``state_norm="rms"`` reads it). Both kinds are probed; neither wins on
every task and model. The states are read at the positions the task's head reads
(:meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.probe_inputs`): every labelled first
sub-word for NER (one row each, a sentence's rows in one fold), the pooled position of a sentence
classifier (its first or last token, or the mean over the real tokens with mean pooling).

Per trial, each kind's probes are fitted on the trial's sample (:meth:`train_sample`), their penalties
chosen by :data:`~peft_layerfusion.probing.FOLDS`-fold cross-validation on that sample alone (fewer folds
where the sample has fewer examples), folds dealt from ``seed + trial``; each probe then predicts dev and
test, scored by the task's scorer (accuracy and macro-F1, seqeval's micro-F1). No choice of the probe
reads dev: the block (and kind) chosen from them (:func:`best_single_layer`, ``--probe-start``,
``--probe-fuse``) is chosen on dev today, by the caller.

Records (:func:`run_probes`): one per (shots, max epochs, trial, feature kind) in the probes file beside
the results file (:func:`probes_path`), keyed by the cell, the setup, the kind and the probe's own
settings (:func:`probe_key`), so a sweep resumes them; each layer's penalty, its cross-validated scores
and its dev and test scores under ``layers``. A probe does not depend on the max epochs: a trial's probes
are fitted once and written for each max epochs of the grid. :mod:`layerfusion_recipes.reporting.layers`
tabulates them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from tqdm.auto import tqdm

from peft_layerfusion.probing import (
    FLAT,
    FOLDS,
    GROW_STEPS,
    PENALTIES,
    PROBED_STATE_NORMS,
    LayerProbes,
    keep_fusion,
    layer_probes,
)

from ..batches import collate
from ..results.cells import Cell
from ..results.records import append_record, fingerprint, read_records, without_probe_choice

if TYPE_CHECKING:
    import os

    from ..cache.feature_cache import FeatureCache

PROBE = "probe"  # the method name of a probe record
PROBE_REGIME = "fe"  # probes read the frozen encoder's states
FEATURES = PROBED_STATE_NORMS  # what a probe reads of z_n: "none" (z_n itself), "rms" (z_n / rms(z_n))
UNIT_RMS = "rms"
READ_BATCH = 64  # examples read from the cache at a time
# What the probes' numbers depend on besides the setup: in every probe key (a change makes new records)
# and in the setup of the runs that start from them.
PROBE_SETTINGS: dict[str, Any] = {
    "penalties": list(PENALTIES),
    "folds": FOLDS,
    "grow": GROW_STEPS,
    "flat": FLAT,
    "probe": "ridge",
}


class ProbedExperiment(Protocol):
    """What the probes read of a task's experiment (a
    :class:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment`): its data and sample, its feature
    cache, its scorer, the positions its head reads and what its records say besides scores."""

    settings: Any  # the task's settings: the probes read ``seed``
    setup: str  # the setup fingerprint
    labels: list[str]
    dev: list[dict]
    test: list[dict]

    def train_sample(self, shots: int, trial: int) -> list[dict]: ...

    def cache(self) -> FeatureCache: ...

    def filled_cache(self, train: Sequence[dict]) -> FeatureCache: ...

    def scorer_of(self, features: Sequence[dict]) -> Any: ...  # a core.engine.runner.Scorer

    def probe_inputs(
        self, states: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def provenance(self) -> dict[str, Any]: ...


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


def probe_key(cell: Cell, setup: str, features: str) -> str:
    """The key of a probe record: the cell, the setup, the feature kind and the fingerprint of
    :data:`PROBE_SETTINGS`.

    Example:
        >>> probe_key(Cell(PROBE, PROBE_REGIME, 8, 25, 0), "3f2a9c0d1e4b", UNIT_RMS)
        'probe|fe|8|25|0|3f2a9c0d1e4b|features=rms|probe=...'
    """
    return f"{cell.key}|{setup}|features={features}|probe={fingerprint(PROBE_SETTINGS)}"


def read_rows(
    experiment: ProbedExperiment, cache: FeatureCache, features: Sequence[dict]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe inputs of ``features`` from the cache: ``(rows, L, d)`` states and ``(rows,)`` labels.

    The cache's batch is ``z_1 .. z_L`` at each sentence's own positions (zeros where it kept nothing: a
    cache of the head's positions only), so the task's read positions index it as they index
    ``output_hidden_states``.
    """
    states = cache.batch_states(features)  # (L, batch, seq, d): z_1 .. z_L (z_0 is not cached)
    return experiment.probe_inputs(states, collate(features))  # (rows, L, d), (rows,)


def training_rows(
    experiment: ProbedExperiment, cache: FeatureCache, train: Sequence[dict]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The probe inputs of a trial's sample, example by example: ``(rows, L, d)``, ``(rows,)`` labels and
    the example of each row where one has several (NER's words: they share a fold), else ``None``."""
    read = [read_rows(experiment, cache, [example]) for example in train]
    counts = torch.tensor([len(labels) for _, labels in read])
    groups = None if (counts == 1).all() else torch.repeat_interleave(torch.arange(len(train)), counts)
    return torch.cat([states for states, _ in read]), torch.cat([labels for _, labels in read]), groups


class TrialProbes(NamedTuple):
    """A trial's probes (:func:`trial_probes`)."""

    probes: dict[str, LayerProbes]  # per feature kind
    rows: int  # the sample's labelled rows (its examples; NER: its labelled words)
    folds: int  # the cross-validation folds


def trial_probes(experiment: ProbedExperiment, train: Sequence[dict], trial: int) -> TrialProbes:
    """Each feature kind's :class:`~peft_layerfusion.probing.LayerProbes` of a trial's sample ``train``:
    their penalties chosen by :data:`~peft_layerfusion.probing.FOLDS`-fold cross-validation on it (one
    example per fold where it has fewer), folds dealt from ``seed + trial``.

    Example:
        >>> found = trial_probes(experiment, experiment.train_sample(2, 0), 0)  # the tiny BERT: L = 3
        >>> sorted(found.probes), len(found.probes["rms"].fits), found.folds
        (['none', 'rms'], 3, 4)
    """
    cache = experiment.filled_cache(train)  # the probes read the head's positions: any kept layout
    states, labels, groups = training_rows(experiment, cache, train)
    kept = labels != -100
    units = int(kept.sum()) if groups is None else len(torch.unique(groups[kept]))
    folds = min(FOLDS, units)
    options = {
        "folds": folds,
        "seed": experiment.settings.seed + trial,
        "groups": groups,
        "classes": len(experiment.labels),
    }
    probes = {kind: layer_probes(states, labels, state_norm=kind, **options) for kind in FEATURES}
    return TrialProbes(probes, int(kept.sum()), folds)


def split_scores(
    experiment: ProbedExperiment, probes: Mapping[str, LayerProbes], split: Sequence[dict], name: str
) -> dict[str, list[dict[str, float | None]]]:
    """``{kind: [{f"{name}_{metric}": score, ...} per layer]}``: each probe's predictions on ``split``
    scored by the task's scorer (every metric ``None`` on an empty split)."""
    metrics = experiment.scorer_of([]).metrics
    layers = len(next(iter(probes.values())).fits)
    if not split:
        return {kind: [{f"{name}_{m}": None for m in metrics} for _ in range(layers)] for kind in probes}
    cache = experiment.cache()
    predicted: dict[str, list[torch.Tensor]] = {kind: [] for kind in probes}
    for start in range(0, len(split), READ_BATCH):
        states, _ = read_rows(experiment, cache, split[start : start + READ_BATCH])
        for kind, found in probes.items():
            predicted[kind].append(found.predict_proba(states).argmax(-1))  # (L, rows)
    scorer = experiment.scorer_of(split)
    return {
        kind: [
            {f"{name}_{m}": value for m, value in scores.items()}
            for scores in scorer.scores(torch.cat(own, 1))
        ]
        for kind, own in predicted.items()
    }


def probe_records(
    experiment: ProbedExperiment, shots: int, epochs: Sequence[int], trial: int
) -> Iterator[dict[str, Any]]:
    """Fit the probes of every layer of one trial, both feature kinds (:func:`trial_probes`), score them
    on dev and test and yield one record per max epochs of ``epochs`` and kind (see the module docstring).

    Example:
        >>> records = list(probe_records(experiment, 2, [2], 0))  # 2 shots, max 2 epochs, trial 0
        >>> [r["features"] for r in records], [entry["layer"] for entry in records[0]["layers"]]
        (['none', 'rms'], [1, 2, 3])
        >>> records[0]["key"], all(0 <= entry["test_f1"] <= 1 for entry in records[0]["layers"])
        ('probe|fe|2|2|0|...|features=none|probe=...', True)
        >>> sorted(records[0]["layers"][0])
        ['cv_accuracy', 'cv_loss', 'dev_f1', 'layer', 'penalty', 'penalty_on_edge', 'test_f1']
    """
    began = time.perf_counter()
    train = experiment.train_sample(shots, trial)
    found = trial_probes(experiment, train, trial)
    dev = split_scores(experiment, found.probes, experiment.dev, "dev")
    test = split_scores(experiment, found.probes, experiment.test, "test")
    seconds = time.perf_counter() - began
    metrics = list(experiment.scorer_of([]).metrics)
    for max_epochs in epochs:
        cell = Cell(PROBE, PROBE_REGIME, shots, max_epochs, trial)
        for kind, probes in found.probes.items():
            layers = [
                {
                    "layer": n,
                    "penalty": fit.penalty,
                    "penalty_on_edge": fit.on_edge,
                    "cv_accuracy": fit.accuracy,
                    "cv_loss": fit.loss,
                    **dev[kind][n - 1],
                    **test[kind][n - 1],
                }
                for n, fit in enumerate(probes.fits, start=1)
            ]
            yield {
                "key": probe_key(cell, experiment.setup, kind),
                **asdict(cell),
                "features": kind,
                "metric": metrics[0],
                "metrics": metrics,
                "probe": PROBE_SETTINGS,
                "folds": found.folds,
                "layers": layers,
                "train_examples": len(train),
                "train_rows": found.rows,
                "seconds": seconds,
                "cached": True,
                **experiment.provenance(),
            }


def probe_cells(grid: dict[str, Any]) -> list[Cell]:
    """The probes' trials of ``grid``, one :class:`~layerfusion_recipes.core.results.cells.Cell` of the method
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


def trial_records(found: Mapping[str, dict[str, Any]], cell: Cell, setup: str) -> list[dict[str, Any]]:
    """The records of ``cell``'s probes under ``setup`` that ``found`` (records by key) has, one per kind."""
    keys = [probe_key(cell, setup, kind) for kind in FEATURES]
    return [found[key] for key in keys if key in found]


def saved_probes(experiment: ProbedExperiment, grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of ``grid``'s probes that the probes file (beside ``grid["results"]``) holds, none
    fitted: what the other processes of a launched sweep read once the main process ran
    :func:`run_probes`.

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # the main process
        >>> saved_probes(experiment, grid) == records  # another process: the same records, none fitted
        True
    """
    found = {record["key"]: record for record in read_records(probes_path(grid["results"]))}
    return [record for cell in probe_cells(grid) for record in trial_records(found, cell, experiment.setup)]


def missing_probes(experiment: ProbedExperiment, grid: dict[str, Any]) -> list[Cell]:
    """The probe cells of ``grid`` whose records (both kinds) the probes file does not hold yet.

    Example:
        >>> [(cell.shots, cell.trial) for cell in missing_probes(experiment, grid)]  # a first run
        [(2, 0), (2, 1)]
    """
    found = {record["key"] for record in read_records(probes_path(grid["results"]))}
    return [
        cell
        for cell in probe_cells(grid)
        if any(probe_key(cell, experiment.setup, kind) not in found for kind in FEATURES)
    ]


def run_probes(
    experiment: ProbedExperiment, grid: dict[str, Any], progress: bool = True
) -> list[dict[str, Any]]:
    """The probes of every (shots, max epochs, trial) of ``grid``, both feature kinds, skipping the records
    already in the probes file (:func:`probes_path` of ``grid["results"]``); a trial's probes are fitted
    once for all its max epochs, and their records appended.

    Returns:
        The records of ``grid``'s probes (:func:`saved_probes`).

    Example:
        >>> grid = {"shots": [2], "epochs": [2], "trials": 2, "results": "out/results.jsonl"}
        >>> records = run_probes(experiment, grid, progress=False)  # 2 trials x 2 kinds
        >>> len(records), len(records) == len(open("out/results.probes.jsonl").readlines())
        (4, True)
        >>> missing_probes(experiment, grid)  # a second run_probes fits none
        []
    """
    path = probes_path(grid["results"])
    todo: dict[tuple[int, int], list[int]] = {}  # (shots, trial) -> the max epochs to write
    for cell in missing_probes(experiment, grid):
        todo.setdefault((cell.shots, cell.trial), []).append(cell.epochs)
    for (shots, trial), epochs in tqdm(
        todo.items(), desc="layer probes", disable=not progress, file=sys.stderr
    ):
        for record in probe_records(experiment, shots, epochs, trial):
            append_record(path, record)
    return saved_probes(experiment, grid)


def current_runs(runs: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` (a results file's records, in file order) without the probe-guided ones that no longer
    read what their trial's probes say: a run with a ``start_layer`` (``--probe-start``) is kept only
    where that block is its trial's best probe, a run with ``probe_layers`` (``--probe-fuse``) only where
    they are its trial's best blocks (:func:`ranked_layers` of that trial's records in ``probes``, the
    probes file's, under the run's setup), and of several such runs of one cell and LR, the newest. A
    trial with no probes in ``probes`` keeps its newest run. A sweep whose new probes moved a choice
    appends the run from the new blocks; a reader shows only that one.

    Example:
        >>> old = {"key": "layer_mix|fe|8|25|0|lr=0.01|s", "start_layer": 3, "shots": 8, "epochs": 25,
        ...        "trial": 0, "setup": "s"}
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
            records = trial_records(found, Cell(PROBE, PROBE_REGIME, *trial[1:]), run["setup"])
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


def current_probes(probes: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probe records a report of ``runs`` reads (``probes``: a probes file's): those of a setup some
    run has (with no runs, all). A probe of another setup read other data, another model or other
    settings: it is stale, and a bar drawn from it would be too.

    Example:
        >>> probes = [{"setup": "old"}, {"setup": "gone"}, {"setup": "new"}]
        >>> [p["setup"] for p in current_probes(probes, [{"setup": "new"}, {"setup": "old"}])]
        ['old', 'new']
    """
    setups = {run.get("setup") for run in runs} or {record.get("setup") for record in probes}
    return [record for record in probes if record.get("setup") in setups]


def best_single_layer(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The probe a user would pick for one trial: the (layer, feature kind) whose dev score is highest
    among ``records`` (that trial's probe records, one per kind; ties to the ``none`` kind, then the lower
    layer), with its test scores: its penalty chosen on the training sample, the block on dev.

    Returns:
        ``{"layer", "penalty", "on_edge", "dev", "test", "metric", "features"}`` (``test`` ``None`` without
        a test split; ``on_edge``: its penalty still at an end of its grown grid).

    Example:
        >>> def record(kind, scores):  # a trial's record of one kind, as probe_records writes it
        ...     layers = [{"layer": n, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": d, "test_f1": t}
        ...               for n, (d, t) in enumerate(scores, 1)]
        ...     return {"features": kind, "metric": "f1", "layers": layers}
        >>> records = [
        ...     record("none", [(0.2, 0.3), (0.6, 0.5), (0.4, 0.4)]),  # (dev, test) of layers 1, 2, 3
        ...     record("rms", [(0.6, 0.7), (0.5, 0.5), (0.1, 0.2)]),
        ... ]
        >>> best_single_layer(records)  # dev 0.6 twice: the none kind
        {'layer': 2, 'penalty': 0.1, 'on_edge': False, 'dev': 0.6, 'test': 0.5, 'metric': 'f1',
         'features': 'none'}
    """
    dev, _, _, record, entry = max(probe_candidates(records), key=lambda c: c[:3])
    metric = record["metric"]
    return {
        "layer": entry["layer"],
        "penalty": entry["penalty"],
        "on_edge": entry["penalty_on_edge"],
        "dev": dev,
        "test": entry[f"test_{metric}"],
        "metric": metric,
        "features": record["features"],
    }


def probe_candidates(records: Sequence[dict[str, Any]]) -> list[tuple]:
    """Every probe of ``records`` (one trial's) as ``(dev, none kind, -layer, record, entry)``: the
    larger the first three, the better the probe (:func:`best_single_layer`, :func:`ranked_layers`)."""
    candidates = []
    for record in records:
        metric, plain = record["metric"], record["features"] == FEATURES[0]
        for entry in record["layers"]:
            candidates.append((entry[f"dev_{metric}"], plain, -entry["layer"], record, entry))
    return candidates


def ranked_layers(records: Sequence[dict[str, Any]]) -> list[int]:
    """The blocks of one trial's probe records, best first: each by its better kind (ordered as
    :func:`best_single_layer` orders them), so the first is that trial's best single layer. Dev only.

    Example:
        >>> def record(kind, devs):
        ...     layers = [{"layer": n, "dev_f1": d, "test_f1": 0.0} for n, d in enumerate(devs, 1)]
        ...     return {"features": kind, "metric": "f1", "layers": layers}
        >>> ranked_layers([record("none", [0.2, 0.6, 0.4]), record("rms", [0.5, 0.1, 0.1])])
        [2, 1, 3]
    """
    best: dict[int, tuple] = {}
    for candidate in probe_candidates(records):
        layer = candidate[4]["layer"]
        if layer not in best or candidate[:3] > best[layer][:3]:
            best[layer] = candidate
    return [layer for layer, _ in sorted(best.items(), key=lambda item: item[1][:3], reverse=True)]


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
        >>> best = {"layer": 7, "penalty": 0.1, "dev": 0.80, "test": 0.74, "metric": "accuracy"}
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
        >>> layers = [{"layer": n, "penalty": 1.0, "penalty_on_edge": False, "dev_f1": dev, "test_f1": dev}
        ...           for n, dev in ((1, 0.4), (2, 0.6))]
        >>> record = {"shots": 8, "epochs": 5, "trial": 0, "features": "none", "metric": "f1"}
        >>> best_per_trial([{**record, "layers": layers}])[8, 5, 0]["layer"]
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
    sweep resumes.

    Example:
        >>> [r["features"] for r in newest_setup([{"setup": "a", "features": "none"},
        ...                                       {"setup": "b", "features": "rms"}])]
        ['rms']
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
