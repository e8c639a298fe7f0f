r"""DWAtt: depth-wise attention over every block's output.

ElNokrashy, AlKhamissi, Diab, "Depth-Wise Attention (DWAtt): A Layer Fusion Method for
Data-Efficient Classification", LREC-COLING 2024 (arXiv 2209.15168). Per token:

.. math::

    f(x)  &= W \, \mathrm{LN}(\mathrm{gelu}(U x))  \qquad U: d \to \gamma d,\ W: \gamma d \to d \\
    k_n   &= W_K \, p_n  \qquad p_n \sim U(0, 1)^{d_{pos}} \text{ fixed (a buffer)} \\
    v_n   &= \mathrm{LN}_n(f^V_n(z_n))  \qquad \text{one MLP and one LayerNorm per layer} \\
    q     &= 1 + \mathrm{elu}(z_L + f^Q(z_L)) \\
    a_n   &= \mathrm{softmax}_n(q \cdot k_n)  \qquad \text{no } 1/\sqrt{d} \text{ in the paper} \\
    h     &= z_L + \textstyle\sum_n a_n v_n

The ``K`` value MLPs are stacked: ``U`` as one ``(K, γd, d)`` weight, ``W`` as one ``(K, d, γd)``, each
``(out, in)`` as ``nn.Linear`` stores its weight (:class:`StackedLinear`); each layer uses its own slice,
so they are ``K`` independent MLPs (nothing shared). The sum over layers is accumulated one layer at a
time, so no ``(K, tokens, d)`` stack is built where it would be large: only a forward without autograd
over at most 64 positions (a decoding step reads one) runs the ``K`` value MLPs as batched matmuls over a
``(K, tokens, d)`` stack, a few ops in all instead of about seven per layer
(:func:`~peft_layerfusion.fusion.runs_stacked`); its values are the same bits as layer by layer. Every
product is ``W x^T`` (:func:`rows_linear`), each output a dot product of a stored row: at one position (a
decoding step) the fast matrix-vector form, with no copy of any weight; there BLAS computes one layer's
product as a matrix-vector product and the stack's as a matrix product, so the two agree up to rounding.

Size: one bottleneck MLP of width ``w`` has ``2 d w + 3 w + d`` parameters (``U``, the LayerNorm,
``W``), so DWAtt has ``(2 d w_Q + 3 w_Q + d) + K (2 d w_V + 3 w_V + d) + 2 K d + d_{pos} d + d``;
the value MLPs alone are 537M at Llama-3.1-8B's shape (K = 32, d = 4096, γ = 0.5). The widths
are the paper's ``γ d`` (γ = 0.5) by default, or set in units with ``query_bottleneck_width`` /
``value_bottleneck_width``.

Identity init (``fusion_init="identity"``): each ``LN_n``'s gain starts at 0 (its shift is 0
already), so ``v_n = 0`` and ``h = z_L`` exactly, whatever ``layers``. (Zeroing the value MLPs'
last linear instead would hand ``LN_n`` an all-zero input, where its derivative is
``1/sqrt(eps) ≈ 316``: the first step would jump to unit-variance values.) At step 1 only the
``LN_n`` gains and shifts get non-zero gradients: ``∂L/∂a_n = g · v_n = 0`` gates the query MLP
and ``W_K``, and the zero gain gates the value MLPs; every parameter has one from step 2.

Scaled DWAtt, the preset ``"scaled_dwatt"``, keeps the depth attention spread. On a pre-norm decoder the
paper's DWAtt feeds the raw residual stream, whose RMS grows with depth by orders of magnitude, into an
unscaled dot product over ``d`` dimensions: its depth softmax saturates, and it ends one-hot on one
block. The preset sets three options, as later depth-mixing designs do (MUDDFormer, Attention Residuals:
a parameter-free norm on what produces the weights, scaled scores, a weight generator that starts at
zero):

* ``state_norm="rms"``: the query reads ``ẑ_L = z_L / rms(z_L)`` and each value MLP ``ẑ_n`` (a
  parameter-free RMS norm per position), and the correction is counted in units of the stream,
  ``h = z_L + rms(z_L) Σ_n a_n v_n``; ``"rms_after_norm"`` adds it where the head reads, after a
  pre-norm stack's final norm ``F`` and in its units: ``h_head = F(z_L) + rms(F(z_L)) Σ_n a_n v_n``
  (``F`` does not run again; the same as ``"rms"`` on a post-norm stack);
* ``score_scale="sqrt_d"``: scores ``q · k_n / sqrt(d)``, as dot-product attention scales them;
* ``query_init="uniform"``: ``W_K`` and its bias start at zero, so every ``k_n = 0`` and the depth
  softmax starts uniform, ``a_n = 1/K`` (the keys get gradients once the values are not all zero).

.. math::

    \hat z_n &= z_n / \mathrm{rms}(z_n),
        \qquad \mathrm{rms}(x) = \sqrt{\tfrac{1}{d} \textstyle\sum_i x_i^2 + \epsilon} \\
    q &= 1 + \mathrm{elu}(\hat z_L + f^Q(\hat z_L)),
        \qquad k_n = W_K \, p_n \quad (W_K = 0 \text{ at init}) \\
    a_n &= \mathrm{softmax}_n\big(q \cdot k_n / \sqrt{d}\big) \qquad (= 1/K \text{ at init}) \\
    v_n &= \mathrm{LN}_n(f^V_n(\hat z_n)) \\
    h &= z_L + \mathrm{rms}(z_L) \textstyle\sum_n a_n v_n

Same sizes, same parameter count; the identity init keeps ``h = z_L`` exactly at initialisation.

Example:
    >>> scaled = DWAttConfig.from_preset("scaled_dwatt", mixing_lr_multiplier=10.0)
    >>> scaled.state_norm, scaled.score_scale, scaled.query_init, scaled.peft_type.value  # a DWAtt
    ('rms', 'sqrt_d', 'uniform', 'DWATT')
    >>> model = get_peft_model(causal_lm, scaled)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DepthMixConfig, Preset, invalid, require_number
from ..fusion import DepthMix, FusionContext, linear_init_, rms, runs_stacked, unit_rms, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel

PAPER_BOTTLENECK = 0.5  # γ of the query and value MLPs in the paper
SCORE_SCALES: tuple[str, ...] = ("none", "sqrt_d")  # values of `score_scale`
QUERY_INITS: tuple[str, ...] = ("paper", "uniform")  # values of `query_init`


def bottleneck_width(hidden_size: int, ratio: float) -> int:
    """``γ d`` rounded, at least 1."""
    return max(1, round(ratio * hidden_size))


def mlp_parameters(hidden_size: int, width: int) -> int:
    """Parameters of one bottleneck MLP ``W LN(gelu(U x))``: ``2 d w + 3 w + d``."""
    return 2 * hidden_size * width + 3 * width + hidden_size


@dataclass
class DWAttConfig(DepthMixConfig):
    """Configuration of DWAtt (depth-wise attention). Paper defaults throughout.

    Args:
        query_bottleneck_width: The query MLP's hidden width in units; ``None``: the paper's ``γ d``
            (γ = 0.5).
        value_bottleneck_width: Each value MLP's hidden width in units; ``None``: ``γ d``.
        d_pos: Size of the fixed random depth embeddings ``p_n``.
        score_scale: ``"none"`` (the paper: scores ``q · k_n``) or ``"sqrt_d"``: divided by ``sqrt(d)``.
        query_init: ``"paper"`` (``W_K`` as ``nn.Linear``) or ``"uniform"``: ``W_K = 0``, so the depth
            softmax starts uniform.
        (plus ``state_norm`` and ``mixing_lr_multiplier`` of :class:`DepthMixConfig`: with
        ``state_norm="rms"`` the query and values read unit-RMS states and the correction is scaled by
        ``rms(z_L)``; every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, DWAttConfig(modules_to_save=["classifier"]))
        >>> small = DWAttConfig(query_bottleneck_width=49, value_bottleneck_width=49)  # LLM sizing
        >>> decoder = DWAttConfig.from_preset("scaled_dwatt")  # Llama, Gemma, Qwen: Scaled DWAtt
    """

    PEFT_TYPE: ClassVar[str] = "DWATT"
    IDENTITY_INIT: ClassVar[bool] = True
    PRESETS: ClassVar[Mapping[str, Preset]] = {
        "scaled_dwatt": Preset({"state_norm": "rms", "score_scale": "sqrt_d", "query_init": "uniform"}),
    }
    FORMER_PEFT_TYPES: ClassVar[tuple[str, ...]] = ("SCALED_DWATT",)  # a type of its own once
    RETIRED_FIELDS: ClassVar[Mapping[str, object]] = {
        "prenorm_scaling": False,  # superseded by state_norm
        "attention_dropout": 0.0,
        "score_temperature": 1.0,  # score_scale="sqrt_d" scales the scores
        "query_bottleneck": PAPER_BOTTLENECK,  # the widths in units: query_bottleneck_width
        "value_bottleneck": PAPER_BOTTLENECK,
    }

    query_bottleneck_width: Optional[int] = field(
        default=None,
        metadata={"help": "Hidden width of the query MLP f^Q in units (None: the paper's 0.5 d)."},
    )
    value_bottleneck_width: Optional[int] = field(
        default=None,
        metadata={"help": "Hidden width of each value MLP f^V_n in units (None: the paper's 0.5 d)."},
    )
    d_pos: int = field(
        default=24, metadata={"help": "Size of the fixed random depth embeddings p_n (paper: 24)."}
    )
    score_scale: str = field(
        default="none",
        metadata={
            "help": "'none' (the paper): depth-attention scores q·k_n; 'sqrt_d': divided by sqrt(d), as "
            "dot-product attention scales them."
        },
    )
    query_init: str = field(
        default="paper",
        metadata={
            "help": "'paper': W_K initialised as nn.Linear; 'uniform': W_K = 0, so the depth attention "
            "starts uniform over the fused layers."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_scale not in SCORE_SCALES:
            raise invalid("score_scale", self.score_scale, f"one of {list(SCORE_SCALES)}")
        if self.query_init not in QUERY_INITS:
            raise invalid("query_init", self.query_init, f"one of {list(QUERY_INITS)}")
        require_number("d_pos", self.d_pos, low=1, integer=True)
        for name in ("query_bottleneck_width", "value_bottleneck_width"):
            if getattr(self, name) is not None:
                require_number(name, getattr(self, name), low=1, integer=True)

    def widths(self, hidden_size: int) -> tuple[int, int]:
        """The hidden widths ``(w_Q, w_V)`` of the query and value MLPs for ``d = hidden_size``."""
        paper = bottleneck_width(hidden_size, PAPER_BOTTLENECK)
        return self.query_bottleneck_width or paper, self.value_bottleneck_width or paper

    def num_parameters(self, num_fused: int, hidden_size: int) -> int:
        """New parameters for ``K = num_fused`` and ``d = hidden_size`` (the formula in the module docstring).

        Example:
            >>> DWAttConfig(query_bottleneck_width=49, value_bottleneck_width=49).num_parameters(32, 4096)
            13751027
        """
        k, d = num_fused, hidden_size
        query, value = self.widths(d)
        return mlp_parameters(d, query) + k * mlp_parameters(d, value) + 2 * k * d + self.d_pos * d + d

    def identity_fits(self, layers: Sequence[int], num_blocks: int) -> bool:
        """Always: ``h = z_L + Σ a_n v_n`` reads ``z_L`` whatever the fused layers."""
        return True


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``W x + b`` per token, weights read row by row as stored: ``x`` ``(tokens, in)``, ``weight`` ``(out,
    in)``, ``bias`` ``(out,)`` -> ``(tokens, out)``. The product is ``W x^T``, each output a contiguous dot
    product: at one position (a decoding step) the fast form of a matrix-vector product on a CPU, where
    ``x W^T`` (``F.linear``) batched over ``K`` maps reads the weights at half the rate or less.

    Example:
        >>> weight, bias, x = torch.randn(3, 4), torch.randn(3), torch.randn(5, 4)
        >>> torch.allclose(rows_linear(x, weight, bias), F.linear(x, weight, bias))
        True
    """
    # in (tokens, out) order, as F.linear's: elementwise ops round a tensor's stretches otherwise by layout
    return torch.addmm(bias.unsqueeze(1), weight, x.T).T.contiguous()  # (no copy at one position)


class StackedLinear(nn.Module):
    """``K`` independent linear maps ``y_k = W_k x_k + b_k``, the weights ``(K, out, in)`` as ``nn.Linear``
    stores one, read row by row with no copy (:func:`rows_linear`, batched).

    Args:
        num_maps: ``K``.
        in_features: Input width.
        out_features: Output width.
    """

    def __init__(self, num_maps: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_maps, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_maps, out_features))
        linear_init_(self.weight, self.bias, fan_in=in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(K, tokens, in)`` -> ``(K, tokens, out)``, map ``k`` on ``x[k]``: the bits of
        :func:`rows_linear` on each slice from two positions on (at one, BLAS computes the slice's product as
        a matrix-vector product and the batch's as a matrix product: equal up to rounding)."""
        rows = torch.baddbmm(self.bias.unsqueeze(2), self.weight, x.transpose(1, 2))  # (K, out, tokens)
        return rows.transpose(1, 2).contiguous()  # (K, tokens, out), as rows_linear's


class StackedBottleneckMLP(nn.Module):
    """``K`` independent bottleneck MLPs ``f_k(x) = W_k LN_k(gelu(U_k x))``, weights stacked.

    Args:
        num_mlps: ``K``.
        hidden_size: ``d``, input and output width.
        bottleneck: ``γ d``, the inner width.
    """

    def __init__(self, num_mlps: int, hidden_size: int, bottleneck: int) -> None:
        super().__init__()
        k, d, h = num_mlps, hidden_size, bottleneck
        self.up = StackedLinear(k, d, h)  # U_k: (K, γd, d)
        self.norm_weight = nn.Parameter(torch.ones(k, h))
        self.norm_bias = nn.Parameter(torch.zeros(k, h))
        self.down = StackedLinear(k, h, d)  # W_k: (K, d, γd)

    def parts(self) -> list[tuple[torch.Tensor, ...]]:
        """Each MLP's ``(U_k, b^U_k, g_k, β_k, W_k, b^W_k)``, views of the stacked parameters taken
        once per forward: indexing a stacked parameter per MLP gives each index a zero-padded
        gradient of the whole stack in backward (K of them); unbind's backward stacks them once."""
        stacked = (
            self.up.weight, self.up.bias, self.norm_weight, self.norm_bias, self.down.weight, self.down.bias
        )  # fmt: skip
        return list(zip(*(parameter.unbind(0) for parameter in stacked), strict=True))

    @staticmethod
    def apply_part(x: torch.Tensor, part: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``f_k(x)`` for ``x`` of shape ``(tokens, d)`` and the weights ``part`` of :meth:`parts`."""
        up_weight, up_bias, norm_weight, norm_bias, down_weight, down_bias = part
        inner = F.gelu(rows_linear(x, up_weight, up_bias))  # (tokens, γd)
        inner = F.layer_norm(inner, inner.shape[-1:], norm_weight, norm_bias)
        return rows_linear(inner, down_weight, down_bias)  # (tokens, d)

    def forward(self, x: torch.Tensor, index: int = 0) -> torch.Tensor:
        """``f_index(x)`` for ``x`` of shape ``(tokens, d)``."""
        return self.apply_part(x, self.parts()[index])

    def forward_all(self, x: torch.Tensor) -> torch.Tensor:
        """Every ``f_k`` at once: ``x`` ``(K, tokens, d)`` -> ``(K, tokens, d)``, ``f_k`` on ``x[k]`` (the
        same bits as :meth:`apply_part` per slice in float32 and float64: batched matmuls, and the
        LayerNorm's affine as the ``addcmul`` it fuses)."""
        inner = F.gelu(self.up(x))  # (K, tokens, γd)
        inner = per_layer_affine(F.layer_norm(inner, inner.shape[-1:]), self.norm_weight, self.norm_bias)
        return self.down(inner)  # (K, tokens, d)


def per_layer_affine(normed: torch.Tensor, gain: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``shift_k + gain_k * normed[k]`` for ``normed`` ``(K, tokens, w)`` and ``gain``, ``shift`` ``(K, w)``:
    a LayerNorm's affine, one per layer."""
    return torch.addcmul(shift.unsqueeze(1), normed, gain.unsqueeze(1))


# The MLP tensors earlier versions saved, with their name now; their weights were stored (K, in, out).
_SAVED_MLP_NAMES = {"up_weight": "up.weight", "up_bias": "up.bias", "down_weight": "down.weight",
                    "down_bias": "down.bias"}  # fmt: skip


def _to_rows(weight: torch.Tensor) -> torch.Tensor:
    """A stacked weight saved ``(K, in, out)`` as ``(K, out, in)``."""
    return weight.transpose(1, 2).contiguous()


class DWAtt(DepthMix):
    """Depth-wise attention (see the module docstring for the formula)."""

    shows_depth_attention = True

    def __init__(self, config: DWAttConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        k, d = context.num_fused, context.hidden_size
        query_width, value_width = config.widths(d)
        starts_at_base = config.starts_at_base(context.model, context.layers, context.located.num_blocks)
        self.score_divisor = math.sqrt(d) if config.score_scale == "sqrt_d" else 1.0
        self.query_mlp = StackedBottleneckMLP(1, d, query_width)
        self.value_mlps = StackedBottleneckMLP(k, d, value_width)
        # LN_n, one per layer; a zero gain makes every v_n = 0 (the identity init)
        self.value_norm_weight = nn.Parameter(torch.zeros(k, d) if starts_at_base else torch.ones(k, d))
        self.value_norm_bias = nn.Parameter(torch.zeros(k, d))
        self.key_proj = nn.Linear(config.d_pos, d)  # W_K
        if config.query_init == "uniform":  # every k_n = 0: the depth softmax starts uniform
            nn.init.zeros_(self.key_proj.weight)
            nn.init.zeros_(self.key_proj.bias)
        self.register_buffer("depth_embeddings", torch.rand(k, config.d_pos))  # p_n ~ U(0, 1), fixed

    @classmethod
    def upgrade_saved(cls, name: str) -> tuple[str, Optional[Callable[[torch.Tensor], torch.Tensor]]]:
        """A query or value MLP tensor as earlier versions saved it (``value_mlps.up_weight``, ``(K, in,
        out)``) under its name now (``value_mlps.up.weight``, ``(K, out, in)``); anything else as it is."""
        owner, _, saved = name.rpartition(".")
        if owner not in ("query_mlp", "value_mlps") or saved not in _SAVED_MLP_NAMES:
            return name, None
        return f"{owner}.{_SAVED_MLP_NAMES[saved]}", _to_rows if saved.endswith("_weight") else None

    def depth_attention(self, last: torch.Tensor) -> torch.Tensor:
        """The weights ``a_n`` ``(..., K)`` for last hidden states ``z_L`` of shape ``(..., d)``."""
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        query = 1.0 + F.elu(tokens + self.query_mlp(tokens))  # (tokens, d), every entry > 0
        # (K, d); the buffer in W_K's dtype: a cast of the parameters alone (TRL's bf16 cast of a
        # quantised model's trainable parameters, `param.data = ...`) leaves it float32
        keys = self.key_proj(self.depth_embeddings.to(self.key_proj.weight.dtype))
        scores = query @ keys.T / self.score_divisor  # (tokens, K)
        return torch.softmax(scores, dim=-1).view(*last.shape[:-1], keys.shape[0])

    def mixing_parameters(self) -> list[nn.Parameter]:
        """The query MLP ``f^Q`` and ``W_K``: what decides the weights ``a_n``."""
        return [*self.query_mlp.parameters(), *self.key_proj.parameters()]

    def values(self, states: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """``v_n = LN_n(f^V_n(z_n))`` ``(tokens, d)`` for each state ``(..., d)``, one at a time (the
        per-layer weights taken once: :meth:`StackedBottleneckMLP.parts`), or all at once where
        :func:`~peft_layerfusion.fusion.runs_stacked`."""
        if runs_stacked(states):
            yield from self.stacked_values(states).unbind(0)
            return
        mlps = self.value_mlps.parts()
        norms = zip(self.value_norm_weight.unbind(0), self.value_norm_bias.unbind(0), strict=True)
        for state, mlp, (gain, bias) in zip(self.unit_states(states), mlps, norms, strict=True):
            tokens = state.reshape(-1, state.shape[-1])  # (tokens, d)
            yield F.layer_norm(StackedBottleneckMLP.apply_part(tokens, mlp), tokens.shape[-1:], gain, bias)

    def stacked_values(self, states: list[torch.Tensor]) -> torch.Tensor:
        """Every ``v_n`` at once, ``(K, tokens, d)``: the value MLPs as batched matmuls."""
        d = states[0].shape[-1]
        stacked = torch.stack([state.reshape(-1, d) for state in states])  # (K, tokens, d)
        if self.normalizes_states:
            stacked = unit_rms(stacked)
        values = self.value_mlps.forward_all(stacked)  # (K, tokens, d)
        return per_layer_affine(F.layer_norm(values, (d,)), self.value_norm_weight, self.value_norm_bias)

    def value(self, index: int, state: torch.Tensor) -> torch.Tensor:
        """``v_n = LN_n(f^V_n(z_n))`` for ``state`` of shape ``(tokens, d)`` (``ẑ_n`` with ``state_norm``)."""
        d = state.shape[-1]
        state = unit_rms(state) if self.normalizes_states else state
        return F.layer_norm(
            self.value_mlps(state, index), (d,), self.value_norm_weight[index], self.value_norm_bias[index]
        )

    def capture_attention(self, capture: Capture) -> torch.Tensor:
        """The weights ``a_n`` ``(tokens, K)`` the forward computes for ``capture``: the query reads ``z_L``
        (``ẑ_L`` with ``state_norm``)."""
        last = capture.states[-1]  # z_L: (batch, seq, d)
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        return self.depth_attention(unit_rms(tokens) if self.normalizes_states else tokens)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        last = capture.states[-1]  # z_L: (batch, seq, d)
        weights = self.capture_attention(capture)  # (tokens, K)
        # h = z_L + Σ a_n v_n, or F(z_L) + rms(F(z_L)) Σ a_n v_n after the final norm: what the head reads
        tokens = (self.last_as_mixed(capture) if self.mixes_after_norm else last).reshape(-1, last.shape[-1])
        if self.normalizes_states:  # a_n rms(z_L): the correction in units of the stream's scale
            weights = weights * rms(tokens)  # (tokens, K)
        # each v_n is made just before it is added (no stack)
        values = self.values(states)
        columns = (weights[:, n : n + 1] for n in range(len(states)))  # each (tokens, 1)
        fused = weighted_sum(zip(values, columns, strict=True), start=tokens)  # (tokens, d)
        return fused.view_as(last)


class DWAttModel(LayerFusionModel):
    """The PEFT tuner of ``DWATT``: ``get_peft_model(model, DWAttConfig())`` builds it."""

    prefix = "dwatt_"
    fusion_module_cls = DWAtt
