"""Each fusion method against an independent recomputation of the METHODS.md formulas.

The reference takes ``z_0 .. z_L`` from ``output_hidden_states`` of an untouched copy of the
base model, applies the formula written out layer by layer from the fusion module's own
parameters, and sends the result through the head; the PeftModel's logits must match.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import NO_DROPOUT, attach, fusion_of, perturb_, tiny_bert

from peft_layerfusion import (
    AverageConfig,
    ConcatConfig,
    DWAttConfig,
    ExtraLayersConfig,
    ScalarMixConfig,
)
from peft_layerfusion.hooks import first_tensor
from peft_layerfusion.registration import ENCODER_METHODS

ATOL = 1e-5


# ----------------------------------------------------------------------------- references
def bottleneck_ref(x: torch.Tensor, mlp: torch.nn.Module, n: int) -> torch.Tensor:
    """``W_n LN_n(gelu(U_n x))`` for the ``n``-th MLP of a stacked bottleneck, written out (``U_n``, ``W_n``
    stored ``(out, in)``)."""
    inner = F.gelu(x @ mlp.up.weight[n].T + vector(mlp.up.bias, n))  # (batch, seq, γd)
    mean = inner.mean(-1, keepdim=True)
    var = inner.var(-1, unbiased=False, keepdim=True)
    inner = (inner - mean) / torch.sqrt(var + 1e-5) * vector(mlp.norm_weight, n) + vector(mlp.norm_bias, n)
    return inner @ mlp.down.weight[n].T + vector(mlp.down.bias, n)  # (batch, seq, d)


def vector(stacked: torch.Tensor, n: int) -> torch.Tensor:
    """Row ``n`` of a per-layer stacked vector parameter, ``(K, width)`` or ``(K, 1, width)``."""
    return stacked[n].reshape(-1)


def root_mean_square(x: torch.Tensor) -> torch.Tensor:
    """``sqrt(mean_i x_i^2 + 1e-6)`` per position, ``(..., d) -> (..., 1)``, written out."""
    return torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-6)


def unit(z: tuple[torch.Tensor, ...], module) -> list[torch.Tensor]:
    """The states a module with ``state_norm="rms"`` mixes (``z_n / rms(z_n)``), else ``z`` as it is."""
    return [state / root_mean_square(state) for state in z] if module.normalizes_states else list(z)


def on_stream_scale(mixed: torch.Tensor, z: tuple[torch.Tensor, ...], module) -> torch.Tensor:
    """A mix of unit-RMS states times ``rms(z_L)`` (``state_norm="rms"``), else the mix itself."""
    return mixed * root_mean_square(z[-1]) if module.normalizes_states else mixed


def dwatt_ref(z: tuple[torch.Tensor, ...], layers: list[int], module, normed_last=None) -> torch.Tensor:
    """DWAtt's ``h``; with ``state_norm="rms"`` query and values read ``z_n / rms(z_n)`` and the correction
    is scaled by ``rms(z_L)``; with ``normed_last`` (``F(z_L)``, ``state_norm="rms_after_norm"``) the
    correction is added to it, scaled by ``rms(F(z_L))``: the head's input."""
    last = z[-1]  # (batch, seq, d)
    read = last
    if module.normalizes_states:
        read, z = last / root_mean_square(last), unit(z, module)
    query = 1.0 + F.elu(read + bottleneck_ref(read, module.query_mlp, 0))
    scores, values = [], []
    for n, index in enumerate(layers):
        key = module.key_proj.weight @ module.depth_embeddings[n] + module.key_proj.bias  # (d,)
        scores.append((query * key).sum(-1) / module.score_divisor)  # (batch, seq)
        value = bottleneck_ref(z[index], module.value_mlps, n)
        norm_weight, norm_bias = vector(module.value_norm_weight, n), vector(module.value_norm_bias, n)
        values.append(F.layer_norm(value, value.shape[-1:], norm_weight, norm_bias))
    weights = torch.softmax(torch.stack(scores, -1), dim=-1)  # (batch, seq, K)
    start = last if normed_last is None else normed_last
    scale = root_mean_square(start) if module.normalizes_states else 1.0  # (batch, seq, 1)
    return start + scale * sum(weights[..., n : n + 1] * v for n, v in enumerate(values))


def concat_ref(z, layers, module) -> torch.Tensor:
    d = z[-1].shape[-1]
    weight, bias = module.proj.weight, module.proj.bias  # (d, K*d)
    states = unit(z, module)
    mixed = sum(states[index] @ weight[:, n * d : (n + 1) * d].T for n, index in enumerate(layers)) + bias
    return on_stream_scale(mixed, z, module)


def average_ref(z, layers, module) -> torch.Tensor:
    states = unit(z, module)
    return on_stream_scale(sum(states[index] for index in layers) / len(layers), z, module)


def scalar_mix_ref(z, layers, module) -> torch.Tensor:
    logits = module.layer_logits
    exp = [torch.exp(logits[n] - logits.max()) for n in range(len(layers))]
    weights = [e / sum(exp) for e in exp]  # softmax(w)
    if "blend" in module._parameters:  # one-hot start: s = e_b + β (softmax(w) - e_b)
        start = module.start_index  # where z_b (z_L under the identity init) sits among the fused states
        beta = module.blend.clamp(0.0, 1.0) if module.bounded_blend else module.blend  # LayerMix: bounded
        weights = [beta * w + (1 - beta) * (n == start) for n, w in enumerate(weights)]
    states = unit(z, module)
    mixed = sum(w * states[index] for w, index in zip(weights, layers, strict=True))
    return module.gamma * on_stream_scale(mixed, z, module)


REFERENCES = {  # by config class: a preset (Scaled DWAtt, LayerMix) is its method's module
    DWAttConfig: dwatt_ref,
    ConcatConfig: concat_ref,
    AverageConfig: average_ref,
    ScalarMixConfig: scalar_mix_ref,
}
REFERENCED = [method for method in ENCODER_METHODS if method.config_cls in REFERENCES]  # presets included


def reference_logits(reference, input_ids, attention_mask, fuse) -> torch.Tensor:
    """Logits of the untouched base with ``fuse(z_0..z_L)`` in place of ``z_L``."""
    with torch.no_grad():
        out = reference(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return reference.classifier(fuse(out.hidden_states))


def peft_logits(model, input_ids, attention_mask) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask).logits


# ----------------------------------------------------------------------------- forward values
@pytest.mark.parametrize("method", REFERENCED, ids=lambda m: m.name)
@pytest.mark.parametrize(
    "options, layers",
    [
        ({}, [1, 2, 3]),
        ({"include_embeddings": True}, [0, 1, 2, 3]),
        ({"layers": [0, 2, -1]}, [0, 2, 3]),
    ],
    ids=["default", "include_embeddings", "explicit_layers"],
)
def test_forward_matches_reference(method, options, layers, input_ids, attention_mask):
    model, reference = attach(method.make_config(modules_to_save=["classifier"], **options))
    module = fusion_of(model)
    perturb_(module)
    assert module.num_fused == len(layers)
    expected = reference_logits(
        reference, input_ids, attention_mask, lambda z: REFERENCES[method.config_cls](z, layers, module)
    )
    got = peft_logits(model, input_ids, attention_mask)
    base = reference_logits(reference, input_ids, attention_mask, lambda z: z[-1])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert (got - base).abs().max() > 1e-3  # the fusion changes what the head sees


@pytest.mark.parametrize("score_scale, divisor", [("none", 1.0), ("sqrt_d", 32**0.5)])
def test_dwatt_score_scale(score_scale, divisor, input_ids, attention_mask):
    model, reference = attach(DWAttConfig(score_scale=score_scale))
    module = fusion_of(model)
    perturb_(module)
    assert module.score_divisor == divisor
    fuse = lambda z: dwatt_ref(z, [1, 2, 3], module)  # noqa: E731
    expected = reference_logits(reference, input_ids, attention_mask, fuse)
    torch.testing.assert_close(peft_logits(model, input_ids, attention_mask), expected, atol=ATOL, rtol=0)
    # the scale changes the result: the same weights under the other scale give other logits
    module.score_divisor = 32**0.5 / divisor
    assert (peft_logits(model, input_ids, attention_mask) - expected).abs().max() > 1e-4


def test_dwatt_widths_and_d_pos_shapes():
    model, _ = attach(DWAttConfig(query_bottleneck_width=8, value_bottleneck_width=32, d_pos=5))
    module = fusion_of(model)
    assert tuple(module.query_mlp.up.weight.shape) == (1, 8, 32)  # (K, out, in), as nn.Linear stores it
    assert tuple(module.query_mlp.down.weight.shape) == (1, 32, 8)
    assert tuple(module.value_mlps.up.weight.shape) == (3, 32, 32)
    assert tuple(module.depth_embeddings.shape) == (3, 5)
    assert tuple(module.key_proj.weight.shape) == (32, 5)
    # p_n ~ U(0, 1), a buffer (not trained)
    assert 0 <= module.depth_embeddings.min() and module.depth_embeddings.max() <= 1
    assert "depth_embeddings" not in dict(module.named_parameters())


def call_arguments(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """A block call's arguments by name, however the model passed them."""
    return inspect.signature(module.forward).bind(*args, **kwargs).arguments


def extended_mask(reference, input_ids, attention_mask) -> torch.Tensor:
    """The attention mask BERT's last block receives (the model's own conversion, any version)."""
    block = reference.bert.encoder.layer[-1]
    seen = {}

    handle = block.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(call_arguments(module, args, kwargs)), with_kwargs=True
    )
    with torch.no_grad():
        reference(input_ids=input_ids, attention_mask=attention_mask)
    handle.remove()
    assert seen["attention_mask"] is not None
    return seen["attention_mask"]


def extra_layers_reference(reference, module, input_ids, attention_mask) -> torch.Tensor:
    """Logits of ``reference`` with R+n's blocks run on ``z_L`` under the last block's own mask."""
    mask = extended_mask(reference, input_ids, attention_mask)

    def stack(z):
        hidden = z[-1]
        for block in module.blocks:
            hidden = first_tensor(block(hidden, attention_mask=mask))  # a tuple on transformers 4.x
        return hidden

    return reference_logits(reference, input_ids, attention_mask, stack)


@pytest.mark.parametrize("num_extra_layers", [1, 2])
def test_extra_layers_match_reference(num_extra_layers, input_ids, attention_mask):
    model, reference = attach(ExtraLayersConfig(num_extra_layers=num_extra_layers))
    module = fusion_of(model)
    assert len(module.blocks) == num_extra_layers
    assert type(module.blocks[0]) is type(reference.bert.encoder.layer[-1])
    # freshly initialised, not a copy of the last block's weights
    fresh = module.blocks[0].intermediate.dense.weight
    assert not torch.equal(fresh, reference.bert.encoder.layer[-1].intermediate.dense.weight)
    assert abs(fresh.std().item() - reference.config.initializer_range) < 0.005  # the model's own init
    assert torch.all(module.blocks[0].intermediate.dense.bias == 0)
    expected = extra_layers_reference(reference, module, input_ids, attention_mask)
    got = peft_logits(model, input_ids, attention_mask)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    # the padding mask is passed on: without it the extra block would give other values
    unmasked = reference_logits(
        reference, input_ids, attention_mask, lambda z: first_tensor(module.blocks[0](z[-1]))
    )
    if num_extra_layers == 1:
        assert (unmasked[0] - got[0]).abs().max() < ATOL  # row 0 has no padding
        assert (unmasked[1] - got[1]).abs().max() > 1e-4


def test_extra_layers_default_matches_concat_budget():
    # a block of width d=32 (intermediate 48) has 4*(32*32+32) + 2*(32*48) + 48 + 32 + 2*2*32 params = 7504;
    # Concat over 3 layers is 3*32*32 + 32 = 3104 -> n = 1; over 12 layers 12320 -> n = 2.
    model, _ = attach(ExtraLayersConfig())
    assert len(fusion_of(model).blocks) == 1
    model, _ = attach(ExtraLayersConfig(), base=tiny_bert(num_hidden_layers=12))
    assert len(fusion_of(model).blocks) == 2


# ----------------------------------------------------------------------------- gradients


def loss_of(model, input_ids, attention_mask) -> torch.Tensor:
    labels = torch.arange(input_ids.numel()).view_as(input_ids) % 5
    return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=lambda m: m.name)
def test_feature_extraction_trains_only_fusion_and_head(method, input_ids, attention_mask):
    config = method.make_config(modules_to_save=["classifier"])
    model, _ = attach(config, base=tiny_bert(**NO_DROPOUT))
    model.train()
    loss_of(model, input_ids, attention_mask).backward()
    fusion_params = dict(fusion_of(model).named_parameters())
    head = model.base_model.model.classifier.modules_to_save["default"]
    head_params = set(map(id, head.parameters()))
    trainable = {id(p) for p in fusion_params.values()} | head_params
    # query_init="uniform": W_K = 0 gates the query MLP at step 1 (every k_n = 0); it learns from step 2
    gated = {id(p) for n, p in fusion_params.items() if n.startswith("query_mlp")}
    gated = gated if getattr(config, "query_init", "paper") == "uniform" else set()
    if gated:
        assert all(fusion_params[n].grad.abs().sum() == 0 for n in fusion_params if n.startswith("query_mlp"))
        with torch.no_grad():
            for param in fusion_params.values():
                param -= 0.1 * param.grad
        model.zero_grad()
        loss_of(model, input_ids, attention_mask).backward()
    for name, param in model.named_parameters():
        if id(param) in trainable:
            assert param.requires_grad, name
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert not param.requires_grad, name
            assert param.grad is None or param.grad.abs().sum() == 0, name
    per_layer_names = [n for n in fusion_params if n.startswith("value")]  # value MLPs f^V_n and LN_n
    assert len(per_layer_names) == (8 if isinstance(config, DWAttConfig) else 0)
    for name in per_layer_names:  # every layer's own slice of a stacked parameter learns
        per_layer = fusion_params[name].grad.abs().flatten(1).sum(1)
        assert per_layer.shape == (3,) and (per_layer > 0).all(), (name, per_layer)
    assert len(head_params) == 2
    # one R+1 block of BERT: q, k, v, attention output + LN, intermediate, output + LN (weights and biases)
    expected_count = {
        "dwatt": 16,
        "concat": 2,
        "scalar_mix": 2,
        "average": 0,
        "extra_layers": 16,
        "scaled_dwatt": 16,
        "layer_mix": 2,
        "probe_ensemble": 2,
        "stacked": 2,
        "joint_probe": 2,
        "joint_ensemble": 2,
    }  # fmt: skip (the presets of Concat: proj, its full maps)
    assert len(fusion_params) == expected_count[method.name]


def per_layer_parameter_views(loss: torch.Tensor, parameters: set[int]) -> list[str]:
    """The autograd nodes that take one index or slice of a parameter in ``parameters`` (by id):
    each gets a zero-padded gradient of the whole parameter in backward."""
    found, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            variable = getattr(child, "variable", None)  # an AccumulateGrad: a leaf parameter
            name = type(node).__name__
            if variable is not None and id(variable) in parameters and name.startswith(("Slice", "Select")):
                found.append(name)
            stack.append(child)
    return found


@pytest.mark.parametrize(
    "config", [ConcatConfig(), ConcatConfig(map_rank=2), DWAttConfig()], ids=["full", "low_rank", "dwatt"]
)
def test_per_layer_weights_are_taken_in_one_view_each(config, input_ids, attention_mask):
    # W_n of Concat and DWAtt's stacked f^V_n, LN_n: split / unbind once per forward. Indexing per layer
    # gave K zero-padded gradients of the whole stack per step (Concat at K = 18, d = 640: 7x slower).
    model, _ = attach(config, base=tiny_bert(**NO_DROPOUT))
    model.train()
    parameters = {id(p) for p in fusion_of(model).parameters()}
    assert per_layer_parameter_views(loss_of(model, input_ids, attention_mask), parameters) == []


def grads_with_checkpointing(
    config_cls, use_reentrant, train_encoder, input_ids, attention_mask, frozen_inputs=False
):
    model, _ = attach(config_cls(modules_to_save=["classifier"]), base=tiny_bert(**NO_DROPOUT), seed=3)
    if train_encoder:
        for name, param in model.named_parameters():
            if "bert.encoder.layer." in name or "bert.embeddings" in name:
                param.requires_grad_(True)
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.base_model.model.bert.encoder.layer[0].gradient_checkpointing
        base = model.base_model.model
        if frozen_inputs and hasattr(base, "_require_grads_hook"):  # what transformers 4.57 does
            base.disable_input_require_grads()
    model.train()
    runs = []  # a module inside block 0: re-run during backward when the block is checkpointed
    block = model.base_model.model.bert.encoder.layer[0]
    block.intermediate.register_forward_hook(lambda *a: runs.append(1))
    input_grad = []  # transformers 5 makes the embeddings' output require grad, 4.57 does not
    block.register_forward_pre_hook(
        lambda m, args, kwargs: input_grad.append(
            call_arguments(m, args, kwargs)["hidden_states"].requires_grad
        ),
        with_kwargs=True,
    )
    loss_of(model, input_ids, attention_mask).backward()
    # block 0 is re-run only if backward has to go through it, i.e. when its input needs grad
    needs_backward = input_grad[0] or train_encoder
    assert len(runs) == (2 if use_reentrant is not None and needs_backward else 1)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("config_cls", [DWAttConfig, ExtraLayersConfig])
@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("train_encoder", [False, True], ids=["frozen", "unfrozen"])
def test_gradient_checkpointing_gives_same_gradients(
    config_cls, use_reentrant, train_encoder, input_ids, attention_mask
):
    plain = grads_with_checkpointing(config_cls, None, train_encoder, input_ids, attention_mask)
    checkpointed = grads_with_checkpointing(
        config_cls, use_reentrant, train_encoder, input_ids, attention_mask
    )
    assert any("fusion" in n for n in plain)
    assert any("encoder.layer.0." in n for n in plain) == train_encoder
    assert_same_grads(plain, checkpointed)


def assert_same_grads(plain: dict[str, torch.Tensor], checkpointed: dict[str, torch.Tensor]) -> None:
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_extra_layers_learn_on_a_frozen_encoder(use_reentrant, input_ids, attention_mask):
    # z_L needs no grad here; re-entrant checkpointing would then give the extra blocks none
    plain = grads_with_checkpointing(ExtraLayersConfig, None, False, input_ids, attention_mask)
    checkpointed = grads_with_checkpointing(
        ExtraLayersConfig, use_reentrant, False, input_ids, attention_mask, frozen_inputs=True
    )
    assert any(".blocks.0." in n for n in plain)
    assert_same_grads(plain, checkpointed)


# ----------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("config_cls", [DWAttConfig, ConcatConfig, ScalarMixConfig, ExtraLayersConfig])
@pytest.mark.parametrize("when", ["before", "after"], ids=["bf16_base", "bf16_peft_model"])
def test_bf16_model_runs_and_stays_close(config_cls, when, input_ids, attention_mask):
    model, _ = attach(config_cls(modules_to_save=["classifier"]))
    perturb_(fusion_of(model), scale=0.1)
    fp32 = peft_logits(model, input_ids, attention_mask)
    if when == "before":  # a bf16 base model gets an adapter; fusion weights stay in fp32
        state = {k: v.clone() for k, v in fusion_of(model).state_dict().items()}
        base = tiny_bert().to(torch.bfloat16)
        model = attach(config_cls(modules_to_save=["classifier"]), base=base)[0]
        fusion_of(model).load_state_dict(state)
    else:
        model = model.to(torch.bfloat16)
        assert all(p.dtype == torch.bfloat16 for p in fusion_of(model).parameters())
    bf16 = peft_logits(model, input_ids, attention_mask)
    assert bf16.dtype == torch.bfloat16
    assert torch.isfinite(bf16).all()
    torch.testing.assert_close(bf16.float(), fp32, atol=0.15, rtol=0.05)
