"""BitFitConfig: bias-only training as its own PEFT type (and the head-only baseline)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_bert
from peft import PeftModel, get_peft_model
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING
from peft.utils.peft_types import PeftType

from peft_layerfusion import BitFitConfig
from peft_layerfusion.bitfit import BitFitModel

# Tiny BERT (d=32, L=3, intermediate 48): embeddings LN 32 + 3 x (q,k,v 96 + attn out 32 + LN 32
# + intermediate 48 + out 32 + LN 32) = 848 biases; the classifier head is 5 x 32 + 5 = 165.
TINY_BIASES = 848
TINY_HEAD = 165


def trainable(model: torch.nn.Module) -> dict[str, int]:
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}


def test_registered_as_its_own_peft_type():
    assert PeftType("BITFIT") is PeftType.BITFIT
    assert PEFT_TYPE_TO_CONFIG_MAPPING[PeftType.BITFIT] is BitFitConfig
    assert BitFitConfig().peft_type == PeftType.BITFIT


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"target_modules": ["query"]}, "target_modules"), ({"bias": "lora_only"}, "bias")],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"`{field}`=.*expected"):
        BitFitConfig(**kwargs)


def test_bitfit_trains_every_bias_and_the_head_only():
    model = get_peft_model(tiny_bert(), BitFitConfig(modules_to_save=["classifier"]))
    assert isinstance(model.base_model, BitFitModel)
    names = trainable(model)
    assert sum(names.values()) == TINY_BIASES + TINY_HEAD
    assert all(n.endswith(".bias") or ".modules_to_save." in n for n in names)
    assert not any("lora_" in n for n, _ in model.named_parameters())


def test_bias_none_is_the_head_only_baseline():
    model = get_peft_model(tiny_bert(), BitFitConfig(bias="none", modules_to_save=["classifier"]))
    assert sum(trainable(model).values()) == TINY_HEAD


def test_save_load_restores_biases_bitwise(tmp_path, input_ids):
    model = get_peft_model(tiny_bert(), BitFitConfig(modules_to_save=["classifier"]))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param))
        expected = model(input_ids=input_ids).logits
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids).logits, expected)
        assert not torch.equal(tiny_bert()(input_ids=input_ids).logits, expected)
