r"""Concat: one learned linear map of every fused layer's output.

ElNokrashy et al. 2024 (the DWAtt paper's second method). Per token:

.. math::

    h = \sum_n W_n z_n + b = W \, [z_1; \dots; z_L] + b \qquad W: K d \to d
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..config import LayerFusionConfig
from ..fusion import FusionContext, FusionModule
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ConcatConfig(LayerFusionConfig):
    """Configuration of Concat (a linear map of the concatenated layer outputs).

    Args:
        (every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, ConcatConfig(modules_to_save=["classifier"]))
    """

    PEFT_TYPE: ClassVar[str] = "CONCAT"


class Concat(FusionModule):
    """``h = W [z_1; ...; z_K] + b``."""

    token_wise = True

    def __init__(self, config: ConcatConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.proj = nn.Linear(context.num_fused * context.hidden_size, context.hidden_size)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        # h = b + sum_n W_n z_n with W_n = proj.weight[:, n*d:(n+1)*d], one product per layer:
        # the same map as proj(cat(states)), without the (batch, seq, K*d) concatenated copy.
        d = self.hidden_size
        tokens = [state.reshape(-1, d) for state in states]  # each (tokens, d)
        weight = self.proj.weight  # (d, K*d)
        # Out of place: in-place addmm_ has no vmap batching rule (LR candidates stacked with
        # torch.func.vmap would run it once per candidate); autograd keeps no partial sum either way.
        fused = torch.addmm(self.proj.bias, tokens[0], weight[:, :d].T)  # (tokens, d)
        for n in range(1, len(tokens)):
            fused = torch.addmm(fused, tokens[n], weight[:, n * d : (n + 1) * d].T)
        return fused.view_as(states[0])


class ConcatModel(LayerFusionModel):
    """The PEFT tuner of ``CONCAT``: ``get_peft_model(model, ConcatConfig())`` builds it."""

    prefix = "concat_"
    fusion_module_cls = Concat
