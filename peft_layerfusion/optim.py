"""Optimizer parameter groups: the mixing parameters of a fusion at their own learning rate.

A fusion's mixing parameters (layer weights and logits, depth queries and keys, maps: each method's
:meth:`~peft_layerfusion.fusion.FusionModule.mixing_parameters`) are a handful of numbers that decide
which layers the head reads; with the head's learning rate they barely move in a few-shot run.
``mixing_lr_multiplier`` (:class:`~peft_layerfusion.config.DepthMixConfig`) gives them
``lr * multiplier``; :func:`parameter_groups` builds the groups for any ``torch.optim`` optimizer,
and so for transformers' ``Trainer`` (``optimizers=(optimizer, None)``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .layer import fusion_layer_of


def mixing_multipliers(model: nn.Module) -> dict[int, float]:
    """``{id(parameter): multiplier}`` for every mixing parameter of every fusion adapter of ``model``.

    Example:
        >>> from peft_layerfusion import ScalarMixConfig
        >>> model = get_peft_model(base_model, ScalarMixConfig(mixing_lr_multiplier=10.0))
        >>> sorted(set(mixing_multipliers(model).values()))
        [10.0]
    """
    layer = fusion_layer_of(model)
    if layer is None:
        return {}
    return {
        id(parameter): module.mixing_lr_multiplier
        for module in layer.fusion_modules.values()
        for parameter in module.mixing_parameters()
    }


def parameter_groups(model: nn.Module, lr: float, weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """Parameter groups of ``model``'s trainable parameters: ``lr`` for all but the fusion's mixing
    parameters, which get ``lr * mixing_lr_multiplier`` (one group per distinct multiplier).

    Args:
        model: A model with a layer-fusion adapter (a ``PeftModel`` or its tuned base), or any model
            (then one group).
        lr: The base learning rate (the head's, LoRA's).
        weight_decay: Put in every group.

    Returns:
        ``[{"params": [...], "lr": ..., "weight_decay": ...}, ...]``, groups with no parameter left out.

    Example:
        >>> from peft_layerfusion import ScalarMixConfig
        >>> config = ScalarMixConfig.from_preset("layer_mix", mixing_lr_multiplier=100.0)  # LayerMix
        >>> config.modules_to_save = ["classifier"]
        >>> model = get_peft_model(base_model, config)
        >>> optimizer = torch.optim.AdamW(parameter_groups(model, lr=1e-3))
        >>> [group["lr"] for group in optimizer.param_groups]
        [0.001, 0.1]
    """
    multipliers = mixing_multipliers(model)
    grouped: dict[float, list[nn.Parameter]] = {1.0: []}
    for parameter in model.parameters():
        if parameter.requires_grad:
            grouped.setdefault(multipliers.get(id(parameter), 1.0), []).append(parameter)
    return [
        {"params": params, "lr": lr * multiplier, "weight_decay": weight_decay}
        for multiplier, params in grouped.items()
        if params
    ]
