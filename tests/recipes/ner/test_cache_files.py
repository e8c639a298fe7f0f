"""Feature cache files: content key, safe shards, damaged shards, temporary files, kill -9 mid-fill."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cache_crash_driver import CELL, crash_data, crash_settings
from conftest import WORDS, toy_dataset, wordpiece_tokenizer, write_tiny_model

from layerfusion_recipes.core.cache import cache_files
from layerfusion_recipes.core.cache.cache_files import feature_key, remove_stale_temp_files
from layerfusion_recipes.core.cache.feature_cache import FeatureCache
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from layerfusion_recipes.ner.models import load_token_classifier
from peft_layerfusion.discovery import find_encoder_blocks

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def experiment(model_path) -> NerExperiment:
    return NerExperiment(NerSettings(model=model_path, data="toy", batch_size=4), toy_dataset(dev=8))


def _cache(experiment: NerExperiment, directory) -> FeatureCache:
    base = load_token_classifier(experiment.settings.model, len(experiment.labels), seed=0)
    located = find_encoder_blocks(base)
    model = experiment.settings.model
    return FeatureCache(base, located, model, 128, directory, tokenizer=experiment.tokenizer)


def _uncached_states(model_path: str, input_ids: list[int]) -> torch.Tensor:
    """``z_1 .. z_L`` of one sentence computed by the model itself: ``(seq, L, d)``."""
    base = load_token_classifier(model_path, 3, seed=0).eval()
    with torch.no_grad():
        hidden = base.base_model(input_ids=torch.tensor([input_ids]), output_hidden_states=True).hidden_states
    return torch.stack(hidden[1:], dim=2)[0]


# ----------------------------------------------------------------------------- key (point 11)


def test_new_weights_saved_at_the_same_path_are_not_served_old_features(tmp_path):
    path = write_tiny_model(tmp_path / "model", seed=0)
    settings = NerSettings(model=path, data="toy", lr=3e-2, batch_size=4, cache_dir=str(tmp_path))
    data = toy_dataset(train=20, dev=6)
    old = NerExperiment(settings, data)
    old_states = dict(old.cache().states)
    write_tiny_model(tmp_path / "model", seed=1)  # fine-tuned weights saved over the old ones
    new = NerExperiment(settings, data)
    key = new.cache().key_of(new.dev[0])
    assert new.cache().key != old.cache().key
    fresh = _uncached_states(path, new.dev[0]["input_ids"])  # what --no-cache computes
    torch.testing.assert_close(new.cache().states[key], fresh, atol=1e-5, rtol=0)
    assert (old_states[key] - fresh).abs().max() > 0.1  # the old features really differ
    cell = Cell("concat", "fe", shots=3, epochs=3, trial=0)
    cached, plain = new.run(cell, use_cache=True), new.run(cell, use_cache=False)
    assert cached["cached"] and not plain["cached"]
    assert [p["dev_f1"] for p in cached["curve"]] == [p["dev_f1"] for p in plain["curve"]]


def test_a_weights_file_is_fingerprinted_by_all_its_bytes_not_its_time(tmp_path):
    """A model installed again (the same bytes, a new modification time) keeps its records' setup; one
    byte changed anywhere in a file of GB-scale proportions (over 64 MB, once sampled in 32 chunks) is
    seen."""
    weights = tmp_path / "model.safetensors"
    with open(weights, "wb") as handle:
        handle.truncate(65 * 2**20)  # sparse zeros
    first = cache_files.file_fingerprint(weights)
    os.utime(weights, ns=(1, 1))
    assert cache_files.file_fingerprint(weights) == first
    with open(weights, "r+b") as handle:
        handle.seek(12_345_678)  # between two of the chunks the sampling read
        handle.write(b"\x01")
    os.utime(weights, ns=(2, 2))
    assert cache_files.file_fingerprint(weights) != first


def test_key_follows_weights_tokenizer_and_length_not_the_head_or_the_name(model_path):
    tokenizer = wordpiece_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    other_tokenizer = wordpiece_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "zurich"])
    base = load_token_classifier(model_path, 3, seed=0)
    key = feature_key(base, tokenizer, 128, 3)
    assert feature_key(load_token_classifier(model_path, 9, seed=5), tokenizer, 128, 3) == key  # head
    assert feature_key(base, other_tokenizer, 128, 3) != key
    assert feature_key(base, tokenizer, 64, 3) != key
    with torch.no_grad():
        base.base_model.encoder.layer[1].output.dense.weight[0, 0] += 1e-3  # one weight changes
    assert feature_key(base, tokenizer, 128, 3) != key


# ----------------------------------------------------------------------------- shard files (point 14)


class _Payload:
    """Unpickling this creates ``marker``: stands for code execution from a crafted file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_crafted_shard_executes_nothing_and_is_removed(tmp_path, experiment, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # seen in the wild
    cache = _cache(experiment, tmp_path)
    cache.fill(experiment.dev[:2])
    marker = tmp_path / "executed"
    for name in ("shard-evil.pt", "shard-evil.safetensors"):
        (cache.path / name).write_bytes(pickle.dumps({"states": _Payload(marker)}))
    with pytest.warns(RuntimeWarning, match="shard-evil.safetensors"):
        reloaded = _cache(experiment, tmp_path)
    assert not marker.exists()
    assert len(reloaded) == 2 and not (cache.path / "shard-evil.safetensors").exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "foreign key"])
def test_a_damaged_shard_is_named_removed_and_recomputed(tmp_path, experiment, damage):
    cache = _cache(experiment, tmp_path)
    assert cache.fill(experiment.dev[:5]) == 5
    (shard,) = cache.path.glob("*.safetensors")
    data = shard.read_bytes()
    # the writer serves its states from the shard (memory-mapped): copies, before the file is damaged
    written = {key: value.clone() for key, value in cache.states.items()}
    del cache  # touching a mapping of a file truncated in place would be a bus error (SIGBUS)
    if damage == "foreign key":
        cache_files.write_shard(shard, list(written), torch.cat(list(written.values())), "0" * 16)
    else:
        shard.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    with pytest.warns(RuntimeWarning, match=shard.name):
        reloaded = _cache(experiment, tmp_path)
    assert len(reloaded) == 0 and not shard.exists()
    assert reloaded.fill(experiment.dev[:5]) == 5  # recomputed
    for key, value in written.items():
        torch.testing.assert_close(reloaded.states[key], value, atol=0, rtol=0)
    assert len(_cache(experiment, tmp_path)) == 5  # the new shard is sound


def test_a_failed_write_leaves_no_temporary_file(tmp_path, experiment, monkeypatch):
    def disk_full(tensors, path, metadata=None):
        Path(path).write_bytes(b"x" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_files, "save_file", disk_full)
    cache = _cache(experiment, tmp_path)
    with pytest.raises(OSError, match="No space"):
        cache.fill(experiment.dev[:3])
    assert list(cache.path.iterdir()) == []


def test_only_temporary_files_of_dead_or_old_writers_are_removed(tmp_path):
    host = socket.gethostname()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # a pid that no longer runs
    names = {
        "dead": f"tmp-{finished.pid}-aa-{host}.tmp",
        "alive": f"tmp-{os.getpid()}-bb-{host}.tmp",
        "other host": f"tmp-{finished.pid}-cc-elsewhere.tmp",
        "other host, old": f"tmp-{finished.pid}-dd-elsewhere.tmp",
        "unknown, old": "crashed-writer.tmp",
        "unknown": "half.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    for label in ("other host, old", "unknown, old"):
        os.utime(tmp_path / names[label], (two_hours_ago, two_hours_ago))
    removed = {path.name for path in remove_stale_temp_files(tmp_path)}
    assert removed == {names["dead"], names["other host, old"], names["unknown, old"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        names[label] for label in ("alive", "other host", "unknown")
    )


# ----------------------------------------------------------------------------- pages of a read shard


def _resident_file_bytes() -> int:
    """This process's resident pages of file mappings (``RssFile``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _one_shard(folder: Path, rows: int) -> tuple[Path, torch.Tensor, dict]:
    """A shard of one sentence keeping ``rows`` positions of 2 blocks x 1024: its path, the states
    written, and the states read back (memory-mapped)."""
    keys = [(tuple(range(rows)), tuple(range(rows)))]
    written = torch.randn(rows, 2, 1024)  # (kept, L, d)
    cache_files.write_shard(folder / "shard-a.safetensors", keys, written, "k")
    read = cache_files.read_shard(folder / "shard-a.safetensors", "k", num_blocks=2)
    return folder / "shard-a.safetensors", written, read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps, madvise")
def test_a_read_shards_pages_leave_the_process_and_read_back_unchanged(tmp_path):
    shard, written, read = _one_shard(tmp_path, rows=4096)  # 32 MiB of states
    (states,) = read.values()
    start, length = cache_files.mapped_range(states, shard)
    assert start % 4096 == 0 and length % 4096 == 0
    assert start <= states.data_ptr() and states.data_ptr() + states.nbytes <= start + length
    assert torch.equal(states, written)  # every page read: resident
    before = _resident_file_bytes()
    assert cache_files.drop_mapped_pages([(start, length)])
    after = _resident_file_bytes()
    assert before - after > 30 * 2**20  # the 32 MiB left the process
    assert torch.equal(states, written)  # read again from the file, unchanged
    assert _resident_file_bytes() - after > 30 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_only_a_mapping_of_the_named_file_is_ever_given_a_range(tmp_path):
    shard, written, read = _one_shard(tmp_path, rows=8)
    (states,) = read.values()
    assert cache_files.mapped_range(states, shard) is not None
    assert cache_files.mapped_range(written, shard) is None  # anonymous memory: would read back as zeros
    assert cache_files.mapped_range(states.clone(), shard) is None
    (tmp_path / "other.safetensors").write_bytes(shard.read_bytes())
    assert cache_files.mapped_range(states, tmp_path / "other.safetensors") is None


# ----------------------------------------------------------------------------- kill -9 mid-fill


KILL_POINTS = ("compute:1", "compute:2", "write:1", "write:2", "rename:2", "published:1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, model_path):
    directory = tmp_path_factory.mktemp("uninterrupted")
    experiment = NerExperiment(crash_settings(model_path, str(directory)), crash_data())
    return experiment.run(CELL), experiment.cache().states


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks the processes it kills")
def test_kill_9_while_filling_then_restart_gives_the_uninterrupted_features_and_results(
    tmp_path, model_path, uninterrupted
):
    reference_record, reference_states = uninterrupted
    driver = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cache_crash_driver.py")), model_path, str(tmp_path)]
        + list(KILL_POINTS),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},  # conftest
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    statuses = json.loads(driver.stdout.strip().splitlines()[-1])
    assert statuses == {point: -9 for point in KILL_POINTS}, driver.stderr[-3000:]  # every point was hit
    left = {point: tmp_path / point.replace(":", "-") for point in KILL_POINTS}
    temps = {point: sorted(p.name for p in d.rglob("*.tmp")) for point, d in left.items()}
    shards = {point: len(list(d.rglob("*.safetensors"))) for point, d in left.items()}
    # what each kill left behind: torn or complete temporary files, 0 or 1 finished shard
    assert [len(temps[p]) for p in KILL_POINTS] == [0, 0, 1, 1, 1, 0]
    assert [shards[p] for p in KILL_POINTS] == [0, 1, 0, 1, 1, 1]
    for point in KILL_POINTS:
        restarted = NerExperiment(crash_settings(model_path, str(left[point])), crash_data())
        record = restarted.run(CELL)
        assert record["curve"] == reference_record["curve"], point
        assert record["depth_attention"] == reference_record["depth_attention"], point
        states = restarted.cache().states
        assert states.keys() == reference_states.keys(), point
        for key, value in reference_states.items():
            torch.testing.assert_close(states[key], value, atol=0, rtol=0)
        assert list(left[point].rglob("*.tmp")) == [], point  # the dead writer's file is gone
        assert len(list(left[point].rglob("*.safetensors"))) == 2, point  # dev + train, nothing twice
