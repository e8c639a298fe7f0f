r"""ScalarMix: a softmax-normalised, scaled mix of the layers (ELMo; Bapna et al. 2018).

Peters et al. 2018 ("Deep contextualized word representations"), as in AllenNLP's
``scalar_mix.py``. With ``K`` + 1 scalars:

.. math::

    h = \gamma \sum_n \mathrm{softmax}(w)_n \, z_n \qquad w \in R^K \text{ (init 0)},\ \gamma \text{ (init 1)}

Identity init (``fusion_init="identity"``; ``z_L`` must be fused): the weights start one-hot on
``z_L`` through one more scalar ``β`` (init 0) that blends the one-hot ``e_L`` into the softmax,

.. math::

    h = \gamma \sum_n s_n z_n, \qquad s = e_L + \beta \, (\mathrm{softmax}(w) - e_L)

so ``h = z_L`` bitwise at initialisation and ``s`` always sums to 1.

Why not a large logit on ``z_L``: softmax's Jacobian ``diag(s) - s s^T`` vanishes at a one-hot
``s``. A logit of ~104 or more makes ``s`` exactly one-hot in float32 and ``w`` never receives a
gradient again; a smaller one (say 20) leaves weights ``e^{-20} ≈ 2e-9`` on the other layers (the output is
not exact where ``z_L`` is small and another layer large) and gradients of that size. With ``β``:
``γ`` and ``β`` have non-zero gradients at step 1 (``∂L/∂β = γ g · (Σ softmax(w)_n z_n - z_L)``),
``w`` from step 2, once ``β ≠ 0``.

A chosen start (``start_layer=b``, e.g. the block whose linear probe scores best on dev): the same
blend starts one-hot on ``z_b`` instead, ``s = e_b + β (softmax(w) - e_b)``, so the model starts as
the head on block ``b`` alone and the mix moves from there.

With ``state_norm="rms"`` the weights mix unit-RMS states and the mix is put back on ``z_L``'s scale
(:class:`~peft_layerfusion.config.DepthMixConfig`):

.. math::

    h = \gamma \Big( z_L + \mathrm{rms}(z_L) \big(\textstyle\sum_n s_n \hat z_n - \hat z_L\big) \Big),
    \qquad \hat z_n = z_n / \mathrm{rms}(z_n)

(exactly ``z_L`` at the identity start; ``γ rms(z_L) ẑ_b`` at a start on block ``b``). The head of a
pre-norm stack then reads ``F(h)``: at a start on block ``b``, ``ẑ_b`` times ``F``'s per-channel gain,
which was fitted to ``z_L``. With ``state_norm="rms_after_norm"`` the mix is taken where the head
reads instead, ``z_L`` entering as ``F(z_L)`` (as ``z_L`` without a final norm), and ``F`` does not
run again:

.. math::

    h_{head} = \gamma \Big( \textstyle\sum_{n < L} s_n \hat z_n + s_L F(z_L) \Big)

(exactly ``F(z_L)`` at the identity start, ``γ ẑ_b`` at a start on block ``b``: what a linear probe on
``ẑ_b`` reads).

LayerMix, the method we recommend, is the preset ``"layer_mix"``: ``state_norm="rms"``, a mix of
unit-RMS states put back on the last state's scale, started one-hot on block ``b``:

.. math::

    s = e_b + \beta \, (\mathrm{softmax}(w) - e_b) \qquad (\beta = 0,\ w = 0 \text{ at init}), \qquad
    h = \gamma \Big( z_L + \mathrm{rms}(z_L) \big(\textstyle\sum_n s_n \hat z_n - \hat z_L\big) \Big)

``b`` is ``start_layer`` when given (the block whose linear probe scores best on dev:
:func:`~peft_layerfusion.probing.best_layer`, the recipes' ``--probe-start``), else ``z_L`` on a decoder
(``h = z_L`` exactly: the base model) and the paper's uniform ``softmax(0)`` on an encoder
(``fusion_init="auto"``). ``K + 2`` parameters (``w``, ``γ``, ``β``), which train at
``lr * mixing_lr_multiplier``. Why: on a pre-norm stack a mix of raw states leans to the deepest blocks
(their RMS is hundreds of times the first ones'); started on the best probed block with the scale taken
out, the mix begins where the best single layer is and moves only where the training data pull it.
How it compares: the documentation's methods page and Results.

Example:
    >>> layer_mix = ScalarMixConfig.from_preset("layer_mix", start_layer=2, modules_to_save=["classifier"])
    >>> layer_mix.state_norm, layer_mix.start_layer, layer_mix.peft_type.value  # a ScalarMix, as saved
    ('rms', 2, 'SCALAR_MIX')
    >>> model = get_peft_model(base_model, layer_mix)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from ..config import DepthMixConfig, Preset, invalid, require_number
from ..fusion import DepthMix, FusionContext, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ScalarMixConfig(DepthMixConfig):
    """Configuration of ScalarMix (``K`` + 1 scalars; one more, ``β``, under the identity init).

    Args:
        fusion_init: ``"identity"`` (``"auto"`` on a decoder-only model) adds ``β`` and starts the
            weights one-hot on ``z_L``; ``"identity"`` needs ``layers`` to fuse ``z_L``, ``"auto"``
            falls back to the paper's init (weights ``softmax(0)``, uniform) where they do not.
        start_layer: Start the weights one-hot on this hidden state (an index into ``z_0 .. z_L`` as
            ``layers`` takes, among the fused ones), e.g. the block whose linear probe scores best on
            dev; ``None`` (default): ``fusion_init`` decides.
        (``state_norm`` and ``mixing_lr_multiplier`` of :class:`DepthMixConfig`, every other option of
        :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> model = get_peft_model(base_model, ScalarMixConfig(modules_to_save=["classifier"]))
        >>> model(ids).logits.shape  # (batch, seq, labels), read from the fused hidden state
        torch.Size([2, 8, 5])
        >>> probed = ScalarMixConfig.from_preset("layer_mix", start_layer=2)  # LayerMix, first a head on z_2
    """

    PEFT_TYPE: ClassVar[str] = "SCALAR_MIX"
    IDENTITY_INIT: ClassVar[bool] = True
    PRESETS: ClassVar[Mapping[str, Preset]] = {
        "layer_mix": Preset({"state_norm": "rms"}),
    }
    FORMER_PEFT_TYPES: ClassVar[tuple[str, ...]] = ("LAYER_MIX",)  # layer_mix was a type of its own once

    start_layer: Optional[int] = field(
        default=None,
        metadata={
            "help": "Start the layer weights one-hot on this hidden state (index into z_0..z_L, one of the "
            "fused layers), e.g. the block whose probe is best on dev. None: fusion_init decides."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start_layer is not None:
            require_number("start_layer", self.start_layer, integer=True)
            if self.fusion_init == "paper":
                allowed = "None with fusion_init='paper' (a chosen start is not the paper's uniform one)"
                raise invalid("start_layer", self.start_layer, allowed)

    def start_position(self, layers: Sequence[int], num_blocks: int, model: nn.Module) -> Optional[int]:
        """Where among the fused ``layers`` the weights start one-hot (``None``: ``softmax(0)``, uniform).

        Raises:
            ValueError: when ``start_layer`` is beyond the model's hidden states (``-(L + 1) .. L``) or
                not one of the fused layers.

        Example:
            >>> ScalarMixConfig(start_layer=-2).start_position([1, 2, 3], 3, base_model)
            1
        """
        if self.start_layer is None:
            return layers.index(num_blocks) if self.starts_at_base(model, layers, num_blocks) else None
        n = num_blocks
        in_range = -(n + 1) <= self.start_layer <= n  # beyond it, 99 % (L + 1) would name a block
        block = self.start_layer % (n + 1) if in_range else None
        if block not in layers:
            allowed = f"one of the fused layers {list(layers)} (indices -{n + 1}..{n} for {n} blocks)"
            raise invalid("start_layer", self.start_layer, allowed)
        return list(layers).index(block)


class ScalarMix(DepthMix):
    """``h = γ Σ_n softmax(w)_n z_n`` (identity init: ``softmax(w)`` blended with ``e_L`` by ``β``)."""

    sized_to_budget = False
    states_held = 2  # the running weighted sum and one weighted state

    def __init__(self, config: ScalarMixConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.layer_logits = nn.Parameter(torch.zeros(context.num_fused))
        self.gamma = nn.Parameter(torch.ones(()))
        # position among the fused states of the one-hot start (z_L: the identity init; or start_layer)
        self.start_index = config.start_position(context.layers, context.located.num_blocks, context.model)
        if self.start_index is not None:
            self.blend = nn.Parameter(torch.zeros(()))  # β

    @classmethod
    def check_supported(cls, config: ScalarMixConfig, context: FusionContext) -> None:
        """Refuse a ``start_layer`` that is not fused (before the model is touched)."""
        config.start_position(context.layers, context.located.num_blocks, context.model)

    def mixing_parameters(self) -> list[nn.Parameter]:
        """``w``, ``γ`` and ``β``: every parameter of the mix."""
        return list(self.parameters())

    def mix_weights(self) -> torch.Tensor:
        """The weights ``s`` ``(K,)``: ``softmax(w)``, or ``e_b + β (softmax(w) - e_b)`` (a one-hot start
        on ``z_b``: ``z_L`` under the identity init, or ``start_layer``)."""
        weights = torch.softmax(self.layer_logits, dim=0)  # (K,)
        if self.start_index is None:
            return weights
        # e_b (K,), never batched under vmap; set by a Python index, so no host sync (F.one_hot checks its
        # index's range on the host) and no copy of the index to the device, at every forward
        one_hot = torch.zeros(weights.shape[-1], dtype=weights.dtype, device=weights.device)
        one_hot[self.start_index].fill_(1.0)
        return torch.lerp(one_hot, weights, self.blend)  # exactly e_b while β = 0

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        weights = self.mix_weights()  # (K,)
        mixed = weighted_sum(zip(self.unit_states(states, capture), weights, strict=True))  # (batch, seq, d)
        return self.gamma * self.in_stream_units(mixed, capture)


class ScalarMixModel(LayerFusionModel):
    """The PEFT tuner of ``SCALAR_MIX``: ``get_peft_model(model, ScalarMixConfig())`` builds it."""

    prefix = "scalar_mix_"
    fusion_module_cls = ScalarMix
