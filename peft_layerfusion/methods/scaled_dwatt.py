r"""Scaled DWAtt: depth-wise attention that keeps its spread over depth.

The paper's DWAtt (:mod:`.dwatt`) feeds the raw residual stream into an unscaled dot product over
``d`` dimensions: on a pre-norm decoder (the stream's RMS grows from about 1 to 1400 over Gemma 3
270M's 18 blocks) its depth softmax saturates, and it ends one-hot on one block per trial. This
variant is the same module with three options set, as later depth-mixing designs do (MUDDFormer,
Attention Residuals: a parameter-free norm on what produces the weights, scaled scores, a weight
generator that starts at zero):

.. math::

    \hat z_n &= z_n / \mathrm{rms}(z_n),
        \qquad \mathrm{rms}(x) = \sqrt{\tfrac{1}{d} \textstyle\sum_i x_i^2 + \epsilon} \\
    q &= 1 + \mathrm{elu}(\hat z_L + f^Q(\hat z_L)),
        \qquad k_n = W_K \, p_n \quad (W_K = 0 \text{ at init}) \\
    a_n &= \mathrm{softmax}_n\big(q \cdot k_n / (\tau \sqrt{d})\big) \qquad (= 1/K \text{ at init}) \\
    v_n &= \mathrm{LN}_n(f^V_n(\hat z_n)) \\
    h &= z_L + \mathrm{rms}(z_L) \textstyle\sum_n a_n v_n

``f^Q``, ``f^V_n``, ``p_n`` and ``LN_n`` are DWAtt's (same sizes, same parameter count). The identity
init (``fusion_init="identity"``, the default ``"auto"`` on decoders) zeroes the ``LN_n`` gains as
DWAtt's does, so ``h = z_L`` exactly at initialisation. Every option of :class:`~.dwatt.DWAttConfig`
can still be set; only the defaults of ``state_norm``, ``score_scale`` and ``query_init`` differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .dwatt import DWAtt, DWAttConfig, DWAttModel


@dataclass
class ScaledDWAttConfig(DWAttConfig):
    """DWAtt with unit-RMS states, scores scaled by ``1/sqrt(d)`` and a uniform start over depth.

    Args:
        state_norm: ``"rms"`` (default here): query and values read unit-RMS states.
        score_scale: ``"sqrt_d"`` (default here): scores divided by ``sqrt(d)``.
        query_init: ``"uniform"`` (default here): ``W_K = 0``, the depth attention starts uniform.
        (every other option of :class:`~.dwatt.DWAttConfig`)

    Example:
        >>> from peft_layerfusion import ScaledDWAttConfig
        >>> config = ScaledDWAttConfig(mixing_lr_multiplier=10.0)
        >>> config.state_norm, config.score_scale, config.query_init
        ('rms', 'sqrt_d', 'uniform')
    """

    PEFT_TYPE: ClassVar[str] = "SCALED_DWATT"

    state_norm: str = field(
        default="rms",
        metadata={"help": "'rms' (default here): the query and values read every state at unit RMS."},
    )
    score_scale: str = field(
        default="sqrt_d",
        metadata={"help": "'sqrt_d' (default here): scores q·k_n / (score_temperature sqrt(d))."},
    )
    query_init: str = field(
        default="uniform",
        metadata={"help": "'uniform' (default here): W_K = 0, so the depth attention starts uniform."},
    )


class ScaledDWAttModel(DWAttModel):
    """The PEFT tuner of ``SCALED_DWATT``: ``get_peft_model(model, ScaledDWAttConfig())`` builds it."""

    prefix = "scaled_dwatt_"
    fusion_module_cls = DWAtt
