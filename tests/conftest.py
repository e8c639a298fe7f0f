"""Tiny random models for the tests: built from configs, no download."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForTokenClassification

import peft_layerfusion  # noqa: F401  (registers the PEFT types)

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
)


def tiny_bert(num_labels: int = 5, seed: int = 0, **overrides) -> BertForTokenClassification:
    """A 3-block, width-32 BERT token classifier in eval mode."""
    torch.manual_seed(seed)
    return BertForTokenClassification(BertConfig(**{**TINY, **overrides}, num_labels=num_labels)).eval()


@pytest.fixture
def bert() -> BertForTokenClassification:
    return tiny_bert()


@pytest.fixture
def input_ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, TINY["vocab_size"], (2, 7), generator=generator)
