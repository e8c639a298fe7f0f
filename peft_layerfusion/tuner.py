"""The PEFT tuner: attaches a fusion module (and optionally LoRA) to a model.

``get_peft_model(model, DWAttConfig())`` builds a :class:`LayerFusionModel`. Its
``inject_adapter``

1. finds the encoder blocks (``discovery``),
2. adds one :class:`LayerFusionLayer` as a child of the blocks' container
   (``<container>.layer_fusion``); the layer owns the hooks (``hooks.BlockCapture``) and
   one fusion module per adapter name (``<prefix>fusion[adapter]``),
3. lets LoRA's own machinery inject LoRA layers where ``target_modules`` says (nothing
   when it is empty), mark what trains, and wrap ``modules_to_save``.

Because the fusion layer is a ``BaseTunerLayer`` inside the model, peft's own
``set_adapter``, ``delete_adapter``, ``disable_adapter``, dtype casting, saving and loading
treat it like any LoRA layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Optional

import torch
from peft.tuners.lora import LoraModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.constants import DUMMY_TARGET_MODULES
from peft.utils.integrations import init_empty_weights
from torch import nn
from torch.utils.hooks import RemovableHandle

from .config import LayerFusionConfig
from .discovery import EncoderBlocks, find_encoder_blocks, hidden_size_of
from .fusion import FusionContext, FusionModule
from .hooks import BlockCapture, Capture
from .positions import position_index, scatter_positions, select_positions

LAYER_NAME = "layer_fusion"  # attribute of the container holding the LayerFusionLayer
FUSION_SUFFIX = "fusion"  # the per-adapter ModuleDict is named f"{prefix}{FUSION_SUFFIX}"


class LayerFusionLayer(nn.Module, BaseTunerLayer):
    """The tuner layer: hooks on the encoder plus one fusion module per adapter.

    Args:
        located: The encoder blocks and their container.
        prefix: The PEFT method's prefix (names the ModuleDict of fusion modules).
    """

    other_param_names: tuple[str, ...] = ()

    def __init__(self, located: EncoderBlocks, prefix: str) -> None:
        nn.Module.__init__(self)
        self.adapter_layer_names = (f"{prefix}{FUSION_SUFFIX}",)
        self.add_module(self.adapter_layer_names[0], nn.ModuleDict())
        self.fused_layers: dict[str, tuple[int, ...]] = {}
        self._active_adapter: list[str] = []
        self.merged_adapters: list[str] = []
        self.located = located
        self.capture = BlockCapture(located, self.fuse)
        self.model_hooks: dict[str, list[RemovableHandle]] = {}  # per adapter, outside the encoder
        self.positions: Optional[torch.Tensor] = None  # (batch, seq) bool, set by positions.fused_positions

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

    def set_model_hooks(self, adapter_name: str, handles: list[RemovableHandle]) -> None:
        """Own the hooks an adapter's module registered outside the encoder (replacing older ones)."""
        self._remove_model_hooks(adapter_name)
        self.model_hooks[adapter_name] = list(handles)

    def is_active_fn(self, adapter_name: str) -> Callable[[], bool]:
        """A callable telling whether ``adapter_name`` is the active, enabled fusion adapter."""
        return lambda: not self.disable_adapters and self._active_fusion() == adapter_name

    def _remove_model_hooks(self, adapter_name: str) -> None:
        for handle in self.model_hooks.pop(adapter_name, []):
            handle.remove()

    def delete_adapter(self, adapter_name: str) -> None:
        self._remove_model_hooks(adapter_name)
        super().delete_adapter(adapter_name)

    def _active_fusion(self) -> Optional[str]:
        active = [name for name in self.active_adapters if name in self.fusion_modules]
        if len(active) > 1:
            raise ValueError(
                f"Layer fusion cannot combine several active fusion adapters {active}: each replaces the "
                "encoder output. Activate one with `set_adapter(name)`."
            )
        return active[0] if active else None

    def fuse(self, capture: Capture) -> Optional[torch.Tensor]:
        """The hook's callback: the active adapter's fused state, or ``None`` (pass-through)."""
        if self.disable_adapters:
            return None
        name = self._active_fusion()
        if name is None:
            return None
        module = self.fusion_modules[name]
        output_dtype = capture.states[-1].dtype
        module_dtype = next((p.dtype for p in module.parameters()), output_dtype)
        if module_dtype != output_dtype:  # e.g. fp32 adapter on a bf16 model (masks cast too)
            capture = capture.to(module_dtype)
        last = capture.states[-1]  # z_L: (batch, seq, d)
        positions = self.positions if module.token_wise else None
        index = None if positions is None else position_index(positions, last)
        if index is not None:  # fuse only where it is read; z_L elsewhere
            capture = select_positions(capture, index)
        states = [capture.states[i] for i in self.fused_layers[name]]
        fused = module(states, capture)
        if index is not None:
            fused = scatter_positions(fused, last, index)
        return fused.to(output_dtype)

    def merge(self, safe_merge: bool = False, adapter_names: Optional[list[str]] = None) -> None:
        raise merge_error()

    def unmerge(self) -> None:
        return None

    def remove_hooks(self) -> None:
        self.capture.remove()
        for adapter_name in list(self.model_hooks):
            self._remove_model_hooks(adapter_name)


def merge_error() -> NotImplementedError:
    return NotImplementedError(
        "A layer-fusion module reads every block's output and cannot be folded into the base weights. "
        "Use `unload()` to get the base model back, or keep the PeftModel for inference."
    )


class LayerFusionModel(LoraModel):
    """Tuner shared by every fusion method; one subclass per PEFT type fixes ``prefix``.

    Args:
        model: The model to adapt.
        config: A :class:`LayerFusionConfig` subclass (or a dict of them).
        adapter_name: Name of the adapter, ``"default"`` by default.

    Example:
        >>> import peft_layerfusion
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, peft_layerfusion.DWAttConfig())
    """

    prefix: str = "layerfusion_"
    tuner_layer_cls = BaseTunerLayer  # our fusion layer and LoRA's layers alike

    # ---------------------------------------------------------------- injection
    def inject_adapter(
        self,
        model: nn.Module,
        adapter_name: str,
        autocast_adapter_dtype: bool = True,
        low_cpu_mem_usage: bool = False,
        state_dict: Optional[dict[str, torch.Tensor]] = None,
    ) -> None:
        config = self.peft_config[adapter_name]
        if not isinstance(config, LayerFusionConfig):
            raise TypeError(f"{type(self).__name__} needs a LayerFusionConfig, got {type(config).__name__}.")
        # Everything that can fail on a bad config is checked before the model is touched.
        located = find_encoder_blocks(model, config.blocks_path)
        context = FusionContext(
            model, located, hidden_size_of(model, located), tuple(config.resolve_layers(located.num_blocks))
        )
        # LoRA layers, trainability of the base, modules_to_save. The fusion layer is added
        # afterwards so that peft treats this first injection as the first adapter.
        inject_lora(
            self,
            model,
            adapter_name,
            autocast_adapter_dtype=autocast_adapter_dtype,
            low_cpu_mem_usage=low_cpu_mem_usage,
            state_dict=state_dict,
        )
        layer = self._attach_fusion(config, context, adapter_name, low_cpu_mem_usage)
        layer.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    def _attach_fusion(
        self, config: LayerFusionConfig, context: FusionContext, adapter_name: str, low_cpu_mem_usage: bool
    ) -> LayerFusionLayer:
        from .registration import fusion_module_class

        located = context.located
        layer = fusion_layer_of(context.model, located)
        if layer is None:
            layer = LayerFusionLayer(located, self.prefix).train(located.container.training)
            located.container.add_module(LAYER_NAME, layer)
        if low_cpu_mem_usage:  # built on the meta device; the checkpoint fills it in
            with init_empty_weights(include_buffers=True):
                module = fusion_module_class(config)(config, context)
        else:
            module = fusion_module_class(config)(config, context)
            # under peft's own init_empty_weights (from_pretrained(low_cpu_mem_usage=True)) the
            # parameters are on the meta device until the checkpoint is assigned: leave them there
            if not any(p.is_meta for p in module.parameters()):
                module = module.to(_device_of(located.container))
        module.train(located.container.training)  # a new module follows the model's train/eval mode
        layer.update_layer(adapter_name, module, context.layers)
        hooks = module.register_model_hooks(context.model, layer.is_active_fn(adapter_name))
        layer.set_model_hooks(adapter_name, hooks)
        return layer

    # ---------------------------------------------------------------- lifecycle
    def merge_and_unload(self, *args: Any, **kwargs: Any) -> nn.Module:
        raise merge_error()

    def merge_adapter(self, *args: Any, **kwargs: Any) -> None:
        raise merge_error()

    def unload(self) -> nn.Module:
        """Remove every hook and fusion module (and LoRA layers); return the base model."""
        self._remove_fusion_layers()
        return super().unload()

    def _remove_fusion_layers(self) -> None:
        for name, module in list(self.model.named_modules()):
            if isinstance(module, LayerFusionLayer):
                module.remove_hooks()
                parent = self.model.get_submodule(name.rpartition(".")[0]) if "." in name else self.model
                delattr(parent, name.rpartition(".")[2])

    # ---------------------------------------------------------------- state dict keys
    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        # `...layer_fusion.dwatt_fusion.<adapter>.query_mlp.up_weight`: the adapter name sits in
        # the middle of a fusion key, where peft's default (last or second-to-last) misses it.
        pattern = rf"(\.{LAYER_NAME}\.[A-Za-z0-9_]*{FUSION_SUFFIX})\.{re.escape(adapter_name)}(\.|$)"
        new_key, found = re.subn(pattern, r"\1\2", key, count=1)
        return new_key if found else super()._remove_adapter_name_from_key(key, adapter_name)


def inject_lora(tuner: LoraModel, model: nn.Module, adapter_name: str, **kwargs: Any) -> None:
    """Run LoRA's ``inject_adapter`` for ``tuner``; empty ``target_modules`` injects no LoRA layer.

    LoRA's machinery still freezes the base, makes biases trainable per ``bias`` and wraps
    ``modules_to_save``: with no targets, peft's dummy target lets it match nothing.

    Args:
        tuner: A tuner deriving from ``LoraModel`` whose ``peft_config[adapter_name]`` is set.
        model: The model being adapted.
        adapter_name: The adapter to inject.
        **kwargs: Passed on to ``LoraModel.inject_adapter``.
    """
    config = tuner.peft_config[adapter_name]
    targets = config.target_modules
    if not targets:
        config.target_modules = DUMMY_TARGET_MODULES  # LoRA matches nothing, on purpose
    try:
        LoraModel.inject_adapter(tuner, model, adapter_name, **kwargs)
    finally:
        config.target_modules = targets


def fusion_layer_of(model: nn.Module, located: Optional[EncoderBlocks] = None) -> Optional[LayerFusionLayer]:
    """The :class:`LayerFusionLayer` attached to ``model``, if any."""
    containers = [located.container] if located is not None else list(model.modules())
    for container in containers:
        layer = container._modules.get(LAYER_NAME)
        if isinstance(layer, LayerFusionLayer):
            return layer
    return None


def _device_of(module: nn.Module) -> torch.device:
    tensor = next(module.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")
