"""Parameter audit: how many new parameters each method trains, by component.

The model is built from its config on the meta device (no weights are read or
downloaded), each method is applied under a regime, and its trainable parameters are
counted, excluding the task head (the audited model is the bare encoder, ``AutoModel``).
Components are the top-level parts of the fusion module (``query_mlp``, ``value_mlps``,
``value_norm``, ``key_proj``, ``proj``, ``blocks``...), plus ``lora``, ``bias`` (BitFit) and
``base`` (fine-tuned pretrained weights) where the regime trains them.

At LLM scale the paper's sizes do not fit a PEFT budget (Concat is ``K d^2 + d``, 537M at
Llama-3.1-8B's shape): :func:`lora_sized_report` sizes every method to the new parameters of
a LoRA (rank 16 on the attention projections ``q, k, v, o`` by default) and audits the sized
configs; ``shapes.LLM_SHAPES`` names published LLM shapes that every function here accepts.

The command line (``layerfusion audit``) lives in the recipes.

Example:
    >>> from transformers import RobertaConfig
    >>> roberta_large = RobertaConfig(
    ...     hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ... )
    >>> audit(roberta_large)["dwatt"]["total"]  # the paper's Table 2
    26353152
    >>> lora_sized_report("llama-3.1-8b")["rows"]["concat (map_rank=52)"]["total"]
    13635584
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig

from ..layer import FUSION_SUFFIX, LAYER_NAME
from ..names import ADAPTER_REGIME_NAMES, PLAIN_HEAD
from ..registration import TRAINED_METHODS
from .budget import (
    DEFAULT_TOLERANCE,
    METHOD_SIZERS,
    count_parameters,
    lora_params_per_rank,
    match_bottleneck,
    match_extra_layers,
    match_lora_rank,
    mismatched_pairs,
)
from .regimes import DEFAULT_LORA_R, apply_regime, default_lora_targets
from .shapes import LLM_SHAPES, llm_shape

AUDITED_METHODS: tuple[str, ...] = tuple(method.name for method in TRAINED_METHODS)
# Not sized to a budget, never flagged: the plain head and the methods (nearly) without parameters.
REFERENCE_METHODS: tuple[str, ...] = (
    PLAIN_HEAD,
    *(method.name for method in TRAINED_METHODS if not method.module_cls.sized_to_budget),
)
HEAD_MARKERS = (".modules_to_save.", ".original_module.")
# The LoRA that LLM methods are sized to by default: rank 16 on the attention projections.
LLM_LORA_R = 16
ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


def load_model_config(config_or_path: str | os.PathLike | PretrainedConfig) -> PretrainedConfig:
    """A transformers config from a config object, a config.json path, a directory, a shape name
    of ``shapes.LLM_SHAPES`` (``"llama-3.1-8b"``) or a Hub name.

    A Hub name works only if it is already in the local cache (nothing is downloaded).

    Raises:
        ValueError: if nothing can be read, saying what was tried.

    Example:
        >>> import json
        >>> _ = open("config.json", "w").write(json.dumps({"model_type": "roberta", "hidden_size": 1024}))
        >>> load_model_config("config.json").hidden_size
        1024
        >>> load_model_config("llama-3.1-8b").num_hidden_layers  # a shape name (``shapes.LLM_SHAPES``)
        32
    """
    if isinstance(config_or_path, PretrainedConfig):
        return config_or_path
    source = os.fspath(config_or_path)
    if source in LLM_SHAPES and not os.path.exists(source):
        return llm_shape(source)
    try:
        return AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as error:
        where = "file or directory" if os.path.exists(source) else "Hub name (looked in the local cache only)"
        raise ValueError(
            f"Cannot read a model config from {source!r} as a {where}: {error}. Pass a config.json path, "
            f"a model directory, a shape name ({', '.join(LLM_SHAPES)}) or the name of a model already "
            "in the Hugging Face cache."
        ) from error


# Config fields that size a model (by name): a negative value cannot build one.
SIZE_FIELD_SUFFIXES = ("_size", "_layers", "_heads", "_dim", "_ff")
SIZE_FIELDS = ("dim", "d_model", "d_ff", "d_kv", "n_layer", "n_head", "n_embd", "n_inner")
# ... and these must be positive: the width of the hidden states, the number of blocks.
POSITIVE_FIELDS = (
    *("hidden_size", "d_model", "dim", "n_embd"),
    *("num_hidden_layers", "num_layers", "n_layers", "n_layer"),
)


def check_sizes(config: PretrainedConfig) -> None:
    """Raise a one-line ``ValueError`` for a negative size field, or a width or block count of 0.

    Example:
        >>> from transformers import BertConfig
        >>> check_sizes(BertConfig(hidden_size=-32))
        Traceback (most recent call last):
        ...
        ValueError: `hidden_size`=-32 in the bert config is negative: a size must be >= 0 ...
    """
    for name, value in sorted(config.to_dict().items()):
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if value < 0 and (name in SIZE_FIELDS or name.endswith(SIZE_FIELD_SUFFIXES)):
            raise ValueError(
                f"`{name}`={value} in the {config.model_type} config is negative: a size must be >= 0 "
                "(fix the config.json)."
            )
        if value == 0 and name in POSITIVE_FIELDS:
            raise ValueError(
                f"`{name}`=0 in the {config.model_type} config: the hidden width and the number of blocks "
                "must be positive (fix the config.json)."
            )


def meta_model(config: PretrainedConfig) -> nn.Module:
    """The bare encoder (``AutoModel``) of ``config`` on the meta device: shapes, no memory.

    Raises:
        ValueError: in one line, for a config that cannot build a model (a negative size, a
            width of 0...).

    Example:
        >>> meta_model(load_model_config("llama-3.1-8b")).device
        device(type='meta')
    """
    check_sizes(config)
    try:
        with torch.device("meta"):
            return AutoModel.from_config(config)
    except (RuntimeError, ZeroDivisionError, ValueError) as error:
        detail = (str(error).strip().splitlines() or ["-"])[0]
        reason = f"{type(error).__name__}: {detail}"
        raise ValueError(
            f"Cannot build a {config.model_type} model from this config ({reason}): check its sizes "
            "(hidden_size, num_hidden_layers, num_attention_heads, ...)."
        ) from error


def component_of(name: str) -> str | None:
    """The audit component of a trainable parameter's name (``None`` for the task head).

    Example:
        >>> component_of("base_model.model.encoder.layer_fusion.dwatt_fusion.default.value_norm_weight")
        'value_norm'
    """
    if any(marker in name for marker in HEAD_MARKERS):
        return None
    parts = name.split(".")
    if LAYER_NAME in parts:
        inside = parts[parts.index(LAYER_NAME) + 3 :]  # skip "<prefix>fusion", "<adapter>"
        if parts[parts.index(LAYER_NAME) + 1].endswith(FUSION_SUFFIX) and inside:
            if len(inside) == 1:  # a parameter of the fusion module itself, e.g. value_norm_weight
                return inside[0].removesuffix("_weight").removesuffix("_bias")
            return inside[0]
    if any(part.startswith("lora_") for part in parts):
        return "lora"
    return "bias" if parts[-1] == "bias" else "base"


def trainable_components(model: nn.Module) -> dict[str, int]:
    """Trainable parameters of ``model`` per component (the task head excluded).

    Example:
        >>> from peft_layerfusion.comparison.regimes import apply_regime
        >>> trainable_components(apply_regime(base_model.bert, "concat", "fe", head_modules=()))
        {'proj': 3104}
    """
    counts: dict[str, int] = {}
    for name, param in model.named_parameters():
        component = component_of(name) if param.requires_grad else None
        if component is not None:
            counts[component] = counts.get(component, 0) + param.numel()
    return counts


def _entry(components: dict[str, int], base_params: int, **extra: Any) -> dict[str, Any]:
    total = sum(components.values())
    return {"total": total, "percent_of_base": 100.0 * total / base_params, "components": components, **extra}


def audit(
    config_or_path: str | os.PathLike | PretrainedConfig,
    regime: str = "fe",
    methods: Sequence[str] = AUDITED_METHODS,
    **regime_options: Any,
) -> dict[str, dict[str, Any]]:
    """New trainable parameters (task head excluded) of each method under a regime.

    Args:
        config_or_path: A transformers config, a config.json path, a directory or a cached
            Hub name. The model is built on the meta device.
        regime: One of ``REGIME_NAMES`` (``fe``: only the fusion module's parameters).
        methods: Method names (see ``regimes.METHOD_NAMES``).
        **regime_options: Passed to :func:`regimes.apply_regime` (``lora_r=...``, method options).

    Returns:
        ``{method: {"total": int, "percent_of_base": float, "components": {name: int}}}``.

    Example:
        >>> from transformers import RobertaConfig
        >>> roberta_large = RobertaConfig(
        ...     hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ... )
        >>> audit(roberta_large)["dwatt"]["total"]
        26353152
    """
    config = load_model_config(config_or_path)
    base_params = count_parameters(meta_model(config))
    report = {}
    for method in methods:
        with torch.device("meta"):  # fusion modules too: no memory for Concat's 537M at an LLM's shape
            model = apply_regime(meta_model(config), method, regime, head_modules=(), **regime_options)
        report[method] = _entry(trainable_components(model), base_params)
    return report


def audit_totals(config_or_path: str | os.PathLike | PretrainedConfig) -> dict[str, int]:
    """``{method: new trainable parameters}`` for the five fusion methods (regime ``fe``).

    Example:
        >>> audit_totals(base_model.config)  # a tiny BERT: 3 blocks of width 32
        {'dwatt': 5408, 'concat': 3104, 'average': 0, 'scalar_mix': 4, 'scaled_dwatt': 5408, 'layer_mix': 4,
         'extra_layers': 7504}
    """
    return {method: entry["total"] for method, entry in audit(config_or_path).items()}


def match_report(
    config_or_path: str | os.PathLike | PretrainedConfig,
    regime: str = "fe",
    match: str = "dwatt",
    tolerance: float = DEFAULT_TOLERANCE,
    **regime_options: Any,
) -> dict[str, Any]:
    """Every candidate's trainable parameters next to baselines sized to ``match``'s budget.

    Rows: every fusion method and ``none`` under ``regime``; then, named ``+...``, baselines
    added on top of what the regime trains anyway (the ``none`` row) and sized to the new
    parameters ``match`` adds: LoRA (rank; under ``lora`` the row also names the rank of the one
    LoRA that replaces the regime's and this one, the baseline to train), R+n (``n``), Pfeiffer
    and Houlsby bottleneck adapters (reduction factor; under ``lora`` also the factor of the
    adapters that replace the regime's LoRA, as the recipes' ``adapter_*`` regimes train them).
    Pairs of budget-sized rows (all but ``none``, ``average``, ``scalar_mix``) more than
    ``tolerance`` apart are flagged.

    Returns:
        ``{"target": str, "rows": {name: entry}, "flagged": [(a, b, gap), ...]}``.

    Example:
        >>> report = match_report(base_model.config, "fe", "dwatt")
        >>> report["target"]
        'dwatt'
        >>> report["rows"]["+lora (r=14)"]["total"]  # LoRA's rank that matches DWAtt on this tiny BERT
        5376
    """
    config = load_model_config(config_or_path)
    base = meta_model(config)
    base_params = count_parameters(base)
    rows = audit(config, regime, ("none",) + AUDITED_METHODS, **regime_options)
    if match not in rows:
        raise ValueError(f"`match`={match!r} is not allowed: expected one of {list(rows)}.")
    target = rows[match]["total"]
    # Baselines are sized to the NEW parameters (what `match` adds to the regime) and sit on top
    # of what the regime trains anyway (its LoRA, biases or base weights: the "none" row).
    own = rows["none"]["components"]
    new_params = target - rows["none"]["total"]
    lora = match_lora_rank(base, new_params, default_lora_targets(config.model_type))
    extra = match_extra_layers(base, new_params)
    lora_name = f"+lora (r={lora.value})"
    if regime == "lora":  # one LoRA of the summed rank stands for the regime's LoRA plus this one
        alone = regime_options.get("lora_r", DEFAULT_LORA_R) + lora.value
        lora_name = f"+lora (r={lora.value}; alone: r={alone})"
    matched = {
        lora_name: ("lora", lora),
        f"+extra_layers (n={extra.value})": ("blocks", extra),
    }
    for name in ADAPTER_REGIME_NAMES:
        kind = name.removeprefix("adapter_")
        bottleneck = match_bottleneck(base, new_params, kind)
        label = f"rf={bottleneck.value:.4g}"
        if regime == "lora":  # trained as a regime of its own, the adapter replaces the LoRA too
            label += f"; alone: rf={match_bottleneck(base, target, kind).value:.4g}"
        matched[f"+{name} ({label})"] = ("adapters", bottleneck)
    for name, (component, found) in matched.items():
        components = {**own, component: own.get(component, 0) + found.params}
        rows[name] = _entry(components, base_params, knob=found.knob, value=found.value)
    flagged = _against_target(rows, target, tolerance)
    return {"target": match, "regime": regime, "rows": rows, "flagged": flagged}


def _against_target(
    rows: dict[str, dict[str, Any]], target: int, tolerance: float, unsized: Sequence[str] = ()
) -> list[tuple[str, str, float]]:
    """Add each row's ``vs_target``; the pairs of budget-sized rows (not references, not
    ``unsized``) more than ``tolerance`` apart."""
    for entry in rows.values():
        entry["vs_target"] = (entry["total"] - target) / target if target else 0.0
    skipped = {*REFERENCE_METHODS, *unsized}
    sized = {name: row["total"] for name, row in rows.items() if name not in skipped}
    return mismatched_pairs(sized, tolerance)


def lora_sized_report(
    config_or_path: str | os.PathLike | PretrainedConfig,
    lora_r: int = LLM_LORA_R,
    lora_targets: Sequence[str] = ATTENTION_PROJECTIONS,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[str, Any]:
    """Every fusion method sized to the new parameters of one LoRA, audited (regime ``fe``).

    Rows: the LoRA (the target, ``r * Σ (d_in + d_out)`` over ``lora_targets``); each method
    with a budget knob (``budget.METHOD_SIZERS``) at the knob value closest to the target,
    named with it (``"concat (map_rank=52)"``) and counted by building the sized config on
    the meta device (``formula`` holds the closed-form count, equal to ``total``); the same
    methods at their defaults (``"concat (default)"``); the reference methods (Average,
    ScalarMix) as they are. R+n cannot go below one block, which may be far over the target:
    its ``vs_target`` says so, and the flags list every sized pair more than ``tolerance`` apart.

    Args:
        config_or_path: As :func:`audit` (a shape name such as ``"llama-3.1-8b"`` too).
        lora_r: The LoRA's rank.
        lora_targets: Its ``target_modules`` (default: ``q_proj, k_proj, v_proj, o_proj``).
        tolerance: Flag sized pairs further apart than this.

    Returns:
        ``{"target": int, "rows": {name: entry}, "flagged": [(a, b, gap), ...]}``, each entry as
        :func:`audit`'s plus ``vs_target`` (and ``knob``, ``value``, ``formula`` where sized).

    Example:
        >>> print(format_table(lora_sized_report("gemma-3-270m")["rows"], reference="lora"))
        method                                                   params   % base  vs target  components
        lora (r=16; q_proj, k_proj, v_proj, o_proj)           1,474,560    0.55%      +0.00% lora=1.47M
        dwatt (query_bottleneck_width=58, value_bottleneck_width=58) ...
        ...
    """
    config = load_model_config(config_or_path)
    base = meta_model(config)
    base_params = count_parameters(base)
    target = lora_r * lora_params_per_rank(base, list(lora_targets))
    rows = {f"lora (r={lora_r}; {', '.join(lora_targets)})": _entry({"lora": target}, base_params)}
    defaults = audit(config, "fe", AUDITED_METHODS)
    for method in AUDITED_METHODS:
        if method not in METHOD_SIZERS:  # a reference: Average, ScalarMix
            rows[method] = defaults[method]
            continue
        found = METHOD_SIZERS[method](base, target)
        label = ", ".join(f"{key}={value}" for key, value in found.options.items())
        entry = audit(config, "fe", (method,), **found.options)[method]
        sized = dict(knob=found.knob, value=found.value, formula=found.params)
        rows[f"{method} ({label})"] = {**entry, **sized}
    unsized = [f"{method} (default)" for method in METHOD_SIZERS]
    rows.update({name: defaults[method] for name, method in zip(unsized, METHOD_SIZERS, strict=True)})
    return {"target": target, "rows": rows, "flagged": _against_target(rows, target, tolerance, unsized)}


def _millions(count: int) -> str:
    return f"{count / 1e6:.2f}M" if count >= 10_000 else str(count)


def format_table(rows: dict[str, dict[str, Any]], reference: str | None = None) -> str:
    """A readable table of audit rows (one line per method, components spelled out)."""
    width = max(len(name) for name in rows) + 2
    lines = [
        f"{'method':<{width}}{'params':>12}{'% base':>9}"
        + ("  vs target" if reference else "")
        + "  components"
    ]
    for name, row in rows.items():
        parts = ", ".join(f"{key}={_millions(value)}" for key, value in row["components"].items()) or "-"
        versus = f"{row['vs_target']:>+10.2%} " if reference else ""
        lines.append(f"{name:<{width}}{row['total']:>12,}{row['percent_of_base']:>8.2f}%  {versus}{parts}")
    return "\n".join(lines)
