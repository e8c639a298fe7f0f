"""Sizing for large models: Concat's ``map_rank``, DWAtt's bottleneck widths, fewer ``layers``.

Parameter counts equal the closed forms of the method docstrings (and hand-computed numbers);
sized modules compute their formula (recomputed from ``output_hidden_states``), reload
bitwise, and the defaults build exactly the modules they built before.
"""

from __future__ import annotations

import pytest
import torch
from conftest import attach, check_lifecycle, fusion_of, perturb_, tiny_bert
from test_methods import ATOL, dwatt_ref, peft_logits, reference_logits

from peft_layerfusion import ConcatConfig, DWAttConfig, count_hooks
from peft_layerfusion.comparison.budget import (
    METHOD_SIZERS,
    match_concat_rank,
    match_dwatt_width,
)
from peft_layerfusion.registration import TRAINED_METHODS

D = 32  # tiny_bert: width 32, 3 blocks


def parameters_of(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- counts
@pytest.mark.parametrize(
    "config, num_fused, by_hand",
    [
        (ConcatConfig(), 3, 3 * D * D + D),  # 3104, the paper's Concat
        (ConcatConfig(map_rank=4), 3, 2 * 3 * D * 4 + D),  # 800
        (ConcatConfig(map_rank=1, include_embeddings=True), 4, 2 * 4 * D + D),  # 288
        (ConcatConfig(map_rank=2, layers=[0, -1]), 2, 2 * 2 * D * 2 + D),  # 288
        (ConcatConfig(layers=[3]), 1, D * D + D),  # a subset of layers, full map
        (DWAttConfig(), 3, 5408),  # γ = 0.5: test_audit's hand count
        # w_Q = 5: 2*32*5 + 3*5 + 32 = 367; w_V = 7: 501 each; LN_n 2*3*32; W_K 24*32 + 32
        (DWAttConfig(query_bottleneck_width=5, value_bottleneck_width=7), 3, 367 + 3 * 501 + 192 + 800),
        (DWAttConfig(value_bottleneck_width=1, d_pos=4, layers=[1, 3]), 2, 1104 + 2 * 99 + 128 + 160),
    ],
    ids=["concat", "concat_r4", "concat_r1_embeddings", "concat_r2_two_layers", "concat_one_layer",
         "dwatt", "dwatt_widths", "dwatt_width_1_two_layers"],
)  # fmt: skip
def test_parameter_counts_are_the_formulas(config, num_fused, by_hand):
    model, _ = attach(config)
    module = fusion_of(model)
    assert module.num_fused == num_fused
    assert parameters_of(module) == config.num_parameters(num_fused, D) == by_hand


def test_llm_shape_counts_from_the_issue():
    # Llama-3.1-8B: K = 32, d = 4096. Concat is 537M; DWAtt's value MLPs about as many.
    assert ConcatConfig().num_parameters(32, 4096) == 536_875_008
    value_mlps = 32 * (2 * 4096 * 2048 + 3 * 2048 + 4096)
    assert value_mlps == 537_198_592
    assert DWAttConfig().num_parameters(32, 4096) == 554_350_592
    assert ConcatConfig(map_rank=52).num_parameters(32, 4096) == 13_635_584


def test_dwatt_width_shapes():
    model, _ = attach(DWAttConfig(query_bottleneck_width=5, value_bottleneck_width=7))
    module = fusion_of(model)
    assert tuple(module.query_mlp.up.weight.shape) == (1, 5, D)  # (K, out, in)
    assert tuple(module.value_mlps.up.weight.shape) == (3, 7, D)
    assert tuple(module.value_mlps.down.weight.shape) == (3, D, 7)
    assert DWAttConfig(query_bottleneck_width=8).widths(D) == (8, 16)  # the paper's d / 2 when none is given


def test_concat_low_rank_shapes_and_init():
    model, _ = attach(ConcatConfig(map_rank=4))
    module = fusion_of(model)
    assert tuple(module.down_weight.shape) == (3, D, 4)  # A_n, stored transposed
    assert tuple(module.up.weight.shape) == (D, 3 * 4)  # B = [B_1 B_2 B_3]
    assert "proj" not in module._modules
    bound_a, bound_b = 1 / D**0.5, 1 / (3 * 4) ** 0.5  # nn.Linear's U(±1/sqrt(fan_in))
    assert 0.8 * bound_a < module.down_weight.abs().max() <= bound_a
    assert 0.8 * bound_b < module.up.weight.abs().max() <= bound_b


# ----------------------------------------------------------------------------- = recomputation
def low_rank_concat_ref(z, layers, module, adds_last: bool) -> torch.Tensor:
    """``Σ_n B_n A_n z_n + b`` (``+ z_L`` for the identity init), one layer at a time."""
    r = module.map_rank
    up = module.up.weight  # (d, K*r)
    fused = module.up.bias + sum(
        z[index] @ module.down_weight[n] @ up[:, n * r : (n + 1) * r].T for n, index in enumerate(layers)
    )
    return fused + z[-1] if adds_last else fused


@pytest.mark.parametrize("init", ["paper", "identity"])
@pytest.mark.parametrize(
    "options, layers", [({}, [1, 2, 3]), ({"layers": [0, 2]}, [0, 2])], ids=["all", "0_2"]
)
def test_low_rank_concat_matches_reference(init, options, layers, input_ids, attention_mask):
    model, reference = attach(
        ConcatConfig(map_rank=3, fusion_init=init, modules_to_save=["classifier"], **options)
    )
    module = fusion_of(model)
    assert module.adds_last == (init == "identity")
    perturb_(module)
    fuse = lambda z: low_rank_concat_ref(z, layers, module, init == "identity")  # noqa: E731
    expected = reference_logits(reference, input_ids, attention_mask, fuse)
    got = peft_logits(model, input_ids, attention_mask)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    base = reference_logits(reference, input_ids, attention_mask, lambda z: z[-1])
    assert (got - base).abs().max() > 1e-3


def test_dwatt_with_widths_matches_reference(input_ids, attention_mask):
    config = DWAttConfig(query_bottleneck_width=3, value_bottleneck_width=5, layers=[0, 3])
    model, reference = attach(config)
    module = fusion_of(model)
    perturb_(module)
    expected = reference_logits(reference, input_ids, attention_mask, lambda z: dwatt_ref(z, [0, 3], module))
    torch.testing.assert_close(peft_logits(model, input_ids, attention_mask), expected, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- save / load
@pytest.mark.parametrize(
    "config",
    [
        ConcatConfig(map_rank=3),
        ConcatConfig(map_rank=3, fusion_init="identity", layers=[0, 1]),
        DWAttConfig(query_bottleneck_width=3, value_bottleneck_width=5, fusion_init="identity"),
    ],
    ids=["concat_low_rank", "concat_low_rank_identity", "dwatt_widths_identity"],
)
def test_sized_adapters_reload_bitwise(config, input_ids, attention_mask, tmp_path):
    config.modules_to_save = ["classifier"]
    fresh = tiny_bert()
    hooks = count_hooks(fresh)
    model, reference = attach(config)
    perturb_(fusion_of(model))  # trained weights, not the init
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    with torch.no_grad():
        plain = reference(**inputs).logits
    check_lifecycle(model, fresh, inputs, tmp_path, plain, hooks)


# ----------------------------------------------------------------------------- defaults unchanged
def test_defaults_build_the_same_modules():
    concat = fusion_of(attach(ConcatConfig())[0])
    assert [name for name, _ in concat.named_parameters()] == ["proj.weight", "proj.bias"]
    assert concat.map_rank is None and not concat.adds_last
    dwatt = fusion_of(attach(DWAttConfig())[0])
    assert DWAttConfig().widths(D) == (16, 16)
    assert torch.equal(dwatt.value_norm_weight, torch.ones(3, D))
    default = fusion_of(attach(DWAttConfig(), seed=5)[0]).state_dict()
    widths = DWAttConfig(query_bottleneck_width=16, value_bottleneck_width=16)
    explicit = fusion_of(attach(widths, seed=5)[0]).state_dict()
    assert list(default) == list(explicit)
    assert all(torch.equal(default[name], explicit[name]) for name in default)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "config_cls, field, value",
    [
        (ConcatConfig, "map_rank", 0),
        (ConcatConfig, "map_rank", 2.0),
        (ConcatConfig, "map_rank", True),
        (ConcatConfig, "map_rank", "8"),
        (DWAttConfig, "value_bottleneck_width", 0),
        (DWAttConfig, "query_bottleneck_width", 1.5),
    ],
)
def test_bad_sizes_name_the_field(config_cls, field, value):
    with pytest.raises(ValueError, match=rf"^`{field}`={value!r} is not allowed: expected an int >= 1"):
        config_cls(**{field: value})


# ----------------------------------------------------------------------------- budget knobs
def test_every_sized_method_has_a_budget_knob():
    assert set(METHOD_SIZERS) == {m.name for m in TRAINED_METHODS if m.module_cls.sized_to_budget}


@pytest.mark.parametrize("target", [800, 1000, 1500, 5000])
def test_concat_rank_is_the_closest(target):
    found = match_concat_rank(tiny_bert(), target)
    sizes = {r: ConcatConfig(map_rank=r).num_parameters(3, D) for r in range(1, 40)}
    assert (
        found.params
        == sizes[found.value]
        == parameters_of(fusion_of(attach(ConcatConfig(**found.options))[0]))
    )
    assert abs(found.params - target) == min(abs(size - target) for size in sizes.values())


def test_concat_rank_stays_below_the_width_concat_accepts():
    found = match_concat_rank(tiny_bert(), 10**7)  # the closest rank would be ~52,000 >> d = 32
    assert found.value == D - 1 and found.params == ConcatConfig(map_rank=D - 1).num_parameters(3, D)
    assert parameters_of(fusion_of(attach(ConcatConfig(**found.options))[0])) == found.params  # it builds


@pytest.mark.parametrize("target", [1500, 5408, 9000])
def test_dwatt_width_is_the_closest(target):
    found = match_dwatt_width(tiny_bert(), target, layers=[1, 3])
    assert set(found.options) == {"query_bottleneck_width", "value_bottleneck_width"}

    def size(width: int) -> int:
        return DWAttConfig(query_bottleneck_width=width, value_bottleneck_width=width).num_parameters(2, D)

    built = fusion_of(attach(DWAttConfig(layers=[1, 3], **found.options))[0])
    assert found.params == size(found.value) == parameters_of(built)
    assert abs(found.params - target) == min(abs(size(w) - target) for w in range(1, 100))
