"""Adapters saved by an earlier version still load, and compute what they computed then (bitwise).

``data/legacy_adapters/`` holds adapters saved at commit 09799e6 (before LayerMix and Scaled DWAtt
became presets of ScalarMix and DWAtt, and before DWAtt stored its MLP weights as ``(out, in)``): a
``LAYER_MIX``, a ``SCALED_DWATT`` and a ``DWATT`` adapter on the tiny decoder :func:`legacy_base`, and
``expected.safetensors``, the logits each gave on ``input_ids`` when it was saved (see its README).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

import peft_layerfusion  # noqa: F401  (registers the PEFT types)

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


@pytest.mark.parametrize("name", LEGACY)
def test_an_adapter_saved_before_loads_bitwise(name):
    expected = load_file(DATA / "expected.safetensors")
    model = PeftModel.from_pretrained(legacy_base(), DATA / name).eval()
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
    assert not torch.equal(logits, legacy_base()(input_ids=expected["input_ids"]).logits)  # the fusion acts
    assert torch.equal(logits, expected[name])
