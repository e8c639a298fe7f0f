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

# The sizing fields of a published config.json, in the order of the table below (``head_dim``:
# ``None`` where the config.json does not set it).
SIZING_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)
_PUBLISHED: dict[str, tuple[type[PretrainedConfig], tuple[Any, ...]]] = {
    #                config class       vocab   width MLP    layers heads KV head_dim tied
    "gemma-3-270m": (Gemma3TextConfig, (262144, 640,  2048,  18,    4,    1, 256,     True)),
    "qwen3-0.6b":   (Qwen3Config,      (151936, 1024, 3072,  28,    16,   8, 128,     True)),
    "llama-3.1-8b": (LlamaConfig,      (128256, 4096, 14336, 32,    32,   8, None,    False)),
}  # fmt: skip


def _sizing(values: tuple[Any, ...]) -> dict[str, Any]:
    """A row of the table as config fields (a ``None`` left out)."""
    return {key: value for key, value in zip(SIZING_FIELDS, values, strict=True) if value is not None}


# name: (config class, the sizing fields of its published config.json)
LLM_SHAPES: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    name: (config_cls, _sizing(values)) for name, (config_cls, values) in _PUBLISHED.items()
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
