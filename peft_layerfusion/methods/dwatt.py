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
accumulated one layer at a time, so no ``(K, tokens, d)`` stack is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LayerFusionConfig, require_number
from ..fusion import FusionContext, FusionModule, linear_init_, weighted_sum
from ..hooks import Capture
from ..model import LayerFusionModel


def bottleneck_width(hidden_size: int, ratio: float) -> int:
    """``γ d`` rounded, at least 1."""
    return max(1, round(ratio * hidden_size))


@dataclass
class DWAttConfig(LayerFusionConfig):
    """Configuration of DWAtt (depth-wise attention). Paper defaults throughout.

    Args:
        query_bottleneck: γ of the query MLP ``f^Q`` (hidden width ``γ d``).
        value_bottleneck: γ of each value MLP ``f^V_n``.
        d_pos: Size of the fixed random depth embeddings ``p_n``.
        score_temperature: Scores are ``q · k_n / score_temperature``; 1.0 reproduces the
            paper (no ``1/sqrt(d)`` scaling).
        attention_dropout: Dropout on the depth-attention weights ``a_n``.
        (plus every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, DWAttConfig(modules_to_save=["classifier"]))
    """

    PEFT_TYPE: ClassVar[str] = "DWATT"

    query_bottleneck: float = field(
        default=0.5, metadata={"help": "Bottleneck ratio γ of the query MLP f^Q (paper: 0.5)."}
    )
    value_bottleneck: float = field(
        default=0.5, metadata={"help": "Bottleneck ratio γ of each per-layer value MLP f^V_n (paper: 0.5)."}
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

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("query_bottleneck", "value_bottleneck", "score_temperature"):
            require_number(name, getattr(self, name), low=0.0, low_open=True)
        require_number("d_pos", self.d_pos, low=1, integer=True)
        require_number("attention_dropout", self.attention_dropout, low=0.0, high=1.0, high_open=True)


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

    def forward(self, x: torch.Tensor, index: int = 0) -> torch.Tensor:
        """``f_index(x)`` for ``x`` of shape ``(tokens, d)``."""
        inner = F.gelu(torch.addmm(self.up_bias[index], x, self.up_weight[index]))  # (tokens, γd)
        inner = F.layer_norm(inner, inner.shape[-1:], self.norm_weight[index], self.norm_bias[index])
        return torch.addmm(self.down_bias[index], inner, self.down_weight[index])  # (tokens, d)


class DWAtt(FusionModule):
    """Depth-wise attention (see the module docstring for the formula)."""

    token_wise = True
    shows_depth_attention = True

    def __init__(self, config: DWAttConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        k, d = context.num_fused, context.hidden_size
        self.score_temperature = float(config.score_temperature)
        self.query_mlp = StackedBottleneckMLP(1, d, bottleneck_width(d, config.query_bottleneck))
        self.value_mlps = StackedBottleneckMLP(k, d, bottleneck_width(d, config.value_bottleneck))
        self.value_norm_weight = nn.Parameter(torch.ones(k, d))  # LN_n, one per layer
        self.value_norm_bias = nn.Parameter(torch.zeros(k, d))
        self.key_proj = nn.Linear(config.d_pos, d)  # W_K
        self.register_buffer("depth_embeddings", torch.rand(k, config.d_pos))  # p_n ~ U(0, 1), fixed
        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def depth_attention(self, last: torch.Tensor) -> torch.Tensor:
        """The weights ``a_n`` ``(..., K)`` for last hidden states ``z_L`` of shape ``(..., d)``."""
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        query = 1.0 + F.elu(tokens + self.query_mlp(tokens))  # (tokens, d), every entry > 0
        keys = self.key_proj(self.depth_embeddings)  # (K, d)
        scores = query @ keys.T / self.score_temperature  # (tokens, K)
        return torch.softmax(scores, dim=-1).view(*last.shape[:-1], keys.shape[0])

    def value(self, index: int, state: torch.Tensor) -> torch.Tensor:
        """``v_n = LN_n(f^V_n(z_n))`` for ``state`` of shape ``(tokens, d)``."""
        d = state.shape[-1]
        return F.layer_norm(
            self.value_mlps(state, index), (d,), self.value_norm_weight[index], self.value_norm_bias[index]
        )

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        last = capture.states[-1]  # z_L: (batch, seq, d)
        tokens = last.reshape(-1, last.shape[-1])  # (tokens, d)
        weights = self.attention_dropout(self.depth_attention(tokens))  # (tokens, K)
        # h = z_L + sum_n a_n v_n; each v_n is made just before it is added (no stack).
        values = (self.value(n, state.reshape(tokens.shape)) for n, state in enumerate(states))
        columns = (weights[:, n : n + 1] for n in range(len(states)))  # each (tokens, 1)
        fused = weighted_sum(zip(values, columns, strict=True), start=tokens)  # (tokens, d)
        return fused.view_as(last)


class DWAttModel(LayerFusionModel):
    """The PEFT tuner of ``DWATT``: ``get_peft_model(model, DWAttConfig())`` builds it."""

    prefix = "dwatt_"
    fusion_module_cls = DWAtt
