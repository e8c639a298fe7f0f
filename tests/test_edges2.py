"""Issue 24, library side: discovery of Funnel, layer drop, failed loads, audit inputs, meta builds."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from conftest import ToyBlock
from peft import get_peft_model
from torch import nn

from peft_layerfusion import DWAttConfig, find_encoder_blocks


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
    with pytest.raises(ValueError, match=r"Passed over .*\['funnel.decoder.layers'\]"):
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
