"""What every fusion module shares: its inputs, its build context, its interface.

A fusion module receives the ``K`` selected hidden states and the full :class:`Capture`
of one encoder forward, and returns the new last hidden state ``h`` ``(batch, seq, d)``.

Placement rule (post-norm and pre-norm stacks alike)
----------------------------------------------------

**The fused state replaces the last block's output** ``z_L``; whatever the model does after its
last block still happens, to ``h`` instead of ``z_L``. So:

* the states fused are the residual stream as the blocks pass it on: ``z_0`` (the input of block
  1) and ``z_n`` (the output of block ``n``), never normalised before mixing;
* a pre-norm stack's final norm ``F`` (``model.norm`` of Llama, Qwen, Mistral, Gemma and Phi,
  GPT-2's ``ln_f``, GPT-NeoX's and OPT's ``final_layer_norm``, T5's and Whisper's, mBART's
  ``layer_norm``, ViT's ``layernorm``, ModernBERT's ``final_norm``...) is applied once, to ``h``,
  where the model applies it to ``z_L``; the head reads ``F(h)``. A post-norm stack has no ``F``
  (its head reads ``h``);
* R+n is then exactly "the model with ``n`` more blocks": its blocks continue ``z_L`` and ``F``
  runs after them;
* sequence-to-sequence methods mix the stream too, and read the encoder output ``F(z_L)``, which
  they leave as it is.

One option departs from the rule, for a head that is trained anew on the fused state:
``state_norm="rms_after_norm"`` (:class:`~peft_layerfusion.config.DepthMixConfig`) mixes where the
head reads, after ``F``. ``z_L`` enters as the head reads it (``F(z_L)``; ``z_L`` on a post-norm
stack), every other state at unit RMS (``z_n / rms(z_n)``, no gain), and ``F`` does not run again; at
an identity start the head reads ``F(z_L)`` exactly, and a one-layer mix of block ``b`` gives it exactly
``z_b / rms(z_b)``, what a linear probe of that block reads. ``F``'s per-channel gain is fitted to ``z_L``
(it can span orders of magnitude): under the rule, a one-layer mix of a middle block hands the head
``z_b / rms(z_b)`` times that gain.

``F`` is found by data flow, not by name: the norm module inside the blocks' container whose
input is the last block's output tensor (``hooks.BlockCapture._at_final_norm``). A final norm
outside the container (ViT on transformers 4.x: ``vit.layernorm`` after ``vit.encoder``) runs on
the container's fused output by itself.

Why this placement: normalising each state before ``F`` applies ``F``'s learned gain, fitted to the
last state's distribution, to directions it was never fitted to; the documentation's "How it works"
page gives the measurement (Gemma 3 270M: four placements, perplexity and probe accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .config import DepthMixConfig, LayerFusionConfig
from .discovery import EncoderBlocks
from .hooks import Capture


@dataclass(frozen=True)
class FusionContext:
    """What a fusion module needs to know about the model it is built for.

    Args:
        model: The (base) model the fusion is attached to.
        located: Its encoder blocks and their container.
        hidden_size: Width ``d`` of the hidden states.
        layers: Indices of the fused hidden states in ``z_0 .. z_L``.
    """

    model: nn.Module
    located: EncoderBlocks
    hidden_size: int
    layers: tuple[int, ...]

    @property
    def num_fused(self) -> int:
        return len(self.layers)


class FusionModule(nn.Module):
    """Base class: ``forward(states, capture) -> h``.

    Args:
        config: The method's config.
        context: See :class:`FusionContext`.
    """

    # True when h at a position depends only on z_0 .. z_L at that position (no mixing along
    # the sequence): such a module may be run on a subset of the positions (``positions.py``).
    token_wise: ClassVar[bool] = False
    # True for sequence-to-sequence methods, which act on the decoder (need an encoder-decoder model).
    seq2seq: ClassVar[bool] = False
    # False for methods with (almost) no parameters (Average, ScalarMix): budget audits use them as
    # references and never size or flag them against the parameter-heavy methods.
    sized_to_budget: ClassVar[bool] = True
    # True when the module has ``capture_attention(capture) -> (tokens, K)`` weights over the fused layers
    # (DWAtt): the recipes record their mean per run and draw them.
    shows_depth_attention: ClassVar[bool] = False
    # d-wide float32 vectors a forward of the module holds per fused position at its peak, beyond the
    # states it reads (which every stacked candidate shares): ``None`` for a bound that grows with the
    # fused states (K + 1 of them: Concat's, DWAtt's); Average and ScalarMix hold 2 (a running sum and
    # the weighted state added to it). The recipes size the groups of LR candidates an evaluation
    # forward runs together by it.
    states_held: ClassVar[int | None] = None
    # True when forward reads the last block's call arguments (``Capture.last_block_args`` and
    # ``last_block_kwargs``: R+n runs its extra blocks with them). Code that skips the encoder's blocks
    # (a feature cache replaying their outputs) must then hand the last block the arguments a real
    # forward would (T5's position bias, which each block hands to the next).
    reads_block_calls: ClassVar[bool] = False
    # False when forward reads none of the fused states ``z_0 .. z_{L-1}``, only ``z_L``
    # (``capture.states[-1]``) and the last block's call (R+n): ``states`` is then empty, and in eval mode
    # the capture hooks only the last block (``hooks.BlockCapture.hook_blocks``).
    reads_block_states: ClassVar[bool] = True

    # True when forward's output is already what the head reads (a mix taken after a pre-norm stack's final
    # norm: DepthMix with state_norm="rms_after_norm"), so the layer does not run that norm on it again.
    mixes_after_norm: bool = False

    def __init__(self, config: LayerFusionConfig, context: FusionContext) -> None:
        super().__init__()
        self.num_fused = context.num_fused
        self.hidden_size = context.hidden_size
        self.register_load_state_dict_post_hook(realign_after_load)

    def mixing_parameters(self) -> list[nn.Parameter]:
        """The parameters that decide how the layers are mixed (weights, logits, queries, maps): they
        train at ``lr * mixing_lr_multiplier`` (:class:`DepthMix`; :func:`peft_layerfusion.parameter_groups`).
        Default: none (a method with no mixing weights)."""
        return []

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:  # noqa: D102
        raise NotImplementedError

    @classmethod
    def upgrade_saved(cls, name: str) -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]:
        """A tensor of this module as an earlier version saved it (``name`` relative to the module): its
        name now, and what makes the saved tensor this version's layout (``None``: kept as it is). Default:
        the same name, kept. Applied when an adapter is loaded."""
        return name, None

    @classmethod
    def check_supported(cls, config: LayerFusionConfig, context: FusionContext) -> None:
        """Raise a ``ValueError`` if this method cannot be built for ``context`` (default: it can).

        Called by the tuner before the model is touched, so a refused model is left as it was.

        Args:
            config: The method's config.
            context: The model and its located encoder.
        """

    def register_model_hooks(
        self, context: FusionContext, is_active: Callable[[], bool]
    ) -> list[RemovableHandle]:
        """Hooks this method needs outside the encoder (default: none).

        Methods that act elsewhere than on the encoder output (e.g. on the decoder of a
        seq2seq model) register them here; the tuner removes them on ``unload`` and
        ``delete_adapter``. Each hook must do nothing unless ``is_active()``.

        Args:
            context: The model and its located encoder, as the module was built with.
            is_active: True while this adapter is the active, enabled fusion adapter.
        """
        return []


class DepthMix(FusionModule):
    """Base class of the token-wise methods that mix states across depth (Average, ScalarMix, Concat,
    DWAtt): the options of :class:`~peft_layerfusion.config.DepthMixConfig` (``state_norm``,
    ``mixing_lr_multiplier``) and the states as they are mixed.

    Args:
        config: The method's config.
        context: See :class:`FusionContext`.
    """

    token_wise = True

    def __init__(self, config: DepthMixConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        self.normalizes_states = config.normalizes_states
        self.mixes_after_norm = config.mixes_after_norm
        self.mixing_lr_multiplier = float(config.mixing_lr_multiplier)

    def last_as_mixed(self, capture: Capture) -> torch.Tensor:
        """``z_L`` as this module mixes it ``(..., d)``: with ``state_norm="rms_after_norm"`` as the head
        reads it (``F(z_L)`` as the model computed it, or ``z_L`` where no final norm runs in the blocks'
        container), ``z_L / rms(z_L)`` with ``state_norm="rms"``, else ``z_L``."""
        last = capture.states[-1]
        if self.mixes_after_norm:
            return last if capture.normed_last is None else capture.normed_last
        return unit_rms(last) if self.normalizes_states else last

    def unit_states(
        self, states: list[torch.Tensor], capture: Capture | None = None
    ) -> Iterable[torch.Tensor]:
        """``states`` as they are mixed: each ``z_n / rms(z_n)`` with ``state_norm="rms"`` (made one at a
        time, as it is read: no ``K`` normalised copies held at once; all at once where
        :func:`runs_stacked`), else ``states`` themselves. With ``capture`` and
        ``state_norm="rms_after_norm"``, ``z_L`` enters as the head reads it (:meth:`last_as_mixed`)."""
        if not self.normalizes_states:
            return states
        units = unit_rms(torch.stack(states)).unbind(0) if runs_stacked(states) else None
        last = capture.states[-1] if capture is not None and self.mixes_after_norm else None
        return (
            self.last_as_mixed(capture) if state is last else (unit_rms(state) if units is None else units[n])
            for n, state in enumerate(states)
        )

    def in_stream_units(self, mixed: torch.Tensor, capture: Capture) -> torch.Tensor:
        """A mix of unit-RMS states put back on ``z_L``'s scale (``state_norm="rms"``), else ``mixed``
        (also with ``state_norm="rms_after_norm"``: the head reads the mix as it is).

        ``h = z_L + rms(z_L) (mixed - z_L / rms(z_L))``: equal to ``rms(z_L) mixed`` up to rounding,
        and to ``z_L`` bitwise where ``mixed`` is exactly ``z_L / rms(z_L)`` (a one-hot start on
        ``z_L``), so identity inits stay exact. ``mixed`` has ``z_L``'s shape.
        """
        if not self.normalizes_states or self.mixes_after_norm:
            return mixed
        last = capture.states[-1]  # z_L: (..., d)
        return torch.addcmul(last, rms(last), mixed - unit_rms(last))


# The CPU allocator's alignment. A tensor loaded with ``assign=True`` (PEFT's
# ``low_cpu_mem_usage``) may be a view at any offset of the file buffer, and BLAS kernels take
# other code paths (other rounding: outputs differ in the last bit) for misaligned inputs.
_ALIGNMENT = 64


def realign_after_load(module: nn.Module, incompatible_keys: object = None) -> None:
    """Give every parameter and buffer of ``module`` its own aligned storage if it lacks one.

    Registered as a load-state-dict post hook of every fusion module, so an adapter loaded with
    ``low_cpu_mem_usage=True`` computes bitwise what it computed before saving. Parameters keep
    their identity (only ``.data`` moves), so optimizers holding them are unaffected.
    """
    with torch.no_grad():
        for sub in module.modules():
            for name, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
                if tensor is None or tensor.device.type != "cpu" or tensor.data_ptr() % _ALIGNMENT == 0:
                    continue
                if isinstance(tensor, nn.Parameter):
                    tensor.data = tensor.data.clone()
                else:
                    sub._buffers[name] = tensor.clone()


RMS_EPS = 1e-6  # the parameter-free RMS norm's epsilon (as Llama's RMSNorm)


def rms(state: torch.Tensor) -> torch.Tensor:
    """Per-position root mean square over the width: ``sqrt(mean_i x_i^2 + eps)``, ``(..., d) -> (..., 1)``.

    Example:
        >>> round(rms(torch.tensor([[3.0, 4.0]])).item(), 4)  # sqrt(12.5 + 1e-6)
        3.5355
    """
    return state.pow(2).mean(-1, keepdim=True).add(RMS_EPS).sqrt()


def unit_rms(state: torch.Tensor) -> torch.Tensor:
    """The parameter-free RMS norm ``z / rms(z)`` per position (no gain): every position at RMS 1, so a
    mix of such states is decided by its weights, not by how large each block's stream has grown.

    Example:
        >>> unit_rms(torch.tensor([[300.0, 400.0]]))
        tensor([[0.8485, 1.1314]])
    """
    return state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True).add(RMS_EPS))


# A forward without autograd over at most this many positions computes over a (K, tokens, d) stack of the
# fused states, a few ops in all, instead of state by state, a few ops per layer: at a decoding step (one
# position) the per-op overhead, not the FLOPs, is what costs. Both ways give the same bits, but at one
# position (matrix_vector_step), where BLAS rounds a stack's matrix-vector products otherwise: up to rounding.
STACKED_TOKENS = 64
# dtypes where the stacked ops round as the per-state ones: in half precision LayerNorm rounds its
# normalised state once before its affine, which the stacked DWAtt applies apart.
STACKED_DTYPES = (torch.float32, torch.float64)


def runs_stacked(states: list[torch.Tensor]) -> bool:
    """Whether a fusion computes over a ``(K, tokens, d)`` stack of ``states`` instead of state by state.

    Where it is small (at most :data:`STACKED_TOKENS` positions), in float32 or float64, without autograd
    (a training step keeps the per-state path, which never holds ``K`` states' intermediates at once),
    and in plain eager code: under ``torch.func.vmap`` (the recipes' stacked LR candidates) batched ops
    round otherwise than the per-state ones, and a compiled graph fuses the per-state ops anyway.

    Example:
        >>> step = [torch.zeros(1, 1, 8) for _ in range(4)]  # a decoding step: one position
        >>> with torch.no_grad():
        ...     runs_stacked(step)
        True
        >>> runs_stacked(step)  # autograd records: per state
        False
    """
    first = states[0]  # (..., d)
    small = first.numel() <= STACKED_TOKENS * first.shape[-1]
    if not small or first.dtype not in STACKED_DTYPES or torch.is_grad_enabled():
        return False
    return not torch.compiler.is_compiling() and not inside_functorch()


def matrix_vector_step(states: list[torch.Tensor]) -> bool:
    """Whether a forward that :func:`runs_stacked` reads one position (a batch-1 decoding step), where
    Concat computes its whole map as one matrix-vector product, ``W [z_1; ...; z_K] + b``, instead of one
    product per layer: the same map, equal up to float rounding (the sums run in another order), not
    bitwise. Two positions or more keep the per-layer products' bits.

    Example:
        >>> with torch.no_grad():
        ...     matrix_vector_step([torch.zeros(1, 1, 8)] * 4), matrix_vector_step([torch.zeros(2, 1, 8)] * 4)
        (True, False)
    """
    first = states[0]  # (..., d)
    return first.numel() == first.shape[-1] and runs_stacked(states)


# torch's own probe of the functorch transforms in progress (private; absent: assume one, so the safe
# per-state path runs)
_PEEK_TRANSFORMS = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def inside_functorch() -> bool:
    """Whether this runs inside a ``torch.func`` transform (``vmap``, ``grad``...), where a batched
    rewrite of a computation may not round as it does in plain eager code (``True`` where this torch
    cannot tell).

    Example:
        >>> inside_functorch()
        False
    """
    return _PEEK_TRANSFORMS is None or _PEEK_TRANSFORMS() is not None


def stack_layers(states: list[torch.Tensor]) -> torch.Tensor:
    """``K`` tensors ``(batch, seq, d)`` -> one ``(K, batch, seq, d)`` tensor."""
    return torch.stack(states, dim=0)


def weighted_sum(
    pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], start: torch.Tensor | None = None
) -> torch.Tensor:
    """``start + Σ_n weight_n · state_n`` over ``(state, weight)`` pairs, accumulated layer by layer.

    No ``(K, batch, seq, d)`` stack is built, and with a generator each state can be made
    just before it is added. Weights broadcast against states (a scalar per layer, or a
    ``(tokens, 1)`` column per layer).

    Example:
        >>> states = [torch.full((2, 3), 1.0), torch.full((2, 3), 3.0)]  # K = 2 layers' (tokens, d)
        >>> weighted_sum(zip(states, torch.softmax(torch.zeros(2), 0)))  # equal weights: the mean
        tensor([[2., 2., 2.],
                [2., 2., 2.]])
    """
    fused = start
    for state, weight in pairs:
        if fused is None:
            fused = state * weight
        else:  # out of place: addcmul_ has no vmap batching rule (stacked LR candidates)
            fused = torch.addcmul(fused, state, weight)
    if fused is None:
        raise ValueError("weighted_sum needs at least one (state, weight) pair")
    return fused


def linear_init_(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    """`nn.Linear`'s default init, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, for stacked weights."""
    bound = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias.uniform_(-bound, bound)
