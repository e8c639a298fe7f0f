r"""Average: the plain mean of the fused layers' outputs (no parameters).

.. math::

    h = \frac{1}{K} \sum_n z_n

With ``state_norm="rms"`` every state is mixed at unit RMS per position and the mean is put back
on ``z_L``'s scale (:class:`~peft_layerfusion.config.DepthMixConfig`):

.. math::

    h = z_L + \mathrm{rms}(z_L) \Big(\frac{1}{K} \sum_n \hat z_n - \hat z_L\Big)
      \approx \mathrm{rms}(z_L) \, \frac{1}{K} \sum_n \hat z_n,
    \qquad \hat z_n = z_n / \mathrm{rms}(z_n),
    \qquad \mathrm{rms}(x) = \sqrt{\tfrac{1}{d} \textstyle\sum_i x_i^2 + \epsilon}

so every block counts the same, however large the stream has grown by its depth. With
``state_norm="rms_after_norm"`` the mean is taken where the head reads, after a pre-norm stack's final
norm ``F``: ``z_L`` enters as ``F(z_L)`` (as ``z_L`` on a post-norm stack; ``F``'s gain is not applied
to the other blocks), and ``F`` does not run again:

.. math::

    h_{head} = \frac{1}{K} \Big( \textstyle\sum_{n < L} \hat z_n + F(z_L) \Big)

(with ``layers=[b]``, ``b < L``: exactly ``ẑ_b``, what a linear probe of block ``b`` on unit-RMS states
reads, on any stack).

No identity init: with no parameters, ``h`` is the mean from the start and can equal the base
model's ``z_L`` only when ``layers`` fuses ``z_L`` alone. ``fusion_init="identity"`` is refused;
``"auto"`` and ``"paper"`` both give the mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import DepthMixConfig
from ..fusion import DepthMix, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class AverageConfig(DepthMixConfig):
    """Configuration of the Average baseline (no new parameters).

    Args:
        fusion_init: ``"identity"`` is refused (no parameters: the mean cannot start as ``z_L``);
            ``"auto"`` and ``"paper"`` both give the mean.
        (``state_norm`` of :class:`DepthMixConfig`, every other option of :class:`LayerFusionConfig`
        and of LoRA)

    Example:
        >>> model = get_peft_model(base_model, AverageConfig(modules_to_save=["classifier"]))
        >>> model(ids).logits.shape  # (batch, seq, labels), read from the fused hidden state
        torch.Size([2, 8, 5])
    """

    PEFT_TYPE: ClassVar[str] = "AVERAGE"


class Average(DepthMix):
    """``h = mean_n z_n``."""

    sized_to_budget = False
    states_held = 2  # the running weighted sum and one weighted state

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        weights = states[0].new_full((len(states),), 1.0 / len(states))  # (K,)
        mixed = weighted_sum(zip(self.unit_states(states, capture), weights, strict=True))  # (batch, seq, d)
        return self.in_stream_units(mixed, capture)


class AverageModel(LayerFusionModel):
    """The PEFT tuner of ``AVERAGE``: ``get_peft_model(model, AverageConfig())`` builds it."""

    prefix = "average_"
    fusion_module_cls = Average
