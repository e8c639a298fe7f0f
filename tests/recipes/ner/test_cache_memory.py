"""The feature cache keeps only what is read, once: bitwise the same records as a cache of every
position laid out as before (padded ``(L+1, batch, seq, d)``), memory-mapped shards, half
precision as a keyed option, and a memory model that predicts the bytes exactly."""

from __future__ import annotations

import dataclasses
import gc
import platform
import sys
from pathlib import Path

import pytest
import torch
from conftest import toy_dataset, write_tiny_model
from torch.nn.utils.rnn import pad_sequence

from layerfusion_recipes.core.cache.feature_cache import (
    ALL_POSITIONS,
    FIRST_POSITION,
    LAST_POSITION,
    PROCESS_BYTES,
    CachePlan,
    FeatureCache,
    KeptPositions,
    TrainingPlan,
    memory_check,
    padded_inputs,
    resident_limit,
)
from layerfusion_recipes.core.engine import experiment as experiment_module
from layerfusion_recipes.core.engine import fitting
from layerfusion_recipes.core.engine import runner as runner_module
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.engine.runner import (
    labelled_predictions,
    largest_first,
    padded_tokens,
    predict_labelled,
)
from layerfusion_recipes.core.memory import release_freed_memory, resident_above, resident_bytes
from layerfusion_recipes.ner.experiment import (
    LABELLED_POSITIONS,
    Cell,
    NerExperiment,
    NerSettings,
    cache_positions_for,
    reads_labelled_only,
)
from layerfusion_recipes.ner.models import load_token_classifier
from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.hooks import BlockCapture
from peft_layerfusion.layer import active_fusion_module
from peft_layerfusion.names import PLAIN_HEAD
from peft_layerfusion.registration import ENCODER_METHODS
from peft_layerfusion.utils import eval_mode

METHODS = [PLAIN_HEAD, *(method.name for method in ENCODER_METHODS)]  # every method the NER recipe runs
TIMING = ("seconds", "pid")  # what may differ between two runs of the same record


class PaddedAsBefore(FeatureCache):
    """The layout the cache replayed before it kept positions: every position of a sentence, the
    batch padded with ``pad_sequence`` into ``(batch, seq, L+1, d)`` (``z_0`` in slot 0) and permuted
    to ``(L+1, batch, seq, d)``, built whole for each batch; block ``i`` replays slot ``i + 1`` (the same
    strides as before)."""

    def batch(self, features):
        full = []
        for feature in features:
            states = self.states[self.key_of(feature)]  # (seq, L, d), every position
            full.append(torch.cat([torch.zeros_like(states[:, :1]), states], dim=1))  # (seq, L+1, d)
        return pad_sequence(full, batch_first=True).permute(2, 0, 1, 3)[1:]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _experiment(
    model_path: str, positions: str, dtype: str = "float32", reference: bool = False
) -> NerExperiment:
    settings = NerSettings(
        model=model_path,
        data="toy",
        lr=[3e-3, 3e-2],
        batch_size=4,
        cache_dtype=dtype,
    )
    plan = SweepPlan(cache_positions=positions)
    experiment = NerExperiment(settings, toy_dataset(train=40, dev=10, test=8), plan)
    if reference:
        base = load_token_classifier(model_path, len(experiment.labels), seed=0)
        experiment._cache = PaddedAsBefore(
            base, find_encoder_blocks(base), model_path, settings.max_length, tokenizer=experiment.tokenizer
        )
    return experiment


def _records(experiment: NerExperiment, method: str) -> list[dict]:
    """Two LRs of one cell (trained together where they can be), then one lone run."""
    records = experiment.run_lrs(Cell(method, "fe", shots=3, epochs=3, trial=1), [3e-3, 3e-2])
    records.append(experiment.run(Cell(method, "fe", shots=2, epochs=2, trial=0), lr=1e-2))
    return [{k: v for k, v in record.items() if k not in TIMING} for record in records]


@pytest.fixture(scope="module")
def reference(model_path) -> NerExperiment:
    return _experiment(model_path, "all", reference=True)


@pytest.mark.parametrize("method", METHODS)
def test_records_are_bitwise_those_of_the_cache_of_every_position_padded_as_before(
    model_path, reference, method
):
    before = _records(reference, method)
    positions = cache_positions_for([method])
    now = _experiment(model_path, positions)
    assert now.cache().positions.name == ("labelled" if reads_labelled_only(method) else "all")
    assert _records(now, method) == before  # every field: curves, best epochs, test F1, depth attention


def test_the_labelled_cache_keeps_only_the_labelled_positions_and_refuses_r_n(model_path):
    everything, labelled = _experiment(model_path, "all"), _experiment(model_path, "labelled")
    feature = labelled.dev[0]
    kept = labelled.cache().key_of(feature)[1]
    assert kept == tuple(i for i, label in enumerate(feature["labels"]) if label != -100)
    assert 0 < len(kept) < len(feature["input_ids"])  # [CLS], [SEP] (and later sub-words) left out
    full = everything.cache().states[everything.cache().key_of(feature)]  # (seq, L, d)
    assert torch.equal(labelled.cache().states[(tuple(feature["input_ids"]), kept)], full[list(kept)])
    assert labelled.cache().nbytes < 0.8 * everything.cache().nbytes
    with pytest.raises(ValueError, match="extra_layers reads every position"):
        labelled.run(Cell("extra_layers", "fe", shots=2, epochs=1, trial=0), lr=1e-2)


def test_a_batch_is_padded_on_the_fly_with_zeros_where_nothing_was_kept(model_path):
    experiment = _experiment(model_path, "labelled")
    cache, features = experiment.cache(), experiment.dev[:3]
    states = cache.batch_states(features)  # (L, batch, seq, d)
    assert states.dtype == torch.float32 and states.shape[:2] == (3, 3)
    for row, feature in enumerate(features):
        kept = list(cache.key_of(feature)[1])
        assert torch.equal(states[:, row, kept], cache.states[cache.key_of(feature)].transpose(0, 1))
        others = [p for p in range(states.shape[2]) if p not in kept]
        assert states[:, row, others].abs().sum() == 0
    assert not hasattr(cache, "_padded")  # nothing kept between calls
    assert cache.batch_states(features) is not states
    batch = cache.batch(features)  # what a replay reads: one block at a time, the same numbers
    assert batch.shape == states.shape
    for index in range(states.shape[0]):
        assert torch.equal(batch.block(index), states[index]) and batch.block(index).is_contiguous()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_is_stored_in_two_bytes_cast_back_and_keyed(model_path, dtype):
    exact, half = _experiment(model_path, "labelled"), _experiment(model_path, "labelled", dtype)
    feature = exact.dev[0]
    key = exact.cache().key_of(feature)
    stored = half.cache().states[key]
    assert stored.dtype == getattr(torch, dtype) and half.cache().nbytes * 2 == exact.cache().nbytes
    assert torch.equal(stored, exact.cache().states[key].to(stored.dtype))  # rounded once, from float32
    batch = half.cache().batch_states([feature])
    assert batch.dtype == torch.float32 and torch.equal(
        batch[:, 0, list(key[1])], stored.float().transpose(0, 1)
    )
    assert half.cache().key != exact.cache().key  # never served from a file of the other precision
    assert half.settings.setup() != exact.settings.setup()
    assert half.settings.setup_fields()["cache_dtype"] == dtype
    assert exact.settings.setup_fields()["cache_dtype"] == "float32"  # the default is in the setup too
    record = half.run(Cell("concat", "fe", shots=2, epochs=2, trial=0), lr=1e-2)
    assert record["settings"]["cache_dtype"] == dtype and record["setup"] == half.setup


def test_the_cache_dtype_is_part_of_the_setup():
    base = NerSettings(model="m", data="d")
    assert base.setup_fields()["cache_dtype"] == "float32"
    assert dataclasses.replace(base, cache_dtype="float32").setup() == base.setup()
    assert dataclasses.replace(base, cache_dtype="bfloat16").setup() != base.setup()


def test_a_bad_cache_dtype_is_one_line_naming_the_allowed_ones(model_path):
    with pytest.raises(ValueError, match=r"--cache-dtype 'half': allowed float32, bfloat16, float16"):
        _experiment(model_path, "all", dtype="half")


@pytest.mark.parametrize("positions", ["all", "labelled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_memory_model_predicts_the_bytes_the_cache_holds(model_path, positions, dtype):
    experiment = _experiment(model_path, positions, dtype)
    cells = [
        Cell(m, "fe", shots, 2, trial) for m in ("none", "dwatt") for shots in (2, 3) for trial in (0, 1)
    ]
    plan = experiment.cache_plan([*cells, Cell("none", "ft", 8, 2, 0)])
    assert plan is not None and experiment.cache_plan([Cell("none", "ft", 8, 2, 0)]) is None
    for cell in cells:
        experiment.filled_cache(experiment.train_sample(cell.shots, cell.trial), cell)
    cache = experiment.cache()
    assert (plan.sentences, plan.nbytes) == (len(cache), cache.nbytes)
    assert (plan.num_blocks, plan.width, plan.kept) == (3, 32, positions)
    assert plan.model_bytes == sum(p.nbytes for p in cache.base_model.parameters()) > 0
    assert plan.with_dtype("bfloat16").nbytes == plan.nbytes // (2 if dtype == "float32" else 1)


def test_the_memory_model_says_its_arithmetic():
    plan = CachePlan(4000, 60000, 12, 768, "float32", "labelled", model_bytes=440_000_000)
    assert plan.nbytes == 60000 * 12 * 768 * 4
    assert plan.describe() == (
        "feature cache: 4000 sentences, 60000 labelled positions x 12 blocks x 768 x 4 B (float32) "
        "= 2.21 GB, model 0.44 GB"
    )


def test_the_resident_limit_leaves_out_states_mapped_from_a_cache_directory():
    plan = CachePlan(4000, 60000, 12, 768, "float32", "labelled", model_bytes=440_000_000)
    held = resident_limit(plan)
    assert held == PROCESS_BYTES + 440_000_000 + plan.nbytes
    assert resident_limit(plan, mapped=True) == held - plan.nbytes  # their pages leave as they are read


def test_a_sentence_task_keeps_its_pooled_position_or_every_one():
    feature = {"input_ids": [101, 7, 8, 9, 102]}
    assert FIRST_POSITION.of(feature) == (0,) and LAST_POSITION.of(feature) == (4,)
    assert ALL_POSITIONS.of(feature) == (0, 1, 2, 3, 4)
    assert LABELLED_POSITIONS.of({**feature, "labels": [-100, 3, -100, 0, -100]}) == (1, 3)
    assert isinstance(LABELLED_POSITIONS, KeptPositions)


def _mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose mapping holds ``tensor``'s data (``/proc/self/maps``), or ``None``."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        start, end = (int(part, 16) for part in span.split("-"))
        if start <= address < end:
            return rest[-1] if len(rest) >= 5 and rest[-1].startswith("/") else None  # not [heap], [anon]
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_with_a_directory_the_states_are_served_memory_mapped_from_the_shards(tmp_path, model_path):
    experiment = _experiment(model_path, "labelled")
    base = load_token_classifier(model_path, len(experiment.labels), seed=0)
    writer = FeatureCache(
        base, find_encoder_blocks(base), model_path, 128, tmp_path, positions=LABELLED_POSITIONS
    )
    assert writer.fill(experiment.dev) == len(experiment.dev)
    reader = FeatureCache(
        base, find_encoder_blocks(base), model_path, 128, tmp_path, positions=LABELLED_POSITIONS
    )
    (shard,) = writer.path.glob("*.safetensors")
    for cache in (writer, reader):  # the writer's own copies in memory were replaced by the file
        assert {_mapped_file(states) for states in cache.states.values()} == {str(shard)}
    memory = FeatureCache(base, find_encoder_blocks(base), model_path, 128, positions=LABELLED_POSITIONS)
    memory.fill(experiment.dev)
    for key, value in memory.states.items():
        assert torch.equal(reader.states[key], value)
    assert _mapped_file(next(iter(memory.states.values()))) is None  # no directory: plain memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps, madvise")
def test_with_a_directory_the_shards_pages_leave_the_process_every_mapped_bytes_held(
    tmp_path, model_path, monkeypatch
):
    from layerfusion_recipes.core.cache import feature_cache

    experiment = _experiment(model_path, "all")
    base = load_token_classifier(model_path, len(experiment.labels), seed=0)
    mapped = FeatureCache(base, find_encoder_blocks(base), model_path, 128, tmp_path)
    memory = FeatureCache(base, find_encoder_blocks(base), model_path, 128)
    for cache in (mapped, memory):
        cache.fill(experiment.dev, batch_size=4)
    (shard,) = mapped.path.glob("*.safetensors")
    dropped, drop = [], feature_cache.drop_mapped_pages
    monkeypatch.setattr(feature_cache, "drop_mapped_pages", lambda got: dropped.append(got) or drop(got))
    batches = [experiment.dev[i : i + 2] for i in range(0, len(experiment.dev), 2)]  # 5 batches
    served = [sum(mapped.states[mapped.key_of(f)].nbytes for f in batch) for batch in batches]
    for held, drops in ((sum(served), 0), (min(served) - 1, len(batches))):  # never; after every batch
        monkeypatch.setattr(feature_cache, "MAPPED_BYTES_HELD", held)
        mapped.pages_dropped, dropped[:] = 0, []
        for batch in batches:
            assert torch.equal(mapped.batch(batch).stacked(), memory.batch(batch).stacked())  # read again
        assert mapped.pages_dropped == len(dropped) == drops and memory.pages_dropped == 0
    assert dropped[0] == [feature_cache.mapped_range(next(iter(mapped.states.values())), shard)]


def test_a_fill_writes_a_shard_every_flush_bytes(tmp_path, model_path, monkeypatch):
    from layerfusion_recipes.core.cache import feature_cache

    experiment = _experiment(model_path, "all")
    base = load_token_classifier(model_path, len(experiment.labels), seed=0)
    one_batch = 3 * 32 * 4 * sum(len(f["input_ids"]) for f in experiment.dev[:4])  # L x d x 4 B x positions
    monkeypatch.setattr(feature_cache, "FLUSH_BYTES", one_batch)
    cache = FeatureCache(base, find_encoder_blocks(base), model_path, 128, tmp_path)
    assert cache.fill(experiment.dev, batch_size=4) == 10
    assert len(list(cache.path.glob("*.safetensors"))) == 3  # batches of 4, 4 (a shard each) and 2
    assert len(FeatureCache(base, find_encoder_blocks(base), model_path, 128, tmp_path)) == 10


def test_a_fill_gives_the_heaps_freed_pages_back_after_every_batch(model_path, monkeypatch):
    """Each batch's activations are freed between the states the cache keeps, which pin the heap's
    pages: glibc returns them only when trimmed (13 x 768: the fill's peak RSS, 3.62-3.73 GB in three
    sweeps, 3.56-3.58 GB with the trims; the states 2.32 GB)."""
    from layerfusion_recipes.core.cache import feature_cache

    calls: list[int] = []
    monkeypatch.setattr(feature_cache, "release_freed_memory", lambda: calls.append(1) or True)
    experiment = _experiment(model_path, "labelled")
    base = load_token_classifier(model_path, len(experiment.labels), seed=0)
    cache = FeatureCache(
        base, find_encoder_blocks(base), model_path, 128, positions=experiment.kept_positions()
    )
    assert cache.fill(experiment.dev, batch_size=4) == 10 and len(calls) == 3  # batches of 4, 4 and 2


# ----------------------------------------------------------------------------- the memory check


def test_a_cache_that_cannot_fit_is_refused_naming_what_would_make_it_fit():
    plan = CachePlan(5000, 100_000, 24, 1024, "float32", "labelled", model_bytes=1_300_000_000)  # 9.83 GB
    line, refusal = memory_check(plan, copies=1, mapped=False, available=8 * 10**9)
    # + the process's own 0.6 GB
    assert line.endswith(
        "9.83 GB, model 1.30 GB; process 0.60 GB; 1 process(es) hold 11.73 GB in memory; 8.00 GB available"
    )
    assert refusal == (
        "the sweep needs 11.73 GB in memory (5000 sentences, 100000 labelled positions x 24 blocks "
        "x 1024 x 4 B (float32) = 9.83 GB, model 1.30 GB; process 0.60 GB; x 1 process(es)) but 8.00 GB "
        "is available; it fits with --cache-dtype bfloat16 (6.82 GB), --cache-dir DIR (memory-mapped, "
        "shared by the workers, paged from disk when short), fewer evaluation sentences (--dev-limit, "
        "--test-limit) or --no-cache"
    )
    assert memory_check(plan, 1, mapped=False, available=12 * 10**9)[1] is None
    _, two = memory_check(plan, copies=2, mapped=False, available=12 * 10**9)
    assert "--workers 1 (11.73 GB)" in two and "bfloat16" not in two  # two halves need 13.63 GB
    line, mapped = memory_check(plan, copies=2, mapped=True, available=4 * 10**9)  # states paged
    assert mapped is None and "one copy for 2 process(es); 2 process(es) hold 3.80 GB besides" in line
    _, short = memory_check(plan, 1, mapped=True, available=10**9)  # not even the model and the process
    assert short.endswith("is available; it fits with --no-cache")
    assert memory_check(plan, 1, mapped=False, available=None)[1] is None  # unknown: not refused


def test_the_memory_model_adds_the_training_state_and_offers_passes_of_fewer_candidates():
    plan = CachePlan(5000, 100_000, 24, 1024, "float32", "labelled", model_bytes=1_300_000_000)
    training = TrainingPlan("dwatt", 27_400_000, 7, 7)  # DWAtt at 25 states x 1024
    assert training.nbytes == 20 * 7 * 27_400_000  # 3.84 GB
    line, refusal = memory_check(plan, 1, mapped=False, available=14 * 10**9, training=training)
    assert line == (
        "feature cache: 5000 sentences, 100000 labelled positions x 24 blocks x 1024 x 4 B (float32) = "
        "9.83 GB, model 1.30 GB; training 7 of 7 LRs per pass x 27.40M dwatt parameters x 20 B = 3.84 GB; "
        "process 0.60 GB; 1 process(es) hold 15.57 GB in memory; 14.00 GB available"
    )
    # 14 - 11.73 GB leaves room for 4 candidates of 0.55 GB: --train-memory 2.20 GB trains passes of 4
    assert "bfloat16 (10.65 GB), --train-memory 2.20 (passes of 4 LR candidates, 13.92 GB)," in refusal
    assert memory_check(plan, 1, False, 14 * 10**9, dataclasses.replace(training, per_pass=4))[1] is None
    _, two = memory_check(plan, 2, mapped=False, available=30 * 10**9, training=training)
    assert "--train-memory 2.74 (passes of 5 LR candidates, 28.94 GB)" in two  # 5 x 0.55 GB per process
    _, lone = memory_check(plan, 1, False, 12 * 10**9, dataclasses.replace(training, per_pass=1))
    assert "--train-memory" not in lone  # one candidate per pass already


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage alive in this process (each storage once)."""
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def test_the_memory_line_holds_what_an_r_n_run_on_a_decoder_holds(tmp_path, monkeypatch):
    """R+n on a decoder whose embeddings are most of it (Gemma 3's way): what the process holds while
    the run's model is built (sampled at every tensor it copies) and at every training step (values,
    gradients, AdamW moments), beside the cache, stays within the memory line's model, states and
    training state. Building R+n once copied the whole model (the fusion's hooks reach the container),
    a model more than the line counted."""
    from conftest import write_tiny_decoder
    from transformers import AutoModelForCausalLM

    path = write_tiny_decoder(tmp_path / "decoder")
    model = AutoModelForCausalLM.from_pretrained(path)
    model.resize_token_embeddings(20_000)  # 0.64M of its 0.66M parameters: the embeddings
    model.save_pretrained(path)
    settings = NerSettings(model=path, data="toy", max_length=64, batch_size=4, head_modules=("score",))
    experiment = NerExperiment(settings, toy_dataset(train=20, dev=6, test=6))
    cell = Cell("extra_layers", "fe", shots=2, epochs=1, trial=0)
    plan, training = experiment.cache_plan([cell]), experiment.training_plan([cell])
    experiment.prefill_cache([cell])  # the encoder that filled the cache goes, as in a sweep
    gc.collect()
    before = live_tensor_bytes()  # the cache's states, and what other tests left alive
    held = []
    original = torch.nn.Parameter.__deepcopy__
    monkeypatch.setattr(
        torch.nn.Parameter,
        "__deepcopy__",
        lambda self, memo: (held.append(live_tensor_bytes()), original(self, memo))[1],
    )
    step = fitting.TrainingLoop.step
    monkeypatch.setattr(
        fitting.TrainingLoop,
        "step",
        lambda loop, loss: (held.append(live_tensor_bytes()), step(loop, loss))[1],
    )
    experiment.run(cell, lr=1e-2)
    line = plan.model_bytes + training.nbytes  # the line but the process's own bytes and the states
    assert held and max(held) - before <= line, (max(held) - before, line)


@pytest.fixture()
def cli_run(tmp_path, model_path):
    from conftest import write_toy_data

    data = write_toy_data(tmp_path / "data", train=40, dev=10, test=8)
    return [
        "sweep", "--model", model_path, "--data", data, "--methods", "none", "concat", "--shots", "2",
        "--epochs", "1", "--trials", "1", "--lr", "1e-2", "--output", str(tmp_path / "out"), "--quiet",
    ]  # fmt: skip


def test_dry_run_prints_the_bytes_alone_and_runs_nothing(tmp_path, cli_run, capsys):
    from layerfusion_recipes.cli import main

    assert main([*cli_run, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "runs planned: 2" in out
    assert "labelled positions x 3 blocks x 32 x 4 B (float32)" in out and "available" in out
    assert "training 1 of 1 LRs per pass x " in out and "; process 0.60 GB; 1 process(es) hold" in out
    assert not (tmp_path / "out").exists()  # no results, no sweeps.jsonl
    assert main([*cli_run, "--lr", "1e-2", "1e-3", "--dry-run"]) == 0
    assert "training 2 of 2 LRs per pass" in capsys.readouterr().out
    assert main([*cli_run, "--lr", "1e-2", "1e-3", "--train-memory", "1e-9", "--dry-run"]) == 0
    assert "training 1 of 2 LRs per pass" in capsys.readouterr().out  # a budget below one candidate: 1


def test_a_sweep_prints_the_bytes_then_refuses_one_line_when_they_cannot_fit(
    tmp_path, cli_run, monkeypatch, capsys
):
    from layerfusion_recipes.cli import main
    from layerfusion_recipes.core.sweeps import sweep
    from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log

    monkeypatch.setattr(sweep, "available_memory", lambda: 1000)
    assert main(cli_run) == 2
    err = capsys.readouterr().err
    assert "error: the sweep needs" in err and "it fits with --cache-dir DIR" in err
    assert "training 1 of 1 LRs per pass x " in err and " concat parameters x 20 B" in err
    assert not (tmp_path / "out" / "results.jsonl").exists()
    monkeypatch.setattr(sweep, "available_memory", lambda: 10**12)
    limits, fit = [], experiment_module.fit
    monkeypatch.setattr(experiment_module, "fit", lambda *a: limits.append(a[3].release_above) or fit(*a))
    assert main([*cli_run, "--cache-dtype", "bfloat16"]) == 0
    assert "labelled positions x 3 blocks x 32 x 2 B (bfloat16)" in capsys.readouterr().err
    (line,) = [entry for entry in read_sweep_log(tmp_path / "out" / "sweeps.jsonl") if entry["completed"]]
    assert line["cache_bytes"] > 0 and line["cache_model_bytes"] > 0
    # every run trims after a step that leaves it above the line: process, model, states, training
    held = PROCESS_BYTES + line["cache_bytes"] + line["cache_model_bytes"]
    assert len(limits) == 2 and limits[0] == limits[1] and held < limits[0] < held + 10**6


def test_a_fill_keeps_bitwise_what_the_block_capture_sees_at_the_kept_positions(model_path):
    experiment = _experiment(model_path, "labelled")
    cache = experiment.cache()  # dev + test, one fill batch (fewer than 64 sentences)
    features = list({cache.key_of(f): f for f in [*experiment.dev, *experiment.test]}.values())
    captured = []
    capture = BlockCapture(cache.located, captured.append)
    ids, mask = padded_inputs(features)
    with torch.no_grad():
        cache.base_model.eval()(input_ids=ids, attention_mask=mask)
    capture.remove()
    states = torch.stack(captured[0].states[1:], dim=2)  # z_1 .. z_L: (batch, seq, L, d)
    for row, feature in enumerate(features):
        key = cache.key_of(feature)
        assert torch.equal(cache.states[key], states[row, list(key[1])])


def test_a_prefilled_cache_lets_its_encoder_go_and_gives_the_same_records(model_path):
    cells = [
        Cell(m, "fe", shots, epochs, trial)
        for m in ("dwatt", "none")
        for shots, epochs, trial in ((3, 3, 1), (2, 2, 0))
    ]
    lazy, prefilled = _experiment(model_path, "labelled"), _experiment(model_path, "labelled")
    prefilled.prefill_cache(
        [*cells, Cell("concat", "ft", 8, 1, 0)]
    )  # what _records runs, and an uncached cell
    cache = prefilled.cache()
    assert cache.base_model is None and cache.located is None  # the encoder's weights are gone
    for method in ("dwatt", "none"):
        assert _records(prefilled, method) == _records(lazy, method)
    with pytest.raises(RuntimeError, match="encoder was released"):
        cache.fill(prefilled.train_sample(4, 3))  # a sample no cell reads


def test_evaluation_runs_its_largest_batch_first_and_predicts_in_order(model_path, monkeypatch):
    """The heap keeps what a batch frees and reuses it for requests that fit: evaluation batches in
    growing order (the sets are sorted by length) grew it by every batch's working set (1.2 GB over
    CoNLL-2003's test split with seven stacked DWAtt candidates); largest first it holds one, and
    what each batch freed is given back before the next (its blocks' states come and go one by one)."""
    experiment = _experiment(model_path, "labelled")
    model, located = experiment.build(Cell("dwatt", "fe", shots=2, epochs=1, trial=0))
    runner = experiment.runner(model, located, experiment.cache(), count=3)
    features = experiment.dev  # sorted by length, shortest first
    seen: list[int] = []
    logits_of = runner.logits
    runner.logits = lambda batch, device: (seen.append(padded_tokens(batch)), logits_of(batch, device))[1]
    monkeypatch.setattr(runner_module, "release_freed_memory", lambda: seen.append(0) or True)
    cpu = torch.device("cpu")
    predicted = predict_labelled(runner, features, 4, cpu, release_above=0)  # (3, labelled)
    in_order = [padded_tokens(features[start : start + 4]) for start in range(0, len(features), 4)]
    assert len(set(in_order)) == len(in_order) and in_order[0] == min(in_order)  # shortest sentences first
    largest_first_sizes = sorted(in_order, reverse=True)
    # the largest first, a trim after each and one at the end
    assert seen == [x for size in largest_first_sizes for x in (size, 0)] + [0]
    seen.clear()
    assert torch.equal(predict_labelled(runner, features, 4, cpu), predicted)
    assert seen == [*largest_first_sizes, 0]  # by default: one trim, at the end
    if resident_bytes() is not None:  # a limit: a trim after each batch that leaves the process above it
        for limit, trims in ((2**62, 1), (resident_bytes() // 2, len(in_order) + 1)):
            seen.clear()
            assert torch.equal(predict_labelled(runner, features, 4, cpu, release_above=limit), predicted)
            assert seen.count(0) == trims, limit
    with torch.no_grad(), eval_mode(runner.model):  # the batches one after another, as before
        batches = (features[start : start + 4] for start in range(0, len(features), 4))
        expected = [labelled_predictions(*logits_of(batch, torch.device("cpu"))) for batch in batches]
    assert predicted.shape[0] == 3 and torch.equal(predicted, torch.cat(expected, dim=-1))


def test_largest_first_covers_every_example_once_ties_in_order():
    lengths = (2, 3, 9, 4, 5, 1, 3, 3)
    batches = largest_first([{"input_ids": [0] * n} for n in lengths], 2)
    assert batches == [slice(2, 4), slice(4, 6), slice(0, 2), slice(6, 8)]  # 18, 10, 6, 6 padded tokens
    assert largest_first([], 2) == []


def test_every_epoch_gives_the_heaps_freed_pages_back(model_path, monkeypatch):
    """glibc's heap kept what a stacked DWAtt run freed (2.4 GB free held after one run of the
    MiniLM sweep, in use 0.8 GB): the loop trims it after every epoch's steps (before its evaluation)
    and at the end of a run; after a training step too when the process is above its resident limit
    (a sweep's memory line), and with a memory budget (``--train-memory``) after every step (what a
    step frees does not fit the next one's tensors: 0.8 GB held between the steps of seven DWAtt
    candidates at 13 x 768), at the price of the pages the next step faults in again. The records are
    the same."""
    calls: list[int] = []
    monkeypatch.setattr(fitting, "release_freed_memory", lambda: calls.append(1) or True)
    experiment = _experiment(model_path, "labelled")
    steps = -(-len(experiment.train_sample(2, 0)) // experiment.settings.batch_size)  # per epoch
    assert steps > 1
    cell, lrs = Cell("dwatt", "fe", shots=2, epochs=3, trial=0), [3e-3, 3e-2]
    records = {}
    resident = resident_bytes()
    below, above = (2**62, 1) if resident is None else (2 * resident, resident // 2)
    # (--train-memory, resident limit) -> trims after the steps
    cases = {(None, None): 0, (10.0, None): 3 * steps, (None, below): 0, (None, above): 3 * steps}
    if resident is None:  # not Linux: no limit can be tested against
        cases = {case: trims for case, trims in cases.items() if case[1] is None}
    for (budget, limit), step_trims in cases.items():
        calls.clear()
        experiment.settings = dataclasses.replace(experiment.settings, train_memory=budget)
        experiment.plan = SweepPlan(cache_positions="labelled", resident_limit=limit)
        runs = experiment.run_lrs(cell, lrs)
        records[budget, limit] = [{k: v for k, v in r.items() if k not in TIMING} for r in runs]
        assert len(calls) == step_trims + 3 + 1, (budget, limit)
    assert all(runs == records[None, None] for runs in records.values())
    assert records[None, None][0]["test_f1"] is not None
    assert resident_above(0) and not resident_above(None) and not resident_above(2**62)
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert release_freed_memory() is True


# ----------------------------------------------------------------------------- evaluation in groups


@pytest.mark.parametrize("method", ["dwatt", "concat"])
def test_stacked_candidates_evaluated_one_at_a_time_give_bitwise_the_same_records(
    model_path, method, monkeypatch
):
    """Evaluation runs the stacked candidates in groups bounded by a byte budget; a budget below one
    candidate's working set runs each alone (three groups per batch), and every record is the same."""
    lrs = [3e-3, 1e-2, 3e-2]
    cell = Cell(method, "fe", shots=3, epochs=3, trial=1)

    def records() -> list[dict]:
        runs = _experiment(model_path, "labelled").run_lrs(cell, lrs)
        return [{k: v for k, v in record.items() if k not in TIMING} for record in runs]

    together = records()
    sizes: list[int] = []
    groups_of = runner_module.candidate_groups
    monkeypatch.setattr(
        runner_module, "candidate_groups", lambda n, size: sizes.append(size) or groups_of(n, size)
    )
    monkeypatch.setattr(runner_module, "EVALUATION_BYTES", 1)
    assert records() == together
    assert set(sizes) == {1, 3}  # evaluation one candidate at a time, training all three together
    assert together[0]["test_f1"] is not None and len({r["best_f1"] for r in together}) > 1


@pytest.mark.parametrize(
    "method, held", [("none", 1), ("average", 2), ("scalar_mix", 2), ("concat", 4), ("dwatt", 4)]
)
def test_a_candidates_evaluation_bytes_follow_what_its_method_holds(model_path, method, held):
    """The plain head holds the head's input, Average and ScalarMix a running sum and one weighted state,
    Concat and DWAtt a bound growing with the states (z_0 .. z_3 here): per fused position, float32,
    d = 32. Cheap methods run every candidate in one evaluation forward (7 groups, each replaying every
    block again, made Average's evaluations 3.4x slower at 13 x 768)."""
    experiment = _experiment(model_path, "labelled")
    model, located = experiment.build(Cell(method, "fe", shots=2, epochs=1, trial=0))
    runner = experiment.runner(model, located, experiment.cache(), count=7)
    assert runner.position_bytes == held * 32 * 4
    runner.fused_count = runner_module.EVALUATION_BYTES // (7 * 2 * 32 * 4)  # 7 candidates of Average fit
    assert runner.evaluation_group_size() == {1: 7, 2: 7, 4: 3}[held]


def test_an_evaluation_forward_runs_as_many_candidates_as_the_byte_budget_holds(model_path, monkeypatch):
    experiment = _experiment(model_path, "labelled")
    model, located = experiment.build(Cell("dwatt", "fe", shots=2, epochs=1, trial=0))
    runner = experiment.runner(model, located, experiment.cache(), count=5)
    for k, candidate in enumerate(runner.candidates):  # five different candidates
        for parameter in candidate:
            parameter.data.add_(torch.randn_like(parameter), alpha=0.1 * (k + 1))
    assert runner.position_bytes == (3 + 1) * 32 * 4  # z_0 .. z_3 of width 32 in float32
    features, cpu = experiment.dev[-4:], torch.device("cpu")
    calls: list[int] = []  # forwards of the fusion module: one per vmapped group
    active_fusion_module(runner.model).register_forward_pre_hook(lambda *_: calls.append(1))
    monkeypatch.setattr(runner_module, "EVALUATION_BYTES", 10**12)
    with torch.no_grad(), eval_mode(runner.model):
        together, labels = runner.logits(features, cpu)
    positions = int((labels != -100).sum())
    assert (runner.groups_run, len(calls)) == (1, 1) and runner.fused_count == positions
    monkeypatch.setattr(runner_module, "EVALUATION_BYTES", 2 * positions * runner.position_bytes)
    with torch.no_grad(), eval_mode(runner.model):
        grouped, _ = runner.logits(features, cpu)  # groups of 2, 2 and 1
    assert (runner.evaluation_group_size(), runner.groups_run, len(calls)) == (2, 3, 4)
    assert together.shape[0] == 5 and torch.equal(grouped, together)
    assert not torch.equal(together[0], together[4])
    runner.logits(features, cpu)  # training: every candidate in one forward, whatever the budget
    assert (runner.groups_run, len(calls)) == (1, 5)
