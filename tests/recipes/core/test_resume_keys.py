"""A run's key is the fingerprint of its whole resolved setup: the settings that change its result
(the cache's dtype included, whatever its value) and, for a fusion method, its config's defaults. A
setting or default that changes gives another key, so a stored record is never served for it."""

from __future__ import annotations

import argparse

import pytest

from layerfusion_recipes.classify.experiment import ClassifySettings
from layerfusion_recipes.cli import build_parser
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.probes.probes import PROBE_SETTINGS
from layerfusion_recipes.core.results.cells import config_defaults, defaults_key
from layerfusion_recipes.core.results.records import fingerprint
from layerfusion_recipes.mlm.options import add_arguments as add_mlm_arguments
from layerfusion_recipes.mlm.records import run_key as mlm_run_key
from layerfusion_recipes.mlm.settings import MlmSettings
from layerfusion_recipes.ner.experiment import Cell, NerSettings, record_key
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.seq2seq import variants
from layerfusion_recipes.seq2seq.command import comparison_header
from layerfusion_recipes.seq2seq.records import comparison_setup, run_key
from peft_layerfusion.registration import METHODS, method_named

NER_ARGV = ["--model", "hub-model/x", "--data", "hub/data", "--lr", "1e-3", "3e-2", "--shots", "8"]
MLM_ARGV = ["--data", "wikitext-x", "--model", "hub/model", "--epochs", "2", "--head-modules", "cls"]


def _parse(add_arguments, argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_ner_setup_holds_every_setting_that_changes_a_result_the_cache_dtype_too():
    settings, _ = resolve(_parse(add_experiment_arguments, NER_ARGV))
    fields = settings.setup_fields()
    assert (fields["cache_dtype"], fields["model"], fields["data"]) == ("float32", "hub-model/x", "hub/data")
    assert settings.setup() == fingerprint(fields)
    half, _ = resolve(_parse(add_experiment_arguments, [*NER_ARGV, "--cache-dtype", "bfloat16"]))
    longer, _ = resolve(_parse(add_experiment_arguments, [*NER_ARGV, "--batch-size", "4"]))
    assert len({settings.setup(), half.setup(), longer.setup()}) == 3


@pytest.mark.parametrize("method", [method.name for method in METHODS])
def test_a_fusion_method_s_key_carries_its_config_defaults(method):
    registered = method_named(method)  # a preset's values over its method's defaults
    preset = registered.config_cls.PRESETS[registered.preset].values if registered.preset else {}
    expected = fingerprint({**config_defaults(registered.config_cls), **preset})
    assert defaults_key(method) == expected and len(expected) == 12
    if registered.preset:  # a preset is another setting of its method: another key
        assert expected != defaults_key(registered.variant_of)
    key = record_key(Cell(method, "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b")
    assert key == f"{method}|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|defaults={expected}"


def test_the_plain_head_has_no_config_so_no_defaults_in_its_key():
    assert defaults_key("none") is None
    key = record_key(Cell("none", "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b")
    assert key == "none|fe|8|25|0|lr=0.001|3f2a9c0d1e4b"


@pytest.mark.parametrize("method", [method.name for method in METHODS])
def test_a_method_whose_defaults_change_gets_another_key(method, monkeypatch):
    cell = Cell(method, "fe", 8, 25, 0)
    before = record_key(cell, 1e-3, "3f2a9c0d1e4b")
    field = method_named(method).config_cls.__dataclass_fields__["fusion_init"]  # every fusion config's
    monkeypatch.setattr(field, "default", "identity" if field.default != "identity" else "paper")
    after = record_key(cell, 1e-3, "3f2a9c0d1e4b")
    assert after != before and after.startswith(f"{method}|fe|8|25|0|lr=0.001|3f2a9c0d1e4b|defaults=")


def test_the_keyed_defaults_are_the_library_s_own_options_not_peft_s():
    defaults = config_defaults(method_named("layer_mix").config_cls)  # ScalarMix's (layer_mix: its preset)
    assert defaults["mixing_lr_multiplier"] == 1.0 and defaults["state_norm"] == "none"
    assert not {"r", "lora_alpha", "task_type", "peft_type", "revision"} & set(defaults)


def test_a_masked_lm_key_changes_with_its_settings_and_carries_the_method_s_defaults():
    settings = MlmSettings.from_args(_parse(add_mlm_arguments, MLM_ARGV))
    stored = settings.run_settings(1e-3)
    assert (stored["method"], stored["epochs"], stored["lr"]) == ("dwatt", 2, 1e-3)
    assert stored["head_modules"] == ["cls"]
    key = mlm_run_key(stored)
    assert key.startswith("dwatt|fe|0|lr=0.001|") and key.endswith(f"|defaults={defaults_key('dwatt')}")
    assert mlm_run_key({**stored, "epochs": 3}) != key and mlm_run_key({**stored, "lr": 3e-3}) != key
    other = MlmSettings.from_args(_parse(add_mlm_arguments, [*MLM_ARGV, "--seed", "1"]))
    assert mlm_run_key(other.run_settings(1e-3)).startswith("dwatt|fe|1|lr=0.001|")


def test_a_seq2seq_variant_s_key_carries_its_options_and_changes_with_them(monkeypatch):
    options = variants.variant_options("surface_hard")
    assert options["fusion"] == "hard" and options["fusion_lambda"] == 0.8
    key = run_key("surface_hard", 0, 3e-3, "3f2a9c0d1e4b")
    assert key == f"surface_hard|0|lr=0.003|3f2a9c0d1e4b|defaults={fingerprint(options)}"
    assert run_key("none", 0, 3e-3, "3f2a9c0d1e4b") == "none|0|lr=0.003|3f2a9c0d1e4b"
    config_cls = next(cls for cls, named in variants.VARIANTS.items() if "surface_hard" in named)
    changed = {**variants.VARIANTS, config_cls: {**variants.VARIANTS[config_cls]}}
    changed[config_cls]["surface_hard"] = {**changed[config_cls]["surface_hard"], "fusion_lambda": 0.5}
    monkeypatch.setattr(variants, "VARIANTS", changed)
    assert run_key("surface_hard", 0, 3e-3, "3f2a9c0d1e4b") != key


# keys computed at 2ca4922, before the sweep's plan left the settings and `lr` took one type: the same
# setup gives the same keys, so no stored record runs again
KEYS_BEFORE = {
    "layer_mix": "layer_mix|fe|8|25|0|lr=0.003|b7ef7ebde7dd|defaults=5f15925e06c6|start=4|layers=2,4",
    "average": "average|fe|8|25|0|lr=0.01|b7ef7ebde7dd|defaults=9ec961ee75c2|layers=2,4",
    "none": "none|fe|8|25|0|lr=0.0001|b7ef7ebde7dd",
    "classify": "dwatt|lora|16|10|2|lr=0.003|a4636eee0077|defaults=3da63963ae43",
    "mlm": "dwatt|fe|0|lr=0.003|87d803e8d675|defaults=3da63963ae43",
    "seq2seq": "surface_hard|1|lr=0.003|4c254100e773|defaults=05eeeb02555a",
}


def test_the_keys_of_a_representative_setup_are_those_before_the_plan_and_the_one_lr_type(monkeypatch):
    """Probe starts and fused blocks from the sweep's plan, LRs by method, half-precision cache, method
    options and a dev limit (NER); a flat LR grid (classify, mlm, seq2seq). The NER setup reads the
    probes' settings: under those of 2ca4922 (no flat-limit rule, 4 growth steps) its keys are the same
    as then; under today's they differ, so no record of the older probes is served as a new one."""
    lr = {"layer_mix": [3e-3, 1e-2], "average": [1e-2]}
    options = {"lr": lr, "batch_size": 4, "method_options": {"lora_r": 4}, "dev_limit": 50}
    ner = NerSettings("tiny-bert", "conll2003", **options)
    ner = NerSettings(**{**vars(ner), "cache_dtype": "bfloat16", "probe_start": True, "probe_fuse": 2})
    plan = SweepPlan("labelled", 10**9, probe_starts={(8, 25, 0): 4}, probe_ranks={(8, 25, 0): [4, 2, 3]})
    cells = {method: Cell(method, "fe", 8, 25, 0) for method in ("layer_mix", "average", "none")}
    today = {m: ner.run_key(cell, ner.lr_grid("fe", m)[0], ner.setup(), plan) for m, cell in cells.items()}
    monkeypatch.setitem(PROBE_SETTINGS, "grow", 4)
    monkeypatch.delitem(PROBE_SETTINGS, "flat")
    for method, cell in cells.items():
        assert ner.run_key(cell, ner.lr_grid("fe", method)[0], ner.setup(), plan) == KEYS_BEFORE[method]
        assert today[method] != KEYS_BEFORE[method]
    monkeypatch.undo()
    classify = ClassifySettings("tiny-bert", "sst2", lr=[1e-3, 3e-3], pooling="mean")
    cell = Cell("dwatt", "lora", 16, 10, 2)
    lr = classify.lr_grid("lora", "dwatt")[1]
    assert classify.run_key(cell, lr, classify.setup(), SweepPlan()) == KEYS_BEFORE["classify"]
    mlm = MlmSettings.from_args(build_parser().parse_args(
        ["mlm", "--data", "wikitext-2", "--model", "tiny-bert", "--method", "dwatt", "--lr", "1e-3", "3e-3"]
        + ["--epochs", "2", "--regime", "fe"]
    ))  # fmt: skip
    assert mlm_run_key(mlm.run_settings(3e-3)) == KEYS_BEFORE["mlm"]
    argv = ["seq2seq", "--data", "wt2", "--epochs", "3", "--lr", "1e-3", "3e-3"]
    header = comparison_header(build_parser().parse_args(argv))
    assert run_key("surface_hard", 1, 3e-3, comparison_setup(header)) == KEYS_BEFORE["seq2seq"]
