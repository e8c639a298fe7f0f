r"""ScalarMix: a softmax-normalised, scaled mix of the layers (ELMo; Bapna et al. 2018).

Peters et al. 2018 ("Deep contextualized word representations"), as in AllenNLP's
``scalar_mix.py``. With ``K`` + 1 scalars:

.. math::

    h = \gamma \sum_n \mathrm{softmax}(w)_n \, z_n \qquad w \in R^K \text{ (init 0)},\ \gamma \text{ (init 1)}

Identity init (``fusion_init="identity"``; ``z_L`` must be fused): the weights start one-hot on
``z_L`` through one more scalar ``β`` (init 0) that blends the one-hot ``e_L`` into the softmax,

.. math::

    h = \gamma \sum_n s_n z_n, \qquad s = e_L + \beta \, (\mathrm{softmax}(w) - e_L)

so ``h = z_L`` bitwise at initialisation and ``s`` always sums to 1. Why not a large logit on
``z_L``: softmax's Jacobian ``diag(s) - s s^T`` vanishes at a one-hot ``s``. A logit of ~104 or
more makes ``s`` exactly one-hot in float32 and ``w`` never receives a gradient again; a
smaller one (say 20) leaves weights ``e^{-20} ≈ 2e-9`` on the other layers (the output is not
exact where ``z_L`` is small and another layer large) and gradients of that size. With ``β``:
``γ`` and ``β`` have non-zero gradients at step 1 (``∂L/∂β = γ g · (Σ softmax(w)_n z_n - z_L)``),
``w`` from step 2, once ``β ≠ 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LayerFusionConfig
from ..fusion import FusionContext, FusionModule, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ScalarMixConfig(LayerFusionConfig):
    """Configuration of ScalarMix (``K`` + 1 scalars; one more, ``β``, under the identity init).

    Args:
        fusion_init: ``"identity"`` (``"auto"`` on a decoder-only model) adds ``β`` and starts the
            weights one-hot on ``z_L``; ``"identity"`` needs ``layers`` to fuse ``z_L``, ``"auto"``
            falls back to the paper's init (weights ``softmax(0)``, uniform) where they do not.
        (every other option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> model = get_peft_model(base_model, ScalarMixConfig(modules_to_save=["classifier"]))
        >>> model(ids).logits.shape  # (batch, seq, labels), read from the fused hidden state
        torch.Size([2, 8, 5])
    """

    PEFT_TYPE: ClassVar[str] = "SCALAR_MIX"
    IDENTITY_INIT: ClassVar[bool] = True


class ScalarMix(FusionModule):
    """``h = γ Σ_n softmax(w)_n z_n`` (identity init: ``softmax(w)`` blended with ``e_L`` by ``β``)."""

    token_wise = True
    sized_to_budget = False
    states_held = 2  # the running weighted sum and one weighted state

    def __init__(self, config: ScalarMixConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.layer_logits = nn.Parameter(torch.zeros(context.num_fused))
        self.gamma = nn.Parameter(torch.ones(()))
        self.start_index: Optional[int] = None  # position of z_L among the fused states (identity init)
        if config.starts_at_base(context.model, context.layers, context.located.num_blocks):
            self.start_index = context.layers.index(context.located.num_blocks)
            self.blend = nn.Parameter(torch.zeros(()))  # β

    def mix_weights(self) -> torch.Tensor:
        """The weights ``s`` ``(K,)``: ``softmax(w)``, or ``e_L + β (softmax(w) - e_L)`` (identity init)."""
        weights = torch.softmax(self.layer_logits, dim=0)  # (K,)
        if self.start_index is None:
            return weights
        index = torch.tensor(self.start_index, device=weights.device)
        one_hot = F.one_hot(index, weights.shape[-1]).to(weights.dtype)  # e_L (K,), never batched under vmap
        return torch.lerp(one_hot, weights, self.blend)  # exactly e_L while β = 0

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        mixed = weighted_sum(zip(states, self.mix_weights(), strict=True))  # (batch, seq, d)
        return self.gamma * mixed


class ScalarMixModel(LayerFusionModel):
    """The PEFT tuner of ``SCALAR_MIX``: ``get_peft_model(model, ScalarMixConfig())`` builds it."""

    prefix = "scalar_mix_"
    fusion_module_cls = ScalarMix
