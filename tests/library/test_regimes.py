"""Regimes by name: exactly the named parameters train, and every combination saves and reloads."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import perturb_, tiny_bert
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

from peft_layerfusion import BitFitConfig, ConcatConfig, DWAttConfig
from peft_layerfusion.comparison.checkpoints import FULL_STATE_FILE, load_trained, save_trained
from peft_layerfusion.comparison.regimes import (
    ANY_QUERY_VALUE_PATTERN,
    METHOD_NAMES,
    REGIME_NAMES,
    apply_regime,
    default_lora_targets,
    make_config,
    trainable_parameter_names,
)


def expected_trainable(name: str, method: str, regime: str) -> bool:
    """What each regime names, written from its definition on parameter names alone."""
    if ".original_module." in name:  # frozen copy of the head that no forward uses
        return False
    if regime == "ft":
        return True
    head = "classifier" in name
    fusion = ".layer_fusion." in name
    extra = {"fe": False, "lora": "lora_" in name, "bitfit": name.endswith(".bias")}[regime]
    return head or fusion or extra


def perturb_trainable_(model: torch.nn.Module) -> None:
    perturb_(torch.nn.ParameterList([p for p in model.parameters() if p.requires_grad]), scale=0.1)


@pytest.mark.parametrize("regime", REGIME_NAMES)
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_gradients_reach_exactly_what_the_regime_names(method, regime, input_ids):
    model = apply_regime(tiny_bert(), method, regime, lora_r=2).train()
    perturb_trainable_(model)  # LoRA's B starts at zero, which would zero the grads of A
    model(input_ids=input_ids).logits.pow(2).sum().backward()
    named = {n for n, _ in model.named_parameters() if expected_trainable(n, method, regime)}
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert set(trainable_parameter_names(model)) == named
    assert with_grad == named
    assert not any("lora_" in n and ".layer_fusion." in n for n in named)  # R+n blocks: no LoRA copies
    if regime == "lora":  # 3 blocks x query, value x (A: 2x32 + B: 32x2)
        assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) == 3 * 2 * 128
    if regime == "bitfit":
        assert sum(1 for n in named if n.endswith(".bias") and ".layer_fusion." not in n) >= 3 * 8


@pytest.mark.parametrize("regime", REGIME_NAMES)
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_save_load_is_bitwise_for_every_combination(method, regime, input_ids, tmp_path):
    model = apply_regime(tiny_bert(), method, regime, lora_r=2)
    perturb_trainable_(model)
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=input_ids).logits
    save_trained(model, tmp_path)
    # ft rewrites the pretrained weights: reload it on a base built from another seed.
    base = tiny_bert(seed=7 if regime == "ft" else 0)
    loaded = load_trained(base, tmp_path)
    assert (tmp_path / FULL_STATE_FILE).exists() == (regime == "ft")
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids).logits, expected)


def test_fusion_and_lora_share_one_adapter(input_ids, tmp_path):
    model = get_peft_model(
        tiny_bert(),
        DWAttConfig(target_modules=["query", "value"], r=8, bias="all", modules_to_save=["classifier"]),
    )
    lora_layers = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert len(lora_layers) == 6 and all(n.endswith(("query", "value")) for n in lora_layers)
    perturb_trainable_(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved["peft_type"] == "DWATT" and saved["r"] == 8 and saved["bias"] == "all"
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids).logits, model.eval()(input_ids=input_ids).logits)


def test_make_config_per_regime():
    assert make_config("none", "ft") is None
    head_only = make_config("none", "fe")
    assert isinstance(head_only, BitFitConfig) and head_only.bias == "none"
    assert make_config("none", "bitfit").bias == "all"
    plain_lora = make_config("none", "lora", lora_r=4, lora_target_modules=["query"])
    assert type(plain_lora) is LoraConfig and plain_lora.r == 4 and plain_lora.target_modules == {"query"}
    combined = make_config("concat", "lora", lora_alpha=32, head_modules=("head",))
    assert isinstance(combined, ConcatConfig) and combined.lora_alpha == 32
    assert combined.target_modules == ANY_QUERY_VALUE_PATTERN and combined.modules_to_save == ["head"]
    dwatt = make_config("dwatt", "bitfit", d_pos=16)
    assert dwatt.bias == "all" and dwatt.d_pos == 16 and not dwatt.target_modules


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("dwat", "fe"), {}, "method"),
        (("dwatt", "prefix"), {}, "regime"),
        (("none", "fe"), {"d_pos": 3}, "method_options"),
        (("dwatt", "adapter_seqbn"), {}, "regime"),
    ],
)
def test_bad_names_are_value_errors_naming_field_and_allowed(args, kwargs, field):
    with pytest.raises(ValueError, match=rf"`{field}`=.*expected"):
        make_config(*args, **kwargs)


def test_adapter_regimes_need_method_none():
    with pytest.raises(ValueError, match="`method`='dwatt'.*'none'"):
        apply_regime(tiny_bert(), "dwatt", "adapter_seqbn")


def test_default_lora_targets_follow_the_model_type():
    assert default_lora_targets("roberta") == ["query", "value"]
    assert default_lora_targets("distilbert") == ["q_lin", "v_lin"]
    with pytest.raises(ValueError, match="lora_target_modules"):
        default_lora_targets("no-such-model")


@pytest.mark.skipif(
    importlib.util.find_spec("adapters") is None, reason="AdapterHub `adapters` not installed"
)
@pytest.mark.parametrize(("regime", "per_block"), [("adapter_seqbn", 1), ("adapter_double_seqbn", 2)])
def test_adapter_regimes_train_adapters_and_head_only(regime, per_block, input_ids):
    model = apply_regime(tiny_bert(), "none", regime, reduction_factor=4).train()
    model(input_ids=input_ids).logits.pow(2).sum().backward()
    names = set(trainable_parameter_names(model))
    assert {n for n, p in model.named_parameters() if p.grad is not None} == names
    assert all(n.startswith("classifier.") or ".adapters.bottleneck." in n for n in names)
    new = sum(
        p.numel() for n, p in model.named_parameters() if n in names and not n.startswith("classifier.")
    )
    assert new == per_block * 3 * (2 * 32 * 8 + 8 + 32)


@pytest.mark.skipif(
    importlib.util.find_spec("adapters") is None, reason="AdapterHub `adapters` not installed"
)
@pytest.mark.parametrize("regime", ["adapter_seqbn", "adapter_double_seqbn"])
def test_adapter_regimes_save_and_load_bitwise(regime, input_ids, tmp_path):
    model = apply_regime(tiny_bert(), "none", regime, reduction_factor=4)
    perturb_trainable_(model)
    with torch.no_grad():
        expected = model.eval()(input_ids=input_ids).logits
    save_trained(model, tmp_path)
    loaded = load_trained(tiny_bert(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids).logits, expected)
        assert not torch.equal(tiny_bert()(input_ids=input_ids).logits, expected)


def test_make_config_default_lora_pattern_finds_query_and_value():
    model = get_peft_model(tiny_bert(), make_config("dwatt", "lora", lora_r=2))
    lora_layers = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert len(lora_layers) == 6 and all(n.endswith(("self.query", "self.value")) for n in lora_layers)
