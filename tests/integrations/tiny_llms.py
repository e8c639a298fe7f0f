"""Tiny random Llama and GPT-2 models (2 blocks, width 32) with an offline tokenizer, for the
integration tests (TRL, bitsandbytes, sentence-transformers), and what they check on every run."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import transformers as tf
from conftest import write_tiny_decoder
from torch import nn

FAMILIES = ("llama", "gpt2")
LORA_TARGETS = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}  # each family's attention projections
HEADS = {"causal": tf.AutoModelForCausalLM, "seq": tf.AutoModelForSequenceClassification}
SENTENCES = (
    "alice went to paris and met bob",
    "acme corp works in london today",
    "bob visited the city with alice",
    "the city met acme corp in paris",
)


def tokenizer_folder(directory: str | Path) -> str:
    """A folder with the offline tokenizer of ``conftest.write_tiny_decoder`` (pad id 0)."""
    return write_tiny_decoder(directory)


def tiny_config(family: str, vocab_size: int, width: int = 32) -> tf.PretrainedConfig:
    """A 2-block config of ``family`` (``llama`` or ``gpt2``) over ``vocab_size`` ids, of width ``width``
    (a Llama's MLP ``2 * width`` wide)."""
    special = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if family == "gpt2":
        sizes = dict(n_embd=width, n_layer=2, n_head=4, n_positions=128)
        return tf.GPT2Config(vocab_size=vocab_size, **sizes, **special)
    return tf.LlamaConfig(
        vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **special,
    )  # fmt: skip


def tiny_llm(
    family: str, head: str, vocab_size: int, seed: int = 0, num_labels: int = 1, width: int = 32
) -> nn.Module:
    """A fresh random ``family`` model with ``head`` (``causal`` or ``seq``), weights from ``seed``, of
    width ``width`` (:func:`tiny_config`)."""
    config = tiny_config(family, vocab_size, width)
    config.num_labels = num_labels
    torch.manual_seed(seed)
    return HEADS[head].from_config(config)


def frozen_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every tensor of ``model`` (the base before training)."""
    return copy.deepcopy(model.state_dict())


def adapter_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every trainable parameter (fusion, LoRA, saved head) of a PeftModel."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def assert_base_frozen(peft_model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Every base weight (those under ``base_layer`` or ``original_module`` in the PeftModel, and the
    plain ones) equals its value in ``before``."""
    base = peft_model.get_base_model().state_dict()
    seen = 0
    for name, tensor in base.items():
        plain = name.replace(".base_layer", "").replace(".original_module", "")
        if plain in before and "lora_" not in name and "modules_to_save" not in name:
            assert torch.equal(tensor.float(), before[plain].float()), name
            seen += 1
    assert seen >= len(before) - 2, f"only {seen} of {len(before)} base tensors compared"


def moved(before: dict[str, torch.Tensor], model: nn.Module, part: str) -> bool:
    """Whether any trainable parameter whose name contains ``part`` changed since ``before``."""
    after = dict(model.named_parameters())
    names = [name for name in before if part in name]
    assert names, f"no trainable parameter named *{part}*"
    return any(not torch.equal(before[name], after[name].detach()) for name in names)
