"""What every fusion module shares: its inputs, its build context, its interface.

A fusion module receives the ``K`` selected hidden states and the full :class:`Capture`
of one encoder forward, and returns the new last hidden state ``h`` ``(batch, seq, d)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .config import LayerFusionConfig
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
    # True for modules that continue the residual stream (R+n's extra blocks): they receive the raw
    # z_0 .. z_L of a pre-norm stack and apply ``capture.final_norm`` themselves. The others receive
    # ẑ_n = F(z_n) (see the placement rule in this module's docstring).
    reads_residual_stream: ClassVar[bool] = False
    # False for methods with (almost) no parameters (Average, ScalarMix): budget audits use them as
    # references and never size or flag them against the parameter-heavy methods.
    sized_to_budget: ClassVar[bool] = True

    def __init__(self, config: LayerFusionConfig, context: FusionContext) -> None:
        super().__init__()
        self.num_fused = context.num_fused
        self.hidden_size = context.hidden_size
        self.register_load_state_dict_post_hook(realign_after_load)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:  # noqa: D102
        raise NotImplementedError

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
        >>> weighted_sum(zip(states, torch.softmax(logits, 0)))
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
