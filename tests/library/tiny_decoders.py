"""Tiny random decoder-only models (2 blocks, width 32, vocabulary 100) and their independent references.

Each family names, independently of the library's discovery, its block list and its final norm
``F`` (the module a pre-norm stack applies to ``z_L`` before the head): the references below
recompute every fused output from ``output_hidden_states`` (``z_L`` from that norm's input), then
``F`` and the head, and R+n from the model with its extra blocks appended.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf
from conftest import TINY, fusion_of, perturb_
from peft import get_peft_model
from torch import nn

VOCAB, PAD, BOS, EOS = 100, 0, 1, 2
TASK_TYPES = {"causal": "CAUSAL_LM", "seq": "SEQ_CLS", "token": "TOKEN_CLS"}  # peft's, per head
SPECIAL_IDS = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
# the tests' tiny sizes, 2 blocks (GPT-2's config takes them under its own names: its attribute_map)
COMMON = {**TINY, "vocab_size": VOCAB, "num_hidden_layers": 2, **SPECIAL_IDS}
WINDOW = 4  # sliding window smaller than the test sequences (prompt 6-7 tokens + 5 generated)


@dataclass(frozen=True)
class Family:
    """A decoder family: its config, where its blocks and final norm are, which heads it has."""

    name: str
    make_config: Callable[[], tf.PretrainedConfig]
    backbone: str  # attribute of the *For* model holding the base model
    blocks: str  # block list inside the backbone
    final_norm: str  # the final norm F inside the backbone
    heads: tuple[str, ...] = ("causal", "seq", "token")
    sliding: bool = False
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")  # LoRA's attention projections in this family
    fan_in_fan_out: bool = False  # the targets store W transposed (GPT-2's Conv1D)

    def config(self) -> tf.PretrainedConfig:
        return self.make_config()

    def build(self, head: str = "causal", seed: int = 0, **overrides) -> nn.Module:
        """The model with ``head`` (``causal``, ``seq`` or ``token``), weights from ``seed``, eval mode."""
        config = self.config()
        config.num_labels = 3
        for key, value in overrides.items():
            setattr(config, key, value)
        auto = {
            "causal": tf.AutoModelForCausalLM,
            "seq": tf.AutoModelForSequenceClassification,
            "token": tf.AutoModelForTokenClassification,
        }[head]
        torch.manual_seed(seed)
        return with_norm_gains(auto.from_config(config).eval(), seed)

    def lora(self, r: int = 4) -> dict:
        """LoRA's fields for this family's attention projections (rank ``r``, ``lora_alpha = 2 r``)."""
        return {"target_modules": list(self.lora_targets), "r": r, "lora_alpha": 2 * r,
                "fan_in_fan_out": self.fan_in_fan_out}  # fmt: skip

    def backbone_of(self, model: nn.Module) -> nn.Module:
        return getattr(model, self.backbone)

    def norm_of(self, model: nn.Module) -> nn.Module:
        return self.backbone_of(model).get_submodule(self.final_norm)

    def blocks_of(self, model: nn.Module) -> nn.ModuleList:
        return self.backbone_of(model).get_submodule(self.blocks)


def with_norm_gains(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` with every norm's gain (and bias) drawn away from 1 (0): a norm applied twice, or
    skipped, then shows (a unit-gain RMS norm is idempotent)."""
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("Norm") or isinstance(module, nn.LayerNorm):
                for param in module.parameters():
                    param.add_(0.5 * torch.randn(param.shape, generator=generator))
    return model


def _rotary(config_cls, **extra) -> Callable[[], tf.PretrainedConfig]:
    return lambda: config_cls(**COMMON, num_key_value_heads=2, **extra)


QKV = ("query_key_value",)  # one fused attention projection (GPT-NeoX, Falcon, BLOOM)


def _gpt2_layout(name: str, make_config: Callable[[], tf.PretrainedConfig], **options) -> Family:
    """A family laid out as GPT-2: blocks ``transformer.h``, final norm ``transformer.ln_f``."""
    return Family(name, make_config, "transformer", "h", "ln_f", **options)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("llama", _rotary(tf.LlamaConfig), "model", "layers", "norm"),
        Family("qwen2", _rotary(tf.Qwen2Config), "model", "layers", "norm"),
        Family("qwen3", _rotary(tf.Qwen3Config, head_dim=8), "model", "layers", "norm"),
        Family(
            "mistral",
            _rotary(tf.MistralConfig, sliding_window=WINDOW),
            "model",
            "layers",
            "norm",
            sliding=True,
        ),  # noqa: E501
        Family(
            "gemma3_text",
            _rotary(
                tf.Gemma3TextConfig,
                head_dim=8,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention"],
            ),
            "model",
            "layers",
            "norm",
            heads=("causal", "seq"),  # no Gemma3 token-classification head in transformers
            sliding=True,
        ),
        Family("phi3", _rotary(tf.Phi3Config), "model", "layers", "norm", lora_targets=("qkv_proj",)),
        Family(
            "gpt2",
            lambda: tf.GPT2Config(**COMMON),  # GPT-2 reads no intermediate_size: its MLP is 4 x width
            "transformer",
            "h",
            "ln_f",
            lora_targets=("c_attn",),
            fan_in_fan_out=True,
        ),
        Family(
            "gpt_neox",
            lambda: tf.GPTNeoXConfig(**COMMON),
            "gpt_neox",
            "layers",
            "final_layer_norm",
            lora_targets=QKV,
        ),
        # `transformer.h` as GPT-2's: Falcon (parallel attention, multi-query), BLOOM (ALiBi, a norm on
        # the embeddings inside the container; a wider init, so that its blocks move the unit-scale
        # stream visibly), GPT-J (parallel attention, partial rotary; no token-classification head in
        # transformers)
        _gpt2_layout("falcon", lambda: tf.FalconConfig(**COMMON), lora_targets=QKV),
        _gpt2_layout("bloom", lambda: tf.BloomConfig(**COMMON, initializer_range=0.1), lora_targets=QKV),
        _gpt2_layout("gptj", lambda: tf.GPTJConfig(**COMMON, rotary_dim=4), heads=("causal", "seq")),
        Family(
            "opt",
            lambda: tf.OPTConfig(**COMMON, ffn_dim=COMMON["intermediate_size"], word_embed_proj_dim=32),
            "model",
            "decoder.layers",
            "decoder.final_layer_norm",
            heads=("causal", "seq"),  # no OPT token-classification head in transformers
        ),
    )
}
NAMES = list(FAMILIES)


def with_blocks(family: str, head: str, blocks: int) -> nn.Module:
    """``family``'s model with ``head`` and ``blocks`` blocks (one layer type per block where its config
    has them: the first one's)."""
    layer_types = getattr(FAMILIES[family].config(), "layer_types", None)
    more = {"layer_types": [layer_types[0]] * blocks} if layer_types else {}
    return FAMILIES[family].build(head, num_hidden_layers=blocks, **more)


def token_ids(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    """Random ids avoiding the special tokens (pad, bos, eos)."""
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def rule_rows(count: int = 16, length: int = 8, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Training rows for a causal LM: sequences whose next token is a fixed function of the current
    one (learnable), no padding, ``labels`` = ``input_ids`` (the model shifts them)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = [int(torch.randint(3, VOCAB, (1,), generator=generator))]
        while len(ids) < length:
            ids.append(3 + (7 * ids[-1]) % (VOCAB - 3))
        ids = torch.tensor(ids)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return rows


def padded(side: str, lengths: tuple[int, ...] = (7, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    """A batch of sequences of ``lengths``, padded with ``PAD`` on ``side`` (``left`` or ``right``)."""
    ids = token_ids(len(lengths), max(lengths), seed)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        real = slice(0, length) if side == "right" else slice(max(lengths) - length, None)
        mask[row, real] = 1
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}


def residual_stream(family: Family, reference: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """``z_0 .. z_L`` of an untouched model: ``output_hidden_states`` and, for ``z_L`` (which the
    hidden states give after the final norm), the final norm's input."""
    seen = []
    handle = family.norm_of(reference).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            backbone = family.backbone_of(reference)
            hidden = backbone(**inputs, output_hidden_states=True, use_cache=False).hidden_states
    finally:
        handle.remove()
    return [*hidden[:-1], seen[-1]]


def head_output(
    family: Family, reference: nn.Module, head: str, h: torch.Tensor, inputs: dict, normed: bool = True
) -> torch.Tensor:
    """What ``reference`` makes of ``h`` in place of ``z_L``: its final norm (``normed=False``: ``h`` in
    place of ``F(z_L)``, no norm), then its head (``seq``: pooled at the last real token)."""
    with torch.no_grad():
        h = family.norm_of(reference)(h) if normed else h
        if head == "causal":
            return reference.get_output_embeddings()(h)
        if head == "token":
            return (reference.score if hasattr(reference, "score") else reference.classifier)(h)
        logits = reference.score(h)  # (batch, seq, labels)
        last = last_real_index(inputs)
        return logits[torch.arange(len(last)), last]


def last_real_index(inputs: dict) -> torch.Tensor:
    """The position of each row's last non-padding token ``(batch,)``, for either padding side."""
    mask = inputs["attention_mask"]
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return (positions * mask).argmax(-1)


def with_blocks_appended(family: Family, model: nn.Module, blocks: list[nn.Module]) -> nn.Module:
    """A deep copy of ``model`` with ``blocks`` appended to its block list: "the model with n more blocks"."""
    deeper = copy.deepcopy(model)
    block_list = family.blocks_of(deeper)
    for block in blocks:
        block_list.append(copy.deepcopy(block))
    config = deeper.config
    config.num_hidden_layers = len(block_list)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [*config.layer_types, *(config.layer_types[-1] for _ in blocks)]
    return deeper


def adapted(base: nn.Module, config, scale: float = 0.2) -> nn.Module:
    """``base`` with ``config``'s adapter (built with seed 5), its fusion module perturbed: no special
    init (zeros, ones) can hide a mistake."""
    torch.manual_seed(5)
    model = get_peft_model(base, config).eval()
    perturb_(fusion_of(model), scale=scale, seed=7)
    return model
