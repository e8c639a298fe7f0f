"""LR selection: the choice on dev, the test score at the dev-chosen epoch, stacked candidates
equal to lone runs, record keys that name their LR and settings."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import replace

import pytest
import torch
from conftest import toy_dataset, write_tiny_model

from layerfusion_recipes.core.engine import experiment as experiment_module
from layerfusion_recipes.core.results.cells import grid_cells
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.results.selection import select_lr
from layerfusion_recipes.core.sweeps.sweep import run_cells
from layerfusion_recipes.ner.candidates import StackedRunner
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings, record_key
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.ner.training import (
    TokenClassifierRunner,
    TrainSettings,
    evaluate,
    evaluate_f1,
    fit,
    train_token_classifier,
)
from layerfusion_recipes.reporting.plot import markdown_table, summarize, write_report
from peft_layerfusion.names import METHOD_NAMES

ALL_METHODS = ["none", "average", "scalar_mix", "concat", "dwatt", "extra_layers"]
SCORES = ("dev_f1", "best_f1", "test_f1", "best_epoch", "curve", "key", "lr")


def _run(lr, trial, dev, test=None, **cell):
    return {"lr": lr, "trial": trial, "dev_f1": dev, "test_f1": test, "key": f"{lr}|{trial}", **cell}


def test_selection_mean_over_trials_ties_to_the_smaller_lr_and_edge_flag():
    runs = [
        _run(1e-3, 0, 0.5),
        _run(1e-3, 1, 0.1),
        _run(1e-2, 0, 0.3),
        _run(1e-2, 1, 0.3),
        _run(1e-1, 0, 0.2),
    ]
    selection = select_lr(runs)
    # the trials every LR has: trial 0 only (1e-1 lacks trial 1): 0.5 > 0.3 > 0.2
    assert selection.trials == [0] and selection.dev_means == {1e-3: 0.5, 1e-2: 0.3, 1e-1: 0.2}
    assert selection.lr == 1e-3 and selection.at_edge
    runs.append(_run(1e-1, 1, 0.9))  # now over both trials: 0.3, 0.3, 0.55
    assert select_lr(runs).lr == 1e-1 and select_lr(runs).at_edge
    tie = [_run(3e-3, 0, 0.4), _run(1e-3, 0, 0.4), _run(1e-2, 0, 0.4)]
    assert select_lr(tie).lr == 1e-3  # ties to the smaller LR, whatever the order
    middle = [_run(1e-3, 0, 0.1), _run(3e-3, 0, 0.6), _run(1e-2, 0, 0.2)]
    assert select_lr(middle).lr == 3e-3 and not select_lr(middle).at_edge
    assert not select_lr([_run(1e-3, 0, 0.1)]).at_edge  # one LR: nothing to widen


def test_summary_reports_test_f1_at_the_selected_lr_with_dev_beside_and_flags_the_edge():
    cell = {"method": "dwatt", "regime": "fe", "shots": 8, "epochs": 5, "setup": "s"}
    runs = [
        _run(1e-3, 0, 0.20, 0.15, **cell),
        _run(1e-3, 1, 0.30, 0.25, **cell),
        _run(1e-2, 0, 0.60, 0.50, **cell),
        _run(1e-2, 1, 0.70, 0.40, **cell),
        _run(1e-2, 1, 0.99, 0.99, **cell),  # the same key again (a concurrent duplicate): not counted
    ]
    (row,) = summarize(runs)
    assert row["lr"] == 1e-2 and row["edge"] and row["score"] == "test" and row["n"] == 2
    assert row["mean"] == pytest.approx(45.0) and row["dev_mean"] == pytest.approx(65.0)
    assert row["dev_by_lr"] == pytest.approx({1e-3: 25.0, 1e-2: 65.0})
    assert row["test_by_lr"] == pytest.approx({1e-3: 20.0, 1e-2: 45.0})
    table = markdown_table([row])
    assert "| fe | 5 | 8 | 45.0 ± 63.5 @0.01 ⚠ (dev 65.0) (n=2) |" in table
    assert "widen the grid" in table and "0.01 of [0.001, 0.01]" in table


def test_f1_vs_lr_figure(tmp_path):
    cell = {"setup": "s", "regime": "fe", "shots": 8, "epochs": 5}
    cell["curve"] = [{"epoch": 5, "step": 5, "dev_f1": 0.1}]
    runs = [
        _run(lr, t, dev, dev / 2, method=m, **cell)
        for m in ("none", "dwatt")
        for lr, dev in ((1e-3, 0.2), (1e-2, 0.5), (1e-1, 0.3))
        for t in (0, 1)
    ]
    for run in runs:
        run["key"] = f"{run['method']}|{run['key']}"
    paths = write_report(runs, tmp_path)
    assert paths["f1_vs_lr"].read_bytes()[:4] == b"\x89PNG"
    single = [r for r in runs if r["lr"] == 1e-2]
    assert "f1_vs_lr" not in write_report(single, tmp_path / "single")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    settings = NerSettings(model=path, data="toy", lr=[1e-3, 3e-2], batch_size=4)
    return NerExperiment(settings, toy_dataset(train=60))


def test_the_lr_that_can_learn_is_selected_over_one_that_cannot(experiment, tmp_path):
    settings = replace(experiment.settings, lr=[1e-7, 3e-2])
    grid = {"methods": ["none"], "regimes": ["fe"], "shots": [4], "epochs": [6], "trials": 2}
    runs = run_cells(grid_cells(grid), tmp_path / "r.jsonl", settings, progress=False, experiment=experiment)
    assert len(runs) == 4 and {r["lr"] for r in runs} == {1e-7, 3e-2}
    (row,) = summarize(runs)
    assert row["lr"] == 3e-2 and row["edge"]
    assert row["dev_by_lr"][3e-2] > row["dev_by_lr"][1e-7] + 10  # points
    assert row["mean"] == pytest.approx(50 * sum(r["test_f1"] for r in runs if r["lr"] == 3e-2))


def test_test_score_is_the_checkpoint_of_the_best_dev_epoch(experiment):
    model, located = experiment.build(Cell("concat", "fe", 4, 5, 0))
    runner = TokenClassifierRunner(model, located)
    train = experiment.train_sample(4, 0)
    test_by_epoch = {}
    head = model.base_model.model.classifier.modules_to_save["default"]

    def on_epoch(epoch):
        test_by_epoch[epoch] = evaluate_f1(
            runner, experiment.test, experiment.id2label, 64, torch.device("cpu")
        )
        if epoch == 3:  # from now on the model predicts O everywhere: later epochs score 0
            with torch.no_grad():
                head.bias[0] = 1e6

    settings = TrainSettings(epochs=5, batch_size=4)
    result = train_token_classifier(
        runner, train, experiment.dev, experiment.id2label, settings, 3e-2, on_epoch, test=experiment.test
    )
    assert result.best_epoch <= 3 < 5 and result.curve[-1]["dev_f1"] == 0.0 and test_by_epoch[5] == 0.0
    assert result.test_f1 == test_by_epoch[result.best_epoch] > 0.0


@pytest.mark.parametrize("method", ALL_METHODS)
def test_stacked_candidates_equal_lone_runs(experiment, method):
    cell = Cell(method, "fe", 4, 3, 0)
    lrs = [1e-3, 1e-2, 3e-2]
    stacked = experiment.run_lrs(cell, lrs)
    lone = [experiment.run(cell, lr=lr) for lr in lrs]
    for together, alone in zip(stacked, lone, strict=True):
        assert together["cached"] and {k: together[k] for k in SCORES} == {k: alone[k] for k in SCORES}
        if method == "dwatt":
            assert together["depth_attention"] == pytest.approx(alone["depth_attention"], abs=1e-6)
    assert len({r["dev_f1"] for r in stacked}) > 1  # the LRs really differ


def test_only_token_wise_methods_stack_their_lrs(experiment, monkeypatch):

    stacked = []
    original = experiment_module.fit

    def fit(*args):  # the experiment calls the function it imported, lone runs too: keep stacked ones
        if isinstance(args[0], StackedRunner):
            stacked.append(args)
        return original(*args)

    monkeypatch.setattr(experiment_module, "fit", fit)
    experiment.run_lrs(Cell("extra_layers", "fe", 2, 1, 0), [1e-3, 1e-2])  # R+n: one after another
    assert stacked == []
    experiment.run_lrs(Cell("scalar_mix", "fe", 2, 1, 0), [1e-3, 1e-2])
    assert len(stacked) == 1 and stacked[0][-2] == [1e-3, 1e-2]
    experiment.run_lrs(Cell("none", "lora", 2, 1, 0), [1e-3, 1e-2])  # uncached regime
    assert len(stacked) == 1


def _per_candidate_bytes(experiment, cell) -> int:
    """The training state of one stacked candidate of ``cell``: 20 B per trainable parameter."""
    model, _ = experiment.build(cell)
    return 20 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def _passes(monkeypatch) -> list[list[float]]:
    """The LRs of every stacked fit the experiment runs from now on (one list per pass)."""
    passes, original = [], experiment_module.fit

    def fit(*args):
        if isinstance(args[0], StackedRunner):
            passes.append(list(args[5]))
        return original(*args)

    monkeypatch.setattr(experiment_module, "fit", fit)
    return passes


def _without_timing(records) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in ("seconds", "pid")} for record in records]


@pytest.mark.parametrize("method", ["concat", "dwatt"])
def test_lr_candidates_in_passes_within_train_memory_give_the_records_of_one_pass(
    experiment, method, monkeypatch
):
    cell = Cell(method, "fe", 4, 3, 0)
    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    passes = _passes(monkeypatch)
    together = experiment.run_lrs(cell, lrs)
    assert passes == [lrs]  # no budget: one pass of all
    per_candidate = _per_candidate_bytes(experiment, cell)
    for size, expected in ((1, [[1e-3], [3e-3], [1e-2], [3e-2]]), (2, [[1e-3, 3e-3], [1e-2, 3e-2]])):
        passes.clear()
        budget = (size + 0.5) * per_candidate / 1e9  # GB: room for `size` candidates, not one more
        monkeypatch.setattr(experiment, "settings", replace(experiment.settings, train_memory=budget))
        split = experiment.run_lrs(cell, lrs)
        assert passes == expected
        assert _without_timing(split) == _without_timing(together)  # every field, bitwise
    assert len({r["dev_f1"] for r in together}) > 1  # the LRs really differ


class _Stop(Exception):
    pass


def test_a_unit_stopped_between_passes_resumes_with_the_missing_lrs_only(experiment, tmp_path, monkeypatch):
    grid = {"methods": ["dwatt"], "regimes": ["fe"], "shots": [4], "epochs": [2], "trials": 1}
    cells = grid_cells(grid)
    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    budget = 2.5 * _per_candidate_bytes(experiment, cells[0]) / 1e9  # passes of 2
    settings = replace(experiment.settings, lr=lrs, train_memory=budget)
    split = NerExperiment(settings, experiment.data)
    results = tmp_path / "r.jsonl"
    passes = _passes(monkeypatch)

    def stop_after_the_first_pass(record):
        if len(read_records(results)) == 2:
            raise _Stop

    with pytest.raises(_Stop):
        stop = stop_after_the_first_pass
        run_cells(cells, results, settings, progress=False, experiment=split, on_record=stop)
    assert passes == [[1e-3, 3e-3]] and len(read_records(results)) == 2
    records = run_cells(cells, results, settings, progress=False, experiment=split)
    assert passes == [[1e-3, 3e-3], [1e-2, 3e-2]]  # the second pass only
    one_pass = NerExperiment(replace(settings, train_memory=None), experiment.data).run_lrs(cells[0], lrs)
    by_lr = sorted(records, key=lambda r: r["lr"])
    stored = [{k: r[k] for k in one_pass[0]} for r in by_lr]  # without the launch fields
    assert _without_timing(stored) == _without_timing(one_pass)


@pytest.mark.parametrize("method", ["concat", "dwatt", "extra_layers"])
def test_stacked_models_match_lone_training_within_float_tolerance(experiment, method):
    """Same models up to float32 summation order (batched vs single matrix products).

    Compared on their dev logits, not their parameters: a parameter whose exact gradient is 0
    (e.g. DWAtt's key bias, which shifts every depth score alike) receives rounding noise, which
    AdamW normalises into steps of size ~LR in either run; it does not change any output.
    """
    cell, lrs = Cell(method, "fe", 4, 3, 0), [1e-3, 3e-2]
    train = experiment.train_sample(4, 0)
    cache = experiment.cache()
    cache.fill(train)
    settings = experiment.train_settings(cell)
    model, located = experiment.build(cell)
    runner = StackedRunner(model, len(lrs), located, cache)
    fit(runner, train, experiment.dev, experiment.id2label, settings, lrs)
    cpu = torch.device("cpu")
    fresh, fresh_located = experiment.build(cell)
    untrained = TokenClassifierRunner(fresh.eval(), fresh_located, cache).logits(experiment.dev, cpu)[0]
    for index, lr in enumerate(lrs):
        alone, alone_located = experiment.build(cell)
        lone_runner = TokenClassifierRunner(alone, alone_located, cache)
        train_token_classifier(lone_runner, train, experiment.dev, experiment.id2label, settings, lr)
        runner.load_candidate(index)
        model.eval(), alone.eval()  # no dropout
        with torch.no_grad():
            got = TokenClassifierRunner(model, located, cache).logits(experiment.dev, cpu)[0]
            want = lone_runner.logits(experiment.dev, cpu)[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert (want - untrained).abs().max() > 1e-2  # it trained
    scores = evaluate(runner, experiment.dev, experiment.id2label, 64, cpu)
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)


def test_record_keys_name_their_lr_and_every_setting(experiment, tmp_path):
    results = tmp_path / "r.jsonl"
    grid = {"methods": ["none"], "regimes": ["fe"], "shots": [2], "epochs": [1], "trials": 1}
    cells = grid_cells(grid)
    lone = replace(experiment.settings, lr=3e-2)
    run_cells(cells, results, lone, progress=False, experiment=NerExperiment(lone, experiment.data))
    assert [r["key"] for r in read_records(results)] == [record_key(cells[0], 3e-2, lone.setup())]
    # a selection run on the same output reuses the 3e-2 record and runs only 1e-3
    selecting = replace(lone, lr=[1e-3, 3e-2])
    assert selecting.setup() == lone.setup()
    records = run_cells(
        cells, results, selecting, progress=False, experiment=NerExperiment(selecting, experiment.data)
    )
    assert sorted(r["lr"] for r in records) == [1e-3, 3e-2] and len(read_records(results)) == 2
    # a setting that changes results makes new records
    assert replace(lone, model=lone.model + "/.").setup() == lone.setup()  # the same model, by real path
    assert lone.setup() not in {
        replace(lone, model=str(tmp_path)).setup(),
        replace(lone, data="other").setup(),
    }
    reseeded = replace(lone, seed=1)
    run_cells(cells, results, reseeded, progress=False, experiment=NerExperiment(reseeded, experiment.data))
    assert len(read_records(results)) == 3
    assert {replace(lone, max_length=64).setup(), replace(lone, dev_limit=5).setup(),
            replace(lone, method_options={"lora_r": 2}).setup(), replace(lone, eval_every=2).setup(),
            replace(lone, batch_size=8).setup(), replace(lone, train_sentences=9).setup(),
            replace(lone, fixed_sample=True).setup(), replace(lone, language="de").setup(),
            replace(lone, test_limit=3).setup()}.isdisjoint({lone.setup()})  # fmt: skip
    assert replace(lone, use_cache=False, cache_dir="x").setup() == lone.setup()  # same results


def test_select_on_the_first_trial_then_run_the_rest_at_the_selected_lr(experiment, tmp_path):
    settings = replace(experiment.settings, lr=[1e-7, 3e-2])
    grid = {"methods": ["none"], "regimes": ["fe"], "shots": [4], "epochs": [4], "trials": 3}
    runs = run_cells(
        grid_cells(grid),
        tmp_path / "r.jsonl",
        settings,
        progress=False,
        experiment=experiment,
        select_trials=1,
    )
    assert sorted((r["trial"], r["lr"]) for r in runs) == [(0, 1e-7), (0, 3e-2), (1, 3e-2), (2, 3e-2)]
    (row,) = summarize(runs)
    assert row["lr"] == 3e-2 and row["n"] == 3 and row["selection_trials"] == [0]
    with pytest.raises(ValueError, match="select_trials"):
        run_cells(grid_cells(grid), tmp_path / "r.jsonl", settings, progress=False, select_trials=0)


def test_lr_flags_and_yaml(tmp_path):
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    settings, _ = resolve(parser.parse_args(["--model", "m", "--data", "d", "--lr", "3e-3", "1e-3"]))
    assert settings.lr_grid("fe", "dwatt") == (1e-3, 3e-3)
    assert settings.lr == {method: (1e-3, 3e-3) for method in METHOD_NAMES}  # one type: by method
    config = tmp_path / "grid.yaml"
    config.write_text("model: m\ndata: d\nlr: [0.01, 0.1]\nselect_trials: 1\n")
    settings, grid = resolve(parser.parse_args(["--config", str(config)]))
    assert settings.lr_grid("lora", "none") == (0.01, 0.1) and grid["select_trials"] == 1
    settings, _ = resolve(parser.parse_args(["--model", "m", "--data", "d"]))
    assert settings.lr_grid("ft", "none") == (3e-5, 1e-4, 3e-4, 1e-3)
    assert settings.lr_for("ft", "none") == 5e-5
    assert settings.lr == {}
    for bad in ("0", "nan", "inf"):
        with pytest.raises(SystemExit):  # argparse names --lr and the value
            parser.parse_args(["--model", "m", "--data", "d", "--lr", "1e-3", bad])
    for bad in ("0", ".nan", ".inf"):  # the YAML grid is checked the same way
        config.write_text(f"model: m\ndata: d\nlr: [0.01, {bad}]\n")
        with pytest.raises(ValueError, match="lr must be one or more finite numbers > 0"):
            resolve(parser.parse_args(["--config", str(config)]))
    with pytest.raises(ValueError, match="pick one"):
        NerSettings("m", "d", lr=[1e-3, 1e-2]).lr_for("fe", "none")
    settings, _ = resolve(parser.parse_args(["--model", "m", "--data", "d", "--train-memory", "1.5"]))
    assert settings.train_memory == 1.5 and settings.setup() == replace(settings, train_memory=None).setup()
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit):  # argparse names --train-memory and the value
            parser.parse_args(["--model", "m", "--data", "d", "--train-memory", bad])


@pytest.mark.parametrize("method", ["none", "average", "scalar_mix", "concat", "dwatt"])
def test_stacked_token_wise_methods_have_no_per_candidate_fallback(experiment, method):
    """vmap runs an op without a batching rule once per candidate (with a UserWarning): in-place
    ``addmm_`` (Concat) and ``addcmul_`` (the weighted sums) did, which cost more than K lone runs."""
    cell = Cell(method, "fe", 2, 1, 0)
    train = experiment.train_sample(2, 0)
    model, located = experiment.build(cell)
    runner = StackedRunner(model, 3, located, experiment.cache())
    runner.cache.fill(train)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not yet implemented the batching rule.*")
        logits, labels = runner.logits(train, torch.device("cpu"))
        logits.sum().backward()
    assert logits.shape[:3] == (3, *labels.shape)


def test_stacked_candidates_are_rows_of_one_tensor_read_without_a_copy(experiment):
    """A step reads the candidates' values as one ``(K, *shape)`` tensor per parameter, the storage
    the candidates' own leaves share (no stacked copy per step: 4 of what were 24 B per parameter);
    each candidate's gradient is the one ``torch.stack`` gives, and an optimizer's in-place update of
    a candidate is what the next step reads."""
    cell = Cell("dwatt", "fe", 2, 1, 0)
    train = experiment.train_sample(2, 0)
    model, located = experiment.build(cell)
    runner = StackedRunner(model, 3, located, experiment.cache())
    runner.cache.fill(train)
    stacked = runner.stacked(range(3))
    for i, name in enumerate(runner.names):
        assert stacked[name].data_ptr() == runner.stacks[name].data_ptr()
        assert [c[i].data_ptr() for c in runner.candidates] == [
            runner.stacks[name][k].data_ptr() for k in range(3)
        ]
        assert all(c[i].is_leaf and c[i].requires_grad for c in runner.candidates)
    assert runner.stacked(range(1, 3))[name].data_ptr() == runner.stacks[name][1].data_ptr()
    logits, _ = runner.logits(train, torch.device("cpu"))
    weights = torch.randn_like(logits)
    (logits * weights).sum().backward()
    got = [[p.grad.clone() for p in candidate] for candidate in runner.candidates]
    copies = [[p.detach().clone().requires_grad_(True) for p in c] for c in runner.candidates]
    runner.stacked = lambda group: {  # what the runner did before: a stacked copy per forward
        name: torch.stack([copies[k][i] for k in group]) for i, name in enumerate(runner.names)
    }
    logits, _ = runner.logits(train, torch.device("cpu"))
    (logits * weights).sum().backward()
    for mine, theirs in zip(got, copies, strict=True):
        assert all(torch.equal(a, b.grad) for a, b in zip(mine, theirs, strict=True))
    assert any(g.abs().sum() > 0 for g in got[0])  # gradients reached the candidates
    with torch.no_grad():
        runner.candidates[1][0].add_(1.0)
    assert torch.equal(runner.stacks[runner.names[0]][1], runner.candidates[1][0])


@pytest.mark.parametrize("method", ["layer_mix", "dwatt"])
def test_a_mixing_lr_multiplier_trains_stacked_as_alone_and_changes_the_run(experiment, method):
    """``mixing_lr_multiplier`` (method_options) splits each candidate's AdamW group: the mix at
    ``lr * 30``. Stacked candidates still equal lone runs, and the runs differ from the multiplier's
    absence (the mix moves faster)."""
    cell = Cell(method, "fe", 4, 3, 0)
    lrs = [1e-3, 1e-2]
    plain = experiment.run_lrs(cell, lrs)
    settings = experiment.settings
    experiment.settings = replace(settings, method_options={"mixing_lr_multiplier": 30.0})
    try:
        stacked = experiment.run_lrs(cell, lrs)
        lone = [experiment.run(cell, lr=lr) for lr in lrs]
    finally:
        experiment.settings = settings
    for together, alone in zip(stacked, lone, strict=True):
        assert {k: together[k] for k in SCORES} == {k: alone[k] for k in SCORES}
    moved = "mix_weights" if method == "layer_mix" else "depth_attention"
    assert [r[moved] for r in stacked] != [r[moved] for r in plain]
