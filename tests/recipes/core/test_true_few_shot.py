"""The true few-shot protocol (core/sweeps/true_few_shot.py) end to end on tiny random models and toy data:
the
rows every method reads equal a recomputation from ``output_hidden_states``, every choice comes from the
sample (no dev split read), each trial's record and the summary, resume, and the recommended recipe saved
as one adapter that reloads bitwise."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_folders, write_text_data, write_tiny_decoder, write_tiny_model, write_toy_data
from peft import PeftModel

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.cli import main
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps import true_few_shot
from layerfusion_recipes.ner.experiment import NerExperiment, NerSettings
from peft_layerfusion import few_shot


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(
        tmp_path_factory,
        model=write_tiny_model,
        decoder=write_tiny_decoder,
        texts=write_text_data,
        ner=write_toy_data,
    )


def classify(paths, model: str = "model", pooling: str = "mean") -> ClassifyExperiment:
    settings = ClassifySettings(model=paths[model], data=paths["texts"], batch_size=4, pooling=pooling)
    return ClassifyExperiment(settings)


def test_rows_are_the_pooled_head_states_of_output_hidden_states(paths):
    experiment = classify(paths)
    model = experiment.load_model(seed=0)
    examples = experiment.test[:3]
    rows = true_few_shot.head_rows(experiment, model, examples, batch_size=2)
    assert rows.states.shape == (3, 4, 32) and rows.example.tolist() == [0, 1, 2]
    for index, example in enumerate(examples):  # one example alone, no padding: the mean over its tokens
        ids = torch.tensor([example["input_ids"]])
        with torch.no_grad():
            hidden = model.backbone(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True
            )
        want = few_shot.head_states(hidden.hidden_states)[0].mean(0)  # (L + 1, d)
        assert torch.allclose(rows.states[index].double(), want, atol=1e-5)
        assert rows.labels[index] == example["labels"]


def test_token_rows_are_the_labelled_words_of_each_sentence(paths):
    experiment = NerExperiment(NerSettings(model=paths["model"], data=paths["ner"], batch_size=4))
    examples = experiment.test[:3]
    rows = true_few_shot.head_rows(experiment, experiment.load_model(seed=0), examples)
    labelled = [sum(label != -100 for label in example["labels"]) for example in examples]
    assert rows.example.tolist() == [i for i, count in enumerate(labelled) for _ in range(count)]
    assert rows.labels.tolist() == [label for e in examples for label in e["labels"] if label != -100]


@pytest.mark.parametrize("task", ["classify", "decoder", "ner"])
def test_a_sweep_chooses_from_the_sample_writes_a_summary_and_resumes(paths, tmp_path, task):
    if task == "classify":
        experiment = classify(paths)
    elif task == "decoder":  # its own head reads the last token, after the final norm; no bias
        experiment = classify(paths, model="decoder", pooling="model")
    else:
        experiment = NerExperiment(NerSettings(model=paths["model"], data=paths["ner"], batch_size=4))
    experiment.dev = []  # the protocol reads no dev split: without one, it runs the same
    plan = true_few_shot.Plan(shots=(4,), trials=2, folds=2)
    summary = true_few_shot.run_true_few_shot(experiment, plan, tmp_path, command="layerfusion test")
    [cell] = summary["cells"]
    assert cell["shots"] == 4 and cell["selection"] == "cv"
    assert set(cell["methods"]) == {*few_shot.METHODS, true_few_shot.CEILING}
    for name, entry in cell["methods"].items():
        assert entry["trials"] == [0, 1] and all(0.0 <= score <= 1.0 for score in entry["test"]), name
    ceiling, block = cell["methods"][true_few_shot.CEILING]["test"], cell["methods"]["best_layer"]["test"]
    assert all(c >= b for c, b in zip(ceiling, block, strict=True))  # the best block on test is the best
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    records = read_records(tmp_path / "results.jsonl")
    assert [r["trial"] for r in records] == [0, 1]
    assert all(r["adapter_reloaded_bitwise"] for r in records)
    reloaded = PeftModel.from_pretrained(experiment.load_model(seed=0), tmp_path / records[0]["adapter"])
    assert reloaded.peft_config["default"].state_norm == "rms_after_norm"
    # resumed: nothing runs again, the same summary
    assert true_few_shot.run_true_few_shot(experiment, plan, tmp_path, command="layerfusion test") == summary
    assert len(read_records(tmp_path / "results.jsonl")) == 2
    if task == "classify":  # a fresh run that finds every state kept loads the model to save its adapters
        fresh = classify(paths)
        again = true_few_shot.run_true_few_shot(
            fresh, plan, tmp_path, "layerfusion test", True, tmp_path / "b.jsonl"
        )
        assert again["cells"] == summary["cells"]


def test_the_states_are_kept_under_a_name_of_the_setup_and_examples(paths, tmp_path):
    experiment = classify(paths)
    store = true_few_shot.StateStore(experiment, tmp_path)
    first = store.rows(experiment.test[:4])
    assert len(list(tmp_path.iterdir())) == 1
    assert torch.equal(
        true_few_shot.StateStore(experiment, tmp_path).rows(experiment.test[:4]).states, first.states
    )
    other = classify(paths, pooling="model")  # another setting: another name, computed anew
    assert true_few_shot.fingerprint(other, experiment.test[:4]) != true_few_shot.fingerprint(
        experiment, experiment.test[:4]
    )
    true_few_shot.StateStore(other, tmp_path).rows(experiment.test[:4])
    assert len(list(tmp_path.iterdir())) == 2


def test_the_verdict_says_what_won_and_gives_no_interval_for_one_trial():
    methods = {
        "guarded_ensemble": {"trials": [0, 1, 2], "test": [0.7, 0.8, 0.75]},
        "best_layer": {"trials": [0, 1, 2], "test": [0.6, 0.7, 0.66]},
    }
    line = true_few_shot.verdict({"cells": [{"shots": 8, "methods": methods}]})
    assert "N=8: +9.7 ± " in line and "over 3 trials (interval excludes 0)" in line
    one = {name: {"trials": [0], "test": entry["test"][:1]} for name, entry in methods.items()}
    assert "N=8: +10.0 points (1 trial: no interval)" in true_few_shot.verdict(
        {"cells": [{"shots": 8, "methods": one}]}
    )
    assert "±" not in true_few_shot.table({"cells": [{"shots": 8, "methods": one}]})


def test_the_command_runs_the_protocol_by_default_and_prints_the_verdict_first(paths, tmp_path, capsys):
    argv = ["classify", "--model", paths["model"], "--data", paths["texts"], "--pooling", "mean"]
    argv += ["--shots", "4", "--trials", "2", "--folds", "2", "--output", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("The recommended recipe (guarded joint ensemble) against the block chosen")
    assert "| N | last-layer head | selected block |" in printed and "no dev split was read" in printed
    assert (tmp_path / "table.md").read_text().strip() == printed.strip()
    assert json.loads((tmp_path / "summary.json").read_text())["cells"][0]["shots"] == 4
    records = read_records(tmp_path / "results.jsonl")
    assert {r["selection"] for r in records} == {"cv"} and {r["task"] for r in records} == {"classify"}


def test_a_head_behind_a_pooler_is_refused_in_one_line_before_any_state(paths, tmp_path, capsys):
    # BERT's classifier reads [CLS] through its pooler (dense + tanh): no linear read-out deploys there
    argv = ["classify", "--model", paths["model"], "--data", paths["texts"], "--pooling", "model"]
    assert main([*argv, "--shots", "4", "--trials", "1", "--output", str(tmp_path), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "layerfusion classify: error: --pooling model: this encoder's classification head reads its first "
        "token through a nonlinear layer (pooler or dense + tanh), which a read-out linear in the blocks' "
        "states cannot deploy exactly; use --pooling mean (or --selection dev)"
    ]
    assert not (tmp_path / "states").exists() and not (tmp_path / "results.jsonl").exists()


def test_a_published_summary_renders_its_paired_table_and_command():
    methods = {
        "none": {"trials": [0, 1, 2], "test": [0.5, 0.6, 0.55]},
        "best_layer": {"trials": [0, 1, 2], "test": [0.6, 0.7, 0.66]},
        "guarded_ensemble": {"trials": [0, 1, 2], "test": [0.7, 0.8, 0.75]},
        "test_best_block": {"trials": [0, 1, 2], "test": [0.7, 0.8, 0.8]},
    }
    summary = {
        "kind": "true_few_shot",
        "model": {"name": "tiny", "fingerprint": "ab"},
        "data": {"name": "toy", "fingerprint": "cd"},
        "metric": "accuracy",
        "folds": 4,
        "commands": ["layerfusion classify --data $DATA/toy"],
        "cells": [
            {"shots": 8, "ensemble_kept": "3/3", "methods": methods},
            {
                "shots": 32,
                "ensemble_kept": "0/3",
                "methods": {**methods, "guarded_ensemble": methods["best_layer"]},
            },
        ],
    }
    text = true_few_shot.summaries_markdown([summary])
    row, same = text.splitlines()[2:4]
    assert row.startswith("| toy, tiny | 8 | 3 | 55.0 | 65.3 | 75.0 | 76.7 | **+9.7 ± ")
    assert row.endswith("| **+20.0 ± 0.0** |")  # the same +20 in every trial: resolved
    assert same.endswith("| +0.0 ± 0.0 | **+10.3 ± 1.4** |")  # the block against itself: never bold
    assert text.splitlines()[-5:] == [
        '<details markdown="1"><summary>What the rows ran on, and their commands</summary>',
        "",
        "Model `tiny` (ab); data `toy` (cd); test accuracy; 4-fold cross-validation on each trial's sample, "
        "no dev split read. Commands (`$DATA`: the folder of the data sets): "
        "`layerfusion classify --data $DATA/toy`.",
        "",
        "</details>",
    ]


def test_several_summaries_render_as_one_table_and_one_folded_line_naming_each_model_once():
    methods = {
        name: {"trials": [0, 1], "test": test}
        for name, test in {
            "none": [0.5, 0.6],
            "best_layer": [0.6, 0.7],
            true_few_shot.RECOMMENDED: [0.7, 0.7],
            true_few_shot.CEILING: [0.7, 0.8],
        }.items()
    }
    summaries = [
        {
            "model": {"name": model, "fingerprint": None},
            "data": {"name": "toy", "fingerprint": "cd"},
            "metric": "accuracy",
            "folds": 4,
            "commands": [f"layerfusion classify --model {model}"],
            "cells": [{"shots": 8, "methods": methods}],
        }
        for model in ("a", "b")
    ]
    lines = true_few_shot.summaries_markdown(summaries).splitlines()
    assert len(lines) == 10 and lines[2].startswith("| toy, a | 8 | 2 | 55.0 | 65.0 | 70.0 | 75.0 | +5.0 ± ")
    assert lines[3].startswith("| toy, b | 8 |") and lines[4] == "" and lines[5].startswith("<details")
    assert lines[7].startswith("Models `a` (no fingerprint), `b` (no fingerprint); data `toy` (cd); test ")
    assert lines[7].endswith(": `layerfusion classify --model a`; `layerfusion classify --model b`.")


def test_a_row_names_the_labels_it_scores_where_the_command_named_them():
    summary = {"data": {"name": "trec", "labels": "fine_label"}, "model": {"name": "m"}}
    assert true_few_shot.title(summary) == "trec (fine_label), m"
    assert true_few_shot.title({"data": {"name": "sst2"}, "model": {"name": "m"}}) == "sst2, m"
    settings = ClassifySettings(model="m", data="d", label_column="fine_label")
    assert true_few_shot.target_name(settings) == "fine_label"
    assert true_few_shot.target_name(ClassifySettings(model="m", data="d")) is None


def test_a_subset_run_of_the_same_setup_adds_no_row_its_twin_already_has():
    """The published trained-fusion cell reruns the first 5 trials of a 10-trial setup: the paired table
    shows that setup's row once (the 10 trials); the subset keeps its own N and its trained table."""

    def summary(trials: int, shots: list[int]) -> dict:
        methods = {
            name: {"trials": list(range(trials)), "test": [0.5 + 0.01 * t for t in range(trials)]}
            for name in ("none", "best_layer", true_few_shot.RECOMMENDED, true_few_shot.CEILING)
        }
        return {
            "setup": "ab",
            "model": {"name": "m", "fingerprint": "x"},
            "data": {"name": "toy", "fingerprint": "y"},
            "metric": "accuracy",
            "folds": 4,
            "commands": [f"layerfusion classify --trials {trials}"],
            "cells": [{"shots": n, "methods": methods} for n in shots],
        }

    lines = true_few_shot.summaries_markdown([summary(10, [8, 32]), summary(5, [8, 128])]).splitlines()
    rows = [line for line in lines if line.startswith("| toy, m |")]
    assert [row.split(" | ")[1:3] for row in rows] == [["8", "10"], ["32", "10"], ["128", "5"]]
    other = dict(summary(10, [8]), setup="cd")  # another setup: its own row
    lines = true_few_shot.summaries_markdown([summary(10, [8]), other]).splitlines()
    assert sum(line.startswith("| toy, m | 8 | 10 |") for line in lines) == 2
