"""Mixing that depth scale cannot decide (``state_norm``), a chosen start (``start_layer``), the mixing
parameters' own learning rate (``mixing_lr_multiplier``, ``parameter_groups``) and Scaled DWAtt.

Every fused output is checked against ``test_methods.REFERENCES`` (the formulas written out from
``output_hidden_states`` of an untouched copy) on a post-norm encoder (BERT) and a pre-norm decoder
(Llama, whose stream grows with depth), and every identity start against the base model, bitwise.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace as replace_options

import pytest
import torch
from conftest import attach, fusion_of, perturb_, tiny_bert
from peft import get_peft_model
from test_methods import REFERENCES, peft_logits, reference_logits
from tiny_decoders import FAMILIES, adapted, head_output, residual_stream, token_ids

from peft_layerfusion import AverageConfig, DWAttConfig, ScalarMixConfig, parameter_groups
from peft_layerfusion.fusion import rms, unit_rms
from peft_layerfusion.registration import method_named

PAPER_METHODS = [method_named(name) for name in ("average", "scalar_mix", "concat", "dwatt")]
LAYER_MIX, SCALED_DWATT = method_named("layer_mix"), method_named("scaled_dwatt")  # the presets
LLAMA = FAMILIES["llama"]


def llama_inputs() -> dict[str, torch.Tensor]:
    ids = token_ids()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def scaled_bert() -> torch.nn.Module:
    """The tiny BERT with block n's output norm gain times n + 1: post-norm states of different RMS."""
    model = tiny_bert()
    with torch.no_grad():
        for n, block in enumerate(model.bert.encoder.layer):
            block.output.LayerNorm.weight.mul_(n + 1)
    return model


def causal_logits(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def test_unit_rms_and_rms_are_the_written_out_norm():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(rms(x), torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(unit_rms(x), x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    assert unit_rms(torch.full((2, 8), 1400.0)).pow(2).mean().item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("method", PAPER_METHODS, ids=lambda m: m.name)
def test_rms_states_on_a_post_norm_encoder_equal_the_recomputation(method, input_ids, attention_mask):
    config = method.make_config(state_norm="rms", modules_to_save=["classifier"])
    model, reference = attach(config, base=scaled_bert())
    module = fusion_of(model)
    perturb_(module)
    expected = reference_logits(
        reference, input_ids, attention_mask, lambda z: REFERENCES[method.config_cls](z, [1, 2, 3], module)
    )
    raw, _ = attach(method.make_config(modules_to_save=["classifier"]), base=scaled_bert())
    perturb_(fusion_of(raw))  # the same parameters, mixing the raw states
    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask).logits
        unnormed = raw(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - unnormed).abs().max() > 1e-4


@pytest.mark.parametrize("method", PAPER_METHODS, ids=lambda m: m.name)
def test_rms_states_on_a_pre_norm_decoder_equal_the_recomputation(method):
    reference = LLAMA.build("causal")
    with torch.no_grad():  # a stream whose RMS grows with depth (about 1, 30, 900), as in deep LLMs
        for n, block in enumerate(LLAMA.blocks_of(reference)):
            block.mlp.down_proj.weight.mul_(30.0 ** (n + 1))
    model = adapted(copy.deepcopy(reference), method.make_config(state_norm="rms", fusion_init="paper"))
    inputs = llama_inputs()
    states = residual_stream(LLAMA, reference, inputs)
    h = REFERENCES[method.config_cls](states, list(range(1, len(states))), fusion_of(model))
    expected = head_output(LLAMA, reference, "causal", h, inputs)
    torch.testing.assert_close(causal_logits(model, inputs), expected, atol=2e-5, rtol=1e-5)
    raw = adapted(copy.deepcopy(reference), method.make_config(fusion_init="paper"))
    assert (causal_logits(raw, inputs) - expected).abs().max() > 1e-3  # the option changes the mix


@pytest.mark.parametrize("method", [*PAPER_METHODS[1:], LAYER_MIX], ids=lambda m: m.name)
@pytest.mark.parametrize("state_norm", ["rms", "rms_after_norm"])
def test_rms_states_keep_the_identity_start_exact_on_a_decoder(method, state_norm):
    base = LLAMA.build("causal")
    inputs = llama_inputs()
    plain = causal_logits(base, inputs)
    model = get_peft_model(base, method.make_config(state_norm=state_norm, fusion_init="identity"))
    assert torch.equal(causal_logits(model, inputs), plain)  # bitwise: h = z_L (F(z_L)) at initialisation


class MixedAsGiven:
    """A fusion module seen by the references as one that mixes its states as they are given (the
    states already written out as the module reads them), every other attribute the module's."""

    normalizes_states = False

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def after_norm_reference(method, states: list[torch.Tensor], normed_last: torch.Tensor, module):
    """``h_head`` of ``state_norm="rms_after_norm"`` written out: ``z_n / rms(z_n)`` for ``n < L`` and
    ``F(z_L)`` mixed by the method's formula, with no rescaling; DWAtt: ``F(z_L) + rms(F(z_L)) Σ a_n v_n``."""
    layers = list(range(1, len(states)))
    if method.config_cls is DWAttConfig:
        return REFERENCES[method.config_cls](states, layers, module, normed_last=normed_last)
    as_mixed = [state / rms(state) for state in states[:-1]] + [normed_last]
    return REFERENCES[method.config_cls](as_mixed, layers, MixedAsGiven(module))


def grown_llama() -> torch.nn.Module:
    """The tiny Llama with a stream whose RMS grows with depth (about 1, 30, 900), as in deep LLMs, and
    a final norm whose gain spreads over three decades, as Gemma 3's (0.19 to 301)."""
    reference = LLAMA.build("causal")
    with torch.no_grad():
        for n, block in enumerate(LLAMA.blocks_of(reference)):
            block.mlp.down_proj.weight.mul_(30.0 ** (n + 1))
        LLAMA.norm_of(reference).weight.copy_(torch.logspace(-0.7, 2.5, reference.config.hidden_size))
    return reference


@pytest.mark.parametrize("method", [*PAPER_METHODS, SCALED_DWATT, LAYER_MIX], ids=lambda m: m.name)
def test_a_mix_after_the_final_norm_equals_the_recomputation(method):
    reference = grown_llama()
    config = method.make_config(state_norm="rms_after_norm", fusion_init="paper")
    model = adapted(copy.deepcopy(reference), config)
    module = fusion_of(model)
    perturb_(module)
    inputs = llama_inputs()
    states = residual_stream(LLAMA, reference, inputs)
    normed_last = LLAMA.norm_of(reference)(states[-1]).detach()  # F(z_L)
    h = after_norm_reference(method, states, normed_last, module)
    expected = head_output(LLAMA, reference, "causal", h, inputs, normed=False)  # F does not run again
    # float32 rounding: the fusion's stacked ops sum in another order than the recomputation (2.9e-5 of
    # logits near 1 seen on one CPU); mixing before F instead moves them by more than 1e-3
    torch.testing.assert_close(causal_logits(model, inputs), expected, atol=5e-5, rtol=1e-5)
    before = adapted(copy.deepcopy(reference), method.make_config(state_norm="rms", fusion_init="paper"))
    perturb_(fusion_of(before))  # the same parameters, mixed before F
    assert (causal_logits(before, inputs) - expected).abs().max() > 1e-3


def test_a_mix_after_the_final_norm_started_on_a_block_reads_that_block_at_unit_rms():
    reference = grown_llama()
    config = LAYER_MIX.make_config(start_layer=1, state_norm="rms_after_norm")
    model = get_peft_model(copy.deepcopy(reference), config).eval()  # as built: one-hot on z_1, γ = 1
    inputs = llama_inputs()
    z_1 = residual_stream(LLAMA, reference, inputs)[1]
    expected = head_output(LLAMA, reference, "causal", z_1 / rms(z_1), inputs, normed=False)
    torch.testing.assert_close(causal_logits(model, inputs), expected, atol=1e-5, rtol=1e-5)
    through_norm = head_output(LLAMA, reference, "causal", z_1, inputs)  # "rms": F's gain on z_1
    assert (through_norm - expected).abs().max() > 1e-2


@pytest.mark.parametrize("method", [*PAPER_METHODS, SCALED_DWATT, LAYER_MIX], ids=lambda m: m.name)
def test_a_mix_where_the_head_reads_on_a_post_norm_encoder_equals_the_recomputation(
    method, input_ids, attention_mask
):
    config = method.make_config(state_norm="rms_after_norm", modules_to_save=["classifier"])
    model, reference = attach(config, base=scaled_bert())
    module = fusion_of(model)
    perturb_(module)

    def fuse(z):  # z_L as the head reads it: z_L itself, no final norm
        return after_norm_reference(method, list(z), z[-1], module)

    expected = reference_logits(reference, input_ids, attention_mask, fuse)
    torch.testing.assert_close(peft_logits(model, input_ids, attention_mask), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_one_layer_mix_where_the_head_reads_is_that_block_at_unit_rms(family, input_ids, attention_mask):
    """What a linear probe of block 1 on unit-RMS states reads, on a post-norm and a pre-norm stack."""
    config = AverageConfig(layers=[1], state_norm="rms_after_norm")
    if family == "bert":
        model, reference = attach(replace_options(config, modules_to_save=["classifier"]), base=scaled_bert())
        expected = reference_logits(reference, input_ids, attention_mask, lambda z: z[1] / rms(z[1]))
        got = peft_logits(model, input_ids, attention_mask)
    else:
        reference = grown_llama()
        model = adapted(copy.deepcopy(reference), config)
        inputs = llama_inputs()
        z_1 = residual_stream(LLAMA, reference, inputs)[1]
        expected = head_output(LLAMA, reference, "causal", z_1 / rms(z_1), inputs, normed=False)
        got = causal_logits(model, inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_paper_defaults_are_unchanged():
    assert DWAttConfig().state_norm == "none" and DWAttConfig().score_scale == "none"
    assert DWAttConfig().query_init == "paper" and ScalarMixConfig().start_layer is None
    for method in PAPER_METHODS:
        config = method.make_config()
        assert config.state_norm == "none" and config.mixing_lr_multiplier == 1.0


@pytest.mark.parametrize("method", [PAPER_METHODS[1], LAYER_MIX], ids=lambda m: m.name)
@pytest.mark.parametrize("norm", ["none", "rms"])
def test_a_start_layer_starts_the_mix_one_hot_on_that_block(method, norm, input_ids, attention_mask):
    config = method.make_config(start_layer=2, state_norm=norm, modules_to_save=["classifier"])
    model, reference = attach(config)
    module = fusion_of(model)
    assert module.mix_weights().tolist() == [0.0, 1.0, 0.0]
    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask).logits
        out = reference(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        z = out.hidden_states
        start = z[2] if norm == "none" else z[2] / rms(z[2]) * rms(z[3])  # the head on block 2 alone
        expected = reference.classifier(start)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    perturb_(module)  # and once the weights move, the written-out mix
    expected = reference_logits(
        reference, input_ids, attention_mask, lambda z: REFERENCES[method.config_cls](z, [1, 2, 3], module)
    )
    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("start_layer", [99, 4, -5])
def test_a_start_layer_beyond_the_blocks_is_refused_in_one_line_before_the_model_changes(start_layer):
    base = tiny_bert()  # 3 blocks: hidden states 0..3, or -4..-1
    with pytest.raises(ValueError) as error:
        get_peft_model(base, LAYER_MIX.make_config(start_layer=start_layer))
    assert str(error.value) == (
        f"`start_layer`={start_layer} is not allowed: expected one of the fused layers [1, 2, 3] "
        "(indices -4..3 for 3 blocks)."
    )
    assert not any("layer_fusion" in name for name, _ in base.named_modules())


def test_a_start_layer_outside_the_fused_layers_is_refused_before_the_model_changes():
    base = tiny_bert()
    with pytest.raises(ValueError, match=r"`start_layer`=0 is not allowed: expected one of the fused layers"):
        get_peft_model(base, ScalarMixConfig(start_layer=0))
    assert not any("layer_fusion" in name for name, _ in base.named_modules())
    with pytest.raises(ValueError, match=r"`start_layer`=2 is not allowed: expected None with fusion_init"):
        ScalarMixConfig(start_layer=2, fusion_init="paper")


@pytest.mark.parametrize(
    "field, value", [("state_norm", "layer"), ("mixing_lr_multiplier", 0.0), ("mixing_lr_multiplier", "10")]
)
def test_depth_mix_options_are_checked(field, value):
    with pytest.raises(ValueError, match=rf"`{field}`={value!r} is not allowed"):
        AverageConfig(**{field: value})


def test_scaled_dwatt_starts_uniform_over_depth_with_scaled_scores(input_ids):
    model, _ = attach(DWAttConfig.from_preset("scaled_dwatt", modules_to_save=["classifier"]))
    module = fusion_of(model)
    assert module.score_divisor == pytest.approx(math.sqrt(32))  # sqrt(d), d = 32
    states = torch.randn(4, 5, 32) * 1000.0
    attention = module.depth_attention(unit_rms(states))
    torch.testing.assert_close(attention, torch.full((4, 5, 3), 1 / 3))
    paper, _ = attach(DWAttConfig(modules_to_save=["classifier"]))  # the paper's: saturated by the scale
    assert fusion_of(paper).depth_attention(states).max(-1).values.min() > 0.99


def test_mixing_parameters_get_their_multiplier_in_the_groups():
    model, _ = attach(ScalarMixConfig(mixing_lr_multiplier=10.0, modules_to_save=["classifier"]))
    groups = parameter_groups(model, lr=1e-3, weight_decay=0.01)
    assert [group["lr"] for group in groups] == [1e-3, pytest.approx(1e-2)]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in fusion_of(model).parameters()}
    assert all(group["weight_decay"] == 0.01 for group in groups)
    head = model.base_model.model.classifier.modules_to_save["default"]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in head.parameters()}
    plain, _ = attach(ScalarMixConfig(modules_to_save=["classifier"]))
    assert len(parameter_groups(plain, lr=1e-3)) == 1  # no multiplier: one group, as before


def test_a_first_adam_step_moves_the_mixing_parameters_multiplier_times_as_far(input_ids, attention_mask):
    """Adam's first step moves every parameter with a gradient by about its LR: the mix 100x the head."""
    model, _ = attach(DWAttConfig(mixing_lr_multiplier=100.0, modules_to_save=["classifier"]))
    module = fusion_of(model)
    perturb_(module)
    optimizer = torch.optim.Adam(parameter_groups(model, lr=1e-5))
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    labels = torch.arange(input_ids.numel()).view_as(input_ids) % 5
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    optimizer.step()
    moved = {name: (p.detach() - before[name]).abs().max().item() for name, p in model.named_parameters()
             if p.requires_grad}  # fmt: skip
    key_step = moved[next(n for n in moved if n.endswith("key_proj.weight"))]
    value_step = moved[next(n for n in moved if n.endswith("value_norm_weight"))]
    head_step = moved[next(n for n in moved if "classifier" in n and n.endswith("weight"))]
    assert key_step == pytest.approx(1e-3, rel=1e-2)
    assert value_step == pytest.approx(1e-5, rel=1e-2) and head_step == pytest.approx(1e-5, rel=1e-2)
