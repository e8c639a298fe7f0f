"""The pre-norm placement rule (issue 24 item 2) on encoders and encoder-decoders' encoders.

The rule (``fusion.py``): a token-wise method mixes ``ẑ_n = F(z_n)``, each state through the stack's
final norm ``F``, and its output replaces ``F(z_L)``; R+n's extra blocks continue the residual stream
``z_L`` and ``F`` comes after them. Post-norm stacks have no ``F`` (``ẑ_n = z_n``).

Every family x method is compared with an independent recomputation: the method's formula
(``test_methods.REFERENCES``) applied to ``F(z_n)`` from ``output_hidden_states`` of an untouched copy
(and the model's own unfused last state, ``F(z_L)``), or, for R+n, the same model with the extra
blocks appended to its block list ("the model with n more blocks"). The final norm is named here
per family, independently of the library's discovery. Decoder-only families: ``test_decoders.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers as tf
from conftest import fusion_of, seq2seq_sizes
from peft import get_peft_model
from test_methods import REFERENCES
from tiny_decoders import BOS, COMMON, EOS, SPECIAL_IDS, adapted, with_norm_gains
from torch import nn

from peft_layerfusion import ExtraLayersConfig, find_encoder_blocks
from peft_layerfusion.registration import ENCODER_METHODS

# the tests' tiny sizes, 2 blocks (as tiny_decoders' COMMON)
D, V, FF = COMMON["hidden_size"], COMMON["vocab_size"], COMMON["intermediate_size"]
SEQ2SEQ = {**seq2seq_sizes(COMMON), **SPECIAL_IDS, "decoder_start_token_id": EOS}
T5 = dict(vocab_size=V, d_model=D, d_kv=8, d_ff=FF, num_layers=2, num_heads=4, decoder_start_token_id=0)
VIT = dict(image_size=16, patch_size=8, num_labels=3)
MODERNBERT = dict(cls_token_id=BOS, sep_token_id=EOS, global_attn_every_n_layers=2, local_attention=4)
AUDIO = dict(**COMMON, conv_dim=(8, 8), conv_stride=(4, 4), conv_kernel=(8, 8), num_conv_pos_embeddings=4,
             num_conv_pos_embedding_groups=2, hidden_dropout=0.0, activation_dropout=0.0,
             attention_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0)  # fmt: skip
TEXT = {"input_ids": torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(1))}
DECODER_IDS = {"decoder_input_ids": TEXT["input_ids"][:, :4]}
# transformers 5 moved ViT's blocks from `vit.encoder.layer` to `vit.layers`, and its final norm
# (`vit.layernorm`) with them into the blocks' container; on 4.x the norm runs outside it.
VIT_BLOCKS_AT_TOP = hasattr(tf.ViTModel(tf.ViTConfig(num_hidden_layers=1)), "layers")


@dataclass(frozen=True)
class Family:
    """A model, the inputs it takes, where its encoder blocks are and its final norm (``None``: post-norm)."""

    build: Callable[[], nn.Module]
    inputs: Callable[[], dict]
    encoder: str  # the module holding the blocks and the final norm
    blocks: str  # the block list inside ``encoder``
    final_norm: str | None  # inside ``encoder``; None for a post-norm stack
    backbone: str = ""  # the module returning ``last_hidden_state`` (models with a head: ``vit``)

    def encoder_of(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.encoder) if self.encoder else model


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return with_norm_gains(make().eval())

    return build


def _audio() -> dict:
    return {"input_values": torch.randn(2, 400, generator=torch.Generator().manual_seed(2))}


FAMILIES: dict[str, Family] = {
    "bert (post-norm)": Family(
        _seeded(lambda: tf.BertModel(tf.BertConfig(**COMMON))),
        lambda: TEXT,
        "encoder",
        "layer",
        None,
    ),  # fmt: skip
    "bart encoder (post-norm)": Family(
        _seeded(lambda: tf.BartModel(tf.BartConfig(**SEQ2SEQ))),
        lambda: TEXT | DECODER_IDS,
        "encoder",
        "layers",
        None,
    ),  # fmt: skip
    "t5 encoder": Family(
        _seeded(lambda: tf.T5Model(tf.T5Config(**T5))),
        lambda: TEXT | DECODER_IDS,
        "encoder",
        "block",
        "final_layer_norm",
    ),  # fmt: skip
    "mbart encoder": Family(
        _seeded(lambda: tf.MBartModel(tf.MBartConfig(**SEQ2SEQ))),
        lambda: TEXT | DECODER_IDS,
        "encoder",
        "layers",
        "layer_norm",
    ),  # fmt: skip
    "whisper encoder": Family(
        _seeded(
            lambda: tf.WhisperModel(
                tf.WhisperConfig(**SEQ2SEQ, num_mel_bins=8, max_source_positions=8, max_target_positions=16)
            )
        ),  # fmt: skip
        lambda: (
            {"input_features": torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))}
            | DECODER_IDS
        ),
        "encoder",
        "layers",
        "layer_norm",
    ),  # fmt: skip
    "vit": Family(
        _seeded(lambda: tf.ViTForImageClassification(tf.ViTConfig(**COMMON, **VIT))),
        lambda: {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))},
        "vit",
        "layers" if VIT_BLOCKS_AT_TOP else "encoder.layer",
        "layernorm",
        backbone="vit",
    ),  # fmt: skip
    "modernbert": Family(
        _seeded(lambda: tf.ModernBertModel(tf.ModernBertConfig(**COMMON, **MODERNBERT))),
        lambda: TEXT,
        "",
        "layers",
        "final_norm",
    ),  # fmt: skip
    "wav2vec2 stable layer norm": Family(
        _seeded(lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(**AUDIO, do_stable_layer_norm=True))),
        _audio,
        "encoder",
        "layers",
        "layer_norm",
    ),  # fmt: skip
    "wav2vec2 (post-norm)": Family(
        _seeded(lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(**AUDIO, do_stable_layer_norm=False))),
        _audio,
        "encoder",
        "layers",
        None,
    ),  # fmt: skip
}
NAMES = list(FAMILIES)
TOKEN_WISE = [method for method in ENCODER_METHODS if method.token_wise]
ATOL = 3e-5


def run(family: Family, model: nn.Module, inputs: dict, **options) -> tuple[object, torch.Tensor | None]:
    """``(the backbone's output, the model's logits if it has a head)``."""
    with torch.no_grad():
        if not family.backbone:
            return model(**inputs, **options), None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return base.get_submodule(family.backbone)(**inputs, **options), model(**inputs).logits


def encoder_output(
    family: Family, model: nn.Module, inputs: dict
) -> tuple[torch.Tensor, torch.Tensor | None]:  # noqa: E501
    """``(the encoder's last state, the model's logits if it has a head)``."""
    out, logits = run(family, model, inputs)
    last = getattr(out, "encoder_last_hidden_state", None)
    return (out.last_hidden_state if last is None else last), logits


def residual_stream(family: Family, reference: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """``z_0 .. z_L`` from ``output_hidden_states``; ``z_L`` from the final norm's input if there is one."""
    norm = final_norm(family, reference)
    seen = []
    record = lambda module, args: seen.append(args[0])  # noqa: E731
    handle = None if norm is None else norm.register_forward_pre_hook(record)
    try:
        out, _ = run(family, reference, inputs, output_hidden_states=True)
    finally:
        if handle is not None:
            handle.remove()
    hidden = getattr(out, "encoder_hidden_states", None) or out.hidden_states
    return [*hidden[:-1], seen[-1] if seen else hidden[-1]]


def final_norm(family: Family, model: nn.Module) -> nn.Module | None:
    if family.final_norm is None:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return family.encoder_of(base).get_submodule(family.final_norm)


@pytest.mark.parametrize("method", TOKEN_WISE, ids=[m.name for m in TOKEN_WISE])
@pytest.mark.parametrize("name", NAMES)
def test_token_wise_fusion_follows_the_rule(name, method):
    family = FAMILIES[name]
    reference = family.build()
    model = adapted(family.build(), method.make_config())
    inputs = family.inputs()
    states = residual_stream(family, reference, inputs)
    expected = REFERENCES[method.config_cls](states, list(range(1, len(states))), fusion_of(model))
    norm = final_norm(family, reference)
    with torch.no_grad():
        expected = expected if norm is None else norm(expected)  # F runs on the fused state
    got, logits = encoder_output(family, model, inputs)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    assert (got - encoder_output(family, reference, inputs)[0]).abs().max() > 1e-3  # the fusion changes it
    if logits is not None:  # ViT: the classifier reads the [CLS] position of the fused state
        with torch.no_grad():
            torch.testing.assert_close(logits, reference.classifier(expected[:, 0]), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_extra_layers_equal_the_model_with_more_blocks(name):
    family = FAMILIES[name]
    base = family.build()
    model = adapted(copy.deepcopy(base), ExtraLayersConfig(num_extra_layers=1))
    deeper = copy.deepcopy(base)
    blocks = family.encoder_of(deeper).get_submodule(family.blocks)
    for block in fusion_of(model).blocks:
        blocks.append(copy.deepcopy(block))
    encoder_config = getattr(family.encoder_of(deeper), "config", deeper.config)  # T5's stacks have their own
    encoder_config.num_hidden_layers += len(fusion_of(model).blocks)  # 4.x sizes its head masks by it
    inputs = family.inputs()
    got, logits = encoder_output(family, model, inputs)
    expected, expected_logits = encoder_output(family, deeper, inputs)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    if logits is not None:
        torch.testing.assert_close(logits, expected_logits, atol=ATOL, rtol=1e-5)
    assert (got - encoder_output(family, base, inputs)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_the_final_norm_found_is_the_one_the_model_applies(name):
    # Inside the blocks' container it is hooked; outside it (ViT on transformers 4.x) it runs on the
    # container's fused output by itself.
    family = FAMILIES[name]
    model = family.build()
    located = find_encoder_blocks(model)
    norm = final_norm(family, model)
    if norm is not None:
        inside = any(module is norm for module in located.container.modules())
        assert any(candidate is norm for candidate in located.final_norms) == inside


class FunctionalNormStack(nn.Module):
    """Blocks, then a final norm written as a function (no module to hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 8)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for block in self.layers:
            hidden = hidden + block(hidden)
        return torch.nn.functional.layer_norm(hidden, (8,))


def test_a_final_norm_without_a_module_is_warned_about():
    model = get_peft_model(FunctionalNormStack(), TOKEN_WISE[0].make_config(blocks_path="layers"))
    with pytest.warns(UserWarning, match="no norm module inside it read that output"):
        model(TEXT["input_ids"])
