"""Layer probes (core/probes.py): the probe of layer n is a linear head trained alone on block n's
output (``output_hidden_states[n]``, before the final norm on a pre-norm decoder; raw, or divided by
its RMS per position) at the positions the task reads (classify: its pooled token, on a post-norm
encoder and a pre-norm decoder; NER: the labelled first sub-words, scored by seqeval itself); records
resume by key; each kind's LR grid grows past an end its best probe sits on, as far as GROW_STEPS."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import write_text_data, write_tiny_decoder, write_tiny_model, write_toy_data
from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.core import probes
from layerfusion_recipes.core.batches import IGNORE_INDEX
from layerfusion_recipes.core.cells import Cell
from layerfusion_recipes.core.fitting import fit
from layerfusion_recipes.core.probes import probe_records, probe_runner, probes_path, run_probes
from layerfusion_recipes.core.records import read_records
from layerfusion_recipes.ner.experiment import Experiment, ExperimentSettings
from seqeval.metrics import f1_score
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModel

LAYERS = 3  # the tiny BERT's and the tiny Llama's blocks
LRS = (3e-2, 3e-1)
EPOCHS = 6


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    return {
        "model": write_tiny_model(root / "bert"),
        "decoder": write_tiny_decoder(root / "llama", layers=LAYERS),  # pre-norm: z_L is not hidden_states[L]
        "texts": write_text_data(root / "texts", sizes=(("train", 30), ("dev", 12), ("test", 12))),
        "ner": write_toy_data(root / "ner", train=30, dev=10, test=10),
    }


# (model, pooling, the position the head reads): BERT's own head, mean pooling, a decoder's own head
READINGS = [("model", "model", "first"), ("model", "mean", "all"), ("decoder", "model", "last")]


@pytest.fixture(scope="module", params=READINGS, ids=["bert-first", "bert-mean", "llama-last"])
def classify(paths, request) -> ClassifyExperiment:
    model, pooling, positions = request.param
    settings = dict(model=paths[model], data=paths["texts"], batch_size=4, seed=3, pooling=pooling)
    experiment = ClassifyExperiment(ClassifySettings(**settings))
    assert experiment.positions == positions
    return experiment


@pytest.fixture(scope="module")
def ner(paths) -> Experiment:
    return Experiment(ExperimentSettings(model=paths["model"], data=paths["ner"], batch_size=4, seed=3))


@torch.no_grad()
def hidden_states(model_path: str, features: list[dict], layer: int) -> list[torch.Tensor]:
    """Block ``layer``'s output for each example alone (no padding): ``(seq, d)`` each, caught by a hook
    on the block and checked against ``output_hidden_states[layer]`` wherever that is the block's own
    output (every block of a post-norm encoder; below the last on a pre-norm decoder, whose last entry
    has the final norm applied)."""
    model = AutoModel.from_pretrained(model_path).eval()
    blocks = model.layers if hasattr(model, "layers") else model.encoder.layer
    caught = []
    handle = blocks[layer - 1].register_forward_hook(
        lambda module, args, output: caught.append(output[0] if isinstance(output, tuple) else output)
    )
    pre_norm_last = hasattr(model, "norm") and layer == len(blocks)
    out = []
    try:
        for feature in features:
            inputs = {key: torch.tensor([feature[key]]) for key in ("input_ids", "attention_mask")}
            listed = model(**inputs, output_hidden_states=True).hidden_states[layer][0]
            state = caught.pop()[0]  # (seq, d)
            if not pre_norm_last:
                torch.testing.assert_close(state, listed, rtol=0, atol=0)
            out.append(state)
    finally:
        handle.remove()
    return out


def lone_head(train: list[tuple], dev_score, test_score, lr: float, seed: int, width: int, classes: int):
    """A linear head trained alone on ``train`` (``(inputs (n, d), labels (n,))`` per example): AdamW,
    the LR linear to zero, the batches of the recipes' protocol, dev scored every epoch, test at the
    best dev epoch (the first on ties). Returns (dev curve, test score, the best head)."""
    torch.manual_seed(seed)
    head = nn.Linear(width, classes)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    loader = DataLoader(
        list(range(len(train))),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=lambda indices: indices,
    )
    total = EPOCHS * math.ceil(len(train) / 4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total - step) / total))
    curve, best, best_state = [], -1.0, None
    for _ in range(EPOCHS):
        for indices in loader:
            inputs = torch.cat([train[i][0] for i in indices])
            labels = torch.cat([train[i][1] for i in indices])
            F.cross_entropy(head(inputs), labels).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        with torch.no_grad():
            score = dev_score(head)
        curve.append(score)
        if score > best:
            best, best_state = score, {k: v.clone() for k, v in head.state_dict().items()}
    head.load_state_dict(best_state)
    with torch.no_grad():
        return curve, test_score(head), head


def trained_probes(experiment, shots: int, trial: int, features: str = "raw"):
    """The probes of a trial trained by ``fit`` (as :func:`probe_records` does), for their weights."""
    train = experiment.train_sample(shots, trial)
    runner = probe_runner(experiment, train, trial, len(LRS), features)
    settings = experiment.train_settings(Cell("probe", "fe", shots, EPOCHS, trial))
    lrs = [lr for lr in LRS for _ in range(LAYERS)]
    fit(runner, train, experiment.dev, settings, experiment.scorer_of, lrs=lrs, test=experiment.test)
    return runner


def check_probe(record_layers, runner, k: int, layer: int, curve, test, head, metric: str) -> None:
    entry = record_layers[layer - 1]
    assert entry["layer"] == layer
    assert [point[f"dev_{metric}"] for point in entry["curve"]] == pytest.approx(curve, abs=1e-12)
    assert entry[f"test_{metric}"] == pytest.approx(test, abs=1e-12)
    weight, bias = runner.candidates[k * LAYERS + layer - 1]
    torch.testing.assert_close(weight.detach(), head.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bias.detach(), head.bias, rtol=1e-4, atol=1e-5)


def unit(state: torch.Tensor) -> torch.Tensor:
    """``state / sqrt(mean(state^2) + 1e-6)`` per row, written out here (not the library's)."""
    return state / torch.sqrt((state * state).sum(-1, keepdim=True) / state.shape[-1] + 1e-6)


@pytest.mark.parametrize("kind", ["raw", "rms"])
@pytest.mark.parametrize("layer", range(1, LAYERS + 1))
def test_classify_probe_of_layer_n_is_a_lone_head_on_its_pooled_hidden_state(classify, paths, layer, kind):
    """The probe reads block n's output at the first token (BERT's own head), its mean over the tokens
    (mean pooling) or the last token (a decoder's own head; z_L before the final norm); the unit-RMS
    kind reads that state divided by its RMS."""
    trial, seed = 1, classify.settings.seed + 1
    train = classify.train_sample(4, trial)
    records = list(probe_records(classify, 4, EPOCHS, trial, LRS, kind))
    runner = trained_probes(classify, 4, trial, kind)
    assert all(record["features"] == kind for record in records)
    assert all(record["key"].endswith("|features=rms") == (kind == "rms") for record in records)

    def examples(features):
        states = hidden_states(classify.settings.model, features, layer)
        read = {"first": lambda s: s[:1], "last": lambda s: s[-1:], "all": lambda s: s.mean(0, keepdim=True)}
        pooled = [read[classify.positions](s) for s in states]  # (1, d) each
        pooled = [unit(p) for p in pooled] if kind == "rms" else pooled
        return [(p, torch.tensor([f["labels"]])) for p, f in zip(pooled, features, strict=True)]

    train_xy, dev_xy, test_xy = examples(train), examples(classify.dev), examples(classify.test)

    def accuracy(split):
        return lambda head: sum(int(head(x).argmax(-1) == y) for x, y in split) / len(split)

    moved = []
    for k, (lr, record) in enumerate(zip(LRS, records, strict=True)):
        assert record["lr"] == lr and record["metric"] == "accuracy"
        curve, test, head = lone_head(train_xy, accuracy(dev_xy), accuracy(test_xy), lr, seed, 32, 3)
        moved.append(len(set(curve)) > 1)
        check_probe(record["layers"], runner, k, layer, curve, test, head, "accuracy")
    assert any(moved), "the toy must move the dev score at one LR at least"


@pytest.mark.parametrize("layer", [1, LAYERS])
def test_ner_probe_of_layer_n_is_a_lone_head_scored_by_seqeval(ner, paths, layer):
    """Token-wise: the probe reads output_hidden_states[n] at each word's first sub-word; its score is
    seqeval's micro-F1 of the word tags."""
    trial, seed = 0, ner.settings.seed
    train = ner.train_sample(2, trial)
    records = list(probe_records(ner, 2, EPOCHS, trial, LRS))
    runner = trained_probes(ner, 2, trial)

    def examples(features):
        states = hidden_states(paths["model"], features, layer)
        out = []
        for state, feature in zip(states, features, strict=True):
            labels = torch.tensor(feature["labels"])
            read = labels != IGNORE_INDEX
            out.append((state[read], labels[read]))
        return out

    train_xy, dev_xy, test_xy = examples(train), examples(ner.dev), examples(ner.test)

    def seqeval_f1(split):
        def score(head):
            gold = [[ner.id2label[int(i)] for i in y] for _, y in split]
            predicted = [[ner.id2label[int(i)] for i in head(x).argmax(-1)] for x, _ in split]
            return f1_score(gold, predicted)

        return score

    assert ner.dev_reach.out_of_reach == ner.test_reach.out_of_reach == 0  # every gold word is read
    for k, (lr, record) in enumerate(zip(LRS, records, strict=True)):
        assert record["metric"] == "f1" and record["metrics"] == ["f1"]
        curve, test, head = lone_head(
            train_xy, seqeval_f1(dev_xy), seqeval_f1(test_xy), lr, seed, 32, len(ner.labels)
        )
        assert len(set(curve)) > 1, "the toy must move the dev score"
        check_probe(record["layers"], runner, k, layer, curve, test, head, "f1")


def test_probe_records_resume_by_key(classify, tmp_path, monkeypatch):
    grid = {"shots": [2], "epochs": [2], "trials": 2, "results": str(tmp_path / "results.jsonl")}
    classify.settings.lr = [1e-3]  # one LR: nothing to grow
    try:
        first = run_probes(classify, grid, progress=False)
        expected = [["probe", "fe", "2", "2", str(t)] for t in (0, 0, 1, 1)]
        assert [r["key"].split("|")[:5] for r in first] == expected
        assert [r["features"] for r in first] == ["raw", "rms", "raw", "rms"]
        assert probes_path(grid["results"]) == tmp_path / "results.probes.jsonl"
        trained = []
        original = probes.probe_records

        def counted(experiment, shots, epochs, trial, lrs, features):
            trained.append((features, lrs))
            return original(experiment, shots, epochs, trial, lrs, features)

        monkeypatch.setattr(probes, "probe_records", counted)
        assert run_probes(classify, grid, progress=False) == first and trained == []  # nothing to train
        classify.settings.lr = [1e-3, 1e-2, 1e-1]
        both = run_probes(classify, grid, progress=False)
        assert trained[:4] == [(kind, [1e-2, 1e-1]) for _ in range(2) for kind in ("raw", "rms")]  # new LRs
        assert [r for r in both if r["lr"] == 1e-3] == first
        assert len(read_records(tmp_path / "results.probes.jsonl")) == len(both)
    finally:
        classify.settings.lr = None


def test_a_kind_s_grid_grows_past_the_end_its_best_probe_sits_on_until_the_best_is_inside(
    classify, tmp_path, monkeypatch
):
    """Probes whose dev score peaks at LR 1e-2 (raw) and 1e-1 (unit RMS; trial 1's raw at 1e-4), from a
    grid 1e-5, 1e-4: each trial's grid of each kind grows one step up (the ratio of its top two LRs)
    until its best LR is inside it; a second run trains nothing and reads the same records."""
    peaks = {("raw", 0): -2, ("rms", 0): -1, ("raw", 1): -4, ("rms", 1): -1}
    trained = []

    def fake(experiment, shots, epochs, trial, lrs, features):
        trained.append((features, trial, list(lrs)))
        cell = probes.Cell(probes.PROBE, probes.PROBE_REGIME, shots, epochs, trial)
        for lr in lrs:
            dev = 1.0 - abs(math.log10(lr) - peaks[features, trial]) / 10
            layers = [{"layer": 1, "dev_f1": dev, "test_f1": dev}]
            key = probes.probe_key(cell, lr, experiment.setup, features)
            place = {"shots": shots, "epochs": epochs, "trial": trial}
            yield {"key": key, **place, "lr": lr, "features": features, "metric": "f1", "layers": layers}

    monkeypatch.setattr(probes, "probe_records", fake)
    grid = {"shots": [3], "epochs": [4], "trials": 2, "results": str(tmp_path / "results.jsonl")}
    classify.settings.lr = [1e-5, 1e-4]
    try:
        records = run_probes(classify, grid, progress=False)
        tops = {("raw", 0): 1e-1, ("rms", 0): 1.0, ("raw", 1): 1e-3, ("rms", 1): 1.0}  # a step past the peak
        for (kind, trial), top in tops.items():
            lrs = [pytest.approx(lr) for lr in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0) if lr <= top * 1.01]
            assert sorted(r["lr"] for r in records if (r["features"], r["trial"]) == (kind, trial)) == lrs
        assert trained[:4] == [(kind, t, [1e-5, 1e-4]) for t in (0, 1) for kind in ("raw", "rms")]
        assert all(len(lrs) == 1 for _, _, lrs in trained[4:])  # then one LR a step
        assert probes.missing_probes(classify, grid) == []
        count = len(trained)
        assert run_probes(classify, grid, progress=False) == records and len(trained) == count
        assert len(read_records(probes_path(grid["results"]))) == len(records)
    finally:
        classify.settings.lr = None


def test_the_grown_lrs_stop_after_grow_steps_at_each_end():
    def record(lr: float, dev: float) -> dict:
        return {"lr": lr, "metric": "f1", "layers": [{"layer": 1, "dev_f1": dev, "test_f1": 0.0}]}

    base = [1e-2, 1e-1]
    rising = [record(lr, lr) for lr in (1e-2, 1e-1)]  # the best always on the top end
    grown = []
    while (step := probes.grown_lr(rising, base)) is not None:
        grown.append(step)
        rising.append(record(step, step))
    assert grown == pytest.approx([1.0, 10.0, 100.0, 1000.0]) and len(grown) == probes.GROW_STEPS
    falling = [record(lr, -lr) for lr in (1e-2, 1e-1)]
    assert probes.grown_lr(falling, base) == pytest.approx(1e-3)  # the bottom end: one step down
    assert probes.grown_lr([record(1e-2, 0.5)], [1e-2]) is None  # one LR: the user's choice, no edge


def test_the_dev_inputs_of_a_trial_are_read_from_the_cache_once(classify, monkeypatch):
    """Evaluation batches repeat every epoch: their read positions are taken from the cache once per
    trial's probes (the training batches, shuffled, each time)."""
    reads: list[int] = []
    original = probes.ProbeRunner.read

    def counted(self, features):
        reads.append(len(features))
        return original(self, features)

    monkeypatch.setattr(probes.ProbeRunner, "read", counted)
    list(probe_records(classify, 2, EPOCHS, 0, LRS))  # 6 train examples: one batch of 4, one of 2
    evaluation = [len(classify.dev), len(classify.test)]  # one batch each (eval batches of 64)
    assert sorted(reads) == sorted([4, 2] * EPOCHS + evaluation)


def _without_timing(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in r.items() if key not in ("seconds", "pid")} for r in records]


@pytest.mark.parametrize("task, kept", [("classify", "first"), ("ner", "labelled")])
def test_probes_on_a_prefilled_cache_of_the_head_positions_match_an_every_position_cache(
    paths, tmp_path, task, kept
):
    """A sweep of token-wise methods caches the head's positions only and lets the encoder go after
    the prefill: the probes then read that cache (zeros elsewhere in a batch) and give the records of
    a cache that keeps every position, filled as they come with the encoder alive."""

    def experiment(positions: str):
        common = {"model": paths["model"], "batch_size": 4, "seed": 3, "cache_positions": positions}
        if task == "classify":
            return ClassifyExperiment(ClassifySettings(data=paths["texts"], **common))
        return Experiment(ExperimentSettings(data=paths["ner"], **common))

    grid = {"shots": [2], "epochs": [3], "trials": 2}
    prefilled, every = experiment("read"), experiment("all")
    prefilled.prefill_cache(probes.probe_cells(grid))
    cache = prefilled.cache()
    assert cache.base_model is None and cache.located is None  # the encoder is gone
    assert cache.positions.name == kept
    if task == "classify":
        assert {len(positions) for _, positions in cache.states} == {1}  # the pooled token alone
    else:
        assert all(len(positions) < len(ids) for ids, positions in cache.states)  # labelled ones only
    read = run_probes(prefilled, {**grid, "results": str(tmp_path / "read.jsonl")}, progress=False)
    full = run_probes(every, {**grid, "results": str(tmp_path / "all.jsonl")}, progress=False)
    assert every.cache().base_model is not None and every.cache().positions.name == "all"
    assert len(read) >= 2 * 2 * len(prefilled.settings.lr_grid("fe"))  # 2 trials, 2 kinds, the grid (grown)
    assert _without_timing(read) == _without_timing(full)  # bitwise: the same states where read


def _probe_record(lr: float, trial: int, scores: list[tuple[float, float]]) -> dict:
    layers = [{"layer": n, "dev_f1": dev, "test_f1": test} for n, (dev, test) in enumerate(scores, start=1)]
    return {"lr": lr, "trial": trial, "shots": 8, "epochs": 5, "metric": "f1", "layers": layers}


def test_the_best_single_layer_is_chosen_on_dev_alone():
    records = [
        _probe_record(1e-2, 0, [(0.5, 0.9), (0.7, 0.2), (0.6, 0.6)]),  # layer 1's test is best: unseen
        _probe_record(1e-3, 0, [(0.4, 0.4), (0.7, 0.3), (0.2, 0.2)]),  # layer 2 ties at a smaller LR
        _probe_record(1e-2, 1, [(0.1, 0.1), (0.2, 0.2), (0.3, 0.5)]),
    ]
    expected = {"layer": 2, "lr": 1e-3, "dev": 0.7, "test": 0.3, "metric": "f1", "features": "raw"}
    assert probes.best_single_layer(records[:2]) == expected
    assert probes.probe_starts(records) == {(8, 5, 0): 2, (8, 5, 1): 3}
    rms = {**_probe_record(1e-4, 0, [(0.7, 0.9), (0.71, 0.1), (0.0, 0.0)]), "features": "rms"}
    assert probes.best_single_layer([*records[:2], rms])["features"] == "rms"  # 0.71 on dev: either kind
    tie = {**_probe_record(1e-4, 0, [(0.7, 0.9), (0.0, 0.0), (0.0, 0.0)]), "features": "rms"}
    assert probes.best_single_layer([*records[:2], tie]) == expected  # a tie across kinds: the raw one


def test_a_reader_shows_each_probe_guided_run_from_the_block_its_trial_s_probes_pick_now():
    """The file holds trial 0's mix from block 3 (before starts were keyed), from 2 and from 3 again
    (new probes moved the start and moved it back): the probes now say 3, so the newest run from 3 is
    shown. Trial 1 has no probes: its newest run. Runs that start nowhere are all kept."""
    setup, base = "s", [0.01, 0.1]
    probes_now = []
    for kind in ("raw", "rms"):
        for lr in base:
            cell = probes.Cell(probes.PROBE, probes.PROBE_REGIME, 8, 25, 0)
            devs = [0.2, 0.3, 0.6] if (kind, lr) == ("rms", 0.01) else [0.2, 0.3, 0.4]  # block 3 at 0.01
            layers = [{"layer": n, "dev_f1": d, "test_f1": d} for n, d in enumerate(devs, start=1)]
            key = probes.probe_key(cell, lr, setup, kind)
            probes_now.append({"key": key, "lr": lr, "features": kind, "metric": "f1", "layers": layers})

    def run(trial: int, start: int | None, keyed: bool = True, method: str = "layer_mix") -> dict:
        key = f"{method}|fe|8|25|{trial}|lr=0.01|{setup}" + (f"|start={start}" if keyed and start else "")
        fields = {"shots": 8, "epochs": 25, "trial": trial, "setup": setup, "settings": {"probe_start": base}}
        return {"key": key, **fields} | ({"start_layer": start} if start else {})

    runs = [run(0, 3, keyed=False), run(0, None, method="none"), run(0, 2), run(1, 1), run(0, 3), run(1, 2)]
    shown = probes.current_runs(runs, probes_now)
    assert shown == [runs[1], runs[4], runs[5]]
    moved = [
        {**p, "layers": [{**e, "dev_f1": 0.9 if e["layer"] == 2 else 0.0} for e in p["layers"]]}
        for p in probes_now
    ]
    assert probes.current_runs(runs, moved) == [runs[1], runs[2], runs[5]]  # the probes pick block 2


def test_a_report_reads_no_probe_of_a_setup_its_runs_lack_and_each_trial_s_newest_setup():
    """Probes of another setup read other data, model or settings: a bar drawn from them is stale."""
    old = {**_probe_record(1e-2, 0, [(0.5, 0.5), (0.9, 0.2)]), "setup": "old"}  # block 2 on old data
    new = {**_probe_record(1e-2, 0, [(0.6, 0.7), (0.4, 0.4)]), "setup": "new"}  # block 1 now
    gone = {**_probe_record(1e-2, 1, [(0.1, 0.1), (0.8, 0.8)]), "setup": "gone"}  # no run has it
    runs = [{"setup": "new"}, {"setup": "old"}]
    assert probes.current_probes([old, gone, new], runs) == [old, new]
    assert probes.current_probes([old, gone], []) == [old, gone]  # no runs: nothing to match
    best = probes.best_per_trial([old, new])[8, 5, 0]
    assert (best["layer"], best["dev"], best["test"]) == (1, 0.6, 0.7)  # the newest setup, not old's 0.9
    assert probes.best_per_trial([new, old])[8, 5, 0]["layer"] == 2  # file order decides which is newest
