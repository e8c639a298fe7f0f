"""A trained fusion under the true few-shot protocol (core/engine/cross_fit.py), on a tiny random model and
toy data: the folds are the read-outs' own, LR and epoch are the best of the recomputed fold scores, the
final run is a fresh fit on the whole sample, and no dev split is read; the command runs it beside the
read-outs and refuses a fitted read-out named as if it trained."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_folders, write_text_data, write_tiny_model, write_toy_data

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.cli import main
from layerfusion_recipes.core.engine import cross_fit
from layerfusion_recipes.core.results.cells import Cell
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps import true_few_shot
from peft_layerfusion import few_shot


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(tmp_path_factory, model=write_tiny_model, texts=write_text_data, ner=write_toy_data)


def experiment_of(paths) -> ClassifyExperiment:
    settings = ClassifySettings(
        model=paths["model"], data=paths["texts"], batch_size=4, pooling="mean", eval_every=2, lr=[1e-2, 1e-1]
    )
    experiment = ClassifyExperiment(settings)
    experiment.dev = []  # the protocol reads no dev split: without one, it runs the same
    return experiment


def test_the_folds_are_those_of_the_readouts_and_a_sentence_without_rows_always_trains():
    labels = torch.tensor([0, 1, 0, 0, 1, 1, 2, 2, 0])
    example = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4, 6])  # example 5 has no labelled row
    folds = cross_fit.example_folds(labels, example, 7, folds=2, seed=3)
    cv = few_shot.make_cv(labels, 2, 3, example)
    assert [folds[e] for e in example.tolist()] == cv.of_row.tolist()
    assert folds[5] == -1 and sorted(set(folds)) == [-1, 0, 1]


def test_a_choice_on_a_grid_end_grows_the_grid_one_step_past_it():
    assert cross_fit._grown([1e-3, 1e-2], 1e-2) == pytest.approx(1e-1)
    assert cross_fit._grown([1e-3, 1e-2, 1e-1], 1e-3) == pytest.approx(1e-4)
    assert cross_fit._grown([1e-3, 1e-2, 1e-1], 1e-2) is None


def test_lr_and_epoch_are_the_best_of_the_fold_scores_and_the_final_run_fits_the_whole_sample(paths):
    experiment = experiment_of(paths)
    sample = experiment.train_sample(4, 0)  # 4 per class
    labels = torch.tensor([e["labels"] for e in sample])
    folds_of = cross_fit.example_folds(labels, torch.arange(len(sample)), len(sample), 2, 0)
    found = cross_fit.cross_fit(experiment, "average", sample, folds_of, 4, 0, epochs=4, start_layer=None)
    # recomputed: each LR alone on each fold (not stacked), the held-out fold scored every 2 epochs
    scores: dict[tuple[float, int], list[float]] = {}
    for lr in found["lr_grid"]:
        for fold in (0, 1):
            train = [e for e, f in zip(sample, folds_of, strict=True) if f != fold]
            held = [e for e, f in zip(sample, folds_of, strict=True) if f == fold]
            [result] = experiment.fit_sample(Cell("average", "fe", 4, 4, 0), [lr], train, held)
            for point in result.curve:
                scores.setdefault((lr, point["epoch"]), []).append(point["dev_accuracy"])
    assert sorted(point for point in scores) == sorted(
        (lr, epoch) for lr in found["lr_grid"] for epoch in (2, 4)
    )
    means = {key: sum(values) / len(values) for key, values in scores.items()}
    assert means[found["lr"], found["epoch"]] == pytest.approx(max(means.values()))
    assert found["cv"] == pytest.approx(max(means.values()))
    assert (found["lr"], found["epoch"]) == cross_fit._best(scores)
    # the final run: a fresh fit on every example of the sample at that LR, for that many epochs
    final = Cell("average", "fe", 4, found["epoch"], 0)
    [result] = experiment.fit_sample(
        final, [found["lr"]], sample, sample, experiment.test, eval_every=found["epoch"]
    )
    assert found["test"] == result.test["accuracy"]
    assert set(found) == {"lr", "epoch", "lr_grid", "lr_on_edge", "cv", "test"}


def test_the_command_trains_the_named_fusions_beside_the_readouts(paths, tmp_path, capsys):
    argv = ["classify", "--model", paths["model"], "--data", paths["texts"], "--pooling", "mean"]
    argv += ["--selection", "cv", "--methods", "none", "layer_mix", "--epochs", "4", "--eval-every", "2"]
    argv += ["--shots", "4", "--trials", "1", "--folds", "2", "--output", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    assert "LayerMix (trained)" in capsys.readouterr().out
    [record] = read_records(tmp_path / "results.jsonl")
    trained = record["trained"]["layer_mix"]
    assert trained["epoch"] in (2, 4) and trained["lr"] in trained["lr_grid"]
    assert record["test"]["trained_layer_mix"] == trained["test"]
    assert "trained=layer_mix|epochs=4" in record["key"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["cells"][0]["methods"]) == {
        *few_shot.METHODS,
        true_few_shot.CEILING,
        "trained_layer_mix",
    }


def test_a_token_task_trains_its_fusion_on_folds_of_whole_sentences(paths, tmp_path):
    argv = ["ner", "--model", paths["model"], "--data", paths["ner"], "--selection", "cv"]
    argv += ["--methods", "dwatt", "--epochs", "2", "--eval-every", "1", "--shots", "2", "--trials", "1"]
    assert main([*argv, "--folds", "2", "--output", str(tmp_path), "--quiet"]) == 0
    [record] = read_records(tmp_path / "results.jsonl")
    trained = record["trained"]["dwatt"]
    assert trained["epoch"] in (1, 2) and 0.0 <= trained["test"] <= 1.0
    assert record["test"]["trained_dwatt"] == trained["test"]


def test_a_fitted_readout_named_as_a_trained_method_is_one_line(paths, tmp_path, capsys):
    argv = ["classify", "--model", paths["model"], "--data", paths["texts"], "--pooling", "mean"]
    argv += ["--selection", "cv", "--methods", "joint_probe", "--output", str(tmp_path), "--quiet"]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "layerfusion classify: error: --methods joint_probe: under --selection cv every read-out fitted in "
        "closed form runs anyway; name the trained fusions to run beside them: dwatt, concat,"
    )
