"""EncoderFusion (transparent attention) on tiny random BART and T5."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from peft import PeftModel, get_peft_model
from test_surface_fusion import BUILDERS, batch, tiny_bart
from transformers.modeling_outputs import BaseModelOutput

from peft_layerfusion import EncoderFusionConfig
from peft_layerfusion.layer import fusion_layer_of


def adapted(base, **options) -> PeftModel:
    return get_peft_model(copy.deepcopy(base), EncoderFusionConfig(**options)).eval()


def fusion_module(model: PeftModel):
    return fusion_layer_of(model.base_model.model).fusion_modules["default"]


def reference_logits(base, inputs: dict, weights: torch.Tensor, layers: list[int], norm) -> torch.Tensor:
    """Every decoder layer reads the same LN(Σ w_i x_i): feed it as the encoder output."""
    with torch.no_grad():
        states = base.get_encoder()(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_hidden_states=True
        ).hidden_states  # x_0 .. x_L (x_L after the encoder's final norm)
        encoder = base.get_encoder()
        final_norm = getattr(encoder, "final_layer_norm", None)  # T5 is pre-norm: x_L is that norm's input
        seen = []
        handle = final_norm.register_forward_pre_hook(lambda m, a: seen.append(a[0])) if final_norm else None
        x_last = encoder(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).last_hidden_state
        if handle is not None:
            handle.remove()
        states = (*states[:-1], seen[-1] if seen else x_last)  # the residual stream (fusion.py)
        mixed = norm(sum(w * states[i] for w, i in zip(weights, layers, strict=True)))
        return base(encoder_outputs=BaseModelOutput(last_hidden_state=mixed), **{
            k: v for k, v in inputs.items() if k != "input_ids"
        }).logits  # fmt: skip


def per_layer_reference_logits(base, module, inputs: dict, layers: list[int]) -> torch.Tensor:
    """(BART) Decoder layer ``j`` reads ``LN_j(Σ_i softmax(W_j)_i x_i)``, each mix computed from the formula.

    The encoder states come from ``output_hidden_states`` of the untouched ``base``; each mix is
    handed to its decoder layer as ``encoder_hidden_states`` (the argument cross-attention reads).
    """
    with torch.no_grad():
        encoder = base.get_encoder()
        states = encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                         output_hidden_states=True).hidden_states  # fmt: skip
        mixes = [
            norm(sum(w * states[i] for w, i in zip(torch.softmax(logits, 0), layers, strict=True)))
            for logits, norm in zip(module.layer_logits, module.norms, strict=True)
        ]  # one (batch, src, d) per decoder layer

        def reads_its_mix(j):
            def hook(layer, args, kwargs):
                bound = inspect.signature(layer.forward).bind(*args, **kwargs)
                bound.arguments["encoder_hidden_states"] = mixes[j]  # positional or keyword alike
                return bound.args, bound.kwargs

            return hook

        decoder_layers = base.get_decoder().layers  # BART's decoder layers
        handles = [layer.register_forward_pre_hook(reads_its_mix(j), with_kwargs=True)
                   for j, layer in enumerate(decoder_layers)]  # fmt: skip
        try:
            return base(**inputs).logits
        finally:
            for handle in handles:
                handle.remove()


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("include_embeddings", [False, True])
def test_decoder_reads_the_layer_normed_mix(family, include_embeddings):
    base = BUILDERS[family]()
    model = adapted(base, include_embeddings=include_embeddings)
    module = fusion_module(model)
    layers = [0, 1, 2] if include_embeddings else [1, 2]
    assert module.layer_logits.shape == (2, len(layers))
    logits = torch.randn(len(layers), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        module.layer_logits.copy_(logits.expand(2, -1))  # the same mix for both decoder layers
        for norm in module.norms:
            norm.weight.fill_(1.5)
            norm.bias.fill_(0.1)
        inputs = batch()
        out = model(**inputs).logits
        plain = base(**inputs).logits
    expected = reference_logits(base, inputs, torch.softmax(logits, 0), layers, module.norms[0])
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=1e-4)
    assert (out - plain).abs().max() > 1e-2


def test_each_decoder_layer_has_its_own_mix():
    base = tiny_bart()
    model = adapted(base)
    module = fusion_module(model)
    inputs = batch()
    with torch.no_grad():
        module.layer_logits.copy_(torch.tensor([[3.0, -3.0], [-3.0, 3.0]]))  # opposite mixes
        module.norms[1].weight.fill_(0.5)  # and different norms
        got = model(**inputs).logits
    expected = per_layer_reference_logits(base, module, inputs, layers=[1, 2])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # one shared mix (layer 0's, or layer 1's, for every decoder layer) gives other logits
    for shared in (0, 1):
        shared_logits = reference_logits(base, inputs, torch.softmax(module.layer_logits[shared], 0), [1, 2],
                                         module.norms[shared])  # fmt: skip
        assert (shared_logits - got).abs().max() > 1e-3


def test_generate_with_cache_matches_full_forwards():
    base = tiny_bart()
    model = adapted(base, include_embeddings=True)
    with torch.no_grad():
        fusion_module(model).layer_logits.normal_(0, 2)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    with torch.no_grad():
        greedy = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        logits = model(**inputs, decoder_input_ids=greedy[:, :-1]).logits
        beams = model.generate(**inputs, max_new_tokens=4, num_beams=3, do_sample=False)
        plain = base.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert torch.equal(greedy[:, 1:], logits.argmax(-1))  # cached cross-attention used the mix
    assert beams.shape[0] == 2
    assert not torch.equal(greedy, plain)


def test_gradients_reach_the_mix_and_the_norms():
    model = get_peft_model(tiny_bart(), EncoderFusionConfig(include_embeddings=True))
    model(**batch()).loss.backward()
    module = fusion_module(model)
    assert module.layer_logits.grad.abs().min() > 0
    assert all(norm.weight.grad.abs().sum() > 0 for norm in module.norms)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 2 * 3 + 2 * 2 * 16


def test_encoder_only_models_are_refused():
    from conftest import tiny_bert

    with pytest.raises(ValueError, match="not an encoder-decoder"):
        get_peft_model(tiny_bert(), EncoderFusionConfig())


def test_parameter_audit_counts_each_component():
    from peft_layerfusion.comparison.audit import trainable_components

    model = get_peft_model(tiny_bart(), EncoderFusionConfig(include_embeddings=True))
    assert trainable_components(model) == {"layer_logits": 2 * 3, "norms": 2 * 2 * 16}
