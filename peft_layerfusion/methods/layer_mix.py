r"""LayerMix: a ScalarMix of unit-RMS states, the method we recommend.

A softmax-weighted mix of every block's state in which depth scale cannot decide the weights, put
back on the last state's scale (``state_norm="rms"`` of :class:`~peft_layerfusion.config.DepthMixConfig`):

.. math::

    \hat z_n &= z_n / \mathrm{rms}(z_n),
        \qquad \mathrm{rms}(x) = \sqrt{\tfrac{1}{d} \textstyle\sum_i x_i^2 + \epsilon} \\
    s &= e_b + \beta \, (\mathrm{softmax}(w) - e_b) \qquad (\beta = 0,\ w = 0 \text{ at init}) \\
    h &= \gamma \Big( z_L + \mathrm{rms}(z_L) \big(\textstyle\sum_n s_n \hat z_n - \hat z_L\big) \Big)

It starts one-hot on block ``b``: ``start_layer`` when given (the block whose linear probe scores
best on dev: the recipes' ``--probe-start`` chooses it per trial from the training sample and dev),
else ``z_L`` on a decoder (``h = z_L`` exactly: the base model) and the paper's uniform
``softmax(0)`` on an encoder (``fusion_init="auto"``). ``K + 2`` parameters (``w``, ``γ``, ``β``),
which train at ``lr * mixing_lr_multiplier``.

Why this one: on a pre-norm stack a mix of raw states leans to the deepest blocks (their RMS is
hundreds of times the first ones'), a one-hot start on ``z_L`` barely moves in a few-shot run, and
a learned depth attention collapses to one block per trial; started on the best probed block with
the scale taken out, the mix begins where the best single layer is and moves only where the
training data pull it. ``ScalarMix`` with the same options is the same module. Measured on few-shot
SST-2, TREC and CoNLL-2003 with a frozen encoder and a frozen decoder LLM: 2.5 to 20 points over the
last-layer head, and up to 5 points under a head on the best single layer chosen on dev (probed on
raw and unit-RMS states). Kept only where its dev score beats that block's probe by more than one
standard error (:func:`~peft_layerfusion.probing.keep_fusion`; else the block is read alone, e.g.
``AverageConfig(layers=[b], state_norm="rms_after_norm")``), it is at or above the best layer in 11
of 12 such cells on trials no choice was made on, and 0.1 points under it in the last; the mix is kept
where it wins clearly (TREC with an encoder read by its token mean), and the block elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .scalar_mix import ScalarMix, ScalarMixConfig, ScalarMixModel


@dataclass
class LayerMixConfig(ScalarMixConfig):
    """ScalarMix over unit-RMS states (``state_norm="rms"`` by default), optionally started on a block.

    Args:
        state_norm: ``"rms"`` (default here).
        start_layer: The block the weights start one-hot on (e.g. the best block on dev by a linear
            probe); ``None``: ``z_L`` on decoders, uniform on encoders.
        mixing_lr_multiplier: LR multiplier of ``w``, ``γ`` and ``β``.
        (every other option of :class:`~.scalar_mix.ScalarMixConfig`)

    Example:
        >>> from peft_layerfusion import LayerMixConfig
        >>> config = LayerMixConfig(start_layer=10, modules_to_save=["score"])
        >>> config.state_norm, config.start_layer
        ('rms', 10)
    """

    PEFT_TYPE: ClassVar[str] = "LAYER_MIX"

    state_norm: str = field(
        default="rms",
        metadata={"help": "'rms' (default here): mix every block's state at unit RMS per position."},
    )


class LayerMixModel(ScalarMixModel):
    """The PEFT tuner of ``LAYER_MIX``: ``get_peft_model(model, LayerMixConfig())`` builds it."""

    prefix = "layer_mix_"
    fusion_module_cls = ScalarMix
