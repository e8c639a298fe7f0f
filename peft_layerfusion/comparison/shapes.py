"""Published shapes of decoder-only LLMs as transformers configs: no weights, no download.

The parameter audit (:mod:`.audit`) builds them on the meta device. Each entry holds the
fields of the model's published ``config.json`` that size it (vocabulary, width, depth,
heads, MLP width, tied embeddings); everything else keeps the config class's default.
``load_model_config`` accepts these names, so ``layerfusion audit llama-3.1-8b`` works.

Example:
    >>> llm_shape("llama-3.1-8b").num_hidden_layers, llm_shape("llama-3.1-8b").hidden_size
    (32, 4096)
"""

from __future__ import annotations

from typing import Any

from transformers import Gemma3TextConfig, LlamaConfig, PretrainedConfig, Qwen3Config

from ..config import invalid

# name: (config class, the sizing fields of its published config.json)
LLM_SHAPES: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "gemma-3-270m": (
        Gemma3TextConfig,
        dict(
            vocab_size=262144,
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3-0.6b": (
        Qwen3Config,
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=True,
        ),
    ),
    "llama-3.1-8b": (
        LlamaConfig,
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
        ),
    ),
}


def llm_shape(name: str) -> PretrainedConfig:
    """The config of the LLM shape ``name`` (one of :data:`LLM_SHAPES`).

    Raises:
        ValueError: naming the known shapes.
    """
    if name not in LLM_SHAPES:
        raise invalid("shape", name, f"one of {list(LLM_SHAPES)}")
    config_cls, fields = LLM_SHAPES[name]
    return config_cls(**fields)
