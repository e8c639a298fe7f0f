"""The tuner layer: one module inside the model that owns the hooks and the fusion modules.

``get_peft_model`` attaches one :class:`LayerFusionLayer` to the encoder's block container
(``<container>.layer_fusion``). It is a peft ``BaseTunerLayer``, so peft's own ``set_adapter``,
``delete_adapter``, ``disable_adapter()``, dtype casting, saving and loading treat it like a
LoRA layer. It holds one fusion module per adapter name and a :class:`~.hooks.BlockCapture`
whose callback (:meth:`LayerFusionLayer.fuse`) runs the active adapter's module.

Also here, the two public ways to reach it from a model:

* :func:`active_fusion_module` -- the fusion module that runs in the next forward;
* :func:`fused_positions` -- run token-wise modules only at the positions a loss reads.

Fusing only where the loss reads
--------------------------------

A token-classification loss reads one position per word (the first sub-word) and a masked-LM
loss only the masked positions; padding is read by nothing. For a token-wise fusion module
(DWAtt, Concat, Average, ScalarMix: ``h`` at a position depends on that position's
``z_0 .. z_L`` only) the fused state at a position does not depend on the other positions, so
computing it only where it is read gives the same numbers there (and the same gradients) for
a fraction of the work. :func:`fused_positions` does that for the duration of a ``with`` block:

* selected positions: the fused state ``h``, exactly as without the restriction;
* every other position: the last block's output ``z_L`` (what the model would see without
  fusion), so heads still get a full ``(batch, seq, d)`` tensor.

Modules that mix positions (R+n's extra blocks, the seq2seq methods) ignore the restriction
and fuse everywhere, which is also exact.

Memory: in a forward without autograd graph (``torch.no_grad()``, eval mode), the capture keeps
``z_0 .. z_{L-1}`` only at the selected positions, gathered as each block is called
(:class:`~.hooks.BlockCapture`'s ``select``), so each whole ``(batch, seq, d)`` state is freed once the
next block has read it instead of all of them living until the fusion runs. The numbers are the same,
bitwise.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Optional

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torch.utils.hooks import RemovableHandle

from .discovery import EncoderBlocks, LinkedBlocks
from .fusion import FusionModule
from .hooks import (
    BlockCapture,
    BoundHook,
    Capture,
    ThreadState,
    position_index,
    scatter_positions,
    select_positions,
    warn_shared_blocks,
)
from .seq2seq.hooks import ENCODER_STATES_ARG, argument, find_seq2seq_parts, repeats_of

LAYER_NAME = "layer_fusion"  # attribute of the container holding the LayerFusionLayer
FUSION_SUFFIX = "fusion"  # the per-adapter ModuleDict is named f"{prefix}{FUSION_SUFFIX}"


class LayerFusionLayer(nn.Module, BaseTunerLayer):
    """The tuner layer: hooks on the encoder plus one fusion module per adapter.

    Args:
        located: The encoder blocks and their container.
        prefix: The PEFT method's prefix (names the ModuleDict of fusion modules).
    """

    other_param_names: tuple[str, ...] = ()

    def __init__(self, located: EncoderBlocks, prefix: str, blocks_path: Optional[str] = None) -> None:
        nn.Module.__init__(self)
        self.adapter_layer_names = (f"{prefix}{FUSION_SUFFIX}",)
        self.add_module(self.adapter_layer_names[0], nn.ModuleDict())
        self.fused_layers: dict[str, tuple[int, ...]] = {}
        self._active_adapter: list[str] = []
        self.merged_adapters: list[str] = []
        self._located = LinkedBlocks(located)  # weak: this layer is a child of the container
        # weak callbacks too: the capture is this layer's, a bound method would be a cycle
        self.capture = BlockCapture(
            located, BoundHook(self.fuse), blocks_path, select=BoundHook(self.read_positions)
        )
        self.model_hooks: dict[str, list[RemovableHandle]] = {}  # per adapter, outside the encoder
        self.root_hooks: list[RemovableHandle] = []  # on the whole model: did the fusion run?
        self.watches_decoder = False  # an encoder-decoder model: fused outputs are kept for its decoder
        self._local = ThreadState()  # per thread: `positions`, the root forwards open

    @property
    def located(self) -> EncoderBlocks:
        """The encoder blocks and their container (``ReferenceError`` once the model was freed)."""
        return self._located()

    @property
    def positions(self) -> Optional[torch.Tensor]:
        """This thread's ``(batch, seq)`` bool mask set by :func:`fused_positions` (``None``: everywhere)."""
        return getattr(self._local, "positions", None)

    @positions.setter
    def positions(self, mask: Optional[torch.Tensor]) -> None:
        self._local.positions = mask

    # ------------------------------------------------------------- the fusion must run
    def watch(self, model: nn.Module) -> None:
        """Check at the end of every forward of ``model`` (the whole model) that the fusion ran.

        A fusion whose hooks never fire (a block list the forward does not run) would leave the
        output un-fused while its parameters "train"; the check raises instead, naming ``blocks_path``.

        In an encoder-decoder model, a forward may run the decoder alone on encoder states computed
        before (every cached step of ``generate()``, or ``encoder_outputs=`` given): a hook on the
        decoder checks that those states are the output this adapter fused (see
        :meth:`check_decoder_input`), and such a forward counts as fused.
        """
        if self.root_hooks:
            return
        self.root_hooks = [
            model.register_forward_pre_hook(BoundHook(self._enter_model)),
            model.register_forward_hook(BoundHook(self._leave_model), always_call=True),
        ]
        decoder = _decoder_of(model)
        # a fusion of the decoder's own stack (blocks_path="decoder.block") reads no encoder states
        container = self.located.container
        fuses_the_decoder = decoder is not None and any(m is container for m in decoder.modules())
        if decoder is not None and not fuses_the_decoder:
            self.watches_decoder = True
            check = decoder.register_forward_pre_hook(BoundHook(self.check_decoder_input), with_kwargs=True)
            self.root_hooks.append(check)

    def _remember_fused(self, adapter_name: str, fused: torch.Tensor) -> None:
        """Keep ``fused`` (the new encoder output) for :meth:`check_decoder_input`: a weak reference
        (the tensor itself) and its detached values (the states ``generate`` repeats for its beams)."""
        self._local.fused = (adapter_name, weakref.ref(fused), fused.detach())
        self._local.verified = None

    def _fused_by(self, name: str, states: torch.Tensor) -> bool:
        """Whether ``states`` are this thread's last fused output of adapter ``name`` (or it repeated)."""
        verified = getattr(self._local, "verified", None)  # the decoder's states at the previous step
        if verified is not None and verified[0] == name and verified[1]() is states:
            return True
        fused = getattr(self._local, "fused", None)
        if fused is None or fused[0] != name:
            return False
        if fused[1]() is not states and repeats_of(fused[2], states) is None:
            return False
        self._local.verified = (name, weakref.ref(states))  # later steps: an identity check
        return True

    @property
    def decoded_count(self) -> int:
        """How many decoder calls of this thread read encoder states checked to be fused."""
        return getattr(self._local, "decoded", 0)

    def check_decoder_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook of the decoder: its encoder states must be what the active adapter fused.

        They are when they are this thread's last fused encoder output itself, or its values
        repeated on the batch (``generate``'s beams). Anything else (``encoder_outputs`` computed
        with the adapter disabled, by another adapter or model, or before a later encoder call)
        would decode un-fused states: raises instead.
        """
        name = None if self.disable_adapters else self.active_fusion_name()
        states = argument(module, ENCODER_STATES_ARG, args, kwargs)
        if name is None or self.fusion_modules[name].seq2seq or not isinstance(states, torch.Tensor):
            return
        if not self._fused_by(name, states):
            raise RuntimeError(
                f"Layer fusion adapter {name!r}: the decoder received encoder states that this adapter "
                "did not fuse (encoder_outputs computed with the adapter disabled, by another adapter or "
                "model, or before a later encoder call), so the output would not be fused. Pass input_ids "
                "(generate() runs the encoder), or encoder_outputs of model.get_encoder() run just before "
                "with this adapter."
            )
        self._local.decoded = self.decoded_count + 1

    def _entered(self) -> list[list[int]]:
        """Per open forward of the whole model (innermost last): ``[closed before, closed by nested,
        decoded before]`` (capture and checked-decoder counts of this thread)."""
        entered = getattr(self._local, "entered", None)
        if entered is None:
            entered = self._local.entered = []
        return entered

    def _enter_model(self, module: nn.Module, args: tuple) -> None:
        self._entered().append([self.capture.closed_count, 0, self.decoded_count])

    def _leave_model(self, module: nn.Module, args: tuple, output: object) -> None:
        entered = self._entered()
        if not entered:
            return
        closed_before, closed_nested, decoded_before = entered.pop()
        closed = self.capture.closed_count - closed_before
        if entered:  # a forward nested in another one (a hook calling the model)
            entered[-1][1] += closed
        if output is None or self.disable_adapters:
            return
        name = self.active_fusion_name()
        if name is None or self.fusion_modules[name].seq2seq:  # seq2seq: decoder steps skip the encoder
            return
        own = closed - closed_nested
        if own > 1:  # the container itself runs several times (a shared block group, as in ALBERT)
            warn_shared_blocks(self.located, self.capture.blocks_path, runs=[own])
        if own == 0 and self.decoded_count == decoded_before:  # no encoder run, no decoder on fused states
            raise RuntimeError(
                f"Layer fusion adapter {name!r} did not run in this forward of {type(module).__name__}: the "
                f"hooks on {self.capture._where()} never fired, so the output is not fused. Set the config "
                "field `blocks_path` to the list of blocks the model's forward actually runs."
            )

    # BaseTunerLayer looks for these on a base layer; a fusion layer wraps none.
    @property
    def weight(self) -> torch.Tensor:
        raise AttributeError("A LayerFusionLayer has no base layer and no `weight`.")

    @property
    def bias(self) -> torch.Tensor:
        raise AttributeError("A LayerFusionLayer has no base layer and no `bias`.")

    @property
    def fusion_modules(self) -> nn.ModuleDict:
        return getattr(self, self.adapter_layer_names[0])

    def update_layer(self, adapter_name: str, module: FusionModule, layers: tuple[int, ...]) -> None:
        self.fusion_modules[adapter_name] = module
        self.fused_layers[adapter_name] = layers
        self.hook_read_blocks()

    def read_blocks(self) -> set[int]:
        """The block inputs ``z_i`` (``i < L``) the adapters read: their fused layers, none for a module
        that reads only ``z_L`` (R+n)."""
        return {
            index
            for name, layers in self.fused_layers.items()
            if self.fusion_modules[name].reads_block_states
            for index in layers
            if index < self.located.num_blocks
        }

    def hook_read_blocks(self) -> None:
        """Hook the blocks the adapters read; in eval mode only those, and the last
        (:meth:`~.hooks.BlockCapture.hook_blocks`)."""
        self.capture.hook_blocks(self.read_blocks(), lean=not self.training)

    def train(self, mode: bool = True) -> LayerFusionLayer:
        """Set train or eval mode (as ``nn.Module.train``), and hook the blocks that mode needs: in eval
        mode only those read, in training every one (layer drop)."""
        super().train(mode)
        self.hook_read_blocks()
        return self

    def set_model_hooks(self, adapter_name: str, handles: list[RemovableHandle]) -> None:
        """Own the hooks an adapter's module registered outside the encoder (replacing older ones)."""
        self._remove_model_hooks(adapter_name)
        self.model_hooks[adapter_name] = list(handles)

    def is_active_fn(self, adapter_name: str) -> Callable[[], bool]:
        """A callable telling whether ``adapter_name`` is the active, enabled fusion adapter.

        A :class:`~.hooks.BoundHook` (not a closure): it does not keep this layer alive from the
        hooks that call it (``None``, falsy, once the layer is freed), and a deep copy of the model
        re-binds it to the copy's layer.
        """
        return BoundHook(self.is_active, adapter_name)

    def is_active(self, adapter_name: str) -> bool:
        """Whether ``adapter_name`` is the active, enabled fusion adapter."""
        return not self.disable_adapters and self.active_fusion_name() == adapter_name

    def _remove_model_hooks(self, adapter_name: str) -> None:
        for handle in self.model_hooks.pop(adapter_name, []):
            handle.remove()

    def delete_adapter(self, adapter_name: str) -> None:
        self._remove_model_hooks(adapter_name)
        self.fused_layers.pop(adapter_name, None)
        super().delete_adapter(adapter_name)
        self.hook_read_blocks()

    def _active_fusion_names(self) -> list[str]:
        return [name for name in self.active_adapters if name in self.fusion_modules]

    def active_fusion_name(self) -> Optional[str]:
        active = self._active_fusion_names()
        if len(active) > 1:
            raise ValueError(
                f"Layer fusion cannot combine several active fusion adapters {active}: each replaces the "
                "encoder output. Activate one with `set_adapter(name)`."
            )
        return active[0] if active else None

    def read_positions(self) -> Optional[torch.Tensor]:
        """The ``(batch, seq)`` positions the active fusion module will read in this forward: the
        :func:`fused_positions` mask when the module is token-wise, else ``None`` (every position). The
        capture of a no-grad forward keeps the block states there only (:class:`BlockCapture`)."""
        mask = self.positions
        if mask is None or self.disable_adapters:
            return None
        active = self._active_fusion_names()
        return mask if len(active) == 1 and self.fusion_modules[active[0]].token_wise else None

    def fuse(self, capture: Capture) -> Optional[torch.Tensor]:
        """The hook's callback: the active adapter's fused state, or ``None`` (pass-through)."""
        if self.disable_adapters:
            return None
        name = self.active_fusion_name()
        if name is None:
            return None
        module = self.fusion_modules[name]
        norm, seen = capture.final_norm, capture.normed_last  # pre-norm stacks: F, and F(z_L) as computed
        output_dtype = (capture.states[-1] if seen is None else seen).dtype
        module_dtype = next((p.dtype for p in module.parameters()), capture.states[-1].dtype)
        if module_dtype != capture.states[-1].dtype:  # e.g. fp32 adapter on a bf16 model (masks cast too)
            capture = capture.to(module_dtype)
        if norm is not None and module.seq2seq:
            # A seq2seq method fuses the stream too, but leaves the encoder output as it is: it reads
            # that output as the decoder will, F(z_L), and gives it back.
            states = self.states_read(name, capture)
            reads = replace(capture, states=[*capture.states[:-1], capture.normed_last])
            return module(states, reads).to(output_dtype)
        last = capture.states[-1]  # z_L, the last block's output: (batch, seq, d)
        positions = self.positions if module.token_wise else None
        index = None if positions is None else position_index(positions, last)
        if index is not None:  # fuse only where it is read; z_L elsewhere
            capture = select_positions(capture, index)
        states = self.states_read(name, capture)
        fused = module(states, capture)  # replaces z_L
        if norm is not None:  # the placement rule (fusion.py): F runs on the fused state as it ran on z_L
            # (a mix after F, state_norm="rms_after_norm", is already what the head reads)
            fused, last = fused if module.mixes_after_norm else capture.apply_final_norm(fused), seen
        if index is not None:
            fused = scatter_positions(fused, last, index)
        fused = fused.to(output_dtype)
        if self.watches_decoder and not module.seq2seq:
            self._remember_fused(name, fused)
        return fused

    def states_read(self, name: str, capture: Capture) -> list[torch.Tensor]:
        """The fused states of adapter ``name`` in ``capture`` (none for a module that reads only ``z_L``)."""
        if not self.fusion_modules[name].reads_block_states:
            return []
        return [capture.states[i] for i in self.fused_layers[name]]

    def merge(self, safe_merge: bool = False, adapter_names: Optional[list[str]] = None) -> None:
        """Nothing to merge: the fusion module keeps running (``merge_adapter`` merges the LoRA layers)."""
        return None

    def unmerge(self) -> None:
        return None

    def remove_hooks(self) -> None:
        self.capture.remove()
        for handle in self.root_hooks:
            handle.remove()
        self.root_hooks.clear()
        for adapter_name in list(self.model_hooks):
            self._remove_model_hooks(adapter_name)


def _decoder_of(model: nn.Module) -> Optional[nn.Module]:
    """The decoder of an encoder-decoder ``model`` (``None`` for any other model)."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    try:
        return find_seq2seq_parts(model).decoder
    except ValueError:
        return None


def merge_error() -> NotImplementedError:
    """The one-line refusal of ``merge_and_unload()``, saying what to do instead."""
    return NotImplementedError(
        "merge_and_unload() cannot fold a layer-fusion module into the base weights (it runs on the blocks' "
        "outputs at every forward): call merge_adapter() to merge only the LoRA part in place while the "
        "PeftModel keeps running the fusion, or unload() for the plain base model."
    )


def fusion_layer_of(model: nn.Module, located: Optional[EncoderBlocks] = None) -> Optional[LayerFusionLayer]:
    """The :class:`LayerFusionLayer` attached to ``model``, if any."""
    containers = [located.container] if located is not None else list(model.modules())
    for container in containers:
        layer = container._modules.get(LAYER_NAME)
        if isinstance(layer, LayerFusionLayer):
            return layer
    return None


def active_fusion_module(model: nn.Module) -> Optional[FusionModule]:
    """The fusion module that runs in ``model``'s next forward (``None``: no fusion runs).

    ``None`` when the model has no fusion layer, the adapters are disabled, or the active
    adapter is not a fusion adapter.

    Args:
        model: A ``PeftModel`` with a layer-fusion adapter, or its tuned base model.

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> module = active_fusion_module(get_peft_model(base_model, DWAttConfig()))
        >>> type(module).__name__
        'DWAtt'
    """
    layer = fusion_layer_of(model)
    if layer is None or layer.disable_adapters:
        return None
    name = layer.active_fusion_name()
    return None if name is None else layer.fusion_modules[name]


@contextmanager
def fused_positions(model: nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """Inside the block, token-wise fusion modules of ``model`` run only where ``mask`` is True.

    Args:
        model: A model with a layer-fusion adapter (a ``PeftModel`` or the tuned base model).
            Without one the block does nothing.
        mask: Boolean ``(batch, seq)``, the positions whose fused state is used (e.g.
            ``labels != -100``). Its shape must match the inputs of every forward inside.

    Example:
        >>> with fused_positions(model, labels != -100):
        ...     logits = model(input_ids=ids, attention_mask=attention).logits
        >>> loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        >>> loss.backward()  # the same gradients as a forward that fuses every position
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        described = f"{tuple(mask.shape)} {mask.dtype}" if isinstance(mask, torch.Tensor) else repr(mask)
        raise ValueError(f"mask must be a boolean (batch, seq) tensor, got {described}")
    layer = fusion_layer_of(model)
    if layer is None:
        yield
        return
    previous, layer.positions = layer.positions, mask
    try:
        yield
    finally:
        layer.positions = previous
