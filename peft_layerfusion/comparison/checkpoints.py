"""Save and reload a trained model of any method x regime combination, exactly.

A PeftModel is saved with ``save_pretrained`` (fusion, LoRA, biases, head). When pretrained
weights train too (regime ``ft``), every weight of the model is also written to
:data:`FULL_STATE_FILE`. AdapterHub regimes write their adapters and head.

Example:
    >>> from peft_layerfusion.comparison.regimes import apply_regime
    >>> model = apply_regime(base_model, "dwatt", "ft")  # everything trains
    >>> save_trained(model, "out/ft-dwatt")
    >>> again = load_trained(type(base_model)(base_model.config), "out/ft-dwatt")  # onto a fresh base
    >>> torch.equal(again.eval()(ids).logits, model.eval()(ids).logits)
    True
"""

from __future__ import annotations

import os
from typing import Optional

from peft import PeftModel
from safetensors.torch import load_model, save_model
from torch import nn

from ..utils import atomic_write
from . import adapters_baseline

FULL_STATE_FILE = "full_model.safetensors"  # every weight, written by `save_trained` for `ft`


def _trains_base_weights(model: nn.Module) -> bool:
    """True when pretrained weights (not only adapters, biases, heads) train: regime ``ft``."""
    if not isinstance(model, PeftModel):
        return True
    adapter_markers = ("lora_", ".layer_fusion.", ".modules_to_save.")
    return any(
        param.requires_grad and not name.endswith("bias") and not any(m in name for m in adapter_markers)
        for name, param in model.named_parameters()
    )


def save_trained(model: nn.Module, directory: str | os.PathLike) -> None:
    """Save what :func:`load_trained` needs to rebuild exactly this trained model.

    A PeftModel writes its adapter (``save_pretrained``: fusion, LoRA, biases, head). When
    base weights train too (regime ``ft``), every weight of the model is also written to
    ``FULL_STATE_FILE`` (atomically). AdapterHub regimes write their adapters and head
    (:func:`adapters_baseline.save_bottleneck`).

    Args:
        model: What :func:`apply_regime` returned, after training.
        directory: Output directory (created).

    Example:
        >>> save_trained(model, "out/ft-dwatt")
    """
    if hasattr(model, adapters_baseline.SPEC_ATTR):  # AdapterHub regimes
        adapters_baseline.save_bottleneck(model, directory)
        return
    os.makedirs(directory, exist_ok=True)
    if isinstance(model, PeftModel):
        model.save_pretrained(directory)
    if _trains_base_weights(model):
        target = model.get_base_model() if isinstance(model, PeftModel) else model
        atomic_write(os.path.join(directory, FULL_STATE_FILE), lambda path: save_model(target, path))


def load_trained(
    base_model: nn.Module, directory: str | os.PathLike, is_trainable: bool = False
) -> nn.Module:
    """Rebuild a model saved by :func:`save_trained` on a freshly built ``base_model``.

    Args:
        base_model: The same architecture as when saved (weights are overwritten as needed).
        directory: What :func:`save_trained` wrote.
        is_trainable: Load the adapter for further training.

    Raises:
        FileNotFoundError: if ``directory`` does not exist or holds nothing :func:`save_trained`
            writes (no adapter config, no full state, no AdapterHub spec): never the untouched base.

    Example:
        >>> from peft_layerfusion.comparison.regimes import apply_regime
        >>> save_trained(apply_regime(base_model, "concat", "fe"), "out/fe-concat")
        >>> fresh = type(base_model)(base_model.config)  # from_pretrained(name) in real use
        >>> type(load_trained(fresh, "out/fe-concat")).__name__
        'PeftModel'
    """
    expected = ("adapter_config.json", FULL_STATE_FILE, adapters_baseline.SPEC_FILE)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"load_trained: there is no directory {os.fspath(directory)!r}.")
    if not any(os.path.exists(os.path.join(directory, name)) for name in expected):
        raise FileNotFoundError(
            f"load_trained: {os.fspath(directory)!r} holds none of {list(expected)}: it is not a model "
            f"written by save_trained (it contains {sorted(os.listdir(directory))[:10]})."
        )
    if os.path.exists(os.path.join(directory, adapters_baseline.SPEC_FILE)):  # AdapterHub regimes
        return adapters_baseline.load_bottleneck(base_model, directory)
    model: nn.Module = base_model
    if os.path.exists(os.path.join(directory, "adapter_config.json")):
        model = PeftModel.from_pretrained(base_model, directory, is_trainable=is_trainable)
    full_state = os.path.join(directory, FULL_STATE_FILE)
    if os.path.exists(full_state):
        target: Optional[nn.Module] = model.get_base_model() if isinstance(model, PeftModel) else model
        load_model(target, full_state, strict=True)
    return model
