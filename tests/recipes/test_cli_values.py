"""Command-line values that cannot run are refused before any cell runs: exit code 2, one line."""

from __future__ import annotations

import pytest
from conftest import toy_dataset, write_tiny_model, write_toy_data

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.errors import UserError
from layerfusion_recipes.ner.experiment import NerExperiment, NerSettings
from layerfusion_recipes.ner.training import TrainSettings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("values")
    return write_tiny_model(root / "model"), write_toy_data(root / "data", train=30, dev=8, test=8)


def _argv(tiny, output, *extra: str) -> list[str]:
    model, data = tiny
    grid = ["--methods", "none", "--epochs", "1", "--shots", "2", "--trials", "1"]
    return ["ner", "--model", model, "--data", data, *grid, "--output", str(output), "--quiet", *extra]


@pytest.mark.parametrize(
    "option, value",
    [
        ("--eval-every", "0"),
        ("--eval-every", "-1"),
        ("--epochs", "0"),
        ("--shots", "0"),
        ("--trials", "0"),
        ("--batch-size", "0"),
        ("--max-length", "0"),
        ("--dev-limit", "0"),
        ("--test-limit", "0"),  # meant "all" silently
        ("--test-limit", "-1"),
        ("--select-trials", "0"),
        ("--workers", "0"),
        ("--probe-fuse", "0"),
        ("--epochs", "two"),
    ],
)
def test_counts_below_one_are_refused_at_parse_time(tiny, tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main([*_argv(tiny, tmp_path), option, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"argument {option}: must be an integer >= 1, got '{value}'")
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ("--shots", "2", "11"),
            "--shots 11 asks for 11 x 3 entity types = 33 training sentences, the train split has 30; "
            "use --shots <= 10",
        ),
        (
            ("--train-sentences", "31"),
            "--train-sentences 31 asks for more training sentences than the train split has (30); "
            "use --train-sentences <= 30",
        ),
        (
            ("--max-length", "2"),
            "--max-length 2 leaves no room for a word: the tokenizer adds 2 special tokens",
        ),
        (  # the tiny model has 128 positions: a traceback on the first sentence longer than that
            ("--max-length", "129"),
            "--max-length 129: BertForTokenClassification embeds at most 128 positions; "
            "use --max-length <= 128",
        ),
        (  # peft skips a modules_to_save name that matches nothing: no head trained (none: a traceback)
            ("--head-modules", "nope"),
            "--head-modules ['nope']: no module of BertForTokenClassification ends with that name; "
            "its top-level modules: bert, dropout, classifier",
        ),
        (
            ("--head-modules", "classifier", "nope", "--methods", "dwatt", "--regimes", "lora"),
            "--head-modules ['nope']: no module of BertForTokenClassification ends with that name",
        ),
    ],
)
def test_values_the_data_cannot_give_are_refused_before_any_cell_runs(tiny, tmp_path, capsys, extra, message):
    assert main(_argv(tiny, tmp_path / "out", *extra)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"layerfusion ner: error: {message}"), lines
    assert not (tmp_path / "out").exists()  # no results.jsonl, no sweeps.jsonl: nothing ran


def test_bad_data_leaves_no_output_folder(tiny, tmp_path, capsys):
    model, _ = tiny
    bad = tmp_path / "bad.txt"
    bad.write_text("alice\tB-PER\tEXTRA\nbob\n")
    argv = ["ner", "--model", model, "--data", str(bad), "--output", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"layerfusion ner: error: {bad}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "line, message",
    [
        ("epochs: [25, 0]", "epochs must be integers >= 1, got [25, 0]"),
        ("test_limit: 0", "test_limit must be integers >= 1, got 0"),
        ("select_trials: 0", "select_trials must be integers >= 1, got 0"),
        ("probe_layers: 0", "probe_layers must be integers >= 1, got 0"),
        ("probe_fuse: 0", "probe_fuse must be integers >= 1, got 0"),
    ],
)
def test_counts_below_one_in_the_yaml_are_refused(tiny, tmp_path, capsys, line, message):
    model, data = tiny
    config = tmp_path / "grid.yaml"
    config.write_text(f"model: {model}\ndata: {data}\nmethods: [none]\nshots: [2]\n{line}\n")
    assert main(["sweep", "--config", str(config), "--results", str(tmp_path / "r.jsonl"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == f"layerfusion sweep: error: {config}: {message}"


def test_train_settings_and_samples_refuse_impossible_values(tiny):
    for field in ("epochs", "eval_every", "batch_size"):
        with pytest.raises(ValueError, match=f"TrainSettings.{field} must be an integer >= 1, got 0"):
            TrainSettings(**{field: 0})
    experiment = NerExperiment(NerSettings(model=tiny[0], data="toy"), toy_dataset(train=30))
    assert len(experiment.train_sample(10, 0)) == 30
    with pytest.raises(ValueError, match="--shots 11 asks for 11 x 3 entity types = 33"):
        experiment.train_sample(11, 0)


@pytest.mark.parametrize("bad", [0, True, 2.0, "2"])
def test_settings_of_a_script_refuse_a_probe_fuse_that_is_no_count(bad):
    with pytest.raises(UserError, match=f"probe_fuse: {bad!r}; allowed: an integer >= 1"):
        NerSettings(model="m", data="d", probe_fuse=bad)
    assert NerSettings(model="m", data="d", probe_fuse=2).probe_fuse == 2
