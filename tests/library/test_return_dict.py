"""``return_dict=False`` gives the fused logits, on every model family and every encoder method.

DeBERTa's head reads the last entry of the encoder's *all hidden states* tuple, not its last
hidden state: before the fix the tuple form (``return_dict=False``) kept the unfused entry there,
so ``model(ids, return_dict=False)[0]`` was the base model's logits.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from conftest import fusion_of, perturb_
from peft import get_peft_model
from test_discovery import BERT_LIKE, FAMILIES, build, inputs_for

from peft_layerfusion.registration import ENCODER_METHODS

pytestmark = pytest.mark.filterwarnings("ignore:Layer fusion. no parameter of the task head")

# DeBERTa (v1) reads the same tuple as v2; the family matrix has v2 only.
EXTRA_FAMILIES = {
    "deberta": (tf.DebertaForTokenClassification, tf.DebertaConfig(**BERT_LIKE, relative_attention=True)),
}


def base_of(family: str) -> torch.nn.Module:
    if family in EXTRA_FAMILIES:
        model_cls, config = EXTRA_FAMILIES[family]
        torch.manual_seed(0)
        return model_cls(config).eval()
    return build(family)


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
@pytest.mark.parametrize("family", [*FAMILIES, *EXTRA_FAMILIES])
def test_tuple_output_equals_the_model_output(family, method):
    base = base_of(family)
    inputs = inputs_for("bert" if family in EXTRA_FAMILIES else family)
    model = get_peft_model(copy.deepcopy(base), method.make_config()).eval()
    perturb_(fusion_of(model), scale=0.2)
    with torch.no_grad():
        plain = base(**inputs).logits
        as_dict = model(**inputs, return_dict=True).logits
        as_tuple = model(**inputs, return_dict=False)[0]
    assert torch.equal(as_tuple, as_dict)
    assert (as_dict - plain).abs().max() > 1e-5  # fused, not the base's logits


@pytest.mark.parametrize("family", ["deberta-v2", "deberta"])
def test_all_hidden_states_end_with_the_fused_state_in_both_forms(family):
    base = base_of(family)
    inputs = inputs_for("bert")
    model = get_peft_model(base, ENCODER_METHODS[0].make_config()).eval()
    with torch.no_grad():
        as_dict = model(**inputs, output_hidden_states=True)
        as_tuple = model(**inputs, output_hidden_states=True, return_dict=False)
    assert torch.equal(as_tuple[1][-1], as_dict.hidden_states[-1])
    assert len(as_tuple[1]) == len(as_dict.hidden_states) == base.config.num_hidden_layers + 1
