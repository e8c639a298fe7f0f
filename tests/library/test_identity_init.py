"""``fusion_init``: the identity init starts every method that has one at the base model's output.

Under ``fusion_init="identity"`` the logits before the first step are BITWISE the base
model's (``torch.equal``), on every encoder family of ``test_discovery`` and for every
registered method whose config has ``IDENTITY_INIT``; one training step then moves the
output, and the parameters each method's docstring names get non-zero gradients at step 1
(every parameter by step 2). ``"auto"`` is the paper's init on encoders (bitwise the same
modules) and the identity on decoder-only models.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as tf
from conftest import NO_DROPOUT, attach, fusion_of, perturb_, tiny_bert
from peft import PeftModel, get_peft_model
from test_discovery import FAMILIES, build, inputs_for

from peft_layerfusion import AverageConfig, ConcatConfig, DWAttConfig, ScalarMixConfig, count_hooks
from peft_layerfusion.config import INIT_CHOICES
from peft_layerfusion.discovery import is_decoder_only
from peft_layerfusion.registration import ENCODER_METHODS, METHODS

IDENTITY_METHODS = [method for method in ENCODER_METHODS if method.config_cls.IDENTITY_INIT]
# Each identity-capable method (a preset with its values), and the variants whose identity init is built
# differently.
VARIANTS = {method.name: (method.make_config, {}) for method in IDENTITY_METHODS} | {
    "concat_low_rank": (ConcatConfig, {"map_rank": 3}),
}
# The fusion parameters with a non-zero gradient at step 1 (the methods' docstrings say why);
# every other one gets its first at step 2.
STEP_1_GRADIENTS = {
    "dwatt": {"value_norm_weight", "value_norm_bias"},
    "concat": {"proj.weight", "proj.bias"},
    "concat_low_rank": {"up.weight", "up.bias"},
    "scalar_mix": {"gamma", "blend"},
    "scaled_dwatt": {"value_norm_weight", "value_norm_bias"},
    "layer_mix": {"gamma", "blend"},
    "probe_ensemble": {"proj.weight", "proj.bias"},  # Concat's full maps, under an identity start
    "stacked": {"proj.weight", "proj.bias"},
    "joint_probe": {"proj.weight", "proj.bias"},
    "joint_ensemble": {"proj.weight", "proj.bias"},
}
# The parameters whose first non-zero gradient comes at step 3, not 2: Scaled DWAtt's query MLP, gated by
# W_K = 0 (every k_n = 0) until W_K's first update at step 2 (its own gradient gated by v_n = 0 at step 1).
STEP_3_GRADIENTS = {"scaled_dwatt": "query_mlp."}


def logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


FITTED = ("probe_ensemble", "stacked", "joint_probe", "joint_ensemble")  # Concat's presets fitted by few_shot


def test_identity_methods_come_from_the_registry():
    names = {"dwatt", "concat", "scalar_mix", "scaled_dwatt", "layer_mix", *FITTED}
    assert {m.name for m in IDENTITY_METHODS} == names
    assert set(STEP_1_GRADIENTS) == set(VARIANTS)


# ----------------------------------------------------------------------------- bitwise the base
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_identity_init_gives_the_base_logits_bitwise(family, variant):
    config_cls, options = VARIANTS[variant]
    base = build(family)
    batch = inputs_for(family)
    expected = logits(base, batch)
    model, _ = attach(config_cls(fusion_init="identity", **options), base=base)
    got = logits(model, batch)
    assert torch.equal(got, expected)
    paper, _ = attach(config_cls(fusion_init="paper", **options), base=build(family))
    assert (logits(paper, batch) - expected).abs().max() > 1e-6  # the paper's init does not


@pytest.mark.parametrize(
    "config",
    [
        DWAttConfig(fusion_init="identity", layers=[0, 1]),  # DWAtt reads z_L itself
        ConcatConfig(fusion_init="identity", layers=[2, 0, -1]),  # W_L = I in the middle slice
        ConcatConfig(fusion_init="identity", layers=[0, 1], map_rank=2),  # low rank adds z_L itself
        ScalarMixConfig(fusion_init="identity", layers=[3, 1]),  # one-hot on the first position
    ],
    ids=[
        "dwatt_without_last",
        "concat_last_in_middle",
        "concat_low_rank_without_last",
        "scalar_mix_last_first",
    ],
)
def test_identity_init_with_explicit_layers(config, input_ids, attention_mask):
    base = tiny_bert()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    expected = logits(base, inputs)
    model, _ = attach(config, base=base)
    assert torch.equal(logits(model, inputs), expected)


# ----------------------------------------------------------------------------- training moves it
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_step_moves_the_output_and_gradients_reach_every_parameter(variant, input_ids, attention_mask):
    config_cls, options = VARIANTS[variant]
    base = tiny_bert(**NO_DROPOUT)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    expected = logits(base, inputs)
    with warnings.catch_warnings():  # the head stays frozen on purpose: only the fusion moves the logits
        warnings.simplefilter("ignore", UserWarning)
        model, _ = attach(config_cls(fusion_init="identity", **options), base=base)
    module = fusion_of(model)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    labels = torch.arange(input_ids.numel()).view_as(input_ids) % 5
    nonzero = []
    for _ in range(3):
        model.train()
        optimizer.zero_grad()
        model(**inputs, labels=labels).loss.backward()
        nonzero.append({name for name, p in module.named_parameters() if p.grad is not None and p.grad.any()})
        optimizer.step()
        model.eval()
        assert (logits(model, inputs) - expected).abs().max() > 1e-3
    everything = {name for name, _ in module.named_parameters()}
    late_prefix = STEP_3_GRADIENTS.get(variant)
    late = {name for name in everything if late_prefix and name.startswith(late_prefix)}
    assert nonzero[0] == STEP_1_GRADIENTS[variant]
    assert nonzero[1] == everything - late
    assert nonzero[2] == everything


# ----------------------------------------------------------------------------- "auto" and "paper"
@pytest.mark.parametrize("method", ENCODER_METHODS, ids=lambda m: m.name)
def test_auto_is_the_paper_init_on_encoders(method):
    default, _ = attach(method.make_config(), seed=3)
    paper, _ = attach(method.make_config(fusion_init="paper"), seed=3)
    assert default.peft_config["default"].fusion_init == "auto"
    first, second = fusion_of(default).state_dict(), fusion_of(paper).state_dict()
    assert list(first) == list(second)
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_identity_is_refused_by_methods_without_one(method):
    if method.config_cls.IDENTITY_INIT:
        assert method.make_config(fusion_init="identity").fusion_init == "identity"
        return
    with pytest.raises(
        ValueError, match=r"^`fusion_init`='identity' is not allowed: expected 'auto' or 'paper'"
    ):
        method.make_config(fusion_init="identity")


@pytest.mark.parametrize("value", ["identical", "Identity", None, 1])
def test_unknown_init_names_the_field(value):
    with pytest.raises(ValueError, match=rf"^`fusion_init`={value!r} is not allowed: expected one of"):
        DWAttConfig(fusion_init=value)
    assert INIT_CHOICES == ("auto", "paper", "identity")


@pytest.mark.parametrize("config_cls", [ConcatConfig, ScalarMixConfig])
def test_identity_without_the_last_layer_is_refused_before_the_model_changes(config_cls):
    base = tiny_bert()
    hooks = count_hooks(base)
    with pytest.raises(
        ValueError, match=r"^`layers`=\[0, 1\] is not allowed: expected a list with the last state \(3"
    ):
        get_peft_model(base, config_cls(fusion_init="identity", layers=[0, 1]))
    assert count_hooks(base) == hooks and "layer_fusion" not in base.bert.encoder._modules


# ----------------------------------------------------------------------------- decoder-only models
D = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4)
DECODERS = {
    "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**D, num_key_value_heads=2)),
    "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**D, num_key_value_heads=2, head_dim=8)),
    "gemma3_text": lambda: tf.Gemma3ForCausalLM(
        tf.Gemma3TextConfig(**D, num_key_value_heads=1, head_dim=8, sliding_window=4)
    ),
}


def tiny_decoder(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return DECODERS[name]().eval()


@pytest.mark.parametrize("name", list(DECODERS))
def test_auto_resolves_to_identity_on_decoders(name):
    model = tiny_decoder(name)
    assert is_decoder_only(model) and not is_decoder_only(tiny_bert())
    assert ConcatConfig().starts_at_base(model, [1, 2, 3], 3)
    assert not ConcatConfig().starts_at_base(model, [1, 2], 3)  # W_L = I needs z_L: the paper's init
    assert ConcatConfig(map_rank=4).starts_at_base(model, [1, 2], 3)
    assert DWAttConfig().starts_at_base(model, [0], 3)
    assert not DWAttConfig(fusion_init="paper").starts_at_base(model, [1, 2, 3], 3)
    assert not AverageConfig().starts_at_base(model, [1, 2, 3], 3)  # no identity init: the mean
    assert not ScalarMixConfig().starts_at_base(tiny_bert(), [1, 2, 3], 3)  # an encoder: the paper's


@pytest.mark.parametrize("config_cls", [ConcatConfig, ScalarMixConfig])
def test_auto_falling_back_to_the_paper_init_on_a_decoder_warns_once(config_cls):
    """Issue 37: ``"auto"`` with ``layers`` leaving out ``z_L`` gave the paper's init silently."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_peft_model(tiny_decoder("llama"), config_cls(layers=[1, 2]))
    method = config_cls.__name__.removesuffix("Config")
    said = [str(w.message) for w in caught if "identity init" in str(w.message)]
    assert said == [
        f"Layer fusion: {method} with fusion_init='auto' starts from the paper's init on this "
        "decoder-only model, not the identity init: layers=[1, 2] leaves out the last state z_L "
        "(3 or -1) that the identity init starts from. Add 3 to `layers`, or set fusion_init='paper' "
        "to silence this."
    ]
    quiet = [  # z_L fused, the paper's init asked for, an encoder, DWAtt (reads z_L whatever the layers)
        (tiny_decoder("llama"), config_cls(layers=[1, 3])),
        (tiny_decoder("llama"), config_cls(layers=[1, 2], fusion_init="paper")),
        (tiny_bert(), config_cls(layers=[1, 2])),
        (tiny_decoder("llama"), DWAttConfig(layers=[1, 2])),
    ]
    for base, config in quiet:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            get_peft_model(base, config)
        assert not [w for w in caught if "identity init" in str(w.message)], config


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoders_start_at_the_base_by_default(name, variant):
    config_cls, options = VARIANTS[variant]
    ids = torch.randint(1, 99, (2, 6), generator=torch.Generator().manual_seed(0))
    expected = logits(tiny_decoder(name), {"input_ids": ids})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the LM head is frozen: fine here
        model = get_peft_model(tiny_decoder(name), config_cls(**options)).eval()
    assert torch.equal(logits(model, {"input_ids": ids}), expected)


@pytest.mark.parametrize("low_cpu_mem_usage", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trained_identity_adapters_reload_bitwise(
    variant, low_cpu_mem_usage, input_ids, attention_mask, tmp_path
):
    config_cls, options = VARIANTS[variant]
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    model, _ = attach(config_cls(fusion_init="identity", modules_to_save=["classifier"], **options))
    perturb_(fusion_of(model))  # trained: away from the identity
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_bert(), tmp_path, low_cpu_mem_usage=low_cpu_mem_usage).eval()
    assert list(fusion_of(loaded).state_dict()) == list(fusion_of(model).state_dict())  # `blend` included
    assert torch.equal(logits(loaded, inputs), logits(model, inputs))
    assert not torch.equal(logits(model, inputs), logits(tiny_bert(), inputs))
