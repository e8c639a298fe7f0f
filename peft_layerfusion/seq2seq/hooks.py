"""Plumbing shared by the encoder-decoder methods (SurfaceFusion, EncoderFusion).

The encoder side re-uses :class:`hooks.BlockCapture` (through the tuner's
``LayerFusionLayer``): its ``fuse`` callback hands each encoder forward to the fusion
module, which stores what the decoder side will need in an :class:`EncoderMemory` and
returns ``x_L`` unchanged. The decoder side is reached with hooks registered by the
module itself (``FusionModule.register_model_hooks``) on the decoder layers, the decoder
stack, the output embedding (``lm_head``) and the top-level model.

Why a memory that is *matched* rather than a plain stash: ``generate()`` runs the encoder
once on ``B`` sequences, then repeats its output ``n`` times (``repeat_interleave`` on
the batch, ``n`` = beams) and runs the decoder many times on ``B·n`` rows. At every
decoder call, :meth:`EncoderMemory.recall` checks that the decoder's
``encoder_hidden_states`` is the stored ``x_L`` repeated ``n`` times and returns the
stored tensors repeated the same way. A decoder fed with some other encoder output
(e.g. ``encoder_outputs`` computed earlier) is refused with a clear error, never fused
with stale states.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..hooks import ThreadState

ENCODER_STATES_ARG = "encoder_hidden_states"
ENCODER_MASK_ARG = "encoder_attention_mask"


@dataclass(frozen=True)
class Seq2SeqParts:
    """The modules of an encoder-decoder model the seq2seq methods hook.

    Args:
        decoder: The decoder stack (``model.get_decoder()``).
        decoder_layers: Its list of layers (``layers`` for BART, ``block`` for T5).
        lm_head: The output embedding, a bias-free linear map ``s -> s·Eᵀ``.
        input_embeddings: The shared token embedding ``E``.
    """

    decoder: nn.Module
    decoder_layers: nn.ModuleList
    lm_head: Optional[nn.Module]
    input_embeddings: nn.Embedding


def find_seq2seq_parts(model: nn.Module) -> Seq2SeqParts:
    """Find the decoder, its layers and the tied embeddings of an encoder-decoder model.

    Args:
        model: A transformers encoder-decoder model (``BartForConditionalGeneration``,
            ``T5ForConditionalGeneration``, ``MarianMTModel``, ...).

    Raises:
        ValueError: if ``model`` has no decoder (``get_decoder``) or no layer list in it.

    Example:
        >>> parts = find_seq2seq_parts(bart)  # a BartForConditionalGeneration, 2 + 2 blocks
        >>> len(parts.decoder_layers)
        2
    """
    is_seq2seq = getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    decoder = model.get_decoder() if is_seq2seq and callable(getattr(model, "get_decoder", None)) else None
    if not isinstance(decoder, nn.Module):
        raise ValueError(
            f"{type(model).__name__} is not an encoder-decoder model (config.is_encoder_decoder with a "
            "`get_decoder()`): the seq2seq fusion methods need one (BART, mBART, Marian, T5...)."
        )
    layers = next(
        (
            decoder._modules[n]
            for n in ("layers", "block", "layer")
            if isinstance(decoder._modules.get(n), nn.ModuleList)
        ),
        None,
    )
    if layers is None:
        raise ValueError(f"Could not find the layer list of the decoder {type(decoder).__name__}.")
    return Seq2SeqParts(decoder, layers, model.get_output_embeddings(), model.get_input_embeddings())


def argument(module: nn.Module, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The value of argument ``name`` in a call ``module(*args, **kwargs)`` (``None`` if absent)."""
    if name in kwargs:
        return kwargs[name]
    position = _position_of(module, name)
    return args[position] if position is not None and position < len(args) else None


def with_argument(
    module: nn.Module, name: str, args: tuple, kwargs: dict[str, Any], value: Any
) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` of a call to ``module`` with argument ``name`` replaced by ``value``."""
    position = _position_of(module, name)
    if name not in kwargs and position is not None and position < len(args):
        return (*args[:position], value, *args[position + 1 :]), kwargs
    return args, {**kwargs, name: value}


def _position_of(module: nn.Module, name: str) -> Optional[int]:
    names = list(inspect.signature(module.forward).parameters)
    return names.index(name) if name in names else None


class EncoderMemory:
    """What one encoder forward left for the decoder, matched to each decoder call.

    Example:
        >>> memory = EncoderMemory()
        >>> x_L, x0 = torch.randn(2, 5, 8), torch.randn(2, 5, 8)  # batch B = 2
        >>> memory.store(x_L, x0=x0)  # at the encoder
        >>> recalled = memory.recall(x_L.repeat_interleave(3, dim=0))  # at the decoder: 3 beams each
        >>> recalled["x0"].shape  # x0 repeated as the encoder states were
        torch.Size([6, 5, 8])
    """

    def __init__(self) -> None:
        self._local = ThreadState()  # per thread: a generate() in one thread never sees another's encoder

    @property
    def _last(self) -> Optional[torch.Tensor]:
        return getattr(self._local, "last", None)

    @property
    def _tensors(self) -> dict[str, torch.Tensor]:
        return getattr(self._local, "tensors", {})

    def store(self, last: torch.Tensor, **tensors: torch.Tensor) -> None:
        """Keep the encoder output ``last`` ``(B, S, d)`` and tensors whose dim ``batch_dim`` is B."""
        self._local.last, self._local.tensors = last, dict(tensors)

    def clear(self) -> None:
        self._local.last, self._local.tensors = None, {}

    def recall(
        self, encoder_hidden_states: torch.Tensor, batch_dims: Optional[dict[str, int]] = None
    ) -> dict:
        """The stored tensors, repeated to the decoder's batch.

        Args:
            encoder_hidden_states: The ``x_L`` the decoder received, ``(B·n, S, d)``.
            batch_dims: Batch dimension of each stored tensor (default 0).

        Raises:
            RuntimeError: if ``encoder_hidden_states`` is not the stored output repeated.
        """
        last = self._last
        repeats = repeats_of(last, encoder_hidden_states) if last is not None else None
        if repeats is None:
            raise self._mismatch()
        dims = batch_dims or {}
        return {k: _repeat(v, repeats, dims.get(k, 0)) for k, v in self._tensors.items()}

    @staticmethod
    def _mismatch() -> RuntimeError:
        return RuntimeError(
            "The decoder received encoder states that the fusion did not see being computed: run the "
            "encoder with the adapter active in the same call (model(input_ids=..., labels=...)) or "
            "through generate(), not with `encoder_outputs` computed separately or with the adapter disabled."
        )


def repeats_of(stored: torch.Tensor, given: torch.Tensor) -> Optional[int]:
    """``n`` when ``given`` is ``stored`` ``(B, ...)`` repeated ``n`` times on the batch (``generate``'s
    beams), else ``None``.

    Example:
        >>> x = torch.randn(2, 4)
        >>> repeats_of(x, x.repeat_interleave(3, dim=0))
        3
    """
    if given is stored:
        return 1
    if given.shape[1:] != stored.shape[1:] or stored.shape[0] == 0:
        return None
    repeats, remainder = divmod(given.shape[0], stored.shape[0])
    if remainder or not torch.equal(_repeat(stored, repeats, 0), given.to(stored.dtype)):
        return None
    return repeats


def _repeat(tensor: torch.Tensor, repeats: int, dim: int) -> torch.Tensor:
    return tensor if repeats == 1 else tensor.repeat_interleave(repeats, dim=dim)


def encoder_input_ids_hook(store: Callable[[torch.Tensor, Optional[torch.Tensor]], None]) -> Callable:
    """A forward pre-hook (``with_kwargs=True``) for the encoder that passes on its input ids and mask."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        store(argument(module, "input_ids", args, kwargs), argument(module, "attention_mask", args, kwargs))

    return hook
