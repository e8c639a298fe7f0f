r"""R+n, the "deeper baseline": ``n`` extra blocks of the base model's own kind on top.

.. math::

    h = F(B_n(\dots B_1(z_L)))  \qquad B_i \text{: fresh, randomly initialised copies of the last block}

``F`` is the stack's final norm (pre-norm stacks: ``model.norm``, ``ln_f``, T5's
``final_layer_norm``...; the identity for post-norm ones), so R+n is exactly "the model with
``n`` more blocks": the extra blocks continue the residual stream ``z_L`` and the final norm
comes after them (see the placement rule in ``fusion.py``).

Each extra block is called with exactly the arguments the model's last block received
(attention mask, causal mask, position bias, rotary embeddings, cache position...), so any
block type works, decoders' included. In a decoder, block ``L + i`` gets its own key/value
cache slot ``L + i`` (its ``layer_idx``; the slot is added to the model's cache next to the
last block's, of the same kind: full or sliding window), so cached generation equals
uncached forwards; a cache that cannot take a slot is refused with one line.

By default ``n`` is chosen so that the extra blocks match Concat's budget (``L d^2``): 1 for
12-layer bases, 2 for 24-layer bases.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache

from ..config import LayerFusionConfig, invalid, require_number
from ..fusion import FusionContext, FusionModule
from ..hooks import Capture
from ..model import LayerFusionModel


@dataclass
class ExtraLayersConfig(LayerFusionConfig):
    """Configuration of R+n: ``n`` randomly initialised extra blocks on top of ``z_L``.

    Args:
        num_extra_layers: ``n``. ``None`` (default) picks the ``n >= 1`` whose size is closest
            to Concat's on the same model (1 for 12-layer bases, 2 for 24-layer bases).
        (every option of :class:`LayerFusionConfig` and of LoRA; ``layers`` only sizes the
        Concat budget that the default ``n`` matches)

    Example:
        >>> model = get_peft_model(base_model, ExtraLayersConfig(modules_to_save=["classifier"]))
        >>> model(ids).logits.shape  # (batch, seq, labels), read from the fused hidden state
        torch.Size([2, 8, 5])
    """

    PEFT_TYPE: ClassVar[str] = "EXTRA_LAYERS"

    num_extra_layers: Optional[int] = field(
        default=None,
        metadata={
            "help": "Number n of extra blocks. None picks the n >= 1 closest to Concat's parameter budget "
            "(1 for 12-layer, 2 for 24-layer bases)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_extra_layers is not None:
            require_number("num_extra_layers", self.num_extra_layers, low=1, integer=True)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_num_extra_layers(block: nn.Module, num_fused: int, hidden_size: int) -> int:
    """The ``n >= 1`` whose ``n`` blocks come closest to Concat's ``K d^2 + d`` parameters."""
    concat_budget = num_fused * hidden_size * hidden_size + hidden_size
    return max(1, round(concat_budget / count_parameters(block)))


def _strip_tuner_layers(block: nn.Module) -> None:
    """Replace peft layers (e.g. LoRA injected before the fusion) by their base layers, in place."""
    for name, sub in list(block.named_modules()):
        if name and isinstance(sub, BaseTunerLayer) and "base_layer" in sub._modules:
            parent_name, _, child = name.rpartition(".")
            setattr(block.get_submodule(parent_name) if parent_name else block, child, sub.get_base_layer())


def fresh_copy(block: nn.Module, model: nn.Module) -> nn.Module:
    """A copy of ``block`` with every weight re-drawn by the model's own initialiser.

    The copy has no hooks, and copies none: a hook on the block (the fusion's capture, transformers'
    output recorders) reaches the block's container, and copying it would copy the whole model
    (freed at once, but the process's memory peaks at two models while R+n is built).
    """
    new = copy.deepcopy(block, memo=_without_hooks(block))
    _strip_tuner_layers(new)
    for tensor in [*new.parameters(), *new.buffers()]:
        if getattr(tensor, "_is_hf_initialized", False):
            tensor._is_hf_initialized = False  # transformers skips tensors flagged as loaded
    init_weights = getattr(model, "_init_weights", None)
    with torch.no_grad():
        for sub in new.modules():
            if init_weights is not None:
                init_weights(sub)
            elif hasattr(sub, "reset_parameters"):
                sub.reset_parameters()
    return new


def _without_hooks(module: nn.Module) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo under which the hook tables of ``module`` and its sub-modules (every
    dict attribute whose name holds ``hooks``) are copied as empty ones: nothing a hook refers to is
    copied."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for name, value in vars(sub).items():
            if "hooks" in name and isinstance(value, dict):
                memo[id(value)] = type(value)()
    return memo


def set_layer_index(block: nn.Module, index: int) -> None:
    """Set every ``layer_idx`` in ``block`` (its attention modules' key/value cache slot) to ``index``."""
    for sub in block.modules():
        if isinstance(getattr(sub, "layer_idx", None), int):
            sub.layer_idx = index


def caches_in(args: tuple, kwargs: dict[str, Any]) -> list[Cache]:
    """The key/value caches among a block call's arguments (self- and cross-attention ones apart)."""
    found = [value for value in (*args, *kwargs.values()) if isinstance(value, Cache)]
    caches: list[Cache] = []
    for cache in found:
        if isinstance(cache, EncoderDecoderCache):
            caches += [cache.self_attention_cache, cache.cross_attention_cache]
        else:
            caches.append(cache)
    return caches


# Constructor parameters a cache layer keeps under another attribute: a static sliding-window layer
# stores only its slot length, ``max_cache_len = min(sliding_window, max_cache_len)``, so passing that
# length as both gives a slot of the same length.
_STORED_AS = {"sliding_window": "max_cache_len"}


def empty_cache_layer_like(layer: Any) -> Any:
    """A new, empty cache layer of ``layer``'s class and settings (e.g. the same sliding window).

    The constructor's named parameters are read back from ``layer``'s attributes of the same name
    (``DynamicSlidingWindowLayer(sliding_window=...)``, ``StaticLayer(max_cache_len=...)``, or the
    attribute ``_STORED_AS`` names). A layer that records its past states (``generate`` turns that on
    for assisted and prompt-lookup decoding, which crop the cache back) gives a layer that records too.

    Raises:
        TypeError: if a parameter cannot be read back.
    """
    cls = type(layer)
    settings = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        stored = name if hasattr(layer, name) else _STORED_AS.get(name)
        if stored is not None and hasattr(layer, stored):
            settings[name] = getattr(layer, stored)
        elif parameter.default is parameter.empty:
            raise TypeError(f"cannot read `{name}` of a {cls.__name__}")
    new = cls(**settings)
    if getattr(layer, "record_past", False) and callable(getattr(new, "activate_past_recording", None)):
        new.activate_past_recording()
    return new


def reserve_cache_slots(caches: list[Cache], first: int, count: int) -> None:
    """Make sure every cache in ``caches`` has slots ``first .. first + count - 1`` (extra blocks' own).

    A new slot copies the kind of slot ``first - 1`` (the last block's), so an extra copy of a
    sliding-window block keeps its window. Lazily growing caches need nothing.

    Raises:
        ValueError: one line, when a cache cannot take a slot (then generate with ``use_cache=False``).
    """
    for cache in caches:
        layers = getattr(cache, "layers", None)
        if getattr(cache, "layer_class_to_replicate", None) is not None:
            continue  # it appends a layer for any new index by itself
        try:
            if not isinstance(layers, list) or not layers:
                raise TypeError("it keeps no list of layers")
            while len(layers) < first + count:
                layers.append(empty_cache_layer_like(layers[min(first, len(layers)) - 1]))
        except TypeError as error:
            raise ValueError(
                f"R+n (extra_layers) cannot give its {count} extra blocks key/value cache slots {first}.."
                f"{first + count - 1} in a {type(cache).__name__} ({error}): use a DynamicCache, or call the "
                "model with use_cache=False."
            ) from error


class ExtraLayers(FusionModule):
    """``h = B_n(... B_1(z_L))`` with blocks of the base model's own class.

    The blocks are copies of the model's own, so ``gradient_checkpointing_enable`` reaches
    them too. Re-entrant checkpointing gives no gradient to a block's weights when its input
    does not require one (a frozen encoder on transformers 4.x, whose
    ``gradient_checkpointing_enable`` leaves the embeddings' output without grad), so
    ``z_L`` then enters the stack as a leaf that requires grad.
    """

    reads_block_calls = True  # the extra blocks run with the last block's call arguments
    reads_block_states = False  # z_L only: in eval mode the capture hooks the last block alone

    def __init__(self, config: ExtraLayersConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        last_block = context.located.blocks[-1]
        n = config.num_extra_layers or matched_num_extra_layers(
            last_block, context.num_fused, context.hidden_size
        )
        self.blocks = nn.ModuleList(fresh_copy(last_block, context.model) for _ in range(n))
        self.first_slot = context.located.num_blocks  # block L + i has cache slot L + i
        for i, block in enumerate(self.blocks):
            set_layer_index(block, self.first_slot + i)

    @classmethod
    def check_supported(cls, config: ExtraLayersConfig, context: FusionContext) -> None:
        """At most as many extra blocks as the base has blocks (R+n at most doubles the depth)."""
        n, num_blocks = config.num_extra_layers, context.located.num_blocks
        if n is not None and n > num_blocks:
            allowed = f"None or an int in [1, {num_blocks}] (at most the base's {num_blocks} blocks)"
            raise invalid("num_extra_layers", n, allowed)

    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        hidden = capture.states[-1]  # z_L: (batch, seq, d)
        if self._needs_input_grad(hidden):
            hidden = hidden.detach().requires_grad_(True)
        caches = caches_in(capture.last_block_args, capture.last_block_kwargs)
        reserve_cache_slots(caches, self.first_slot, len(self.blocks))
        for block in self.blocks:
            hidden = capture.call_like_last_block(block, hidden)
        return hidden  # the final norm F (if any) runs on it next: the model with n more blocks

    def _needs_input_grad(self, hidden: torch.Tensor) -> bool:
        """Whether ``z_L`` must be made to require grad so checkpointed blocks get gradients."""
        if not torch.is_grad_enabled() or hidden.requires_grad:
            return False
        checkpointed = any(getattr(block, "gradient_checkpointing", False) for block in self.blocks)
        return checkpointed and self.training and any(p.requires_grad for p in self.blocks.parameters())


class ExtraLayersModel(LayerFusionModel):
    """The PEFT tuner of ``EXTRA_LAYERS``: ``get_peft_model(model, ExtraLayersConfig())`` builds it."""

    prefix = "extra_layers_"
    fusion_module_cls = ExtraLayers
