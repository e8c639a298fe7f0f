"""Sweep: grid, atomic results, resume after an interruption (nothing lost, nothing redone)."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch
from conftest import toy_dataset, write_tiny_model

from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.results.cells import grid_cells, longest_first
from layerfusion_recipes.core.results.records import append_record, finished_keys, read_records
from layerfusion_recipes.core.sweeps.sweep import _UnitRunner, run_cells, runs_left
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings, record_key
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve

GRID = {"methods": ["none", "concat"], "regimes": ["fe"], "shots": [2, 4], "epochs": [2], "trials": 2}


def test_grid_cells_cover_the_product_once():
    cells = grid_cells(GRID)
    assert len(cells) == 8 and len({c.key for c in cells}) == 8
    assert cells[0] == Cell("none", "fe", 2, 2, 0) and cells[1] == Cell("none", "fe", 2, 2, 1)


def test_torn_last_line_is_ignored_and_not_glued(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, {"key": "a", "best_f1": 0.5})
    with open(path, "a") as handle:
        handle.write('{"key": "b", "best_')  # killed mid-write
    append_record(path, {"key": "c", "best_f1": 0.25})
    assert [r["key"] for r in read_records(path)] == ["a", "c"]
    assert finished_keys(tmp_path / "missing.jsonl") == set()


class CountingExperiment(NerExperiment):
    def __init__(self, *args, stop_after: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran: list[str] = []
        self.stop_after = stop_after

    def iter_lrs(self, cell, lrs, use_cache=None):
        if self.stop_after is not None and len(self.ran) == self.stop_after:
            raise KeyboardInterrupt  # killed while this cell runs
        self.ran.append(cell.key)
        return super().iter_lrs(cell, lrs, use_cache)


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return NerSettings(model=write_tiny_model(tmp_path_factory.mktemp("tiny") / "m"), data="toy", lr=3e-2)


def test_interrupt_then_resume_loses_and_redoes_nothing(tmp_path, settings):
    results = tmp_path / "results.jsonl"
    cells = grid_cells(GRID)
    first = CountingExperiment(settings, toy_dataset(), stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        run_cells(cells, results, settings, progress=False, experiment=first)
    assert first.ran == [c.key for c in cells[:3]]
    setup = settings.setup()
    on_disk = [record_key(c, 3e-2, setup) for c in cells[:3]]
    assert [r["key"] for r in read_records(results)] == on_disk  # every finished cell is on disk
    second = CountingExperiment(settings, toy_dataset())
    records = run_cells(cells, results, settings, progress=False, experiment=second)
    assert second.ran == [c.key for c in cells[3:]]  # nothing redone
    assert sorted(r["key"] for r in records) == sorted(record_key(c, 3e-2, setup) for c in cells)
    third = CountingExperiment(settings, toy_dataset())
    run_cells(cells, results, settings, progress=False, experiment=third)
    assert third.ran == []
    assert len(results.read_text().splitlines()) == 8


class StopOnRun(NerExperiment):
    """Interrupted while its ``stop_at``-th lone run trains."""

    def __init__(self, *args, stop_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs, self.stop_at = 0, stop_at

    def run(self, *args, **kwargs):
        self.runs += 1
        if self.runs == self.stop_at:
            raise KeyboardInterrupt
        return super().run(*args, **kwargs)


@pytest.mark.parametrize(("method", "regime"), [("extra_layers", "fe"), ("none", "bitfit")])
def test_lrs_run_one_after_another_are_stored_one_by_one(tmp_path, settings, method, regime):
    """R+n and the uncached regimes train their LRs one after another: an interrupted cell keeps
    the LRs it finished, and the resumed sweep runs only the rest."""
    lr_settings = NerSettings(**{**settings.__dict__, "lr": [1e-3, 1e-2, 3e-2]})
    cells = [Cell(method, regime, 2, 1, 0)]
    results = tmp_path / "results.jsonl"
    first = StopOnRun(lr_settings, toy_dataset(), stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        run_cells(cells, results, lr_settings, progress=False, experiment=first)
    setup = lr_settings.setup()
    finished = [record_key(cells[0], lr, setup) for lr in (1e-3, 1e-2)]
    assert [r["key"] for r in read_records(results)] == finished
    second = StopOnRun(lr_settings, toy_dataset(), stop_at=0)
    run_cells(cells, results, lr_settings, progress=False, experiment=second)
    assert second.runs == 1 and [r["lr"] for r in read_records(results)] == [1e-3, 1e-2, 3e-2]


def test_pool_tasks_split_only_the_lrs_that_run_one_after_another(settings):
    runner = _UnitRunner("unused.jsonl", settings, SweepPlan(), 2, None, None, None, {})
    lrs = (1e-3, 1e-2)
    stacked = (Cell("dwatt", "fe", 2, 1, 0), lrs)
    assert runner._pieces(stacked) == [stacked]
    for cell in (Cell("extra_layers", "fe", 2, 1, 0), Cell("dwatt", "lora", 2, 1, 0)):
        assert runner._pieces((cell, lrs)) == [(cell, (1e-3,)), (cell, (1e-2,))]


def test_yaml_config_and_flags(tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text(
        "model: some/model\ndata: data/dir\nshots: [8, 16]\ntrials: 2\nlr: 0.01\nmethod_options: {d_pos: 8}\n"
    )
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    settings, grid = resolve(
        parser.parse_args(["--config", str(config), "--trials", "3", "--output", str(tmp_path)])
    )
    assert (settings.model, settings.data) == ("some/model", "data/dir")
    assert settings.lr_grid("fe", "dwatt") == (0.01,)
    assert settings.method_options == {"d_pos": 8} and settings.dev_limit is None
    assert grid["shots"] == [8, 16] and grid["trials"] == 3  # the flag wins
    assert grid["epochs"] == [25] and grid["results"] == str(tmp_path / "results.jsonl")  # USER_AXES
    config.write_text("shots: [8]\nshot: 3\n")
    with pytest.raises(ValueError, match="shot"):
        resolve(parser.parse_args(["--config", str(config)]))


# each method's dev-selected LRs on WNUT-16 (the README's one-trial slice and the demo's runs): the
# plain head's 3e-2 (1e-2 to 1e-1 at N = 2), R+1's 1e-3, Concat's 1e-3 or 3e-3, DWAtt's 3e-3
DEMO_BEST_LRS = {
    "none": (1e-2, 3e-2, 1e-1),
    "extra_layers": (1e-3,),
    "concat": (1e-3, 3e-3),
    "dwatt": (1e-3, 3e-3),  # 1e-3 at N = 8 (2026-11-27), 3e-3 before
}


def test_the_demo_gives_each_method_lrs_on_both_sides_of_its_best():
    """The demo (no --model/--data) trains each method at its own LRs, each grid around that method's
    known best LR, so the LR it selects is not at an edge of its grid; ``--lr`` gives every method the
    same LRs."""
    from layerfusion_recipes.core.models.demo import GRID_METHODS
    from layerfusion_recipes.core.options.grids import DEMO_AXES
    from layerfusion_recipes.core.results.cells import planned_runs

    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    settings, grid = resolve(parser.parse_args(["--selection", "dev"]))  # the paper's comparison
    assert grid["methods"] == GRID_METHODS and list(DEMO_AXES["lr"]) == GRID_METHODS  # every method, once
    assert settings.lr_grid("fe", "none")[1:4] == (1e-2, 3e-2, 1e-1)  # the head's best and both neighbours
    for method, best in DEMO_BEST_LRS.items():
        lrs = settings.lr_grid("fe", method)
        assert set(best) <= set(lrs[1:-1]), (method, lrs)
    assert planned_runs(grid_cells(grid), settings) == 2 * 3 * (5 + 3 + 4 + 4)  # shots x trials x LRs
    flat, _ = resolve(parser.parse_args(["--lr", "1e-3", "3e-3"]))
    assert {flat.lr_grid("fe", method) for method in GRID_METHODS} == {(1e-3, 3e-3)}


def test_lrs_by_method_name_known_methods(tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text("model: some/model\ndata: data/dir\nlr: {dwat: [0.001]}\n")
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    with pytest.raises(ValueError, match=r"--lr: unknown \['dwat'\]; allowed: none"):
        resolve(parser.parse_args(["--config", str(config)]))
    by_method = NerSettings(model="m", data="d", lr={"dwatt": [3e-3, 1e-3]})
    assert by_method.lr_grid("fe", "dwatt") == (1e-3, 3e-3) and by_method.lr_for("fe", "concat") == 1e-3
    assert by_method.lr_grid("lora", "none") == (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # not given: the regime's
    assert by_method.lr == {"dwatt": (1e-3, 3e-3)}  # one type: each method's grid, ascending
    with pytest.raises(ValueError, match=r"--lr: unknown \['dwat'\]"):  # a script's typo, too
        NerSettings(model="m", data="d", lr={"dwat": [1e-3]})


def test_workers_run_cells_in_other_processes(tmp_path, settings):
    from conftest import write_toy_data

    worker_settings = NerSettings(**{**settings.__dict__, "data": write_toy_data(tmp_path / "data")})
    cells = grid_cells({**GRID, "methods": ["none"], "shots": [2], "trials": 2})
    records = run_cells(cells, tmp_path / "r.jsonl", worker_settings, workers=2, progress=False)
    setup = worker_settings.setup()
    assert sorted(r["key"] for r in records) == sorted(record_key(c, 3e-2, setup) for c in cells)
    pids = {json.loads(line)["pid"] for line in (tmp_path / "r.jsonl").read_text().splitlines()}
    assert os.getpid() not in pids


def test_longest_cells_go_first_and_ties_keep_grid_order():
    grid = {"methods": ["none", "dwatt"], "regimes": ["fe"], "shots": [8, 128], "epochs": [25, 100]}
    grid["trials"] = 1
    ordered = [(c.epochs, c.shots, c.method) for c in longest_first(grid_cells(grid))]
    assert ordered == [
        (100, 128, "none"), (100, 128, "dwatt"),  # 12800 epoch-shots
        (25, 128, "none"), (25, 128, "dwatt"),  # 3200
        (100, 8, "none"), (100, 8, "dwatt"),  # 800
        (25, 8, "none"), (25, 8, "dwatt"),  # 200
    ]  # fmt: skip


def _ner(model: str, data: str, output) -> list[str]:
    """One FE run of the plain head (one LR, one trial), the table and figures off."""
    return [
        "sweep", *("--model", model, "--data", data, "--methods", "none", "--shots", "2"),
        *("--epochs", "1", "--trials", "1", "--lr", "3e-2", "--output", str(output), "--quiet"),
    ]  # fmt: skip


def _flip_tags(path) -> None:
    """Give every entity in the ``token<TAB>tag`` file ``path`` another type, in place."""
    other = {"PER": "LOC", "LOC": "ORG", "ORG": "PER"}
    lines = path.read_text().splitlines()
    flipped = [f"{t}\t{g[:2]}{other[g[2:]]}" if "\t" in line and (g := line.split("\t")[1]) != "O" else line
               for line in lines for t in [line.split("\t")[0]]]  # fmt: skip
    assert flipped != lines
    path.write_text("\n".join(flipped) + "\n")


def test_a_resumed_sweep_runs_again_what_new_data_or_weights_at_the_same_path_change(tmp_path, capsys):
    """Records are keyed by the content of the model and data paths, not by their names: after the
    test labels are flipped in place, or new weights are saved into the model folder, the same command
    trains again (another key) instead of serving the earlier record; an unchanged re-run trains nothing."""
    from conftest import write_toy_data
    from transformers import AutoModel

    from layerfusion_recipes.cli import main

    model, data = (
        write_tiny_model(tmp_path / "model"),
        write_toy_data(tmp_path / "data", train=20, dev=6, test=6),
    )
    results = tmp_path / "out" / "results.jsonl"
    assert main(_ner(model, data, tmp_path / "out")) == 0
    [first] = read_records(results)
    assert main(_ner(model, data, tmp_path / "out")) == 0  # nothing changed: resumed, nothing trained
    assert read_records(results) == [first]

    _flip_tags(tmp_path / "data" / "test.txt")
    assert main(_ner(model, data, tmp_path / "out")) == 0
    assert len(read_records(results)) == 2  # trained again, the earlier record not served
    _, flipped = read_records(results)
    assert flipped["key"] != first["key"] and flipped["settings"]["model"] == first["settings"]["model"]
    assert flipped["settings"]["content"]["data"] != first["settings"]["content"]["data"]
    assert flipped["settings"]["content"]["model"] == first["settings"]["content"]["model"]

    weights = AutoModel.from_pretrained(model)
    torch.manual_seed(5)
    weights.embeddings.word_embeddings.weight.data.normal_()
    weights.save_pretrained(model)  # new weights at the same path
    assert main(_ner(model, data, tmp_path / "out")) == 0
    *_, retrained = read_records(results)
    assert len(read_records(results)) == 3 and retrained["key"] not in {first["key"], flipped["key"]}
    assert retrained["settings"]["content"]["model"] != flipped["settings"]["content"]["model"]
    capsys.readouterr()


def test_the_content_fingerprint_reads_bytes_not_times(tmp_path):
    """Rewriting a data file with the same bytes keeps the setup (a copy or ``touch`` re-runs nothing);
    one changed byte changes it; a Hub name has no content; hidden files do not count."""
    from conftest import write_toy_data

    data = write_toy_data(tmp_path / "data", train=20, dev=6, test=6)
    settings = NerSettings(model="hub/model", data=data)
    setup = settings.setup()
    assert set(settings.content_fingerprints()) == {"data"}
    train = tmp_path / "data" / "train.txt"
    text = train.read_text()
    train.write_text(text)
    os.utime(train, ns=(1, 1))
    (tmp_path / "data" / ".lock").write_text("x")
    assert NerSettings(model="hub/model", data=data).setup() == setup
    train.write_text(text.replace("alice", "alicf", 1))
    assert NerSettings(model="hub/model", data=data).setup() != setup
    assert settings.setup() != setup  # the same settings object notices too (its paths' content)
    assert "content" not in NerSettings(model="hub/model", data="hub/data").setup_fields()


def test_runs_left_reads_each_method_s_own_lrs(tmp_path):
    """A grid whose ``lr`` maps methods to LRs (the demo's): the finished-runs check asks each cell's
    method for its LRs (it raised "name the method" before, so `layerfusion ner` stopped at once)."""
    settings = NerSettings(model="m", data="d", lr={"none": [1e-2, 3e-2], "dwatt": [1e-3]})
    grid = {"methods": ["none", "dwatt"], "regimes": ["fe"], "shots": [2], "epochs": [2], "trials": 1}
    assert runs_left(grid_cells(grid), tmp_path / "results.jsonl", settings, None) is True
