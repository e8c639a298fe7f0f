"""Loading an adapter that fails leaves nothing behind, and says why in one line.

peft's ``PeftModel.load_adapter(path, name)`` first adds the adapter (a freshly initialised
fusion module, its hooks, LoRA layers, copies of ``modules_to_save``), then reads the weights
into it. When reading fails (a file of another model, a truncated or edited file), peft raises
but keeps the adapter registered: ``set_adapter(name)`` would then activate a random fusion
module (a leftover LoRA is a no-op at init; a leftover fusion is not). ``PeftModel.from_pretrained``
likewise leaves the base model it was given carrying hooks and a random fusion.

:func:`install_load_guards` (called by ``registration.register_all``) wraps both once, for this
package's adapter types only:

* ``load_adapter``: a new adapter whose load fails is deleted again (its ``peft_config`` entry,
  fusion module, hooks, LoRA layers and ``modules_to_save`` copies);
* ``from_pretrained``: the base model is put back as it was (children, hooks, ``requires_grad``,
  attributes: :class:`~.model.ModelSnapshot`);
* transformers' own ``model.load_adapter(path)`` (``PeftAdapterMixin``): a new adapter of ours
  whose load fails (a truncated file, weights of another width) is taken out again, the model put
  back as it was (:func:`roll_back_transformers_load`);
* a weights file that lacks the keys of a module in ``modules_to_save`` (peft raises a bare
  ``KeyError``) becomes a ``ValueError`` naming the file, the missing keys and what to do;
* transformers' ``model.load_adapter`` of an adapter saved by an earlier version of this package (a
  former PEFT type, or tensors laid out otherwise) is refused before it starts, in one line naming
  ``PeftModel.from_pretrained``, which converts it (:func:`refuse_earlier_format`).

Example:
    >>> model.save_pretrained("corrupt_adapter")
    >>> _ = open("corrupt_adapter/adapter_model.safetensors", "wb").write(b"not safetensors")
    >>> try:
    ...     model.load_adapter("corrupt_adapter", adapter_name="b")
    ... except Exception as error:
    ...     print(type(error).__name__)
    SafetensorError
    >>> "b" in model.peft_config
    False
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
from peft import PeftModel
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from peft.utils import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME
from peft.utils.other import AuxiliaryTrainingWrapper
from safetensors import safe_open
from torch import nn
from transformers.integrations.peft import PeftAdapterMixin

from .card import is_layerfusion_config
from .config import LayerFusionConfig
from .layer import LayerFusionLayer
from .model import ModelSnapshot, forget_fusion_adapter, upgraded_key

_GUARD_MARK = "_peft_layerfusion_load_guard"


def install_load_guards() -> None:
    """Wrap ``PeftModel.load_adapter`` and ``PeftModel.from_pretrained`` (idempotent)."""
    load_adapter: Callable[..., Any] = PeftModel.load_adapter
    if not getattr(load_adapter, _GUARD_MARK, False):

        @functools.wraps(load_adapter)
        def guarded_load_adapter(self: PeftModel, model_id: str, adapter_name: str, *args: Any, **kw: Any):
            return load_or_roll_back(load_adapter, self, model_id, adapter_name, *args, **kw)

        setattr(guarded_load_adapter, _GUARD_MARK, True)
        PeftModel.load_adapter = guarded_load_adapter
    from_pretrained: Callable[..., PeftModel] = PeftModel.__dict__["from_pretrained"].__func__
    if not getattr(from_pretrained, _GUARD_MARK, False):

        @functools.wraps(from_pretrained)
        def guarded_from_pretrained(cls: type, model: nn.Module, model_id: str, *args: Any, **kwargs: Any):
            snapshot = ModelSnapshot(model)
            try:
                return from_pretrained(cls, model, model_id, *args, **kwargs)
            except Exception:
                restore_if_ours(model, snapshot)
                raise

        setattr(guarded_from_pretrained, _GUARD_MARK, True)
        PeftModel.from_pretrained = classmethod(guarded_from_pretrained)
    transformers_load: Callable[..., Any] = PeftAdapterMixin.load_adapter
    if not getattr(transformers_load, _GUARD_MARK, False):

        @functools.wraps(transformers_load)
        def guarded_transformers_load(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            refuse_earlier_format(args[0] if args else kwargs.get("peft_model_id"))
            snapshot, configs = ModelSnapshot(self), dict(self.__dict__.get("peft_config") or {})
            biases = BiasValues(self)
            try:
                return transformers_load(self, *args, **kwargs)
            except Exception:
                if roll_back_transformers_load(self, snapshot, configs):
                    biases.restore()
                raise

        setattr(guarded_transformers_load, _GUARD_MARK, True)
        PeftAdapterMixin.load_adapter = guarded_transformers_load


def refuse_earlier_format(model_id: str | os.PathLike | None) -> None:
    """Refuse, in one line, an adapter folder an earlier version of this package saved in a form it reads
    no longer: a former PEFT type (``LAYER_MIX``, now a preset of ``SCALAR_MIX``) or tensors this version
    names or lays out otherwise (DWAtt's MLP weights). ``PeftModel.from_pretrained`` converts such an
    adapter as it loads it; transformers' ``model.load_adapter`` reads its tensors by name, so it would
    leave the fusion at its random init. Anything but a local folder of ours passes.

    Raises:
        ValueError: naming the folder, what is of the earlier form, and the load that converts it.
    """
    folder = Path(os.fspath(model_id)) if model_id is not None else None
    if folder is None or not (folder / CONFIG_NAME).is_file():
        return
    peft_type = json.loads((folder / CONFIG_NAME).read_text()).get("peft_type")
    config_cls = PEFT_TYPE_TO_CONFIG_MAPPING.get(peft_type)
    if config_cls is None or not issubclass(config_cls, LayerFusionConfig):
        return
    weights = folder / SAFETENSORS_WEIGHTS_NAME
    keys: list[str] = []
    if weights.is_file():
        with safe_open(weights, framework="pt") as saved:
            keys = list(saved.keys())
    tuner_cls = PEFT_TYPE_TO_TUNER_MAPPING[config_cls.PEFT_TYPE]
    renamed = [key for key in keys if upgraded_key(key, tuner_cls, config_cls) != (key, None)]
    if peft_type == config_cls.PEFT_TYPE and not renamed:
        return
    what = f"PEFT type {peft_type!r}" if peft_type != config_cls.PEFT_TYPE else f"tensors {renamed[:2]}"
    raise ValueError(
        f"The adapter in {folder} was saved by an earlier peft_layerfusion ({what}), which transformers' "
        f"model.load_adapter cannot convert: load it with PeftModel.from_pretrained(model, {str(folder)!r}) "
        "(save_pretrained then stores it as this version does)."
    )


def load_or_roll_back(
    load_adapter: Callable[..., Any], model: PeftModel, model_id: str | os.PathLike, adapter_name: str,
    *args: Any, **kwargs: Any,
) -> Any:  # fmt: skip
    """``load_adapter(model, model_id, adapter_name, ...)``; if it fails, a new adapter of ours is deleted.

    Args:
        load_adapter: peft's own ``PeftModel.load_adapter``.
        model: The PeftModel.
        model_id: Where the adapter is.
        adapter_name: Its name in ``model``.
        *args: Passed on.
        **kwargs: Passed on.

    Raises:
        ValueError: for a weights file without the keys of a module in ``modules_to_save``.
    """
    new = adapter_name not in model.peft_config
    try:
        return load_adapter(model, model_id, adapter_name, *args, **kwargs)
    except Exception as error:
        config = model.peft_config.get(adapter_name)
        if config is None or not is_layerfusion_config(config):
            raise
        keys_error = isinstance(error, KeyError)
        message = _missing_keys_message(model, model_id, adapter_name, kwargs) if keys_error else None
        if new:
            model.delete_adapter(adapter_name)
        if message is not None:
            raise ValueError(message) from error
        raise


def restore_if_ours(model: nn.Module, snapshot: ModelSnapshot) -> None:
    """Put ``model`` back as ``snapshot`` found it if a failed load gave it an adapter of ours."""
    configs = model.__dict__.get("peft_config") if "peft_config" not in snapshot.root_attributes else None
    if isinstance(configs, dict) and any(is_layerfusion_config(c) for c in configs.values()):
        for layer in [m for m in model.modules() if isinstance(m, LayerFusionLayer)]:
            layer.remove_hooks()
        snapshot.restore()


def roll_back_transformers_load(model: nn.Module, snapshot: ModelSnapshot, configs: dict[str, Any]) -> bool:
    """After a failed transformers ``model.load_adapter``: take a new adapter of ours out again.

    transformers injects the adapter (fusion layer, hooks, LoRA layers) before it reads the weights;
    when reading fails the injected adapter would stay, its fresh fusion running in every forward.

    Args:
        model: The transformers model ``load_adapter`` was called on.
        snapshot: The model as it was before the call.
        configs: Its ``peft_config`` entries before the call (empty when it had none).

    Returns:
        Whether an adapter of ours was taken out.
    """
    current = model.__dict__.get("peft_config")
    current = current if isinstance(current, dict) else {}
    new = {name: config for name, config in current.items() if name not in configs}
    if not any(is_layerfusion_config(config) for config in new.values()):
        return False
    for name in new:
        forget_fusion_adapter(model, name)
    snapshot.restore()  # children, hooks, requires_grad; new root attributes (peft_config) go
    if isinstance(model.__dict__.get("peft_config"), dict):  # the model carried adapters before
        for name in new:
            del model.peft_config[name]
    return True


class BiasValues:
    """The values of every bias of a model, to put back after a failed load.

    The only tensors of the base an adapter of ours loads in place are biases (BitFit, or
    ``bias="all"``): transformers reads them one by one, so a load that fails half-way (weights of
    another width: the biases whose shape still fits are read before the first that does not)
    leaves some of them overwritten. Biases are a tiny share of a model's parameters.

    Args:
        model: The model whose biases are kept.

    Example:
        >>> biases = BiasValues(model)
        >>> biases.restore()
    """

    def __init__(self, model: nn.Module) -> None:
        self.values = [
            (param, param.detach().clone())
            for name, param in model.named_parameters()
            if name.rpartition(".")[2] == "bias"
        ]

    def restore(self) -> None:
        """Copy the kept values back into the same parameters."""
        with torch.no_grad():
            for param, value in self.values:
                param.copy_(value)


def _missing_keys_message(
    model: PeftModel, model_id: str | os.PathLike, adapter_name: str, kwargs: dict[str, Any]
) -> Optional[str]:
    """One line naming the weights file, the keys of ``modules_to_save`` it lacks, and what to do."""
    expected = {  # what peft looks up for every modules_to_save wrapper of this adapter
        f"{name}.{key}": name
        for name, module in model.named_modules()
        if isinstance(module, AuxiliaryTrainingWrapper)
        for key in module.adapter_state_dict_load_map(adapter_name)
    }
    path = os.path.join(os.fspath(model_id), kwargs.get("subfolder") or "", SAFETENSORS_WEIGHTS_NAME)
    if not expected or not os.path.isfile(path):
        return None
    with safe_open(path, framework="pt") as weights:
        present = set(weights.keys())
    missing = sorted(key for key in expected if key not in present)
    if not missing:
        return None
    modules = sorted({expected[key].removeprefix("base_model.model.") for key in missing})
    return (
        f"The adapter weights {path} lack the keys {missing} of `modules_to_save` {modules}: the file was "
        f"saved without them or edited. Save the adapter again from the trained model, or drop {modules} "
        "from its adapter_config.json (`modules_to_save`, or the `task_type` that adds a head) to load it "
        "with the base model's own modules."
    )
