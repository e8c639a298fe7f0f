"""``layerfusion classify`` end to end on tiny random models and tiny data files: the protocol (N per
class, shared samples, every LR, test scores at the best dev epoch), resume, the dev cut, the one-line
errors, an encoder and a decoder family, and the scorer against scikit-learn."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch
from conftest import write_folders, write_text_data, write_tiny_decoder, write_tiny_model

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.classify.scoring import ClassScorer
from layerfusion_recipes.cli import main
from layerfusion_recipes.core.results.cells import FULL_TRAIN, Cell
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log, sweep_log_path
from peft_layerfusion.discovery import EncoderBlocks

SCORES = ("dev_accuracy", "dev_macro_f1", "test_accuracy", "test_macro_f1", "best_epoch", "curve")
PRE_NORM = "final_norms" in EncoderBlocks.__dataclass_fields__  # decoders' cache replay (decoders branch)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(
        tmp_path_factory, model=write_tiny_model, decoder=write_tiny_decoder, data=write_text_data
    )


@pytest.fixture(scope="module")
def experiment(paths) -> ClassifyExperiment:
    return ClassifyExperiment(ClassifySettings(model=paths["model"], data=paths["data"], batch_size=4))


def argv(paths, output, *extra) -> list[str]:
    return [
        "classify",
        *(
            "--model",
            paths["model"],
            "--data",
            paths["data"],
            "--methods",
            "none",
            "scalar_mix",
            "extra_layers",
        ),
        *("--shots", "2", "all", "--epochs", "2", "--trials", "2", "--lr", "1e-3", "3e-2"),
        *("--batch-size", "4", "--output", str(output), "--quiet", *extra),
    ]


def test_classify_runs_the_grid_writes_tables_and_figures_and_resumes(paths, tmp_path, capsys):
    assert main(argv(paths, tmp_path)) == 0
    records = read_records(tmp_path / "results.jsonl")
    assert len(records) == 2 * 3 * 2 * 2  # shots x methods x trials x LRs
    sizes = {(r["shots"], r["train_examples"]) for r in records}
    assert sizes == {(2, 2 * 3), (FULL_TRAIN, 24)}  # N per class of 3 classes; the whole train split
    for record in records:
        assert record["metric"] == "accuracy" and record["metrics"] == ["accuracy", "macro_f1"]
        (best,) = [point for point in record["curve"] if point["epoch"] == record["best_epoch"]]
        assert (
            record["dev_accuracy"] == best["dev_accuracy"] == max(p["dev_accuracy"] for p in record["curve"])
        )
        assert record["dev_macro_f1"] == best["dev_macro_f1"]
        assert 0 <= record["test_accuracy"] <= 1 and record["test_examples"] == 10
        assert record["labels"] == ["loc", "org", "per"] and record["head"] == ["classifier"]
    assert {r["cached"] for r in records if r["method"] != "extra_layers"} == {True}
    table = (tmp_path / "table.md").read_text()
    assert "Test accuracy at each run's best dev epoch" in table and "Test macro-F1 at each run's" in table
    assert "| fe | 2 | all |" in table and "scalar_mix - extra_layers" in table
    for figure in ("accuracy_vs_shots.png", "accuracy_vs_lr.png", "dev_curves.png"):
        assert (tmp_path / figure).stat().st_size > 0
    capsys.readouterr()
    assert main(argv(paths, tmp_path)) == 0  # resumed: nothing runs again
    assert read_sweep_log(sweep_log_path(tmp_path / "results.jsonl"))[-1]["runs"] == 0
    assert read_records(tmp_path / "results.jsonl") == records


def test_trials_share_their_sample_across_methods_and_draw_a_new_one(experiment):
    first = experiment.train_sample(3, 0)
    assert first == experiment.train_sample(3, 0) != experiment.train_sample(3, 1)
    assert Counter(f["labels"] for f in first) == {0: 3, 1: 3, 2: 3}
    assert len(experiment.train_sample(FULL_TRAIN, 1)) == len(experiment.data.train)


def test_a_class_smaller_than_n_is_taken_whole_and_said_once(experiment, capsys):
    assert experiment.class_counts() == {"loc": 10, "org": 4, "per": 10}
    experiment.check_shots([2, FULL_TRAIN, 5])
    sample = [experiment.train_sample(5, trial) for trial in range(2)]  # each checks its N again
    assert capsys.readouterr().err == (
        "layerfusion: --shots 5: 1 class has fewer train examples and is taken whole: 'org' (4); a sample "
        "has 14 examples, not 5 x 3 = 15\n"
    )
    assert [Counter(f["labels"] for f in s) for s in sample] == [{0: 5, 1: 4, 2: 5}] * 2
    with pytest.raises(ValueError) as error:
        experiment.check_shots([2, 11])
    assert str(error.value) == (
        "--shots 11 asks for 11 examples of each class; the largest class, 'loc', has 10 in train: use "
        "--shots <= 10, or --shots all for the whole train split"
    )


def test_lrs_together_on_the_cache_equal_lone_uncached_runs(experiment):
    cell, lrs = Cell("scalar_mix", "fe", 4, 6, 0), [1e-3, 3e-1]
    together = experiment.run_lrs(cell, lrs)
    lone = [experiment.run(cell, use_cache=False, lr=lr) for lr in lrs]
    for stacked, alone in zip(together, lone, strict=True):
        assert stacked["cached"] and not alone["cached"]
        assert {k: stacked[k] for k in SCORES} == {k: alone[k] for k in SCORES}
    assert len({json.dumps(r["curve"]) for r in together}) > 1  # the LRs really differ


@pytest.mark.parametrize("regime", ["ft", "lora", "bitfit"])
def test_every_regime_trains(experiment, regime):
    record = experiment.run(Cell("average", regime, 2, 1, 0), lr=1e-3)
    assert not record["cached"] and record["regime"] == regime and record["test_accuracy"] is not None


def test_decoder_family_reads_its_last_token(paths, tmp_path):
    extra = () if PRE_NORM else ("--no-cache",)
    command = argv({**paths, "model": paths["decoder"]}, tmp_path, "--methods", "none", "average", *extra)
    assert main(command) == 0
    records = read_records(tmp_path / "results.jsonl")
    assert {r["read_positions"] for r in records} == {"last"} and {tuple(r["head"]) for r in records} == {
        ("score",)
    }


def test_dev_cut_from_train_is_said(paths, tmp_path, capsys):
    data = write_text_data(tmp_path / "data", sizes=(("train", 40), ("test", 8)))
    command = argv(
        {**paths, "data": data}, tmp_path / "out", "--methods", "none", "--shots", "2", "--trials", "1"
    )
    assert main(command) == 0
    assert "no dev split: cut into train/dev 80/20 with seed 0" in capsys.readouterr().err
    assert {r["dev_examples"] for r in read_records(tmp_path / "out" / "results.jsonl")} == {8}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda a: [x for i, x in enumerate(a) if x != "--data" and a[i - 1] != "--data"],
            "--data is required",
        ),
        (lambda a: [*a, "--shots", "50"], r"--shots 50 asks for 50 examples of each class"),
        (lambda a: [*a, "--label-column", "stars"], r"no column 'stars' \(--label-column\)"),
        (lambda a: [*a, "--methods", "dwat"], r"--methods: unknown \['dwat'\]"),
        (lambda a: [*a, "--regimes", "adapter_seqbn"], r"--regimes: unknown \['adapter_seqbn'\]"),
        (lambda a: [*a, "--head-modules", "clasifier"], r"--head-modules \['clasifier'\]: no module of"),
        (
            lambda a: [*a, "--max-length", "500"],
            r"--max-length 500: BertForSequenceClassification embeds at most",
        ),
    ],
)
def test_bad_options_and_data_are_one_line(paths, tmp_path, capsys, change, message):
    assert main(change(argv(paths, tmp_path))) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("layerfusion classify: error: ")
    assert __import__("re").search(message, error), error
    assert not (tmp_path / "results.jsonl").exists()


def test_bad_line_of_a_data_file_names_file_and_line(paths, tmp_path, capsys):
    data = write_text_data(tmp_path / "data")
    with open(f"{data}/dev.csv", "a") as handle:
        handle.write("a text,with,two commas\n")
    assert main(argv({**paths, "data": data}, tmp_path / "out")) == 2
    assert capsys.readouterr().err == (
        f"layerfusion classify: error: {data}/dev.csv, line 12: "
        "3 fields where the header has 2 (text, label)\n"
    )


def test_scorer_equals_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    gold = [rng.randrange(4) for _ in range(40)]
    predicted = torch.tensor([[rng.randrange(4) for _ in gold] for _ in range(3)] + [[0] * len(gold)])
    scores = ClassScorer([{"labels": label} for label in gold], 4, "macro_f1").scores(predicted)
    for row, score in zip(predicted.tolist(), scores, strict=True):
        assert list(score) == ["macro_f1", "accuracy"]
        assert score["accuracy"] == pytest.approx(metrics.accuracy_score(gold, row), abs=1e-12)
        expected = metrics.f1_score(gold, row, average="macro", zero_division=0)
        assert score["macro_f1"] == pytest.approx(expected, abs=1e-12)


def test_record_settings_name_what_changes_a_result(paths):
    one = ClassifySettings(model=paths["model"], data=paths["data"])
    changes = (("pooling", "mean"), ("metric", "macro_f1"), ("label_column", "y"), ("text_column", "t"))
    keys = {ClassifySettings(**{**vars(one), name: value}).setup() for name, value in changes}
    assert len(keys | {one.setup()}) == 5
    assert json.loads(json.dumps(one.setup_fields()))["pooling"] == "model"
