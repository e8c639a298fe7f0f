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

The per-layer value MLPs are stored as stacked weights ``(K, d, γd)`` and run as one
batched matrix product over the ``K`` fused layers; mathematically they are ``K``
independent MLPs (nothing shared).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .config import LayerFusionConfig, invalid
from .fusion import FusionContext, FusionModule, linear_init_, stack_layers
from .hooks import Capture


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
    d_pos: int = field(default=24, metadata={"help": "Size of the fixed random depth embeddings p_n (paper: 24)."})
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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise invalid(name, value, "a number > 0")
        if isinstance(self.d_pos, bool) or not isinstance(self.d_pos, int) or self.d_pos < 1:
            raise invalid("d_pos", self.d_pos, "an int >= 1")
        if isinstance(self.attention_dropout, bool) or not 0.0 <= self.attention_dropout < 1.0:
            raise invalid("attention_dropout", self.attention_dropout, "a probability in [0, 1)")


class StackedBottleneckMLP(nn.Module):
    """``K`` independent bottleneck MLPs ``f_k(x) = W_k LN_k(gelu(U_k x))`` run as one batch.

    Args:
        num_mlps: ``K``.
        hidden_size: ``d``, input and output width.
        bottleneck: ``γ d``, the inner width.
    """

    def __init__(self, num_mlps: int, hidden_size: int, bottleneck: int) -> None:
        super().__init__()
        k, d, h = num_mlps, hidden_size, bottleneck
        self.up_weight = nn.Parameter(torch.empty(k, d, h))
        self.up_bias = nn.Parameter(torch.empty(k, 1, h))
        self.norm_weight = nn.Parameter(torch.ones(k, 1, h))
        self.norm_bias = nn.Parameter(torch.zeros(k, 1, h))
        self.down_weight = nn.Parameter(torch.empty(k, h, d))
        self.down_bias = nn.Parameter(torch.empty(k, 1, d))
        linear_init_(self.up_weight, self.up_bias, fan_in=d)
        linear_init_(self.down_weight, self.down_bias, fan_in=h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (K, tokens, d)
        inner = F.gelu(torch.baddbmm(self.up_bias, x, self.up_weight))  # (K, tokens, γd)
        inner = F.layer_norm(inner, inner.shape[-1:]) * self.norm_weight + self.norm_bias
        return torch.baddbmm(self.down_bias, inner, self.down_weight)  # (K, tokens, d)


class DWAtt(FusionModule):
    """Depth-wise attention (see the module docstring for the formula)."""

    def __init__(self, config: DWAttConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        k, d = context.num_fused, context.hidden_size
        self.score_temperature = float(config.score_temperature)
        self.query_mlp = StackedBottleneckMLP(1, d, bottleneck_width(d, config.query_bottleneck))
        self.value_mlps = StackedBottleneckMLP(k, d, bottleneck_width(d, config.value_bottleneck))
        self.value_norm_weight = nn.Parameter(torch.ones(k, 1, d))
        self.value_norm_bias = nn.Parameter(torch.zeros(k, 1, d))
        self.key_proj = nn.Linear(config.d_pos, d)
        self.register_buffer("depth_embeddings", torch.rand(k, config.d_pos))  # p_n ~ U(0, 1), fixed
        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def depth_attention(self, last: torch.Tensor) -> torch.Tensor:
        """The weights ``a_n`` ``(batch, seq, K)`` for the last hidden state ``z_L``."""
        tokens = last.reshape(1, -1, last.shape[-1])  # (1, batch*seq, d)
        query = 1.0 + F.elu(last + self.query_mlp(tokens).view_as(last))  # (batch, seq, d)
        keys = self.key_proj(self.depth_embeddings)  # (K, d)
        scores = query @ keys.T / self.score_temperature  # (batch, seq, K)
        return torch.softmax(scores, dim=-1)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        last = capture.states[-1]  # z_L: (batch, seq, d)
        weights = self.attention_dropout(self.depth_attention(last))  # (batch, seq, K)
        stacked = stack_layers(states)  # (K, batch, seq, d)
        k, d = stacked.shape[0], stacked.shape[-1]
        values = self.value_mlps(stacked.view(k, -1, d))  # (K, batch*seq, d)
        values = F.layer_norm(values, (d,)) * self.value_norm_weight + self.value_norm_bias
        mixed = torch.einsum("nk,knd->nd", weights.reshape(-1, k), values)  # (batch*seq, d)
        return last + mixed.view_as(last)
