r"""Concat: one learned linear map of every fused layer's output.

ElNokrashy et al. 2024 (the DWAtt paper's second method). Per token:

.. math::

    h = \sum_n W_n z_n + b = W \, [z_1; \dots; z_K] + b \qquad W: K d \to d

``K d^2 + d`` parameters: 537M at Llama-3.1-8B's shape (K = 32, d = 4096). With
``map_rank=r`` each map is low rank,

.. math::

    W_n = B_n A_n, \qquad h = B \, [A_1 z_1; \dots; A_K z_K] + b
    \qquad A_n: d \to r,\ B = [B_1 \dots B_K]: K r \to d

with ``2 K d r + d`` parameters; ``A_n`` and ``B`` start as ``nn.Linear(d, r)`` and
``nn.Linear(K r, d)`` do (``U(±1/sqrt(fan_in))``).

Identity init (``fusion_init="identity"``), ``h = z_L`` exactly at initialisation:

* full maps: ``W_L = I``, every other ``W_n = 0``, ``b = 0`` (``z_L`` must be fused). Every
  ``W_n`` and ``b`` has a non-zero gradient at step 1 (``∂L/∂W_n = g z_n^T``).
* low rank: a rank-``r`` map cannot be the identity, so the identity is a fixed term,
  ``W_L = I + B_L A_L``: ``h = z_L + Σ_n B_n A_n z_n + b`` with ``B = 0``, ``b = 0`` and
  ``A_n`` random. At step 1 only ``B`` and ``b`` have non-zero gradients (``∂L/∂A_n =
  B_n^T g z_n^T = 0`` while ``B = 0``, as LoRA's ``A`` under its zero ``B``); ``A`` trains from
  step 2.

With ``state_norm="rms"`` the map reads unit-RMS states and its output is put back on ``z_L``'s
scale (:class:`~peft_layerfusion.config.DepthMixConfig`; exact at the identity start):

.. math::

    h = z_L + \mathrm{rms}(z_L) \big(W [\hat z_1; \dots; \hat z_K] + b - \hat z_L\big),
    \qquad \hat z_n = z_n / \mathrm{rms}(z_n)

With ``state_norm="rms_after_norm"`` the map is taken where the head reads, after a pre-norm stack's
final norm ``F``: ``z_L`` enters as ``F(z_L)`` (``z_L`` on a post-norm stack; in the map, and as a
low-rank identity start's fixed term), and ``F`` does not run again:

.. math::

    h_{head} = W [\hat z_1; \dots; \hat z_{L-1}; F(z_L)] + b
        \;\;(+\, F(z_L) \text{ at a low-rank identity start})

Four presets are read-outs fitted in closed form on a few-shot training sample, no dev set and no
gradient step (:func:`peft_layerfusion.few_shot.choose`, then :func:`~peft_layerfusion.few_shot.deploy`
writes the weights): ``"probe_ensemble"``, ``"stacked"``, ``"joint_probe"`` and ``"joint_ensemble"``.
Each is a Concat of rank ``C`` (the head's classes) where the head reads, over the blocks ``B`` the
read-out uses (``deploy`` sets ``map_rank=C``, ``layers=B``, ``state_norm="rms_after_norm"`` and
``fusion_init="paper"``), with one ridge probe ``(W_s, b_s)`` per block fitted on ``x_s`` (``ẑ_s``,
and ``F(z_L)`` for the last) and cross-validated on the sample:

.. math::

    A_s = a_s W_s, \quad B = \begin{bmatrix} I_C & \cdots & I_C \\ 0 & \cdots & 0 \end{bmatrix}, \quad
    b = \begin{bmatrix} \sum_s a_s b_s + c \\ 0 \end{bmatrix}, \quad \text{head} = [I_C\ 0]:
    \qquad \mathrm{logits} = \textstyle\sum_{s \in B} a_s (W_s x_s + b_s) + c

* ``probe_ensemble``: ``a_s = 1/k`` over the ``k`` blocks whose probes score best out of fold, ``k``
  chosen by cross-validation, ``c = 0``: the mean of the top-k blocks' probe scores.
* ``stacked``: every block, ``a`` and ``c`` a balanced least-squares fit of the one-hot labels on the
  blocks' out-of-fold probe scores (cross-fitted), pulled towards ``a_s = 1/L``.
* ``joint_probe``: not one probe per block but one ridge probe on the concatenation of every block's
  ``x_s / r_s`` (``r_s`` the RMS of block ``s`` over the sample, a constant), its penalty chosen by
  the same cross-validation: ``A_s = W_s / r_s``, ``a_s = 1``, ``b`` its bias.
* ``joint_ensemble``: the mean of the two read-outs, ``joint_probe`` and ``probe_ensemble``, each
  weighted ``1/2``.

The saved ``adapter_config.json`` says which (``readout_fit``); the forward is Concat's, so the deployed
adapter trains further like any other (the Trainer, ``save_pretrained``). A read-out of one block deploys
as an ``AverageConfig(layers=[b], state_norm="rms_after_norm")`` instead (the head is that probe). A
preset sets ``readout_fit`` alone: ``get_peft_model(model, ConcatConfig.from_preset("stacked"))`` is
Concat with the options given (the read-out's are ``state_norm="rms_after_norm", map_rank=C``), trained
from scratch from Concat's init (the paper's random maps on an encoder, the base model's output on a
decoder): no probe in it, nothing of an ensemble; the closed-form fit is what makes it one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from ..config import DepthMixConfig, Preset, invalid, require_number
from ..fusion import DepthMix, FusionContext, linear_init_, matrix_vector_step
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ConcatConfig(DepthMixConfig):
    """Configuration of Concat (a linear map of the concatenated layer outputs).

    Args:
        map_rank: Rank ``r`` of each per-layer map ``W_n = B_n A_n`` (``2 K d r + d``
            parameters); ``None`` (default) keeps the paper's full maps (``K d^2 + d``).
        readout_fit: How the map's weights were fitted: ``None`` (default; trained, from the init), or
            the few-shot read-out :func:`peft_layerfusion.few_shot.deploy` wrote in closed form,
            ``"probe_ensemble"``, ``"stacked"``, ``"joint_probe"`` or ``"joint_ensemble"`` (set by the
            presets of those names). A record of the fit: the forward is the same.
        (``state_norm`` and ``mixing_lr_multiplier`` of :class:`DepthMixConfig`, every option of
        :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, ConcatConfig(modules_to_save=["classifier"]))
        >>> llm = get_peft_model(causal_lm, ConcatConfig(map_rank=4, fusion_init="identity"))
        >>> llm.print_trainable_parameters()  # 3 low-rank maps: 2 K d r + d = 2 * 3 * 32 * 4 + 32
        trainable params: 800 || all params: ... || trainable%: ...
        >>> ConcatConfig.from_preset("stacked", map_rank=5).readout_fit  # fitted by few_shot.deploy
        'stacked'
    """

    PEFT_TYPE: ClassVar[str] = "CONCAT"
    IDENTITY_INIT: ClassVar[bool] = True
    # the few-shot read-outs few_shot.deploy writes, each its weights fitted in closed form
    PRESETS: ClassVar[Mapping[str, Preset]] = {
        "probe_ensemble": Preset({"readout_fit": "probe_ensemble"}),
        "stacked": Preset({"readout_fit": "stacked"}),
        "joint_probe": Preset({"readout_fit": "joint_probe"}),
        "joint_ensemble": Preset({"readout_fit": "joint_ensemble"}),
    }

    map_rank: Optional[int] = field(
        default=None,
        metadata={
            "help": "Rank r of each per-layer map W_n = B_n A_n (2 K d r + d parameters instead of "
            "K d^2 + d). None (default): the paper's full maps."
        },
    )

    readout_fit: Optional[str] = field(
        default=None,
        metadata={
            "help": "How the map's weights were fitted: None (trained, from the init), or in closed form "
            "on a few-shot sample by peft_layerfusion.few_shot.deploy: 'probe_ensemble' (the mean of the "
            "top-k blocks' ridge probes), 'stacked' (their least-squares combination), 'joint_probe' (one "
            "ridge probe on every block's scaled state) or 'joint_ensemble' (the mean of the last and the "
            "probe ensemble). Set by the presets of those names; the forward is the same."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.map_rank is not None:
            require_number("map_rank", self.map_rank, low=1, integer=True)
        if self.readout_fit is not None and self.readout_fit not in self.PRESETS:
            raise invalid("readout_fit", self.readout_fit, f"None or one of {list(self.PRESETS)}")

    def num_parameters(self, num_fused: int, hidden_size: int) -> int:
        """New parameters for ``K = num_fused`` and ``d = hidden_size``: ``K d^2 + d``, or ``2 K d r + d``.

        Example:
            >>> ConcatConfig(map_rank=52).num_parameters(32, 4096)  # Llama-3.1-8B's shape
            13635584
        """
        k, d, r = num_fused, hidden_size, self.map_rank
        return (k * d * d if r is None else 2 * k * d * r) + d

    def identity_fits(self, layers: Sequence[int], num_blocks: int) -> bool:
        """Full maps need ``z_L`` among the fused states (``W_L = I``); low rank adds ``z_L`` itself."""
        return self.map_rank is not None or super().identity_fits(layers, num_blocks)


class Concat(DepthMix):
    """``h = W [z_1; ...; z_K] + b``, or with ``map_rank`` ``h = B [A_1 z_1; ...; A_K z_K] + b``."""

    def __init__(self, config: ConcatConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        k, d, r = context.num_fused, context.hidden_size, config.map_rank
        starts_at_base = config.starts_at_base(context.model, context.layers, context.located.num_blocks)
        self.map_rank = r
        self.adds_last = starts_at_base and r is not None  # the fixed identity term of a low-rank start
        if r is None:
            self.proj = nn.Linear(k * d, d)  # W = [W_1 ... W_K], b
            if starts_at_base:
                last = context.layers.index(context.located.num_blocks)
                with torch.no_grad():
                    self.proj.weight.zero_()
                    self.proj.bias.zero_()
                    self.proj.weight[:, last * d : (last + 1) * d].diagonal().fill_(1.0)  # W_L = I
        else:
            self.down_weight = nn.Parameter(torch.empty(k, d, r))  # A_n, stored transposed
            linear_init_(self.down_weight, None, fan_in=d)
            self.up = nn.Linear(k * r, d)  # B = [B_1 ... B_K], b
            if starts_at_base:
                with torch.no_grad():
                    self.up.weight.zero_()
                    self.up.bias.zero_()

    def mixing_parameters(self) -> list[nn.Parameter]:
        """Every parameter: the maps are the mix."""
        return list(self.parameters())

    @classmethod
    def check_supported(cls, config: ConcatConfig, context: FusionContext) -> None:
        """``map_rank`` below ``d``: at ``r >= d`` the "low-rank" maps have more parameters than full ones."""
        r, d = config.map_rank, context.hidden_size
        if r is not None and r >= d:
            allowed = f"None (full maps) or an int in [1, {d - 1}], below the hidden size d = {d}"
            raise invalid("map_rank", r, allowed)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        d = self.hidden_size
        tokens = [state.reshape(-1, d) for state in self.unit_states(states, capture)]  # each (tokens, d)
        fused = self._full(tokens) if self.map_rank is None else self._low_rank(tokens)  # (tokens, d)
        if self.adds_last:  # z_L + Σ B_n A_n z_n + b (ẑ_L with state_norm: put on z_L's scale below)
            fused = fused + self.last_as_mixed(capture).reshape(-1, d)
        return self.in_stream_units(fused.view_as(states[0]), capture)

    def _full(self, tokens: list[torch.Tensor]) -> torch.Tensor:
        if matrix_vector_step(tokens):  # one position: W [z_1; ...; z_K] + b, the map read once, by rows
            return torch.addmm(self.proj.bias, torch.cat(tokens, dim=-1), self.proj.weight.T)  # (1, d)
        # h = b + sum_n W_n z_n with W_n = proj.weight[:, n*d:(n+1)*d], one product per layer:
        # the same map as proj(cat(states)), without the (batch, seq, K*d) concatenated copy.
        # The W_n come from one split: its backward concatenates their gradients once, where
        # slicing W per layer would give each slice a zero-padded gradient of W's whole size
        # (K of them per step).
        blocks = self.proj.weight.split(self.hidden_size, dim=1)  # K of (d, d)
        # Out of place: in-place addmm_ has no vmap batching rule (LR candidates stacked with
        # torch.func.vmap would run it once per candidate); autograd keeps no partial sum either way.
        fused = torch.addmm(self.proj.bias, tokens[0], blocks[0].T)  # (tokens, d)
        for n in range(1, len(tokens)):
            fused = torch.addmm(fused, tokens[n], blocks[n].T)
        return fused

    def _low_rank(self, tokens: list[torch.Tensor]) -> torch.Tensor:
        downs = self.down_weight.unbind(0)  # A_n, one backward for all (see _full)
        codes = torch.cat([x @ downs[n] for n, x in enumerate(tokens)], dim=-1)  # (tokens, K*r)
        return torch.addmm(self.up.bias, codes, self.up.weight.T)  # (tokens, d)


class ConcatModel(LayerFusionModel):
    """The PEFT tuner of ``CONCAT``: ``get_peft_model(model, ConcatConfig())`` builds it."""

    prefix = "concat_"
    fusion_module_cls = Concat
