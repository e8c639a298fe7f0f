"""Every registered method x the PEFT lifecycle, in the style of peft's ``tests/test_custom_models.py``.

The method list is ``registration.METHODS``: a method registered there gets every test of this
file, and the matrix fails until it also has a forward reference in :data:`FORWARD_CHECKS`
(an independent recomputation of its formula from the base model's public outputs).

Encoder methods run on a tiny BERT token classifier, sequence-to-sequence methods on a tiny
BART; the "output" is the model's logits in both cases.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from conftest import NO_DROPOUT, fusion_of, perturb_, survivors, tiny_bert
from peft import PeftModel, get_peft_model
from test_encoder_fusion import per_layer_reference_logits
from test_methods import REFERENCES, extra_layers_reference, reference_logits
from test_surface_fusion import batch, reference_log_probs, tiny_bart
from torch import nn

from peft_layerfusion import count_hooks
from peft_layerfusion.registration import METHODS, Method

IDS = [method.name for method in METHODS]


@dataclass
class Case:
    """A method on its kind of model: a fresh base (same weights on every call), inputs, a config."""

    method: Method

    def base(self) -> nn.Module:
        return tiny_bart() if self.method.seq2seq else tiny_bert(**NO_DROPOUT)

    def config(self, **options):
        head = {} if self.method.seq2seq else {"modules_to_save": ["classifier"]}
        return self.method.make_config(**head, **options)

    def inputs(self, with_labels: bool = False) -> dict[str, torch.Tensor]:
        if self.method.seq2seq:
            inputs = batch()
            return (
                inputs
                if with_labels
                else {k: v for k, v in inputs.items() if k != "labels"}
                | {"decoder_input_ids": inputs["labels"].clamp(min=3)}
            )
        generator = torch.Generator().manual_seed(1)
        input_ids = torch.randint(1, 99, (2, 7), generator=generator)
        attention_mask = torch.ones(2, 7, dtype=torch.long)
        attention_mask[1, 5:] = 0
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if with_labels:
            inputs["labels"] = torch.arange(14).view(2, 7) % 5
        return inputs

    def adapted(self, base: nn.Module | None = None, seed: int = 0) -> PeftModel:
        """The base with this method's adapter, its fusion module perturbed (no special init)."""
        base = self.base() if base is None else base
        torch.manual_seed(seed)
        model = get_peft_model(base, self.config()).eval()
        perturb_(fusion_of(model), scale=0.2, seed=seed + 7)
        return model


def output(model: nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


# ----------------------------------------------------------------------------- forward references
def token_wise_check(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused logits vs the formula applied to ``output_hidden_states`` of an untouched copy."""
    reference = case.base()
    model = case.adapted()
    module = fusion_of(model)
    inputs = case.inputs()
    layers = list(range(1, reference.config.num_hidden_layers + 1))
    formula = REFERENCES[case.method.config_cls]
    expected = reference_logits(reference, inputs["input_ids"], inputs["attention_mask"],
                                lambda z: formula(z, layers, module))  # fmt: skip
    return output(model, inputs), expected


def extra_layers_check(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    reference = case.base()
    model = case.adapted()
    inputs = case.inputs()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    expected = extra_layers_reference(reference, fusion_of(model), ids, mask)
    return output(model, inputs), expected


def surface_fusion_check(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    base = case.base()
    model = case.adapted(copy.deepcopy(base))
    inputs = case.inputs()
    with torch.no_grad():
        expected = reference_log_probs(base, fusion_of(model), inputs, inputs["decoder_input_ids"], {})
    return output(model, inputs), expected


def encoder_fusion_check(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    base = case.base()
    model = case.adapted(copy.deepcopy(base))
    inputs = case.inputs()
    expected = per_layer_reference_logits(base, fusion_of(model), inputs, layers=[1, 2])
    return output(model, inputs), expected


FORWARD_CHECKS: dict[str, Callable[[Case], tuple[torch.Tensor, torch.Tensor]]] = {
    "dwatt": token_wise_check,
    "concat": token_wise_check,
    "average": token_wise_check,
    "scalar_mix": token_wise_check,
    "scaled_dwatt": token_wise_check,
    "layer_mix": token_wise_check,
    "probe_ensemble": token_wise_check,
    "stacked": token_wise_check,
    "joint_probe": token_wise_check,
    "joint_ensemble": token_wise_check,
    "extra_layers": extra_layers_check,
    "surface_fusion": surface_fusion_check,
    "encoder_fusion": encoder_fusion_check,
}


def test_every_registered_method_has_a_forward_reference():
    assert set(FORWARD_CHECKS) == {method.name for method in METHODS}


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_forward_equals_its_reference(method):
    case = Case(method)
    got, expected = FORWARD_CHECKS[method.name](case)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    plain = output(case.base(), case.inputs())
    assert (got - plain).abs().max() > 1e-3  # the fusion changes the output


# ----------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_save_and_load_are_bitwise(method, tmp_path):
    case = Case(method)
    model = case.adapted()
    inputs = case.inputs()
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(case.base(), tmp_path).eval()
    saved_state, loaded_state = model.state_dict(), loaded.state_dict()
    assert saved_state.keys() == loaded_state.keys()
    for name, tensor in saved_state.items():
        assert torch.equal(tensor, loaded_state[name]), name
    assert torch.equal(output(loaded, inputs), output(model, inputs))


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_disable_adapter_equals_the_base(method):
    case = Case(method)
    inputs = case.inputs()
    plain = output(case.base(), inputs)
    model = case.adapted()
    assert not torch.allclose(output(model, inputs), plain)
    with model.disable_adapter():
        assert torch.equal(output(model, inputs), plain)
    assert not torch.allclose(output(model, inputs), plain)  # enabled again


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_unload_leaves_no_hooks_and_the_base_outputs(method):
    case = Case(method)
    inputs = case.inputs()
    base = case.base()
    hooks_before = count_hooks(base)
    plain = output(base, inputs)
    unloaded = case.adapted(base).unload()
    assert count_hooks(unloaded) == hooks_before == 0
    assert not any("layer_fusion" in name for name, _ in unloaded.named_modules())
    assert torch.equal(output(unloaded, inputs), plain)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_set_and_delete_adapter(method):
    case = Case(method)
    inputs = case.inputs()
    model = case.adapted()
    first = output(model, inputs)
    torch.manual_seed(11)
    model.add_adapter("other", case.config())
    perturb_(fusion_of(model, "other"), scale=0.5, seed=99)
    if not method.seq2seq:  # its own head too (Average has no parameter of its own)
        perturb_(model.base_model.model.classifier.modules_to_save["other"], scale=0.5, seed=98)
    assert torch.equal(output(model, inputs), first)  # adding does not activate
    model.set_adapter("other")
    second = output(model, inputs)
    assert (second - first).abs().max() > 1e-3
    model.set_adapter("default")
    assert torch.equal(output(model, inputs), first)
    model.delete_adapter("other")
    assert "other" not in model.peft_config
    assert not any(".other." in name for name, _ in model.named_parameters())
    assert torch.equal(output(model, inputs), first)


def run_every_path(case: Case, model: nn.Module) -> None:
    """A training step (backward), an evaluation forward (the capture of the read positions) and,
    on a sequence-to-sequence model, a beam search (its wrapped ``generate``)."""
    model.train()
    model(**case.inputs(with_labels=True)).loss.backward()
    model.eval()
    output(model, case.inputs())
    if case.method.seq2seq:
        inputs = case.inputs()
        model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=2,
                       max_new_tokens=3, do_sample=False)  # fmt: skip


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_a_deleted_model_is_freed_at_once(method):
    """No reference cycle through the adapter's hooks, capture or layer: with the cyclic collector off, the
    adapted model is freed when its last reference goes (as the base model alone, or with LoRA, is)."""
    case = Case(method)
    assert survivors(case.base, lambda model: output(model, case.inputs())) == []  # the control
    assert survivors(case.adapted, lambda model: run_every_path(case, model)) == []


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_bf16_model_runs_and_stays_close(method):
    case = Case(method)
    inputs = case.inputs()
    model = case.adapted()
    fp32 = output(model, inputs)
    model = model.to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in fusion_of(model).parameters())
    bf16 = output(model, inputs)
    assert bf16.dtype == torch.bfloat16 and torch.isfinite(bf16).all()
    torch.testing.assert_close(bf16.float(), fp32, atol=0.2, rtol=0.05)


def gradients(case: Case, checkpointing: bool) -> dict[str, torch.Tensor]:
    """Gradients of every trainable parameter after one loss, with or without checkpointing."""
    model = case.adapted(seed=3)
    for name, param in model.named_parameters():  # the encoder trains too: backward crosses the blocks
        if ".original_module." not in name:
            param.requires_grad_(True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    torch.manual_seed(0)  # the same dropout masks in both runs (BART keeps its dropout)
    model(**case.inputs(with_labels=True)).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method", METHODS, ids=IDS)
def test_gradient_checkpointing_gives_the_same_gradients(method):
    case = Case(method)
    plain, checkpointed = gradients(case, False), gradients(case, True)
    assert plain.keys() == checkpointed.keys()
    fusion = [name for name in plain if ".layer_fusion." in name]
    assert len(fusion) == len(list(fusion_of(case.adapted()).parameters()))  # Average: none
    assert all(plain[name].abs().sum() > 0 for name in fusion)
    assert any(".layers.0." in name or ".layer.0." in name for name in plain)  # through the first block
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=2e-5, rtol=1e-4, msg=name)
