r"""DWAtt: depth-wise attention over every block's output.

ElNokrashy, AlKhamissi, Diab, "Depth-Wise Attention (DWAtt): A Layer Fusion Method for
Data-Efficient Classification", LREC-COLING 2024 (arXiv 2209.15168). Per token:

.. math::

    f(x)  &= W \, \mathrm{LN}(\mathrm{gelu}(U x))  \qquad U: d \to \gamma d,\ W: \gamma d \to d \\
    k_n   &= W_K \, p_n  \qquad p_n \sim U(0, 1)^{d_{pos}} \text{ fixed (a buffer)} \\
    v_n   &= \mathrm{LN}_n(f^V_n(z_n))  \qquad \text{one MLP and one LayerNorm per layer} \\
    q     &= 1 + \mathrm{elu}(z_L + f^Q(z_L)) \\
    a_n   &= \mathrm{softmax}_n(q \cdot k_n / \tau)  \qquad \tau = 1 \text{ in the paper} \\
    h     &= z_L + \textstyle\sum_n a_n v_n

The per-layer value MLPs are stored as stacked weights ``(K, d, γd)``; each layer uses its
own slice, so they are ``K`` independent MLPs (nothing shared). The sum over layers is
accumulated one layer at a time, so no ``(K, tokens, d)`` stack is built where it would be large:
only a forward without autograd over at most 64 positions (a decoding step reads one) runs the ``K``
value MLPs as batched matmuls over a ``(K, tokens, d)`` stack, a few ops in all instead of about seven
per layer (:func:`~peft_layerfusion.fusion.runs_stacked`); its values are the same bits as layer by
layer. At one position (a batch-1 decoding step) the value MLPs read ``(out, in)`` copies of their
weights, a CPU's fast matrix-vector form, equal up to rounding
(:func:`~peft_layerfusion.fusion.matrix_vector_step`).

Size: one bottleneck MLP of width ``w`` has ``2 d w + 3 w + d`` parameters (``U``, the LayerNorm,
``W``), so DWAtt has ``(2 d w_Q + 3 w_Q + d) + K (2 d w_V + 3 w_V + d) + 2 K d + d_{pos} d + d``;
the value MLPs alone are 537M at Llama-3.1-8B's shape (K = 32, d = 4096, γ = 0.5). The widths
are ``γ d`` by default, or set in units with ``query_bottleneck_width`` / ``value_bottleneck_width``.

Pre-norm stacks (``prenorm_scaling=True``): where a final norm ``F`` follows the last block
(Llama, Gemma, Qwen, GPT-2...), ``z_L`` is the raw residual stream, whose RMS grows with depth
(about 1400 at Gemma 3 270M's last block, against 4.4 for ``F(z_L)``): the paper's query then
saturates the depth softmax, and unit-scale values are a vanishing part of ``h`` (the head reads
``F(h) ≈ F(z_L)``). With the option the query reads what the head reads, and the correction is
counted in units of the stream's per-token RMS:

.. math::

    q &= 1 + \mathrm{elu}(F(z_L) + f^Q(F(z_L))) \\
    h &= z_L + \mathrm{rms}(z_L) \textstyle\sum_n a_n v_n
        \qquad \mathrm{rms}(x) = \sqrt{\tfrac{1}{d} \textstyle\sum_i x_i^2}

so the head reads ``F(h) = F(z_L / rms(z_L) + Σ a_n v_n)`` (``F`` is scale-invariant up to its
ε): the paper's proportions, where ``z_L`` is a normalised state. Where the fusion sees no final norm
(post-norm stacks; a final norm outside the blocks' container, as ViT's on transformers 4.x, which
runs on the fused output by itself) the option changes nothing.

Identity init (``fusion_init="identity"``): each ``LN_n``'s gain starts at 0 (its shift is 0
already), so ``v_n = 0`` and ``h = z_L`` exactly, whatever ``layers``. (Zeroing the value MLPs'
last linear instead would hand ``LN_n`` an all-zero input, where its derivative is
``1/sqrt(eps) ≈ 316``: the first step would jump to unit-variance values.) At step 1 only the
``LN_n`` gains and shifts get non-zero gradients: ``∂L/∂a_n = g · v_n = 0`` gates the query MLP
and ``W_K``, and the zero gain gates the value MLPs; every parameter has one from step 2.

Keeping the depth attention spread (the options :class:`~.scaled_dwatt.ScaledDWAttConfig` turns on):

* ``state_norm="rms"``: the query reads ``ẑ_L = z_L / rms(z_L)`` and each value MLP ``ẑ_n``
  (a parameter-free RMS norm per position), and the correction is counted in units of the stream,
  ``h = z_L + rms(z_L) Σ_n a_n v_n``; ``"rms_after_norm"`` adds it where the head reads, after a
  pre-norm stack's final norm ``F`` and in its units: ``h_head = F(z_L) + rms(F(z_L)) Σ_n a_n v_n``
  (``F`` does not run again; the same as ``"rms"`` on a post-norm stack);
* ``score_scale="sqrt_d"``: scores ``q · k_n / (τ sqrt(d))``, as dot-product attention scales them;
* ``query_init="uniform"``: ``W_K`` and its bias start at zero, so every ``k_n = 0`` and the depth
  softmax starts uniform, ``a_n = 1/K`` (the keys get gradients once the values are not all zero).

.. math::

    a_n = \mathrm{softmax}_n\Big(\frac{q \cdot k_n}{\tau \sqrt{d}}\Big),
    \quad q = 1 + \mathrm{elu}(\hat z_L + f^Q(\hat z_L)),
    \quad v_n = \mathrm{LN}_n(f^V_n(\hat z_n)),
    \quad h = z_L + \mathrm{rms}(z_L) \textstyle\sum_n a_n v_n
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DepthMixConfig, invalid, require_number
from ..fusion import (
    FusionContext,
    FusionModule,
    linear_init_,
    matrix_vector_step,
    rms,
    runs_stacked,
    unit_rms,
    weighted_sum,
)
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
        query_bottleneck: γ of the query MLP ``f^Q`` (hidden width ``γ d``).
        value_bottleneck: γ of each value MLP ``f^V_n``.
        query_bottleneck_width: The query MLP's hidden width in units, instead of ``γ d``.
        value_bottleneck_width: Each value MLP's hidden width in units, instead of ``γ d``.
        d_pos: Size of the fixed random depth embeddings ``p_n``.
        score_temperature: Scores are ``q · k_n / score_temperature``; 1.0 reproduces the
            paper (no ``1/sqrt(d)`` scaling).
        attention_dropout: Dropout on the depth-attention weights ``a_n``.
        prenorm_scaling: On a pre-norm stack, the query reads ``F(z_L)`` and the correction is
            scaled by ``rms(z_L)`` (module docstring); no effect without a final norm.
        score_scale: ``"none"`` (the paper) or ``"sqrt_d"``: scores divided by ``sqrt(d)`` too.
        query_init: ``"paper"`` (``W_K`` as ``nn.Linear``) or ``"uniform"``: ``W_K = 0``, so the depth
            softmax starts uniform.
        (plus ``state_norm`` and ``mixing_lr_multiplier`` of :class:`DepthMixConfig`: with
        ``state_norm="rms"`` the query and values read unit-RMS states and the correction is scaled by
        ``rms(z_L)``; every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, DWAttConfig(modules_to_save=["classifier"]))
        >>> small = DWAttConfig(query_bottleneck_width=49, value_bottleneck_width=49)  # LLM sizing
        >>> decoder = DWAttConfig(prenorm_scaling=True)  # Llama, Gemma, Qwen: the stream's scale
    """

    PEFT_TYPE: ClassVar[str] = "DWATT"
    IDENTITY_INIT: ClassVar[bool] = True

    query_bottleneck: float = field(
        default=PAPER_BOTTLENECK, metadata={"help": "Bottleneck ratio γ of the query MLP f^Q (paper: 0.5)."}
    )
    value_bottleneck: float = field(
        default=PAPER_BOTTLENECK,
        metadata={"help": "Bottleneck ratio γ of each per-layer value MLP f^V_n (paper: 0.5)."},
    )
    query_bottleneck_width: Optional[int] = field(
        default=None,
        metadata={
            "help": "Hidden width of the query MLP in units, instead of the ratio "
            "(None: query_bottleneck * d)."
        },
    )
    value_bottleneck_width: Optional[int] = field(
        default=None,
        metadata={
            "help": "Hidden width of each value MLP in units, instead of the ratio "
            "(None: value_bottleneck * d)."
        },
    )
    d_pos: int = field(
        default=24, metadata={"help": "Size of the fixed random depth embeddings p_n (paper: 24)."}
    )
    score_temperature: float = field(
        default=1.0,
        metadata={"help": "Depth-attention scores are q·k_n / score_temperature. 1.0 reproduces the paper."},
    )
    attention_dropout: float = field(
        default=0.0, metadata={"help": "Dropout probability on the depth-attention weights a_n."}
    )
    prenorm_scaling: bool = field(
        default=False,
        metadata={
            "help": "On a pre-norm stack (a final norm F after the last block: Llama, Gemma, Qwen, "
            "GPT-2), the query reads F(z_L) and the correction sum_n a_n v_n is scaled by z_L's "
            "per-token RMS, so that F(h) = F(z_L / rms(z_L) + sum_n a_n v_n). False reproduces the "
            "paper; no effect on post-norm stacks."
        },
    )
    score_scale: str = field(
        default="none",
        metadata={
            "help": "'none' (the paper): scores q·k_n / score_temperature; 'sqrt_d': also divided by "
            "sqrt(d), as dot-product attention scales them."
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
        if self.prenorm_scaling and self.state_norm == "rms":
            allowed = "False with state_norm='rms' (the query then reads z_L / rms(z_L) already)"
            raise invalid("prenorm_scaling", True, allowed)
        for name in ("query_bottleneck", "value_bottleneck", "score_temperature"):
            require_number(name, getattr(self, name), low=0.0, low_open=True)
        require_number("d_pos", self.d_pos, low=1, integer=True)
        require_number("attention_dropout", self.attention_dropout, low=0.0, high=1.0, high_open=True)
        if not isinstance(self.prenorm_scaling, bool):
            raise invalid("prenorm_scaling", self.prenorm_scaling, "True or False")
        for kind in ("query", "value"):
            width, ratio = getattr(self, f"{kind}_bottleneck_width"), getattr(self, f"{kind}_bottleneck")
            if width is None:
                continue
            require_number(f"{kind}_bottleneck_width", width, low=1, integer=True)
            if ratio != PAPER_BOTTLENECK:
                allowed = f"None when `{kind}_bottleneck`={ratio!r} is given (give the ratio or the width)"
                raise invalid(f"{kind}_bottleneck_width", width, allowed)

    def widths(self, hidden_size: int) -> tuple[int, int]:
        """The hidden widths ``(w_Q, w_V)`` of the query and value MLPs for ``d = hidden_size``."""
        query = self.query_bottleneck_width or bottleneck_width(hidden_size, self.query_bottleneck)
        value = self.value_bottleneck_width or bottleneck_width(hidden_size, self.value_bottleneck)
        return query, value

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
        self.up_weight = nn.Parameter(torch.empty(k, d, h))  # U_k, stored transposed
        self.up_bias = nn.Parameter(torch.empty(k, h))
        self.norm_weight = nn.Parameter(torch.ones(k, h))
        self.norm_bias = nn.Parameter(torch.zeros(k, h))
        self.down_weight = nn.Parameter(torch.empty(k, h, d))  # W_k, stored transposed
        self.down_bias = nn.Parameter(torch.empty(k, d))
        linear_init_(self.up_weight, self.up_bias, fan_in=d)
        linear_init_(self.down_weight, self.down_bias, fan_in=h)
        self._row_major: tuple[torch.Tensor, ...] = ()  # (U_k, W_k) as (K, out, in), see row_major_weights
        self._row_major_key: tuple = ()

    def row_major_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``U_k`` and ``W_k`` as ``(K, out, in)`` contiguous copies (no autograd), for the matrix-vector
        products of one position (:func:`~peft_layerfusion.fusion.matrix_vector_step`).

        Made on first use and again whenever a weight changes: its storage, dtype or device, or an
        in-place write (an optimiser step, ``load_state_dict``), which moves the weight's version counter.
        Writes through ``.data``, which autograd does not see either, are not seen. ``train()`` drops
        the copies; in eval mode they hold as much memory as ``U`` and ``W``.
        """
        weights = (self.up_weight, self.down_weight)
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
        if key != getattr(self, "_row_major_key", ()):  # absent on a module pickled before it existed
            self._row_major = tuple(w.detach().transpose(1, 2).contiguous() for w in weights)
            self._row_major_key = key
        return self._row_major

    def train(self, mode: bool = True) -> StackedBottleneckMLP:  # noqa: D102 (nn.Module.train)
        if mode:
            self._row_major, self._row_major_key = (), ()
        return super().train(mode)

    def parts(self) -> list[tuple[torch.Tensor, ...]]:
        """Each MLP's ``(U_k, b^U_k, g_k, β_k, W_k, b^W_k)``, views of the stacked parameters taken
        once per forward: indexing a stacked parameter per MLP gives each index a zero-padded
        gradient of the whole stack in backward (K of them); unbind's backward stacks them once."""
        stacked = (
            self.up_weight, self.up_bias, self.norm_weight, self.norm_bias, self.down_weight, self.down_bias
        )  # fmt: skip
        return list(zip(*(parameter.unbind(0) for parameter in stacked), strict=True))

    @staticmethod
    def apply_part(x: torch.Tensor, part: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``f_k(x)`` for ``x`` of shape ``(tokens, d)`` and the weights ``part`` of :meth:`parts`."""
        up_weight, up_bias, norm_weight, norm_bias, down_weight, down_bias = part
        inner = F.gelu(torch.addmm(up_bias, x, up_weight))  # (tokens, γd)
        inner = F.layer_norm(inner, inner.shape[-1:], norm_weight, norm_bias)
        return torch.addmm(down_bias, inner, down_weight)  # (tokens, d)

    def forward(self, x: torch.Tensor, index: int = 0) -> torch.Tensor:
        """``f_index(x)`` for ``x`` of shape ``(tokens, d)``."""
        return self.apply_part(x, self.parts()[index])

    def forward_all(self, x: torch.Tensor, row_major: bool = False) -> torch.Tensor:
        """Every ``f_k`` at once: ``x`` ``(K, tokens, d)`` -> ``(K, tokens, d)``, ``f_k`` on ``x[k]`` (the
        same bits as :meth:`apply_part` per slice in float32 and float64: batched matmuls, and the
        LayerNorm's affine as the ``addcmul`` it fuses). With ``row_major`` (one position, no autograd)
        the products read :meth:`row_major_weights`, equal up to rounding."""
        # U_k, W_k: (K, d, γd), (K, γd, d) stored (in, out); their (out, in) copies with row_major
        up_weight, down_weight = self.row_major_weights() if row_major else (self.up_weight, self.down_weight)
        linear = rows_linear if row_major else batched_linear
        inner = F.gelu(linear(x, up_weight, self.up_bias))  # (K, tokens, γd)
        inner = per_layer_affine(F.layer_norm(inner, inner.shape[-1:]), self.norm_weight, self.norm_bias)
        return linear(inner, down_weight, self.down_bias)  # (K, tokens, d)


def batched_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``bias_k + x[k] @ weight[k]``: ``x`` ``(K, tokens, in)``, ``weight`` ``(K, in, out)``, ``bias``
    ``(K, out)``."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight)  # (K, tokens, out)


def rows_linear(x: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``bias_k + rows[k] x[k]`` per token: ``x`` ``(K, tokens, in)``, ``rows`` ``(K, out, in)``, ``bias``
    ``(K, out)``; each output a contiguous dot product, the fast form of a matrix-vector product."""
    return torch.baddbmm(bias.unsqueeze(2), rows, x.transpose(1, 2)).transpose(1, 2)  # (K, tokens, out)


def per_layer_affine(normed: torch.Tensor, gain: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``shift_k + gain_k * normed[k]`` for ``normed`` ``(K, tokens, w)`` and ``gain``, ``shift`` ``(K, w)``:
    a LayerNorm's affine, one per layer."""
    return torch.addcmul(shift.unsqueeze(1), normed, gain.unsqueeze(1))


class DWAtt(FusionModule):
    """Depth-wise attention (see the module docstring for the formula)."""

    token_wise = True
    shows_depth_attention = True

    def __init__(self, config: DWAttConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        k, d = context.num_fused, context.hidden_size
        query_width, value_width = config.widths(d)
        starts_at_base = config.starts_at_base(context.model, context.layers, context.located.num_blocks)
        self.score_temperature = float(config.score_temperature)
        if config.score_scale == "sqrt_d":
            self.score_temperature *= math.sqrt(d)
        self.prenorm_scaling = bool(config.prenorm_scaling)
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
        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def depth_attention(self, last: torch.Tensor) -> torch.Tensor:
        """The weights ``a_n`` ``(..., K)`` for last hidden states ``z_L`` of shape ``(..., d)``."""
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        query = 1.0 + F.elu(tokens + self.query_mlp(tokens))  # (tokens, d), every entry > 0
        # (K, d); the buffer in W_K's dtype: a cast of the parameters alone (TRL's bf16 cast of a
        # quantised model's trainable parameters, `param.data = ...`) leaves it float32
        keys = self.key_proj(self.depth_embeddings.to(self.key_proj.weight.dtype))
        scores = query @ keys.T / self.score_temperature  # (tokens, K)
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
        values = self.value_mlps.forward_all(stacked, row_major=matrix_vector_step(states))  # (K, tokens, d)
        return per_layer_affine(F.layer_norm(values, (d,)), self.value_norm_weight, self.value_norm_bias)

    def value(self, index: int, state: torch.Tensor) -> torch.Tensor:
        """``v_n = LN_n(f^V_n(z_n))`` for ``state`` of shape ``(tokens, d)`` (``ẑ_n`` with ``state_norm``)."""
        d = state.shape[-1]
        state = unit_rms(state) if self.normalizes_states else state
        return F.layer_norm(
            self.value_mlps(state, index), (d,), self.value_norm_weight[index], self.value_norm_bias[index]
        )

    def scales_to_stream(self, capture: Capture) -> bool:
        """Whether this forward reads ``F(z_L)`` and scales by ``rms(z_L)`` (``prenorm_scaling`` on a
        stack with a final norm)."""
        return self.prenorm_scaling and capture.final_norm is not None

    def capture_attention(self, capture: Capture) -> torch.Tensor:
        """The weights ``a_n`` ``(tokens, K)`` the forward computes for ``capture`` (no dropout): the
        query reads ``z_L``, or ``F(z_L)`` where :meth:`scales_to_stream`."""
        last = capture.states[-1]  # z_L: (batch, seq, d)
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        if self.normalizes_states:
            return self.depth_attention(unit_rms(tokens))
        query_input = normed_tokens(capture, last) if self.scales_to_stream(capture) else tokens
        return self.depth_attention(query_input)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        last = capture.states[-1]  # z_L: (batch, seq, d)
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        weights = self.attention_dropout(self.capture_attention(capture))  # (tokens, K)
        if self.mixes_after_norm:  # h = F(z_L) + rms(F(z_L)) Σ a_n v_n: what the head reads
            tokens = self.last_as_mixed(capture).reshape(-1, last.shape[-1])  # (tokens, d)
        if self.normalizes_states:  # a_n rms(z_L): the correction in units of the stream's scale
            weights = weights * rms(tokens)  # (tokens, K)
        elif self.scales_to_stream(capture):  # the same, as prenorm_scaling has it (no ε)
            weights = weights * tokens.pow(2).mean(-1, keepdim=True).sqrt()  # (tokens, K)
        # h = z_L + sum_n a_n v_n; each v_n is made just before it is added (no stack).
        values = self.values(states)
        columns = (weights[:, n : n + 1] for n in range(len(states)))  # each (tokens, 1)
        fused = weighted_sum(zip(values, columns, strict=True), start=tokens)  # (tokens, d)
        return fused.view_as(last)


def normed_tokens(capture: Capture, last: torch.Tensor) -> torch.Tensor:
    """``F(z_L)`` ``(tokens, d)`` in ``z_L``'s dtype, for ``last = z_L`` of shape ``(..., d)`` (the
    positions the fusion reads: computed again there, not taken from the model's full ``F(z_L)``)."""
    return capture.apply_final_norm(last).to(last.dtype).reshape(-1, last.shape[-1])


class DWAttModel(LayerFusionModel):
    """The PEFT tuner of ``DWATT``: ``get_peft_model(model, DWAttConfig())`` builds it."""

    prefix = "dwatt_"
    fusion_module_cls = DWAtt
