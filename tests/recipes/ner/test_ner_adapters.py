"""The NER recipe with AdapterHub's bottleneck adapters (regimes ``adapter_seqbn``, ``adapter_double_seqbn``).

What is refused is refused before any run in every stack; the training itself runs where
AdapterHub's ``adapters`` (transformers 4.57.x) is installed and is skipped elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys

import pytest
import torch
import yaml
from conftest import toy_dataset, write_tiny_model, write_toy_data

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.models.models import regime_options
from layerfusion_recipes.core.options.grids import DEFAULT_LR_GRIDS
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings, record_key
from layerfusion_recipes.ner.models import NER_REGIME_NAMES
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.ner.training import TokenClassifierRunner, train_token_classifier
from peft_layerfusion.comparison.budget import bottleneck_params
from peft_layerfusion.comparison.regimes import trainable_parameter_names


def parse(*argv: str) -> argparse.Namespace:
    """The sweep's options of ``argv``, with a model and data that are never loaded."""
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    return parser.parse_args(["--model", "some/model", "--data", "some/data", *argv])


def write_grid(path, **options) -> str:
    path.write_text(yaml.safe_dump(options))
    return str(path)


def test_every_regime_of_the_recipe_has_a_default_lr_grid_and_a_help_line(capsys):
    assert set(DEFAULT_LR_GRIDS) == set(NER_REGIME_NAMES)
    assert (
        DEFAULT_LR_GRIDS["adapter_seqbn"]
        == DEFAULT_LR_GRIDS["adapter_double_seqbn"]
        == (3e-4, 1e-3, 3e-3, 1e-2)
    )
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "adapter_seqbn" in out and "adapter_double_seqbn" in out


def test_a_fusion_method_with_an_adapter_regime_stops_before_any_run(tmp_path, capsys):
    with pytest.raises(
        ValueError, match=r"--methods dwatt with --regimes adapter_seqbn: .* method none only"
    ):
        resolve(parse("--methods", "none", "dwatt", "--regimes", "lora", "adapter_seqbn"))
    grid = write_grid(tmp_path / "grid.yaml", methods=["concat"], regimes=["adapter_double_seqbn"])
    with pytest.raises(ValueError, match=r"`methods: \[none\]`.*concat in one of the regimes fe, ft, lora"):
        resolve(parse("--config", grid))
    # the command: one line, exit code 2, and no model or data was read (the model and data folders
    # exist, as the command line checks before it imports the library, but hold nothing)
    (tmp_path / "none").mkdir()
    argv = ["sweep", "--model", str(tmp_path / "none"), "--data", str(tmp_path)]
    assert main([*argv, "--methods", "dwatt", "--regimes", "adapter_seqbn", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--methods dwatt with --regimes adapter_seqbn" in err


def test_without_adapters_the_regimes_stop_with_one_line_naming_the_stack(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "adapters", None)  # `import adapters` fails, in every stack
    (tmp_path / "none").mkdir()  # an empty model folder: there (checked first), never read
    argv = ["sweep", "--model", str(tmp_path / "none"), "--data", str(tmp_path)]  # no data in it
    code = main([*argv, "--methods", "none", "--regimes", "fe", "adapter_seqbn", "--output", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("layerfusion sweep: error: --regimes adapter_seqbn: ")
    assert "`adapters` 1.3.0" in err and "transformers 4.57" in err and "peft_layerfusion[adapters]" in err
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("regimes", "options", "message"),
    [
        (["lora"], {"adapter_reduction_factor": 8}, r"\['adapter_reduction_factor'\] size .* does not run"),
        (["adapter_seqbn"], {"lora_r": 8}, r"\['lora_r'\] do not apply .* allowed: adapter_reduction_factor"),
        (["adapter_seqbn"], {"adapter_reduction_factor": 0}, r"a number > 0 .*, got 0"),
        (["adapter_seqbn"], {"adapter_reduction_factor": "8"}, r"a number > 0 .*, got '8'"),
    ],
)
def test_adapter_options_nothing_would_use_are_refused(tmp_path, regimes, options, message):
    grid = write_grid(tmp_path / "grid.yaml", methods=["none"], regimes=regimes, method_options=options)
    with pytest.raises(ValueError, match=message):
        resolve(parse("--config", grid))


def test_one_grid_sizes_lora_and_the_adapters_side_by_side():
    options = {"lora_r": 114, "adapter_reduction_factor": 1.5}
    assert regime_options("adapter_double_seqbn", options) == {"reduction_factor": 1.5}
    assert regime_options("lora", options) == {"lora_r": 114}
    assert regime_options("adapter_seqbn", {}) == {}


def test_the_reduction_factor_is_part_of_the_record_key():
    cell = Cell("none", "adapter_seqbn", 8, 25, 0)
    setups = [NerSettings("m", "d", method_options={"adapter_reduction_factor": f}).setup() for f in (4, 8)]
    assert len({record_key(cell, 1e-3, setup) for setup in setups}) == 2


def test_sweep_trains_bottleneck_adapters_and_resumes_per_reduction_factor(tmp_path, capsys):
    pytest.importorskip("adapters")
    model = write_tiny_model(tmp_path / "model")  # 3 blocks of width 32
    options = dict(model=model, data=write_toy_data(tmp_path / "data"), methods=["none"])
    options.update(regimes=["adapter_seqbn"], shots=[8], epochs=[8], trials=1, batch_size=4, eval_every=1)
    options.update(output=str(tmp_path / "out"), quiet=True, threads=1)
    results = tmp_path / "out" / "results.jsonl"

    def sweep(reduction_factor: float) -> list[dict]:
        method_options = {"adapter_reduction_factor": reduction_factor}
        grid = write_grid(tmp_path / "grid.yaml", **options, method_options=method_options)
        assert main(["sweep", "--config", grid]) == 0, capsys.readouterr().err
        return [r for r in read_records(results) if r.get("method_options") == method_options]

    records = sweep(8)  # bottleneck 32 // 8 = 4
    assert sorted(r["lr"] for r in records) == list(DEFAULT_LR_GRIDS["adapter_seqbn"])
    for record in records:
        assert record["regime"] == "adapter_seqbn" and not record["cached"]
        assert 0.0 <= record["test_f1"] <= 1.0 and len(record["curve"]) == 8
        assert record["adapter"] == {
            "kind": "seqbn",
            "reduction_factor": 8.0,
            "params": bottleneck_params(32, 3, 4),
        }
    assert max(r["dev_f1"] for r in records) > 0.5, [
        r["curve"] for r in records
    ]  # it learns the toy entities
    assert sweep(8) == records  # resumed: nothing ran again
    larger = sweep(4)  # bottleneck 8: new records under another setup, none reused
    assert len(larger) == 4 and len(read_records(results)) == 8
    assert {r["setup"] for r in larger}.isdisjoint(r["setup"] for r in records)
    assert {r["adapter"]["params"] for r in larger} == {bottleneck_params(32, 3, 8)}
    assert json.loads(results.read_text().splitlines()[-1])["key"].startswith("none|adapter_seqbn|8|8|0|lr=")


def test_the_adapters_train_in_the_recipe_and_the_encoder_does_not(tmp_path):
    pytest.importorskip("adapters")
    settings = NerSettings(write_tiny_model(tmp_path / "model"), "toy", batch_size=4)
    experiment = NerExperiment(settings, toy_dataset())
    cell = Cell("none", "adapter_seqbn", 4, 2, 0)
    model, located = experiment.build(cell)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    train = experiment.train_sample(4, 0)
    runner = TokenClassifierRunner(model, located)
    train_token_classifier(
        runner, train, experiment.dev, experiment.id2label, experiment.train_settings(cell), 1e-2
    )
    moved = {name for name, param in model.named_parameters() if not torch.equal(param, before[name])}
    assert moved == set(trainable_parameter_names(model))
    assert any(".adapters.bottleneck." in name for name in moved) and "classifier.weight" in moved
