"""Issue 24, library side: discovery of Funnel, layer drop, failed loads, audit inputs, meta builds."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from conftest import TINY, ToyBlock, fusion_of, perturb_
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from test_matrix import Case, output
from test_methods import REFERENCES
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from peft_layerfusion import DWAttConfig, count_hooks, find_encoder_blocks
from peft_layerfusion.comparison.audit import audit
from peft_layerfusion.hooks import first_tensor
from peft_layerfusion.registration import ENCODER_METHODS, METHODS


# ----------------------------------------------------------------------------- Funnel (item 8)
def tiny_funnel() -> nn.Module:
    """Three block groups (the sequence is pooled between them) and a two-layer upsampling decoder."""
    torch.manual_seed(0)
    config = tf.FunnelConfig(
        vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=48, block_sizes=[1, 1, 1], num_decoder_layers=2
    )
    return tf.FunnelForTokenClassification(config).eval()


def test_funnel_decoder_is_not_taken_for_the_encoder():
    model = tiny_funnel()
    with pytest.raises(ValueError, match=r"`funnel.decoder.layers` \(a decoder beside the model's encoder\)"):
        get_peft_model(model, DWAttConfig())
    assert not any("layer_fusion" in name for name, _ in model.named_modules())


def test_funnel_block_groups_and_a_list_inside_a_list_are_refused():
    with pytest.raises(ValueError, match="groups of blocks .*different lengths"):
        find_encoder_blocks(tiny_funnel(), "encoder.blocks")
    with pytest.raises(ValueError, match="`funnel.encoder.blocks`, a ModuleList that is never called"):
        find_encoder_blocks(tiny_funnel(), "encoder.blocks.0")


class DecoderOnlyToy(nn.Module):
    """A stack named ``decoder`` with no ``encoder`` beside it (as OPT's ``model.decoder.layers``)."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(ToyBlock(8) for _ in range(2))


def test_a_decoder_without_an_encoder_beside_it_is_still_found():
    assert find_encoder_blocks(DecoderOnlyToy()).blocks_name == "decoder.layers"


# ----------------------------------------------------------------------------- layer drop (item 7)
AUDIO_SIZES = dict(
    hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48, vocab_size=12,
    conv_dim=(8, 8), conv_stride=(4, 4), conv_kernel=(8, 8),
    num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
)  # fmt: skip
# Layer drop is the only randomness left in training mode (no dropout, no SpecAugment masks).
NO_AUDIO_NOISE = dict(
    hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
    final_dropout=0.0, mask_time_prob=0.0, mask_feature_prob=0.0,
)  # fmt: skip
AUDIO = {
    "wav2vec2": (tf.Wav2Vec2ForCTC, tf.Wav2Vec2Config, "wav2vec2"),
    "hubert": (tf.HubertForCTC, tf.HubertConfig, "hubert"),
}
LAYER_DROP = 0.5


def tiny_audio(family: str) -> nn.Module:
    model_cls, config_cls, _ = AUDIO[family]
    torch.manual_seed(0)
    return model_cls(config_cls(**AUDIO_SIZES, **NO_AUDIO_NOISE, layerdrop=LAYER_DROP)).eval()


def encoder_of(model: nn.Module, family: str) -> nn.Module:
    return getattr(model, AUDIO[family][2]).encoder


def dropped_reference(base: nn.Module, family: str, ran: list[int], fuse, audio: torch.Tensor):
    """Logits of ``base`` with the blocks that did not run taken out, ``fuse(z_0 .. z_L)`` before the head.

    The model without the dropped blocks, in eval mode (no layer drop), gives ``z_0`` and the
    output of every block that ran (``output_hidden_states``); a dropped block passes its input on.
    """
    reduced = copy.deepcopy(base).eval()
    encoder = encoder_of(reduced, family)
    encoder.layers = nn.ModuleList(encoder.layers[i] for i in ran)
    with torch.no_grad():
        computed = list(reduced(audio, output_hidden_states=True).hidden_states)  # z_0, one per block run
        z = [computed.pop(0)]
        for index in range(base.config.num_hidden_layers):
            z.append(computed.pop(0) if index in ran else z[-1])
        return reduced.lm_head(fuse(z))


def fuse_of(method, module, num_blocks: int):
    if method.name == "extra_layers":  # R+n: its blocks on z_L (no padding: no mask)

        def run_blocks(z):
            hidden = z[-1]
            for block in module.blocks:
                hidden = first_tensor(block(hidden))
            return hidden

        return run_blocks
    formula = REFERENCES[method.config_cls]
    return lambda z: formula(z, list(range(1, num_blocks + 1)), module)


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
@pytest.mark.parametrize("family", list(AUDIO))
def test_layer_drop_fuses_the_states_the_model_computed(family, method):
    base = tiny_audio(family)
    model = get_peft_model(copy.deepcopy(base), method.make_config(modules_to_save=["lm_head"]))
    perturb_(fusion_of(model), scale=0.2)
    model.train()
    ran: list[int] = []
    for index, layer in enumerate(encoder_of(model.base_model.model, family).layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: ran.append(index))
    audio = torch.randn(2, 400, generator=torch.Generator().manual_seed(0))
    module = fusion_of(model).eval()  # no dropout of its own (DWAtt's attention, R+n's blocks)
    fuse = fuse_of(method, module, base.config.num_hidden_layers)
    patterns = set()
    for seed in range(16):
        ran.clear()
        torch.manual_seed(seed)
        if seed == 0:  # the dropped steps train: gradients reach the fusion
            model(audio).logits.square().sum().backward()
            continue
        try:
            with torch.no_grad():
                got = model(audio).logits
        except RuntimeError as error:  # every block dropped (probability 1/16 here): one clear line
            assert not ran and "skipped every block" in str(error)
            continue
        expected = dropped_reference(base, family, list(ran), fuse, audio)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        patterns.add(tuple(ran))
    assert any(p[0] != 0 for p in patterns) and any(p[-1] != 3 for p in patterns) and len(patterns) >= 4
    assert all(p.grad is not None for p in fusion_of(model).parameters())


def test_a_block_missing_in_eval_mode_is_still_refused():
    base = tiny_audio("wav2vec2")
    model = get_peft_model(base, DWAttConfig(modules_to_save=["lm_head"])).eval()
    encoder = encoder_of(base, "wav2vec2")
    original_forward = encoder.forward

    def skip_block_1(hidden_states, attention_mask=None, **kwargs):  # an early exit, in eval mode
        layers = encoder.layers
        encoder.layers = nn.ModuleList([layers[0], layers[2], layers[3]])
        try:
            return original_forward(hidden_states, attention_mask=attention_mask, **kwargs)
        finally:
            encoder.layers = layers

    encoder.forward = skip_block_1
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"blocks \[1\] .* eval-mode forward"):
        model(torch.randn(1, 400))


# ----------------------------------------------------------------------------- failed loads (items 6, 9)
def corrupt(folder, how: str) -> None:
    """Edit a saved adapter: ``"shape"`` gives one tensor a wrong shape; ``"head"`` drops the head's."""
    path = folder / "adapter_model.safetensors"
    weights = load_file(path)
    if how == "head":
        weights = {k: v for k, v in weights.items() if ".classifier." not in k and ".lm_head." not in k}
    else:
        shaped = [k for k, v in weights.items() if v.dim() > 0]
        key = next((k for k in shaped if ".layer_fusion." in k), shaped[0])  # Average: a LoRA tensor
        weights[key] = torch.zeros(*weights[key].shape[:-1], weights[key].shape[-1] + 1)
    save_file(weights, path)


def adapted_case(method):
    case = Case(method)
    options = {"target_modules": ["q_proj"] if method.seq2seq else ["query"]}  # LoRA layers too
    base = case.base()
    torch.manual_seed(0)
    model = get_peft_model(base, case.config(**options)).eval()
    perturb_(fusion_of(model), scale=0.2)
    return case, model, options


def observable_state(model: nn.Module) -> dict:
    """What a leftover adapter would change: parameter names, hooks, modules, the root's attributes."""
    return {
        "params": sorted(name for name, _ in model.named_parameters()),
        "modules": sorted(name for name, _ in model.named_modules()),
        "hooks": count_hooks(model, package=None),
        "root": sorted(vars(model)),
    }


@pytest.mark.parametrize("how", ["shape", "head"])
@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_a_failed_load_adapter_leaves_no_adapter(method, how, tmp_path):
    case, model, options = adapted_case(method)
    if how == "head" and method.seq2seq:
        pytest.skip("the seq2seq cases save no head")
    inputs = case.inputs()
    model.save_pretrained(tmp_path)
    corrupt(tmp_path, how)
    before, outputs = observable_state(model), output(model, inputs)
    error = ValueError if how == "head" else RuntimeError
    with pytest.raises(error, match="lack the keys" if how == "head" else "size mismatch"):
        model.load_adapter(str(tmp_path), adapter_name="b")
    assert list(model.peft_config) == ["default"]
    assert observable_state(model) == before
    with pytest.raises(ValueError):
        model.set_adapter("b")
    assert torch.equal(output(model, inputs), outputs)
    model.add_adapter("b", case.config(**options))  # the name is free again


@pytest.mark.parametrize("how", ["shape", "head"])
def test_a_failed_from_pretrained_gives_the_base_back(how, tmp_path):
    case, model, _ = adapted_case(METHODS[0])
    model.save_pretrained(tmp_path)
    corrupt(tmp_path, how)
    base = case.base()
    before, outputs = observable_state(base), output(base, case.inputs())
    with pytest.raises(ValueError if how == "head" else RuntimeError):
        PeftModel.from_pretrained(base, str(tmp_path))
    assert observable_state(base) == before
    assert all(p.requires_grad for p in base.parameters())  # as built, not frozen by the failed load
    assert torch.equal(output(base, case.inputs()), outputs)
    get_peft_model(base, case.config())  # a clean base: no "already carries a layer-fusion adapter"


def test_missing_head_keys_are_one_line_naming_the_file_and_the_fix(tmp_path):
    _, model, _ = adapted_case(METHODS[0])
    model.save_pretrained(tmp_path)
    corrupt(tmp_path, "head")
    with pytest.raises(ValueError) as error:
        model.load_adapter(str(tmp_path), adapter_name="b")
    message = str(error.value)
    assert "\n" not in message
    assert str(tmp_path / "adapter_model.safetensors") in message
    assert "['base_model.model.classifier.bias', 'base_model.model.classifier.weight']" in message
    assert "Save the adapter again" in message and "modules_to_save" in message


# ----------------------------------------------------------------------------- the audit (item 9)
SIZES = ["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads"]


@pytest.mark.parametrize("field", SIZES)
def test_audit_refuses_a_negative_size_in_one_line(field):
    config = tf.BertConfig(**{**TINY, field: -4})
    with pytest.raises(ValueError, match=rf"^`{field}`=-4 in the bert config is negative") as error:
        audit(config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers"])
def test_audit_refuses_no_width_or_no_blocks_in_one_line(field):
    with pytest.raises(ValueError, match=rf"^`{field}`=0 in the bert config: the hidden width"):
        audit(tf.BertConfig(**{**TINY, field: 0}))


def test_audit_turns_a_failed_build_into_one_line():
    expected = r"^Cannot build a bert model from this config \(ValueError: The hidden size \(30\) is not a"
    with pytest.raises(ValueError, match=expected) as error:
        audit(tf.BertConfig(**{**TINY, "hidden_size": 30}))  # 4 heads
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("regime", ["fe", "bitfit", "ft"])
def test_audit_builds_every_fusion_module_on_the_meta_device(regime):
    """No parameter is ever allocated for real: each is on the meta device when it is registered."""
    devices: list[tuple[str, str]] = []

    def record(module: nn.Module, name: str, param: torch.Tensor | None) -> None:
        if param is not None:
            devices.append((type(module).__name__, param.device.type))

    handle = register_module_parameter_registration_hook(record)
    try:
        report = audit(tf.BertConfig(**TINY), regime)
    finally:
        handle.remove()
    assert report["dwatt"]["total"] > 0 and report["concat"]["total"] > 0
    kinds = {kind for kind, _ in devices}
    assert {"DWAtt", "StackedBottleneckMLP", "ScalarMix"} <= kinds  # the fusion modules were built
    assert [entry for entry in devices if entry[1] != "meta"] == []
