r"""EncoderFusion: transparent attention from every decoder layer to all encoder layers.

Bapna et al. 2018 ("Training Deeper Neural Machine Translation Models with Transparent
Attention"), the EncoderFusion baseline of Liu et al., ICLR 2021 (arXiv 2012.14768).
Decoder layer ``j`` cross-attends to

.. math::

    \tilde x^{(j)} = \mathrm{LN}_j\Big( \sum_i \mathrm{softmax}_i(W_{j,\cdot})_i \; x_i \Big)

instead of ``x_L``, where ``x_i`` are the encoder's hidden states (blocks ``1..L`` by
default, ``x_0`` too with ``include_embeddings=True``, or the ``layers`` given), ``W``
is a ``(J, K)`` matrix of logits (init 0: a uniform mix) and ``LN_j`` one LayerNorm per
decoder layer. The encoder's own output is left unchanged (the top-level
``encoder_last_hidden_state`` is still ``x_L``).

How: the encoder capture stores ``x_i`` (see ``seq2seq_hooks``); a forward pre-hook on
each decoder layer replaces its ``encoder_hidden_states`` argument by ``\tilde x^{(j)}``.
During ``generate()`` the cross-attention keys/values are cached at the first step from
the swapped states, which is what transparent attention means; later steps swap too
(harmlessly, the cache is used).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..config import LayerFusionConfig
from ..fusion import FusionContext, FusionModule, stack_layers
from ..hooks import BoundHook, Capture
from ..model import LayerFusionModel
from .hooks import ENCODER_STATES_ARG, EncoderMemory, argument, find_seq2seq_parts, with_argument


@dataclass
class EncoderFusionConfig(LayerFusionConfig):
    """Configuration of EncoderFusion (``J·K`` logits plus ``J`` LayerNorms).

    Args:
        (every option of :class:`LayerFusionConfig` and of LoRA; ``include_embeddings``
        adds the embedding output ``x_0`` to the mix)

    Example:
        >>> model = get_peft_model(bart, EncoderFusionConfig(include_embeddings=True))
        >>> model(input_ids=ids, labels=ids).logits.shape  # (batch, target length, vocab)
        torch.Size([2, 8, 100])
    """

    PEFT_TYPE: ClassVar[str] = "ENCODER_FUSION"


class EncoderFusion(FusionModule):
    """Per decoder layer ``j``: ``LN_j(Σ_i softmax_i(W_j)_i x_i)`` replaces ``x_L``.

    Parameters: ``layer_logits`` ``(J, K)``, ``norms.{j}`` (one LayerNorm per decoder layer).
    """

    seq2seq = True

    def __init__(self, config: EncoderFusionConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.num_decoder_layers = len(find_seq2seq_parts(context.model).decoder_layers)
        self.layer_logits = nn.Parameter(torch.zeros(self.num_decoder_layers, context.num_fused))
        self.norms = nn.ModuleList(nn.LayerNorm(context.hidden_size) for _ in range(self.num_decoder_layers))
        self.memory = EncoderMemory()

    @classmethod
    def check_supported(cls, config: EncoderFusionConfig, context: FusionContext) -> None:
        find_seq2seq_parts(context.model)  # raises for a model without a decoder

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        """Remember the fused states for the decoder; return ``x_L`` unchanged."""
        self.memory.store(capture.states[-1], stacked=stack_layers(states))  # (K, batch, src, d)
        return capture.states[-1]

    def mix(self, stacked: torch.Tensor, decoder_layer: int) -> torch.Tensor:
        """``LN_j(Σ_i softmax(W_j)_i x_i)`` for stacked states ``(K, batch, src, d)``."""
        weights = torch.softmax(self.layer_logits[decoder_layer], dim=0)  # (K,)
        return self.norms[decoder_layer](torch.einsum("k,kbsd->bsd", weights, stacked))  # (batch, src, d)

    def register_model_hooks(
        self, context: FusionContext, is_active: Callable[[], bool]
    ) -> list[RemovableHandle]:
        layers = find_seq2seq_parts(context.model).decoder_layers
        return [
            layer.register_forward_pre_hook(BoundHook(self.swap, j, is_active), with_kwargs=True)
            for j, layer in enumerate(layers)
        ]

    def swap(
        self, decoder_layer: int, is_active: Callable[[], bool], module: nn.Module, args: tuple, kwargs: dict
    ) -> tuple[tuple, dict] | None:
        """Forward pre-hook of decoder layer ``decoder_layer``: its encoder states become the mix."""
        encoder_states = argument(module, ENCODER_STATES_ARG, args, kwargs)
        if encoder_states is None or not is_active():
            return None
        stacked = self.memory.recall(encoder_states, batch_dims={"stacked": 1})["stacked"]
        dtype = self.layer_logits.dtype
        mixed = self.mix(stacked.to(dtype), decoder_layer).to(encoder_states.dtype)  # (batch, src, d)
        return with_argument(module, ENCODER_STATES_ARG, args, kwargs, mixed)


class EncoderFusionModel(LayerFusionModel):
    """The PEFT tuner of ``ENCODER_FUSION``: ``get_peft_model(model, EncoderFusionConfig())`` builds it."""

    prefix = "encoder_fusion_"
    fusion_module_cls = EncoderFusion
