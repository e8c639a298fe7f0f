"""The few-shot probe ensemble and stacked combiner as presets of Concat: :func:`few_shot.deploy` builds
their configs through the presets (the saved ``adapter_config.json`` says which), the deployed adapter
gives the read-out's logits, reloads bitwise, and trains further with the Trainer."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import NO_DROPOUT, fusion_of, tiny_bert
from peft import PeftModel
from test_trainer import NUM_LABELS, mean_loss, quiet_arguments, token_examples
from transformers import Trainer

from peft_layerfusion import ConcatConfig, few_shot
from peft_layerfusion.registration import method_named

PRESETS = ("probe_ensemble", "stacked", "joint_probe", "joint_ensemble")


def sample_trial(base: torch.nn.Module) -> tuple[few_shot.Trial, list[dict[str, torch.Tensor]], torch.Tensor]:
    """:func:`few_shot.choose` on the states of ``base`` for the Trainer tests' tagged sentences (their
    scored tokens): the trial, the examples, and the rows ``(tokens, L + 1, d)``."""
    examples = token_examples()
    ids = torch.stack([example["input_ids"] for example in examples])  # (16, 8)
    labels = torch.stack([example["labels"] for example in examples])  # (16, 8), -100 on the padded tail
    with torch.no_grad():
        hidden = base(input_ids=ids, output_hidden_states=True).hidden_states
    scored = labels.flatten() != -100
    states = few_shot.head_states(hidden).flatten(0, 1)[scored]  # (96, L + 1, d)
    sentence = torch.arange(len(examples)).repeat_interleave(ids.shape[1])[scored]
    trial = few_shot.choose(states, labels.flatten()[scored], folds=4, groups=sentence, classes=NUM_LABELS)
    return trial, examples, states


def readout_named(trial: few_shot.Trial, name: str) -> few_shot.LinearReadout:
    """The trial's ``stacked`` read-out; for ``probe_ensemble`` the ensemble of every block (``k = L``): on
    this sample cross-validation picks ``k = 1`` (the tiny model's blocks probe alike), one block, which
    deploys as an Average."""
    if name == "stacked":
        return trial.readouts[name]
    weight = torch.stack([p.weight for p in trial.probes], dim=1) / len(trial.probes)  # (C, L, d)
    bias = torch.stack([p.bias for p in trial.probes]).mean(0)
    return few_shot.LinearReadout(tuple(p.block for p in trial.probes), weight, bias, method=name)


def test_the_registry_lists_them_as_presets_of_concat():
    for name in PRESETS:
        method = method_named(name)
        config = method.make_config(map_rank=5)
        assert method.variant_of == "concat" and type(config) is ConcatConfig
        assert (config.readout_fit, config.state_norm, config.map_rank) == (name, "none", 5)  # Concat's
    with pytest.raises(ValueError) as error:
        ConcatConfig(readout_fit="ensemble")
    allowed = "['probe_ensemble', 'stacked', 'joint_probe', 'joint_ensemble']"
    assert str(error.value) == f"`readout_fit`='ensemble' is not allowed: expected None or one of {allowed}."


def test_choose_names_each_readout_and_the_guarded_one_by_what_it_deploys():
    trial, _, _ = sample_trial(tiny_bert(num_labels=NUM_LABELS, **NO_DROPOUT))
    assert {
        name: readout.method for name, readout in trial.readouts.items() if name != "guarded_ensemble"
    } == {name: name for name in few_shot.METHODS if name != "guarded_ensemble"}
    assert trial.readouts["guarded_ensemble"].method == trial.guard.deploy
    assert (trial.top_k, trial.readouts["probe_ensemble"].blocks) == (1, (trial.best_block,))
    assert trial.readouts["stacked"].blocks == (1, 2, 3)


@pytest.mark.parametrize("name", PRESETS)
def test_a_readout_deploys_through_its_preset_and_reloads_bitwise(name, tmp_path):
    base = tiny_bert(num_labels=NUM_LABELS, **NO_DROPOUT)
    trial, _, states = sample_trial(base)
    readout = readout_named(trial, name)
    assert readout.blocks == (1, 2, 3)  # every block of the tiny BERT: a Concat, not an Average
    model = few_shot.deploy(copy.deepcopy(base), readout, "classifier").eval()
    config = model.peft_config["default"]
    assert type(config) is ConcatConfig and config.readout_fit == name
    assert (config.map_rank, config.fusion_init, config.layers) == (NUM_LABELS, "paper", list(readout.blocks))
    assert config.state_norm == "rms_after_norm"
    ids = torch.stack([example["input_ids"] for example in token_examples()])
    scored = torch.stack([example["labels"] for example in token_examples()]).flatten() != -100
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # (16, 8, C)
    torch.testing.assert_close(
        logits.flatten(0, 1)[scored].double(), readout.logits(states), atol=1e-5, rtol=0
    )
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (saved["peft_type"], saved["readout_fit"]) == ("CONCAT", name)
    assert f"(the preset `{name}`)" in (tmp_path / "README.md").read_text()
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path).eval()
    assert reloaded.peft_config["default"].readout_fit == name
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits)


def test_a_readout_of_no_preset_deploys_as_a_plain_concat():
    base = tiny_bert(num_labels=3, **NO_DROPOUT)
    weight, bias = torch.randn(3, 2, 32, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for method in (None, "average"):
        config = few_shot.readout_config(few_shot.LinearReadout((1, 3), weight, bias, method), "classifier")
        assert type(config) is ConcatConfig and config.readout_fit is None and config.fusion_init == "paper"
    one = few_shot.LinearReadout((2,), weight[:, :1], bias, "probe_ensemble")  # k = 1: the block alone
    assert type(few_shot.readout_config(one, "classifier")).__name__ == "AverageConfig"
    assert few_shot.deploy(base, one, "classifier").peft_config["default"].layers == [2]


@pytest.mark.parametrize("name", PRESETS)
def test_the_trainer_trains_a_deployed_readout_further_and_it_reloads_bitwise(name, tmp_path):
    base = tiny_bert(num_labels=NUM_LABELS, **NO_DROPOUT)
    trial, examples, _ = sample_trial(base)
    model = few_shot.deploy(copy.deepcopy(base), readout_named(trial, name), "classifier")
    fusion_before = {key: value.clone() for key, value in fusion_of(model).state_dict().items()}
    loss_before = mean_loss(model, examples)
    arguments = quiet_arguments(str(tmp_path / "run"), max_steps=8, learning_rate=1e-2)
    Trainer(model=model, args=arguments, train_dataset=examples).train()
    loss_after = mean_loss(model, examples)
    print(f"{name}: loss {loss_before:.4f} -> {loss_after:.4f}")
    assert loss_after < loss_before - 0.05
    fusion_after = fusion_of(model).state_dict()
    assert all(not torch.equal(fusion_after[key], tensor) for key, tensor in fusion_before.items())  # A, B, b
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter").eval()
    assert reloaded.peft_config["default"].readout_fit == name
    batch = {key: torch.stack([example[key] for example in examples]) for key in examples[0]}
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model.eval()(**batch).logits)
