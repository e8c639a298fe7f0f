"""The PEFT tuner: attaches a fusion module (and optionally LoRA) to a model.

``get_peft_model(model, DWAttConfig())`` builds a ``DWAttModel``, the subclass of
:class:`LayerFusionModel` defined next to its module in ``methods/dwatt.py`` (each method
names its ``prefix`` and ``fusion_module_cls``). Its ``inject_adapter``

1. finds the encoder blocks (``discovery``),
2. adds one :class:`~.layer.LayerFusionLayer` as a child of the blocks' container
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
from typing import Any, ClassVar, Optional

import torch
from peft.tuners.lora import LoraModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.constants import DUMMY_TARGET_MODULES
from peft.utils.integrations import init_empty_weights
from torch import nn

from .config import LayerFusionConfig
from .discovery import find_encoder_blocks, hidden_size_of
from .fusion import FusionContext, FusionModule
from .layer import FUSION_SUFFIX, LAYER_NAME, LayerFusionLayer, fusion_layer_of, merge_error


class LayerFusionModel(LoraModel):
    """Tuner shared by every fusion method; one subclass per PEFT type fixes ``prefix`` and
    ``fusion_module_cls`` (e.g. ``methods.dwatt.DWAttModel``).

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
    fusion_module_cls: ClassVar[Optional[type[FusionModule]]] = None  # set by each method's subclass
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
        module_cls = self.fusion_module_cls
        if module_cls is None:
            raise TypeError(f"{type(self).__name__} names no `fusion_module_cls`: use a method's own tuner.")
        located = context.located
        layer = fusion_layer_of(context.model, located)
        if layer is None:
            layer = LayerFusionLayer(located, self.prefix).train(located.container.training)
            located.container.add_module(LAYER_NAME, layer)
        if low_cpu_mem_usage:  # built on the meta device; the checkpoint fills it in
            with init_empty_weights(include_buffers=True):
                module = module_cls(config, context)
        else:
            module = module_cls(config, context)
            # under peft's own init_empty_weights (from_pretrained(low_cpu_mem_usage=True)) the
            # parameters are on the meta device until the checkpoint is assigned: leave them there
            if not any(p.is_meta for p in module.parameters()):
                module = module.to(_device_of(located.container))
        module.train(located.container.training)  # a new module follows the model's train/eval mode
        layer.update_layer(adapter_name, module, context.layers)
        hooks = module.register_model_hooks(context, layer.is_active_fn(adapter_name))
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


def _device_of(module: nn.Module) -> torch.device:
    tensor = next(module.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")
