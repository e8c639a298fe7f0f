"""transformers' own ``model.load_adapter`` on our adapters (after ``import peft_layerfusion``).

It loads every method with every tensor bitwise equal. transformers 4 gives bitwise equal
logits too. transformers 5 leaves the loaded tensors at unaligned addresses of the file
buffer (its loader bypasses ``load_state_dict``, so the fusion modules' realigning hook does
not run) and the CPU kernels then round differently: logits equal up to float rounding, and
bitwise once the tensors are realigned. ``PeftModel.from_pretrained`` is bitwise on both.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from conftest import perturb_, tiny_bert
from peft import get_peft_model
from test_surface_fusion import batch, tiny_bart

from peft_layerfusion.fusion import realign_after_load
from peft_layerfusion.registration import BASELINE_TYPES, METHODS

CONFIGS = {method.name: method.config_cls for method in METHODS} | {
    name: config_cls for name, config_cls, _ in BASELINE_TYPES
}
SEQ2SEQ = {method.name for method in METHODS if method.seq2seq}
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_transformers_load_adapter_restores_every_tensor_and_the_logits(tmp_path, name):
    if name in SEQ2SEQ:
        base, inputs, options = tiny_bart(), batch(), {}
    else:
        input_ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(1))
        base, inputs, options = tiny_bert(), {"input_ids": input_ids}, {"modules_to_save": ["classifier"]}
    perturb_(base)
    fresh = copy.deepcopy(base)
    model = get_peft_model(base, CONFIGS[name](**options)).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # every trainable tensor away from its init (BitFit: the base's biases)
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
        saved_logits = model(**inputs).logits
    model.save_pretrained(tmp_path)

    fresh.load_adapter(str(tmp_path))
    fresh.eval()
    saved_state = model.base_model.model.state_dict()
    loaded_state = fresh.state_dict()
    assert saved_state.keys() == loaded_state.keys()
    for key, tensor in saved_state.items():
        assert torch.equal(loaded_state[key], tensor), key
    with torch.no_grad():
        logits = fresh(**inputs).logits
        if TRANSFORMERS_5:
            torch.testing.assert_close(logits, saved_logits, rtol=1e-5, atol=1e-5)
            realign_after_load(fresh)
            logits = fresh(**inputs).logits
    assert torch.equal(logits, saved_logits)
