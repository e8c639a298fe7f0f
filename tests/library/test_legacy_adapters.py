"""Adapters saved by an earlier version still load, and compute what they computed then (bitwise).

``data/legacy_adapters/`` holds adapters saved at commit 09799e6 (before LayerMix and Scaled DWAtt
became presets of ScalarMix and DWAtt, and before DWAtt stored its MLP weights as ``(out, in)``): a
``LAYER_MIX``, a ``SCALED_DWATT`` and a ``DWATT`` adapter on the tiny decoder :func:`legacy_base`, and
``expected.safetensors``, the logits each gave on ``input_ids`` when it was saved (see its README). Each
loads as its method (a former preset type as its method with the preset's fields), every tensor as saved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import fusion_of
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from peft_layerfusion import DWAttConfig, ScalarMixConfig

DATA = Path(__file__).parent / "data" / "legacy_adapters"
LEGACY = ("layer_mix", "scaled_dwatt", "dwatt")


def legacy_base() -> LlamaForCausalLM:
    """The tiny Llama (3 blocks, width 8) the adapters were saved on: its weights drawn here, by name,
    from one seed (independent of transformers' own init)."""
    model = LlamaForCausalLM(LlamaConfig(**json.loads((DATA / "base_config.json").read_text()))).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return model


# what each loads as: its config class and the fields the saved adapter_config.json set
LOADS_AS = {
    "layer_mix": (  # saved before bounded_blend: the unbounded blend it computed then
        ScalarMixConfig,
        {"state_norm": "rms", "start_layer": 2, "mixing_lr_multiplier": 10.0, "bounded_blend": False},
    ),
    "scaled_dwatt": (DWAttConfig, {"state_norm": "rms", "score_scale": "sqrt_d", "query_init": "uniform"}),
    "dwatt": (DWAttConfig, {"state_norm": "none", "d_pos": 4, "fusion_init": "paper"}),
}


def logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@pytest.mark.parametrize("name", LEGACY)
def test_an_adapter_saved_before_loads_as_its_method_with_every_tensor(name):
    model = PeftModel.from_pretrained(legacy_base(), DATA / name).eval()
    config_cls, fields = LOADS_AS[name]
    config = model.peft_config["default"]
    assert type(config) is config_cls and config.peft_type.value == config_cls.PEFT_TYPE
    assert {field: getattr(config, field) for field in fields} == fields
    saved = load_file(DATA / name / "adapter_model.safetensors")
    loaded = fusion_of(model).state_dict()
    assert len(saved) == len(loaded)  # nothing left at its init
    for key, tensor in saved.items():
        # `...layer_fusion.scaled_dwatt_fusion.value_mlps.up_weight`: value_mlps, up_weight
        path, _, field = key.partition("layer_fusion.")[2].partition("_fusion.")[2].rpartition(".")
        if field in ("up_weight", "down_weight"):  # (K, in, out) then, (K, out, in) as nn.Linear now
            now, tensor = f"{path}.{field[: -len('_weight')]}.weight", tensor.transpose(1, 2)
        elif field in ("up_bias", "down_bias"):
            now = f"{path}.{field[: -len('_bias')]}.bias"
        else:
            now = f"{path}.{field}".lstrip(".")
        assert torch.equal(loaded[now], tensor), key


def test_a_layer_mix_saved_before_gives_its_saved_logits_bitwise():
    expected = load_file(DATA / "expected.safetensors")
    model = PeftModel.from_pretrained(legacy_base(), DATA / "layer_mix").eval()
    assert not torch.equal(logits(model, expected["input_ids"]), logits(legacy_base(), expected["input_ids"]))
    assert torch.equal(logits(model, expected["input_ids"]), expected["layer_mix"])


@pytest.mark.parametrize("name", ["scaled_dwatt", "dwatt"])
def test_a_dwatt_saved_before_gives_its_saved_logits_up_to_rounding(name):
    """DWAtt's MLP products now read weights stored (out, in): the same sums in another order, so the
    logits agree to float rounding (a few units in the last place of float32 here), not bitwise."""
    expected = load_file(DATA / "expected.safetensors")
    model = PeftModel.from_pretrained(legacy_base(), DATA / name).eval()
    got = logits(model, expected["input_ids"])
    assert not torch.allclose(got, logits(legacy_base(), expected["input_ids"]), atol=1e-3)  # the fusion acts
    torch.testing.assert_close(got, expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", LEGACY)
def test_an_adapter_saved_before_is_saved_again_as_its_method(name, tmp_path):
    ids = load_file(DATA / "expected.safetensors")["input_ids"]
    model = PeftModel.from_pretrained(legacy_base(), DATA / name).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    config_cls, _ = LOADS_AS[name]
    assert saved["peft_type"] == config_cls.PEFT_TYPE
    assert not set(config_cls.RETIRED_FIELDS) & set(saved)
    again = PeftModel.from_pretrained(legacy_base(), tmp_path).eval()
    assert torch.equal(logits(again, ids), logits(model, ids))


@pytest.mark.parametrize(
    "name, what",
    [
        ("layer_mix", "PEFT type 'LAYER_MIX'"),
        (
            "dwatt",
            "tensors ['base_model.model.model.layer_fusion.dwatt_fusion.query_mlp.down_bias', "
            "'base_model.model.model.layer_fusion.dwatt_fusion.query_mlp.down_weight']",
        ),
    ],
)
def test_transformers_load_adapter_refuses_an_earlier_form_in_one_line(name, what):
    base = legacy_base()
    with pytest.raises(ValueError) as caught:
        base.load_adapter(str(DATA / name))
    folder = DATA / name
    assert str(caught.value) == (
        f"The adapter in {folder} was saved by an earlier peft_layerfusion ({what}), which transformers' "
        f"model.load_adapter cannot convert: load it with PeftModel.from_pretrained(model, {str(folder)!r}) "
        "(save_pretrained then stores it as this version does)."
    )
    assert not hasattr(base, "peft_config")  # refused before anything was added


def test_a_retired_field_saved_at_another_value_is_refused_in_one_line(tmp_path):
    shutil.copytree(DATA / "scaled_dwatt", tmp_path, dirs_exist_ok=True)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**saved, "score_temperature": 25.3}))
    with pytest.raises(ValueError) as caught:
        PeftModel.from_pretrained(legacy_base(), tmp_path)
    assert str(caught.value) == (
        "`score_temperature`=25.3 is not allowed: expected 1.0 (the option was removed: this version "
        "computes only that)."
    )
