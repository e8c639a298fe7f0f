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

import copy
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Optional, Union

import torch
from peft.tuners.lora import LoraModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.constants import DUMMY_TARGET_MODULES
from peft.utils.integrations import init_empty_weights
from torch import nn
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
)

from .config import LayerFusionConfig, invalid
from .discovery import HEAD_MODULE_NAMES, find_encoder_blocks, hidden_size_of, shares_weights
from .fusion import FusionContext, FusionModule
from .hooks import warn_shared_blocks
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
        # Everything that can fail on a bad config or model is checked before the model is touched.
        context = self._checked_context(model, config, adapter_name)
        snapshot = ModelSnapshot(model)
        try:
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
            layer.watch(model)
        except BaseException:
            self._forget_adapter(model, adapter_name)
            snapshot.restore()
            raise
        if not config.inference_mode:
            warn_if_head_frozen(model, config)

    def _checked_context(
        self, model: nn.Module, config: LayerFusionConfig, adapter_name: str
    ) -> FusionContext:
        """The :class:`FusionContext` for ``config`` on ``model``; raises before anything is changed."""
        module_cls = self.fusion_module_cls
        if module_cls is None:
            raise TypeError(f"{type(self).__name__} names no `fusion_module_cls`: use a method's own tuner.")
        check_task_type(model, config.task_type)
        located = find_encoder_blocks(model, config.blocks_path)
        existing = fusion_layer_of(model)
        if existing is not None and set(self.peft_config) == {adapter_name}:  # not this model's add_adapter
            raise ValueError(
                f"{type(model).__name__} already carries a layer-fusion adapter "
                f"(`{existing.located.container_name}.{LAYER_NAME}`): it was given to `get_peft_model` "
                "before. "
                "Build a fresh base model, or add another adapter to the existing PeftModel with "
                "`add_adapter(name, config)`; `unload()` gives the plain base back."
            )
        context = FusionContext(
            model, located, hidden_size_of(model, located), tuple(config.resolve_layers(located.num_blocks))
        )
        module_cls.check_supported(config, context)
        config.starts_at_base(model, context.layers, located.num_blocks, warn=True)  # 'identity' may raise
        if shares_weights(located):
            warn_shared_blocks(located, config.blocks_path)
        return context

    def _forget_adapter(self, model: nn.Module, adapter_name: str) -> None:
        forget_fusion_adapter(model, adapter_name)

    def _attach_fusion(
        self, config: LayerFusionConfig, context: FusionContext, adapter_name: str, low_cpu_mem_usage: bool
    ) -> LayerFusionLayer:
        module_cls = self.fusion_module_cls
        located = context.located
        layer = fusion_layer_of(context.model, located)
        if layer is None:
            layer = LayerFusionLayer(located, self.prefix, config.blocks_path)
            layer.train(located.container.training)
            located.container.add_module(LAYER_NAME, layer)
        on_meta = _device_of(located.container).type == "meta"  # e.g. the parameter audit's model
        if low_cpu_mem_usage or on_meta:  # built on the meta device (no memory); a checkpoint fills it in
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
        """Refused with one line (:func:`~.layer.merge_error`): the fusion module cannot be folded into
        the base weights, and the plain model returned would silently lose it."""
        raise merge_error()

    def merge_adapter(self, adapter_names: Optional[list[str]] = None, safe_merge: bool = False) -> None:
        """Merge the LoRA part of the adapter into the base weights, in place; the fusion keeps running.

        LoRA's layers fold ``B A`` into their base weights (as with any LoRA adapter), so a forward
        no longer runs them; the fusion module stays in the model and fuses as before, so the outputs
        are the unmerged ones up to float rounding. ``unmerge_adapter()`` undoes the merge. An adapter
        without LoRA (no ``target_modules``) has nothing to merge.

        Example:
            >>> from peft_layerfusion import DWAttConfig
            >>> model = get_peft_model(causal_lm, DWAttConfig(target_modules=["q_proj", "v_proj"]))
            >>> model.merge_adapter()  # q_proj and v_proj carry B A; DWAtt still fuses
        """
        super().merge_adapter(adapter_names=adapter_names, safe_merge=safe_merge)

    def add_weighted_adapter(self, *args: Any, **kwargs: Any) -> None:
        """Refused: a weighted combination of fusion adapters is not defined.

        LoRA's version would create a "combined" adapter whose fusion module is a fresh random
        init (only LoRA weights are combined).
        """
        raise NotImplementedError(
            "add_weighted_adapter cannot combine layer-fusion adapters: a fusion module (DWAtt, Concat, ...) "
            "has no weighted sum with another, and the combined adapter would get a fresh random fusion. "
            "Train one adapter on the combined task, or switch between adapters with `set_adapter(name)`."
        )

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
    def _remap_adapter_state_dict_for_load(
        cls,
        model: nn.Module,
        config: LayerFusionConfig,
        adapter_name: str,
        state_dict: dict[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """peft's remapping, of the tensors as this version names and lays them out (:func:`upgraded_key`:
        an adapter saved by an earlier version)."""
        upgraded = {}
        for key, tensor in state_dict.items():
            key, convert = upgraded_key(key, cls, type(config))
            upgraded[key] = tensor if convert is None else convert(tensor)
        return super()._remap_adapter_state_dict_for_load(model, config, adapter_name, upgraded)

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        # `...layer_fusion.dwatt_fusion.<adapter>.query_mlp.up.weight`: the adapter name sits in
        # the middle of a fusion key, where peft's default (last or second-to-last) misses it. The
        # key starts with `layer_fusion.` when the container is the model itself (a bare decoder).
        pattern = rf"((?:^|\.){LAYER_NAME}\.[A-Za-z0-9_]*{FUSION_SUFFIX})\.{re.escape(adapter_name)}(\.|$)"
        new_key, found = re.subn(pattern, r"\1\2", key, count=1)
        return new_key if found else super()._remove_adapter_name_from_key(key, adapter_name)


def upgraded_key(
    key: str, tuner_cls: type[LayerFusionModel], config_cls: type[LayerFusionConfig]
) -> tuple[str, Optional[Callable[[torch.Tensor], torch.Tensor]]]:
    """A key of a saved adapter as this version names it, and what makes its tensor this version's
    layout (``None``: kept as it is).

    A key under a former PEFT type's fusion module (``layer_fusion.layer_mix_fusion.``: the config's
    ``FORMER_PEFT_TYPES``) moves under this tuner's (``layer_fusion.scalar_mix_fusion.``); a fusion
    tensor then goes through its module's :meth:`~.fusion.FusionModule.upgrade_saved` (DWAtt's MLP
    weights, saved ``(K, in, out)`` by earlier versions, are transposed).

    Example:
        >>> from peft_layerfusion import ScalarMixConfig, ScalarMixModel
        >>> upgraded_key("model.layer_fusion.layer_mix_fusion.gamma", ScalarMixModel, ScalarMixConfig)
        ('model.layer_fusion.scalar_mix_fusion.gamma', None)
    """
    own = f"{LAYER_NAME}.{tuner_cls.prefix}{FUSION_SUFFIX}."
    for peft_type in config_cls.FORMER_PEFT_TYPES:
        key = key.replace(f"{LAYER_NAME}.{peft_type.lower()}_{FUSION_SUFFIX}.", own)
    head, found, name = key.partition(own)
    if not found or tuner_cls.fusion_module_cls is None:
        return key, None
    name, convert = tuner_cls.fusion_module_cls.upgrade_saved(name)
    return head + own + name, convert


def forget_fusion_adapter(model: nn.Module, adapter_name: str) -> None:
    """Undo what a failed injection or load of ``adapter_name`` registered outside the module tree.

    The hooks its fusion module put on the model, the fusion layer's records of it, and, where the
    layer held no other adapter (it was new), every hook of the layer. The module tree itself is put
    back by :class:`ModelSnapshot`.

    Example:
        >>> forget_fusion_adapter(model, "default")
    """
    for layer in [m for m in model.modules() if isinstance(m, LayerFusionLayer)]:
        layer._remove_model_hooks(adapter_name)
        layer.fused_layers.pop(adapter_name, None)
        if not layer.fused_layers:  # the layer was new: all its hooks go
            layer.remove_hooks()


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


class ModelSnapshot:
    """What an injection may change in a model, to put it back if the injection fails.

    Kept: every module's children (LoRA layers, ``modules_to_save`` wrappers and the fusion layer
    replace or add children), its parameters (the objects: a loader may swap in new ones), its
    forward hooks, every parameter's ``requires_grad``, the attributes of the root (e.g. a wrapped
    ``generate``), and the active adapters of the tuner layers already there.

    Example:
        >>> snapshot = ModelSnapshot(base_model)
        >>> base_model.classifier = nn.Linear(32, 2)  # an injection that replaced a child, then failed
        >>> snapshot.restore()
        >>> base_model.classifier.out_features  # the head as it was
        5
    """

    _HOOK_DICTS = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_always_called",
    )

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = [
            (module, dict(module._modules), {name: set(getattr(module, name)) for name in self._HOOK_DICTS})
            for module in model.modules()
        ]
        self.parameters = [(module, dict(module._parameters)) for module in model.modules()]
        self.requires_grad = [(param, param.requires_grad) for param in model.parameters()]
        self.root_attributes = set(model.__dict__)
        self.active = [  # tuner layers already there: which adapters they run
            (module, copy.copy(module._active_adapter))
            for module in model.modules()
            if isinstance(module, BaseTunerLayer) and "_active_adapter" in module.__dict__
        ]

    def restore(self) -> None:
        """Put children, parameters, hooks, ``requires_grad`` and root attributes back as they were."""
        for module, parameters in self.parameters:  # a loader may have put new Parameter objects in
            module._parameters.clear()
            module._parameters.update(parameters)
        for module, children, hooks in self.modules:
            module._modules.clear()
            module._modules.update(children)
            for name, keys in hooks.items():
                registered = getattr(module, name)
                for key in [k for k in registered if k not in keys]:
                    del registered[key]
        for param, requires_grad in self.requires_grad:
            param.requires_grad_(requires_grad)
        for name in set(self.model.__dict__) - self.root_attributes:
            del self.model.__dict__[name]
        for module, active in self.active:
            module._active_adapter = active


def warn_if_head_frozen(model: nn.Module, config: LayerFusionConfig) -> None:
    """Warn when no parameter of the task head trains (no ``task_type``, head not in ``modules_to_save``).

    The head is found generically: the children of ``model`` outside its backbone
    (``model.<base_model_prefix>``), or, without one, the children named like a head
    (``classifier``, ``lm_head``, ``qa_outputs``, ``score``...). Parameters tied to the rest of
    the model (an output embedding tied to the input one) do not count; encoder-decoder models
    (whose LM head usually stays frozen on purpose) are not checked.

    Example:
        >>> import warnings
        >>> from peft_layerfusion import DWAttConfig
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_if_head_frozen(base_model.requires_grad_(False), DWAttConfig())
        >>> "classifier" in str(caught[0].message)
        True
    """
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return  # a seq2seq LM head (tied or not) usually stays frozen under PEFT, on purpose
    if callable(getattr(model, "can_generate", None)) and model.can_generate():
        return  # so does a causal LM's vocabulary head (as with LoRA)
    heads = _head_modules(model)
    head_names = {name for name, _ in heads}
    backbone_params = {  # everything outside the head: a head weight tied to it does not count
        id(p) for name, child in model.named_children() if name not in head_names for p in child.parameters()
    }
    own = {name: [p for p in module.parameters() if id(p) not in backbone_params] for name, module in heads}
    own = {name: params for name, params in own.items() if params}
    if not own or any(p.requires_grad for params in own.values() for p in params):
        return
    to_save = [*(config.modules_to_save or []), *TASK_HEAD_MODULES.get(str(config.task_type), ())]
    if any(name == m or name.endswith("." + m) for name in own for m in to_save):
        return  # peft wraps it after the injection (task_type)
    warnings.warn(
        f"Layer fusion: no parameter of the task head {sorted(own)} trains: it keeps its random or "
        'pretrained weights. Set `task_type` (e.g. task_type="TOKEN_CLS") or '
        f"`modules_to_save={sorted(own)}` in the config to train it.",
        UserWarning,
        stacklevel=4,
    )


# The transformers classes of each peft task type that reads a head (by model type: a class name, or several).
TASK_MODEL_CLASSES: dict[str, Mapping[str, Union[str, tuple[str, ...]]]] = {
    "SEQ_CLS": MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "TOKEN_CLS": MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    "QUESTION_ANS": MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    "CAUSAL_LM": MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    "SEQ_2_SEQ_LM": MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
}


def check_task_type(model: nn.Module, task_type: object) -> None:
    """Refuse a ``task_type`` whose head ``model`` does not have, in one line (``SEQ_CLS`` on a causal LM:
    peft would look for a classifier to train and save, and the model would still answer with its own head).

    A transformers task model (its class, or a base class, in :data:`TASK_MODEL_CLASSES`) takes the task
    types of its classes, ``FEATURE_EXTRACTION`` and ``None``; any other model takes every task type.

    Raises:
        ValueError: naming the task type, the task types the model takes and its class.

    Example:
        >>> check_task_type(causal_lm, "SEQ_CLS")
        Traceback (most recent call last):
        ...
        ValueError: `task_type`='SEQ_CLS' is not allowed: expected one of ['CAUSAL_LM',
        'FEATURE_EXTRACTION'] or None for a LlamaForCausalLM.
    """
    task = getattr(task_type, "value", task_type)
    names = {klass.__name__ for klass in type(model).__mro__}
    fits = [
        kind
        for kind, classes in TASK_MODEL_CLASSES.items()
        if any(names & ({value} if isinstance(value, str) else set(value)) for value in classes.values())
    ]
    if task is not None and task != "FEATURE_EXTRACTION" and fits and task not in fits:
        allowed = f"one of {[*fits, 'FEATURE_EXTRACTION']} or None for a {type(model).__name__}"
        raise invalid("task_type", task, allowed)


# The head modules peft's PeftModelFor<task> adds to `modules_to_save` after the injection.
TASK_HEAD_MODULES: dict[str, tuple[str, ...]] = {
    "SEQ_CLS": ("classifier", "score"),
    "TOKEN_CLS": ("classifier", "score"),
    "QUESTION_ANS": ("qa_outputs",),
}


def _backbone_of(model: nn.Module) -> Optional[nn.Module]:
    """``model.<base_model_prefix>`` (``model.bert``), if the model has a separate backbone."""
    prefix = getattr(model, "base_model_prefix", None)
    backbone = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    return backbone if isinstance(backbone, nn.Module) and backbone is not model else None


def _head_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of ``model`` outside its backbone, or (without one) those named like a head."""
    backbone = _backbone_of(model)
    if backbone is not None:
        return [(name, child) for name, child in model.named_children() if child is not backbone]
    return [(name, child) for name, child in model.named_children() if name in HEAD_MODULE_NAMES]


def _device_of(module: nn.Module) -> torch.device:
    tensor = next(module.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")
