"""Layer probes (core/probes/probes.py): the probe of layer n is the library's cross-validated logistic probe
on
block n's output (``output_hidden_states[n]``, before the final norm on a pre-norm decoder; as it is, or
divided by its RMS per position) at the positions the task reads (classify: its pooled token, on a
post-norm encoder and a pre-norm decoder; NER: the labelled first sub-words, a sentence's words in one
fold, scored by seqeval itself); its penalty is chosen on the trial's sample alone; records resume by
key, a trial's probes fitted once for every max epochs."""

from __future__ import annotations

import pytest
import torch
from conftest import write_text_data, write_tiny_decoder, write_tiny_model, write_toy_data
from seqeval.metrics import f1_score
from transformers import AutoModel

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.core.batches import IGNORE_INDEX
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.probes import probes
from layerfusion_recipes.core.probes.probes import probe_records, probes_path, run_probes
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.ner.experiment import NerExperiment, NerSettings
from peft_layerfusion import cross_validated_probe
from peft_layerfusion.probing import FOLDS, probe_accuracy

LAYERS = 3  # the tiny BERT's and the tiny Llama's blocks


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
def ner(paths) -> NerExperiment:
    return NerExperiment(NerSettings(model=paths["model"], data=paths["ner"], batch_size=4, seed=3))


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


def unit(state: torch.Tensor) -> torch.Tensor:
    """``state / sqrt(mean(state^2) + 1e-6)`` per row in float64, written out here (not the library's)."""
    state = state.double()
    return state / torch.sqrt((state * state).sum(-1, keepdim=True) / state.shape[-1] + 1e-6)


def check_layer(entry: dict, found, dev_score: float, test_score: float, metric: str, layer: int) -> None:
    """A record's layer entry against the probe fitted here (``found``) and its scores."""
    assert entry["layer"] == layer
    assert entry["penalty"] == pytest.approx(found.penalty, rel=1e-12)
    assert entry["penalty_on_edge"] == found.on_edge
    assert entry["cv_loss"] == pytest.approx(found.loss, rel=1e-6)
    assert entry["cv_accuracy"] == pytest.approx(found.accuracy, abs=1e-12)
    assert entry[f"dev_{metric}"] == pytest.approx(dev_score, abs=1e-12)
    assert entry[f"test_{metric}"] == pytest.approx(test_score, abs=1e-12)


@pytest.mark.parametrize("kind", ["none", "rms"])
@pytest.mark.parametrize("layer", range(1, LAYERS + 1))
def test_classify_probe_of_layer_n_is_the_library_s_probe_on_its_pooled_hidden_state(classify, layer, kind):
    """The probe reads block n's output at the first token (BERT's own head), its mean over the tokens
    (mean pooling) or the last token (a decoder's own head; z_L before the final norm); the unit-RMS
    kind reads that state divided by its RMS; its penalty by 4-fold cross-validation on the sample, the
    folds dealt from seed + trial."""
    trial = 1
    train = classify.train_sample(4, trial)
    records = {r["features"]: r for r in probe_records(classify, 4, [5], trial)}
    record = records[kind]
    assert record["metric"] == "accuracy" and record["folds"] == FOLDS and record["train_rows"] == len(train)

    def pooled(features):
        states = hidden_states(classify.settings.model, features, layer)
        read = {"first": lambda s: s[0], "last": lambda s: s[-1], "all": lambda s: s.mean(0)}
        rows = torch.stack([read[classify.positions](s) for s in states]).double()  # (n, d)
        return (unit(rows) if kind == "rms" else rows), torch.tensor([f["labels"] for f in features])

    (train_x, train_y), (dev_x, dev_y), (test_x, test_y) = map(pooled, (train, classify.dev, classify.test))
    found = cross_validated_probe(
        train_x, train_y, folds=FOLDS, seed=classify.settings.seed + trial, classes=3
    )
    dev, test = (
        probe_accuracy(found.probe.predict_proba(x), y) for x, y in ((dev_x, dev_y), (test_x, test_y))
    )
    check_layer(record["layers"][layer - 1], found, dev, test, "accuracy", layer)


@pytest.mark.parametrize("layer", [1, LAYERS])
def test_ner_probe_of_layer_n_is_the_library_s_probe_on_the_labelled_words_scored_by_seqeval(
    ner, paths, layer
):
    """Token-wise: one row per labelled first sub-word of output_hidden_states[n], a sentence's words in
    one fold; the score is seqeval's micro-F1 of the word tags."""
    trial = 0
    train = ner.train_sample(2, trial)
    record = next(r for r in probe_records(ner, 2, [5], trial) if r["features"] == "none")

    def words(features):
        rows, labels, sentences = [], [], []
        for index, (state, feature) in enumerate(
            zip(hidden_states(paths["model"], features, layer), features, strict=True)
        ):
            tags = torch.tensor(feature["labels"])
            read = tags != IGNORE_INDEX
            rows.append(state[read].double())
            labels.append(tags[read])
            sentences.append(torch.full((int(read.sum()),), index))
        return torch.cat(rows), torch.cat(labels), torch.cat(sentences), [len(tags) for tags in labels]

    train_x, train_y, groups, _ = words(train)
    assert record["train_rows"] == len(train_y) and record["folds"] == FOLDS
    found = cross_validated_probe(
        train_x, train_y, folds=FOLDS, seed=ner.settings.seed + trial, groups=groups, classes=len(ner.labels)
    )

    def seqeval_f1(split):
        x, y, _, lengths = words(split)
        predicted = found.probe.predict(x)
        gold = [[ner.id2label[int(i)] for i in tags] for tags in y.split(lengths)]
        return f1_score(gold, [[ner.id2label[int(i)] for i in tags] for tags in predicted.split(lengths)])

    assert ner.dev_reach.out_of_reach == ner.test_reach.out_of_reach == 0  # every gold word is read
    check_layer(record["layers"][layer - 1], found, seqeval_f1(ner.dev), seqeval_f1(ner.test), "f1", layer)


def test_the_probes_choose_their_penalty_on_the_training_sample_alone(classify, monkeypatch):
    """Dev labels turned round move the dev scores and nothing the probes chose."""
    first = list(probe_records(classify, 4, [5], 0))
    flipped = [{**feature, "labels": (feature["labels"] + 1) % 3} for feature in classify.dev]
    monkeypatch.setattr(classify, "dev", flipped)
    second = list(probe_records(classify, 4, [5], 0))
    chosen = ("layer", "penalty", "penalty_on_edge", "cv_accuracy", "cv_loss", "test_accuracy")
    for old, new in zip(first, second, strict=True):
        assert [{k: e[k] for k in chosen} for e in old["layers"]] == [
            {k: e[k] for k in chosen} for e in new["layers"]
        ]
    assert [e["dev_accuracy"] for r in first for e in r["layers"]] != [
        e["dev_accuracy"] for r in second for e in r["layers"]
    ]


def test_a_split_without_examples_scores_none(classify):
    found = probes.trial_probes(classify, classify.train_sample(2, 0), 0)
    scores = probes.split_scores(classify, found.probes, [], "test")
    assert scores == {
        kind: [{"test_accuracy": None, "test_macro_f1": None}] * LAYERS for kind in ("none", "rms")
    }


def _without_timing(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in r.items() if key not in ("seconds", "pid")} for r in records]


def test_probe_records_resume_by_key_and_a_trial_is_fitted_once_for_every_max_epochs(
    classify, tmp_path, monkeypatch
):
    grid = {"shots": [2], "epochs": [2, 5], "trials": 2, "results": str(tmp_path / "results.jsonl")}
    fitted = []
    original = probes.trial_probes

    def counted(experiment, train, trial):
        fitted.append(trial)
        return original(experiment, train, trial)

    monkeypatch.setattr(probes, "trial_probes", counted)
    first = run_probes(classify, grid, progress=False)
    assert fitted == [0, 1]  # once per trial, for both max epochs
    assert [(r["epochs"], r["trial"], r["features"]) for r in first] == [
        (epochs, trial, kind) for epochs in (2, 5) for trial in (0, 1) for kind in ("none", "rms")
    ]
    assert all(r["key"].startswith(f"probe|fe|2|{r['epochs']}|{r['trial']}|{classify.setup}|") for r in first)
    same = [{k: v for k, v in r.items() if k not in ("key", "epochs")} for r in first]
    assert same[:4] == same[4:]  # the max epochs change nothing a probe does
    assert probes_path(grid["results"]) == tmp_path / "results.probes.jsonl"
    assert run_probes(classify, grid, progress=False) == first and fitted == [0, 1]  # nothing fitted again
    assert len(read_records(tmp_path / "results.probes.jsonl")) == len(first)
    again = run_probes(classify, {**grid, "results": str(tmp_path / "again.jsonl")}, progress=False)
    assert _without_timing(again) == _without_timing(first)  # fitted again: the same numbers


def test_a_sample_with_fewer_examples_than_folds_is_cross_validated_one_example_a_fold(paths):
    experiment = ClassifyExperiment(ClassifySettings(model=paths["model"], data=paths["texts"], seed=3))
    record = next(probe_records(experiment, 1, [5], 0))  # 1 shot x 3 classes
    assert record["train_examples"] == 3 and record["folds"] == 3


@pytest.mark.parametrize("task, kept", [("classify", "first"), ("ner", "labelled")])
def test_probes_on_a_prefilled_cache_of_the_head_positions_match_an_every_position_cache(
    paths, tmp_path, task, kept
):
    """A sweep of token-wise methods caches the head's positions only and lets the encoder go after
    the prefill: the probes then read that cache (zeros elsewhere in a batch) and give the records of
    a cache that keeps every position, filled as they come with the encoder alive."""

    def experiment(positions: str):
        common = {"model": paths["model"], "batch_size": 4, "seed": 3}
        plan = SweepPlan(cache_positions=positions)
        if task == "classify":
            return ClassifyExperiment(ClassifySettings(data=paths["texts"], **common), plan=plan)
        return NerExperiment(NerSettings(data=paths["ner"], **common), plan=plan)

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
    assert len(read) == 2 * 2  # 2 trials, 2 kinds
    assert _without_timing(read) == _without_timing(full)  # bitwise: the same states where read


def _probe_record(trial: int, scores: list[tuple[float, float]], kind: str = "none") -> dict:
    layers = [
        {"layer": n, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": dev, "test_f1": test}
        for n, (dev, test) in enumerate(scores, start=1)
    ]
    return {"features": kind, "trial": trial, "shots": 8, "epochs": 5, "metric": "f1", "layers": layers}


def test_the_best_single_layer_is_chosen_on_dev_alone():
    records = [
        _probe_record(0, [(0.5, 0.9), (0.7, 0.2), (0.6, 0.6)]),  # layer 1's test is best: unseen
        _probe_record(0, [(0.4, 0.4), (0.7, 0.3), (0.2, 0.2)], "rms"),  # layer 2 ties on dev: the none kind
        _probe_record(1, [(0.1, 0.1), (0.2, 0.2), (0.3, 0.5)]),
    ]
    expected = {"layer": 2, "penalty": 0.1, "on_edge": False, "dev": 0.7, "test": 0.2, "metric": "f1"}
    assert probes.best_single_layer(records[:2]) == {**expected, "features": "none"}
    assert probes.probe_starts(records) == {(8, 5, 0): 2, (8, 5, 1): 3}
    rms = _probe_record(0, [(0.7, 0.9), (0.71, 0.1), (0.0, 0.0)], "rms")
    assert probes.best_single_layer([records[0], rms])["features"] == "rms"  # 0.71 on dev: either kind
    assert probes.ranked_layers([records[0], rms]) == [2, 1, 3]
    tie = _probe_record(0, [(0.7, 0.9), (0.7, 0.0), (0.0, 0.0)], "rms")
    assert probes.best_single_layer([tie])["layer"] == 1  # a tie across layers: the lower


def test_a_reader_shows_each_probe_guided_run_from_the_block_its_trial_s_probes_pick_now():
    """The file holds trial 0's mix from block 3 (before starts were keyed), from 2 and from 3 again
    (new probes moved the start and moved it back): the probes now say 3, so the newest run from 3 is
    shown. Trial 1 has no probes: its newest run. Runs that start nowhere are all kept."""
    setup = "s"
    cell = probes.Cell(probes.PROBE, probes.PROBE_REGIME, 8, 25, 0)
    probes_now = []
    for kind in ("none", "rms"):
        devs = [0.2, 0.3, 0.6] if kind == "rms" else [0.2, 0.3, 0.4]  # block 3 on z/rms(z)
        layers = [{"layer": n, "dev_f1": d, "test_f1": d} for n, d in enumerate(devs, start=1)]
        key = probes.probe_key(cell, setup, kind)
        probes_now.append({"key": key, "features": kind, "metric": "f1", "layers": layers})

    def run(trial: int, start: int | None, keyed: bool = True, method: str = "layer_mix") -> dict:
        key = f"{method}|fe|8|25|{trial}|lr=0.01|{setup}" + (f"|start={start}" if keyed and start else "")
        fields = {"shots": 8, "epochs": 25, "trial": trial, "setup": setup}
        return {"key": key, **fields} | ({"start_layer": start} if start else {})

    runs = [run(0, 3, keyed=False), run(0, None, method="none"), run(0, 2), run(1, 1), run(0, 3), run(1, 2)]
    shown = probes.current_runs(runs, probes_now)
    assert shown == [runs[1], runs[4], runs[5]]
    moved = [
        {**p, "layers": [{**e, "dev_f1": 0.9 if e["layer"] == 2 else 0.0} for e in p["layers"]]}
        for p in probes_now
    ]
    assert probes.current_runs(runs, moved) == [runs[1], runs[2], runs[5]]  # the probes pick block 2
    other = [{**p, "key": probes.probe_key(cell, "another", p["features"])} for p in moved]
    assert probes.current_runs(runs, other) == [runs[1], runs[4], runs[5]]  # another setup's: no probes


def test_a_report_reads_no_probe_of_a_setup_its_runs_lack_and_each_trial_s_newest_setup():
    """Probes of another setup read other data, model or settings: a bar drawn from them is stale."""
    old = {**_probe_record(0, [(0.5, 0.5), (0.9, 0.2)]), "setup": "old"}  # block 2 on old data
    new = {**_probe_record(0, [(0.6, 0.7), (0.4, 0.4)]), "setup": "new"}  # block 1 now
    gone = {**_probe_record(1, [(0.1, 0.1), (0.8, 0.8)]), "setup": "gone"}  # no run has it
    runs = [{"setup": "new"}, {"setup": "old"}]
    assert probes.current_probes([old, gone, new], runs) == [old, new]
    assert probes.current_probes([old, gone], []) == [old, gone]  # no runs: nothing to match
    best = probes.best_per_trial([old, new])[8, 5, 0]
    assert (best["layer"], best["dev"], best["test"]) == (1, 0.6, 0.7)  # the newest setup, not old's 0.9
    assert probes.best_per_trial([new, old])[8, 5, 0]["layer"] == 2  # file order decides which is newest
