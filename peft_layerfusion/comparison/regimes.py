"""Training regimes by name: what trains, for every fusion method and for none.

A *method* says how the encoder's layers are fused (``"none"``: the plain last layer goes
to the head); a *regime* says which pretrained weights train next to it:

========  =====================================================================
``fe``    feature extraction: the base is frozen; the fusion module and the head train.
          Without fusion: a frozen encoder with a trainable head
          (``BitFitConfig(bias="none")``).
``ft``    fine-tuning: every weight trains. With fusion: the PeftModel with every base
          weight unfrozen (save it with :func:`.checkpoints.save_trained`, which also writes
          the base weights); without fusion: the plain model.
``lora``  LoRA on the encoder (default targets: the attention query/value linears of
          the model type, from peft's own mapping) + fusion + head, in ONE adapter.
``bitfit`` every bias of the base (``bias="all"``) + fusion + head; without fusion the
          standalone :class:`BitFitConfig`.
========  =====================================================================

AdapterHub bottleneck adapters (``adapter_seqbn``, ``adapter_double_seqbn``, see
:mod:`.adapters_baseline`) are regimes of :func:`apply_regime` for the
method ``"none"`` only; they are not PEFT configs, so :func:`make_config` refuses them.

Example:
    >>> model = apply_regime(base_model, "dwatt", "lora", lora_r=4)
    >>> config = make_config("concat", "bitfit")          # ConcatConfig(bias="all", ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from torch import nn

from ..bitfit import BitFitConfig
from ..config import invalid
from ..names import ADAPTER_REGIME_NAMES, METHOD_NAMES, PLAIN_HEAD, REGIME_NAMES
from ..registration import method_named
from .adapters_baseline import apply_bottleneck_adapters

DEFAULT_LORA_R = 8  # LoRA rank of the regime `lora`

# Query/value linears of encoder types peft's own mapping does not list.
EXTRA_LORA_TARGETS: dict[str, list[str]] = {
    "distilbert": ["q_lin", "v_lin"],
    "mpnet": ["q", "v"],
    "modernbert": ["Wqkv"],
    "camembert": ["query", "value"],
    "mbart": ["q_proj", "v_proj"],
    "marian": ["q_proj", "v_proj"],
}
# Used by `make_config` when no model (type) is known: any module named like a query/value
# linear of a known encoder. `apply_regime` uses the exact list of the model's type instead.
ANY_QUERY_VALUE_PATTERN = r".*\.(query|value|q_lin|v_lin|q|v|q_proj|v_proj|query_proj|value_proj|Wqkv)"


def _check_names(method: str, regime: str, *, adapters_ok: bool = False) -> None:
    if method not in METHOD_NAMES:
        raise invalid("method", method, f"one of {list(METHOD_NAMES)}")
    regimes = REGIME_NAMES + (ADAPTER_REGIME_NAMES if adapters_ok else ())
    if regime in ADAPTER_REGIME_NAMES and not adapters_ok:
        raise invalid(
            "regime", regime, f"one of {list(REGIME_NAMES)} (AdapterHub regimes go through apply_regime)"
        )
    if regime not in regimes:
        raise invalid("regime", regime, f"one of {list(regimes)}")
    if regime in ADAPTER_REGIME_NAMES and method != PLAIN_HEAD:
        raise invalid("method", method, f"'none' with the AdapterHub regime {regime!r}")


def default_lora_targets(model_type: str) -> list[str]:
    """The attention query/value linears LoRA adapts by default for a model type.

    Args:
        model_type: ``config.model_type`` of a transformers model, e.g. ``"roberta"``.

    Example:
        >>> default_lora_targets("bert")
        ['query', 'value']
    """
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type) or EXTRA_LORA_TARGETS.get(
        model_type
    )
    if not targets:
        raise ValueError(
            f"No default LoRA targets are known for model type {model_type!r}: pass `lora_target_modules`."
        )
    return list(targets)


def make_config(
    method: str,
    regime: str,
    *,
    head_modules: Sequence[str] = ("classifier",),
    lora_r: int = DEFAULT_LORA_R,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_target_modules: Sequence[str] | None = None,
    **method_options: Any,
) -> PeftConfig | None:
    """The PEFT config of a method under a regime (``None`` for plain fine-tuning).

    Args:
        method: One of :data:`~peft_layerfusion.names.METHOD_NAMES`.
        regime: One of :data:`~peft_layerfusion.names.REGIME_NAMES`.
        head_modules: The task head's module names (trained and saved in full).
        lora_r, lora_alpha, lora_dropout: LoRA's options (regime ``lora`` only).
        lora_target_modules: LoRA targets; ``None`` means the query/value linears (a name
            pattern covering the known encoders; :func:`apply_regime` uses the model type's
            exact list).
        **method_options: Fields of the method's config (e.g. ``d_pos=16`` for DWAtt).

    Returns:
        The config; ``None`` for ``("none", "ft")`` (train the plain model). For ``ft``
        with a fusion method the config is the ``fe`` one: :func:`apply_regime` unfreezes
        the base.

    Raises:
        ValueError: on an unknown method or regime, or options given to ``"none"``.

    Example:
        >>> make_config("dwatt", "lora", lora_r=4).target_modules
        '.*\\\\.(query|value|...)'
    """
    _check_names(method, regime)
    heads = list(head_modules) or None
    targets = list(lora_target_modules) if lora_target_modules else ANY_QUERY_VALUE_PATTERN
    lora = dict(target_modules=targets, r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout)
    if method == PLAIN_HEAD:
        if method_options:
            raise invalid("method_options", method_options, "no options for method 'none'")
        if regime == "ft":
            return None
        if regime == "lora":
            return LoraConfig(**lora, modules_to_save=heads)
        return BitFitConfig(bias="all" if regime == "bitfit" else "none", modules_to_save=heads)
    options: dict[str, Any] = dict(modules_to_save=heads, **method_options)
    if regime == "lora":
        options.update(lora)
    elif regime == "bitfit":
        options["bias"] = "all"
    return method_named(method).make_config(**options)


def apply_regime(model: nn.Module, method: str, regime: str, **kwargs: Any) -> nn.Module:
    """Make ``model`` train what ``method`` under ``regime`` says (see the module docstring).

    Args:
        model: A transformers model with its task head.
        method: One of :data:`~peft_layerfusion.names.METHOD_NAMES`.
        regime: One of :data:`~peft_layerfusion.names.REGIME_NAMES` or (method ``"none"``)
            :data:`~peft_layerfusion.names.ADAPTER_REGIME_NAMES`.
        **kwargs: As :func:`make_config`; AdapterHub regimes take ``reduction_factor``.

    Returns:
        A ``PeftModel`` (the plain ``model`` for ``("none", "ft")`` and AdapterHub regimes).

    Example:
        >>> peft_model = apply_regime(base_model, "concat", "bitfit")
        >>> any("bias" in n for n in trainable_parameter_names(peft_model))
        True
    """
    _check_names(method, regime, adapters_ok=True)
    if regime in ADAPTER_REGIME_NAMES:
        return apply_bottleneck_adapters(model, regime.removeprefix("adapter_"), **kwargs)
    if regime == "lora" and kwargs.get("lora_target_modules") is None:
        kwargs["lora_target_modules"] = default_lora_targets(model.config.model_type)
    config = make_config(method, regime, **kwargs)
    if config is None:
        model.requires_grad_(True)
        return model
    peft_model = get_peft_model(model, config)
    if regime == "ft":
        unfreeze_base(peft_model)
    return peft_model


def unfreeze_base(peft_model: PeftModel) -> None:
    """Make every weight of a PeftModel train (regime ``ft``), except the frozen copies of
    ``modules_to_save`` (``original_module``), which no forward uses.

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> peft_model = get_peft_model(base_model, DWAttConfig())
        >>> unfreeze_base(peft_model)
        >>> all(param.requires_grad for param in peft_model.parameters())
        True
    """
    for name, param in peft_model.named_parameters():
        param.requires_grad_(".original_module." not in name)


def trainable_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that train (``requires_grad``), in module order.

    Example:
        >>> trainable_parameter_names(apply_regime(base_model, "none", "fe"))
        ['base_model.model.classifier.modules_to_save.default.weight', ...]
    """
    return [name for name, param in model.named_parameters() if param.requires_grad]
