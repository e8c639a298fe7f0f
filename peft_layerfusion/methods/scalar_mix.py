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

Bounded blend (``bounded_blend=True``, the default of LayerMix): ``β`` above is unbounded, and a ``β``
below 0 or above 1 puts ``s`` outside the simplex (negative weights; seen on CoNLL-2003, where ``β``
went below 0). With the bound the parameter ``ρ`` (stored as ``blend``, init 0) enters through a clamp
whose gradient is projected:

.. math::

    \beta = \mathrm{clamp}(\rho, 0, 1), \qquad
    \frac{\partial L}{\partial \rho} = \frac{\partial L}{\partial \beta} \cdot
    \mathbb{1}\Big[0 \le \rho \le 1 \;\lor\; \big(\rho < 0 \land \tfrac{\partial L}{\partial \beta} < 0\big)
    \;\lor\; \big(\rho > 1 \land \tfrac{\partial L}{\partial \beta} > 0\big)\Big]

so ``s = e_b + β (softmax(w) - e_b)`` stays a convex combination (``s_n >= 0``, ``Σ s_n = 1``) whatever
``ρ`` an optimizer step leaves. At init ``ρ = 0``: ``β = 0`` exactly (``h = z_b``, or ``z_L``, bitwise)
and ``∂L/∂ρ = ∂L/∂β``, the unbounded blend's gradient (the indicator includes the boundary). Outside
``[0, 1]`` the model reads the boundary's ``β``, and ``ρ`` gets the gradient only when a descent step
(``ρ - lr ∂L/∂ρ``) moves it back towards ``[0, 1]``: it never drifts further out on its own gradient, and
comes back as soon as the data pull ``β`` inside. Why not ``β = σ(ρ)`` or ``sin^2 ρ``: neither is
exactly 0 with a non-zero gradient at the same point (a bitwise start needs one, a start that trains
needs the other); a plain ``torch.clamp`` has both at init, but a ``ρ`` that steps outside gets a zero
gradient there for good. Saved adapters without the field load unbounded (``False``), as they computed.

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

LayerMix, the trained fusion we recommend (with a few labels and no dev set, the closed-form guarded
joint ensemble of :mod:`peft_layerfusion.few_shot` comes first), is the preset ``"layer_mix"``:
``state_norm="rms"``, a mix of unit-RMS states put back on the last state's scale, started one-hot on
block ``b``, its blend bounded (``bounded_blend=True``: ``β = clamp(ρ, 0, 1)`` as above):

.. math::

    s = e_b + \beta \, (\mathrm{softmax}(w) - e_b) \qquad (\beta = \rho = 0,\ w = 0 \text{ at init}), \qquad
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
    >>> layer_mix.state_norm, layer_mix.bounded_blend, layer_mix.peft_type.value  # a ScalarMix, as saved
    ('rms', True, 'SCALAR_MIX')
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
        bounded_blend: Keep the blend ``β`` of a one-hot start in ``[0, 1]`` (``β = clamp(ρ, 0, 1)`` with a
            projected gradient, see the module), so the weights stay on the simplex; ``False`` (default of
            ScalarMix, and of adapters saved without the field): ``β`` unbounded. LayerMix sets ``True``.
            No effect where the weights start at ``softmax(0)`` (no ``β``).
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
        "layer_mix": Preset({"state_norm": "rms", "bounded_blend": True}),
    }
    FORMER_PEFT_TYPES: ClassVar[tuple[str, ...]] = ("LAYER_MIX",)  # layer_mix was a type of its own once

    start_layer: Optional[int] = field(
        default=None,
        metadata={
            "help": "Start the layer weights one-hot on this hidden state (index into z_0..z_L, one of the "
            "fused layers), e.g. the block whose probe is best on dev. None: fusion_init decides."
        },
    )

    bounded_blend: bool = field(
        default=False,
        metadata={
            "help": "Keep the blend beta of a one-hot start (identity init or start_layer) in [0, 1]: beta = "
            "clamp(rho, 0, 1) with a projected gradient, so the layer weights stay on the simplex. False "
            "(default; adapters saved without it): beta unbounded. The layer_mix preset sets True."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.bounded_blend, bool):
            raise invalid("bounded_blend", self.bounded_blend, "True or False")
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


class ProjectedClamp(torch.autograd.Function):
    """``clamp(ρ, 0, 1)`` whose gradient passes where ``ρ`` is in ``[0, 1]``, or where a descent step moves
    it back towards ``[0, 1]`` (a projected gradient; the module docstring has the formula).

    Example:
        >>> rho = torch.tensor(-0.5, requires_grad=True)
        >>> beta = ProjectedClamp.apply(rho)
        >>> (beta * 2.0).backward()  # dL/dbeta = 2 > 0 would push rho further out: blocked
        >>> beta.item(), rho.grad.item()
        (0.0, 0.0)
    """

    generate_vmap_rule = True  # elementwise: vmap (the recipes' stacked LR candidates) batches it as is

    @staticmethod
    def forward(rho: torch.Tensor) -> torch.Tensor:
        return rho.clamp(0.0, 1.0)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (rho,) = ctx.saved_tensors
        inside = (rho >= 0.0) & (rho <= 1.0)
        returns = ((rho < 0.0) & (grad < 0.0)) | ((rho > 1.0) & (grad > 0.0))  # ρ - lr g moves back in
        return torch.where(inside | returns, grad, torch.zeros_like(grad))


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
        self.bounded_blend = config.bounded_blend
        if self.start_index is not None:
            self.blend = nn.Parameter(torch.zeros(()))  # β, or ρ of β = clamp(ρ, 0, 1) (bounded_blend)

    @classmethod
    def check_supported(cls, config: ScalarMixConfig, context: FusionContext) -> None:
        """Refuse a ``start_layer`` that is not fused (before the model is touched)."""
        config.start_position(context.layers, context.located.num_blocks, context.model)

    def mixing_parameters(self) -> list[nn.Parameter]:
        """``w``, ``γ`` and ``β``: every parameter of the mix."""
        return list(self.parameters())

    def blend_weight(self) -> torch.Tensor:
        """``β`` ``()``: the parameter, or ``clamp(ρ, 0, 1)`` with ``bounded_blend`` (one-hot starts only)."""
        return ProjectedClamp.apply(self.blend) if self.bounded_blend else self.blend

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
        return torch.lerp(one_hot, weights, self.blend_weight())  # exactly e_b while β = 0

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        weights = self.mix_weights()  # (K,)
        mixed = weighted_sum(zip(self.unit_states(states, capture), weights, strict=True))  # (batch, seq, d)
        return self.gamma * self.in_stream_units(mixed, capture)


class ScalarMixModel(LayerFusionModel):
    """The PEFT tuner of ``SCALAR_MIX``: ``get_peft_model(model, ScalarMixConfig())`` builds it."""

    prefix = "scalar_mix_"
    fusion_module_cls = ScalarMix
