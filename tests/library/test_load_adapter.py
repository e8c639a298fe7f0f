"""transformers' own ``model.load_adapter`` on our adapters (after ``import peft_layerfusion``).

It loads every method with every tensor bitwise equal. transformers 4 gives bitwise equal
logits too. transformers 5 leaves the loaded tensors at unaligned addresses of the file
buffer (its loader bypasses ``load_state_dict``, so the fusion modules' realigning hook does
not run) and the CPU kernels then round differently: logits equal up to float rounding, and
bitwise once the tensors are realigned. ``PeftModel.from_pretrained`` is bitwise on both.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
import transformers
from conftest import perturb_, tiny_bert
from peft import get_peft_model
from test_surface_fusion import batch, tiny_bart
from tiny_decoders import FAMILIES, adapted, token_ids

from peft_layerfusion import count_hooks
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


def base_and_inputs(name: str) -> tuple[torch.nn.Module, dict, dict]:
    """The tiny base for method ``name`` (BART for the seq2seq methods), its inputs and config options."""
    if name in SEQ2SEQ:
        return tiny_bart(), batch(), {}
    input_ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(1))
    return tiny_bert(), {"input_ids": input_ids}, {"modules_to_save": ["classifier"]}


def wider(base: torch.nn.Module) -> torch.nn.Module:
    """A model like ``base`` with hidden states 16 wider (its adapters do not fit ``base``)."""
    config = copy.deepcopy(base.config)
    config.hidden_size += 16  # BART's d_model through its attribute map
    torch.manual_seed(3)
    return type(base)(config).eval()


@pytest.mark.parametrize("failure", ["truncated", "other_width"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_failed_transformers_load_adapter_leaves_the_model_as_it_was(tmp_path, name, failure):
    """Issue 37 item 6: transformers injects the adapter before it reads the weights; a read that
    failed left the fresh fusion's hooks live, and the untouched model's logits moved. Now the model is
    put back: logits bitwise, no hook and no adapter left, and a good adapter then loads."""
    base, inputs, options = base_and_inputs(name)
    perturb_(base)
    source = base if failure == "truncated" else wider(base)
    get_peft_model(copy.deepcopy(source), CONFIGS[name](**options)).save_pretrained(tmp_path / "bad")
    if failure == "truncated":
        weights = tmp_path / "bad" / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    model = get_peft_model(copy.deepcopy(base), CONFIGS[name](**options)).eval()
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():  # every trainable tensor away from its init (BitFit: the base's biases)
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(tmp_path / "good")
    with torch.no_grad():
        saved_logits = model(**inputs).logits
        before = base(**inputs).logits
    with pytest.raises(Exception):  # noqa: B017 (transformers' own error, by cause and version)
        base.load_adapter(str(tmp_path / "bad"))
    with torch.no_grad():
        assert torch.equal(base(**inputs).logits, before)
    assert count_hooks(base) == 0 and not getattr(base, "peft_config", None)
    base.load_adapter(str(tmp_path / "good"))
    realign_after_load(base)
    with torch.no_grad():
        assert torch.equal(base.eval()(**inputs).logits, saved_logits)


def wrapped_like_accelerate(model: torch.nn.Module) -> None:
    """What accelerate's mixed precision does to a prepared model: wrap ``model.forward.__func__``."""
    inner = model.forward.__func__

    def forward(self, *args, **kwargs):
        return inner(self, *args, **kwargs)

    model.forward = types.MethodType(forward, model)


@pytest.mark.parametrize("name", [method.name for method in METHODS if not method.seq2seq])
def test_a_bare_decoder_loaded_by_transformers_fuses_when_its_forward_is_called_directly(tmp_path, name):
    """transformers' ``load_adapter`` on a bare ``LlamaModel`` puts the hooks on the model itself (it is the
    blocks' container); sentence-transformers then calls ``model.forward(...)``, which skips a module's
    hooks. That call fuses as ``model(...)`` does, also after a deep copy and under accelerate's wrap."""
    family = FAMILIES["llama"]
    base = family.backbone_of(family.build("causal"))  # LlamaModel: container and root at once
    inputs = {"input_ids": token_ids()}
    with torch.no_grad():
        plain = base(**inputs).last_hidden_state
    trained = adapted(copy.deepcopy(base), CONFIGS[name]())
    trained.save_pretrained(tmp_path)
    fresh = copy.deepcopy(base)
    fresh.load_adapter(str(tmp_path))
    fresh.eval()
    with torch.no_grad():
        called = fresh(**inputs).last_hidden_state
        assert (called - plain).abs().max() > 1e-3  # the adapter changes the output
        torch.testing.assert_close(called, trained(**inputs).last_hidden_state)  # every weight loaded
        assert torch.equal(fresh.forward(**inputs).last_hidden_state, called)
        copied = copy.deepcopy(fresh)  # tensors realigned: equal to its own call, close to fresh
        assert torch.equal(copied.forward(**inputs).last_hidden_state, copied(**inputs).last_hidden_state)
        torch.testing.assert_close(copied.forward(**inputs).last_hidden_state, called)
        wrapped_like_accelerate(fresh)
        assert torch.equal(fresh.forward(**inputs).last_hidden_state, called)
        assert torch.equal(fresh(**inputs).last_hidden_state, called)
