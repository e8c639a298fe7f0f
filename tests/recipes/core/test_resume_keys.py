"""Records written before the recipes were rearranged are still resumed: the keys and stored settings
of NER and masked-LM runs, computed by the code of that time, are pinned here; and the stored seq2seq
comparison of benchmarks/results/ is resumed by its command. A method whose config defaults change
gets other keys, so its old records are never served for the new defaults."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import write_tiny_model
from layerfusion_recipes.cli import build_parser, main
from layerfusion_recipes.core.cells import KEYED_DEFAULTS, config_defaults, defaults_key
from layerfusion_recipes.mlm import experiment as mlm
from layerfusion_recipes.mlm.options import add_arguments as add_mlm_arguments
from layerfusion_recipes.mlm.settings import MlmSettings
from layerfusion_recipes.ner.experiment import Cell, record_key
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.seq2seq.experiment import METHOD_NAMES, comparison_header
from layerfusion_recipes.seq2seq.records import comparison_setup, legacy_records, run_key

from peft_layerfusion.registration import METHODS, method_named

ROOT = Path(__file__).resolve().parents[3]
NER_ARGV = ["--model", "hub-model/x", "--data", "hub/data", "--lr", "1e-3", "3e-2", "--shots", "8"]
NER_ARGV += ["--batch-size", "4", "--eval-every", "1"]  # the default before the small grid of user data
MLM_ARGV = ["--data", "wikitext-x", "--model", "hub/model", "--epochs", "2", "--head-modules", "cls"]
# computed by the flat recipes/ of commit 2e9b5e8 (experiment.record_key, mlm.run_settings)
NER_SETUP = "6ae3dec27c10"
MLM_SETTINGS = {
    "model": "hub/model", "data": "wikitext-x", "holdout": 0.1, "method": "dwatt", "regime": "fe",
    "epochs": 2, "batch_size": 8, "block_size": 128, "mlm_probability": 0.15, "max_train_blocks": None,
    "max_eval_blocks": None, "head_modules": ["cls"], "seed": 0, "lr": 0.001,
}  # fmt: skip


def _parse(add_arguments, argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_ner_record_key_is_the_one_written_before():
    settings, _ = resolve(_parse(add_experiment_arguments, NER_ARGV))
    assert settings.setup() == NER_SETUP
    key = record_key(Cell("concat", "fe", 8, 25, 0), 1e-3, settings.setup())  # dwatt's defaults changed
    assert key == f"concat|fe|8|25|0|lr=0.001|{NER_SETUP}"


@pytest.mark.parametrize("method", [method.name for method in METHODS])
def test_a_method_whose_defaults_change_gets_keys_its_old_records_do_not_have(method, monkeypatch):
    cell = Cell(method, "fe", 8, 25, 0)
    before = record_key(cell, 1e-3, NER_SETUP)
    field = method_named(method).config_cls.__dataclass_fields__["fusion_init"]  # every fusion config's
    monkeypatch.setattr(field, "default", "identity" if field.default != "identity" else "paper")
    after = record_key(cell, 1e-3, NER_SETUP)
    assert after != before
    assert after.startswith(f"{method}|fe|8|25|0|lr=0.001|{NER_SETUP}|defaults=")


def test_every_method_keeps_the_keys_of_its_committed_records():
    assert set(KEYED_DEFAULTS) == {method.name for method in METHODS}  # a new method: keys carry defaults
    unchanged = {method.name for method in METHODS if defaults_key(method.name) is None}
    # no default changed, so benchmarks/results resume as they are; after a change, the changed method
    # leaves this set (never edit KEYED_DEFAULTS: its old records would be served for the new defaults)
    # DWAtt stores its MLP weights (out, in) now (its init draws them so, its products round otherwise)
    assert unchanged == set(KEYED_DEFAULTS) - {"dwatt", "scaled_dwatt"}
    assert record_key(Cell("none", "fe", 8, 25, 0), 1e-3, NER_SETUP) == f"none|fe|8|25|0|lr=0.001|{NER_SETUP}"


def test_the_keyed_defaults_are_the_library_s_own_options_not_peft_s():
    defaults = config_defaults(method_named("layer_mix").config_cls)  # ScalarMix's (layer_mix: its preset)
    assert defaults["mixing_lr_multiplier"] == 1.0 and defaults["state_norm"] == "none"
    assert not {"r", "lora_alpha", "task_type", "peft_type", "revision"} & set(defaults)


def test_a_masked_lm_run_file_of_before_is_reused(tmp_path, monkeypatch, capsys):
    settings = MlmSettings.from_args(_parse(add_mlm_arguments, MLM_ARGV))
    assert settings.run_settings(1e-3) == MLM_SETTINGS
    # a run file as the earlier recipe wrote it: the grid resumes it instead of training
    model = write_tiny_model(tmp_path / "model")
    data = tmp_path / "wt"
    data.mkdir()
    for name in ("valid.txt", "test.txt"):
        (data / name).write_text("alice went to paris .\n" * 20)
    stored = {**MLM_SETTINGS, "model": model, "data": str(data), "head_modules": None, "epochs": 1}
    record = {"model": model, "method": "dwatt", "regime": "fe", "epochs": 1, "lr": 1e-3, "dev_ppl": 9.0,
              "best_valid_ppl": 9.0, "test_ppl": 8.0, "data": "note", "settings": stored}  # fmt: skip
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlm-dwatt-fe-lr0.001.json").write_text(json.dumps(record))
    monkeypatch.setattr(mlm, "prepare_data", None)  # nothing may run
    argv = ["mlm", "--data", str(data), "--model", model, "--epochs", "1", "--lr", "1e-3"]
    assert main([*argv, "--output", str(tmp_path / "out")]) == 0
    assert "finished earlier with these settings, skipped" in capsys.readouterr().out


def test_the_stored_seq2seq_comparison_is_resumed_by_its_command():
    """``benchmarks/results/seq2seq/results.json`` (written before results.jsonl): its 12 runs have the
    keys a re-run of its command (RESULTS.md section 5, on the machine that ran it) asks for."""
    folder = ROOT / "benchmarks" / "results" / "seq2seq"
    stored = json.loads((folder / "results.json").read_text())
    args = build_parser().parse_args(["seq2seq", "--data", str(Path(stored["train_file"]).parent)])
    setup = comparison_setup(comparison_header(args))
    wanted = {run_key(m, seed, lr, setup) for m in METHOD_NAMES for seed in (0, 1, 2) for lr in (3e-3,)}
    assert {record["key"] for record in legacy_records(folder)} == wanted and len(wanted) == 12
