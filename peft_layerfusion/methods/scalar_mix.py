r"""ScalarMix: a softmax-normalised, scaled mix of the layers (ELMo; Bapna et al. 2018).

Peters et al. 2018 ("Deep contextualized word representations"), as in AllenNLP's
``scalar_mix.py``. With ``K`` + 1 scalars:

.. math::

    h = \gamma \sum_n \mathrm{softmax}(w)_n \, z_n \qquad w \in R^K \text{ (init 0)},\ \gamma \text{ (init 1)}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..config import LayerFusionConfig
from ..fusion import FusionContext, FusionModule, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ScalarMixConfig(LayerFusionConfig):
    """Configuration of ScalarMix (``K`` + 1 scalars).

    Args:
        (every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> model = get_peft_model(base_model, ScalarMixConfig(modules_to_save=["classifier"]))
    """

    PEFT_TYPE: ClassVar[str] = "SCALAR_MIX"


class ScalarMix(FusionModule):
    """``h = γ Σ_n softmax(w)_n z_n``."""

    token_wise = True
    sized_to_budget = False

    def __init__(self, config: ScalarMixConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.layer_logits = nn.Parameter(torch.zeros(context.num_fused))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        weights = torch.softmax(self.layer_logits, dim=0)  # (K,)
        mixed = weighted_sum(zip(states, weights, strict=True))  # (batch, seq, d)
        return self.gamma * mixed


class ScalarMixModel(LayerFusionModel):
    """The PEFT tuner of ``SCALAR_MIX``: ``get_peft_model(model, ScalarMixConfig())`` builds it."""

    prefix = "scalar_mix_"
    fusion_module_cls = ScalarMix
