"""What the tasks' models share: load a pretrained model with a new head drawn from a seed, apply a
method and regime, the head modules, checks before a run, train modes (each task's own model is in its
folder: NER's token classifiers in :mod:`layerfusion_recipes.ner.models`).

Method and regime names and :func:`apply_regime` come from ``peft_layerfusion.comparison.regimes``
(methods ``none`` (plain last-layer head), ``dwatt``, ``concat``, ``average``, ``scalar_mix``,
``extra_layers``; regimes ``fe``, ``ft``, ``lora``, ``bitfit``). The NER recipe also trains the
AdapterHub bottleneck adapters ``adapter_seqbn`` and ``adapter_double_seqbn`` (method ``none``
only; the optional ``adapters`` package, on transformers 4.57.x), sized by the method option
``adapter_reduction_factor`` (:data:`ADAPTER_OPTIONS`); :func:`check_adapter_grid` refuses what
they cannot train before any run.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig

from peft_layerfusion.comparison import regimes
from peft_layerfusion.comparison.adapters_baseline import (
    SPEC_ATTR,
    adapter_parameter_count,
    require_adapters,
)
from peft_layerfusion.layer import LayerFusionLayer
from peft_layerfusion.names import ADAPTER_REGIME_NAMES, METHOD_NAMES, PLAIN_HEAD, REGIME_NAMES
from peft_layerfusion.registration import ENCODER_METHODS

from ..errors import UserError
from ..options.locations import check_model_path

# The methods sized to a parameter budget (DWAtt, Concat, R+n: the paper's comparison; no variant of
# them, such as Scaled DWAtt), registry order.
BUDGET_METHOD_NAMES: tuple[str, ...] = tuple(
    m.name for m in ENCODER_METHODS if m.module_cls.sized_to_budget and m.variant_of is None
)
# Method options of the AdapterHub regimes -> the keyword of `apply_regime` each one becomes.
ADAPTER_OPTIONS: dict[str, str] = {"adapter_reduction_factor": "reduction_factor"}
# What transformers 5 warns each time peft 0.21's `PeftModel.__init__` reads the model's
# `is_gradient_checkpointing` (deprecated alias of `is_activation_checkpointing`, same value).
PEFT_ALIAS_WARNING = r"`is_gradient_checkpointing` is deprecated"


@contextmanager
def peft_alias_quiet() -> Iterator[None]:
    """Inside, the one warning of :data:`PEFT_ALIAS_WARNING` is not shown; every other warning is.

    Every ``get_peft_model`` / ``PeftModel`` of a transformers 5 model triggers it: peft's own
    ``PeftModel.__init__`` reads the deprecated alias (``getattr(model, "is_gradient_checkpointing",
    True)``), not the recipes nor the user, so a user of the command can do nothing about it. The
    recipes build their PEFT models inside this block (:func:`apply_regime`, the seq2seq methods,
    the audit).

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> with peft_alias_quiet():
        ...     model = get_peft_model(base_model, DWAttConfig())
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_ALIAS_WARNING, category=FutureWarning)
        yield


def apply_regime(model: nn.Module, method: str, regime: str, **kwargs: Any) -> nn.Module:
    """:func:`peft_layerfusion.comparison.regimes.apply_regime` inside :func:`peft_alias_quiet`.

    Example:
        >>> peft_model = apply_regime(base_model, "dwatt", "fe", head_modules=("classifier",))
        >>> type(peft_model).__name__
        'PeftModel'
    """
    with peft_alias_quiet():
        return regimes.apply_regime(model, method, regime, **kwargs)


def load_pretrained(auto_class: type, model_name: str, seed: int, **kwargs) -> nn.Module:
    """``auto_class.from_pretrained`` with new weights (e.g. a head) drawn from ``seed``, quietly.

    The "newly initialized" report and progress bars are silenced: a fresh head is expected here. A
    local folder gone since the command started is said in one line (``check_model_path``), not as a Hub
    name that is not one.

    Example:
        >>> from transformers import AutoModelForMaskedLM
        >>> model = load_pretrained(AutoModelForMaskedLM, model_path, seed=0)  # the MLM head is new: seeded
        >>> type(model).__name__
        'BertForMaskedLM'
    """
    from transformers.utils import logging

    check_model_path(model_name)
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


def head_module_names(model: nn.Module) -> tuple[str, ...]:
    """The top-level modules of a task model outside its base model that hold weights: its head
    (BERT's and GPT-2's ``classifier``, Llama's ``score``, the NER recipe's
    :class:`~layerfusion_recipes.ner.models.DecoderTokenClassifier`'s ``classifier``).

    Example:
        >>> from transformers import AutoModelForTokenClassification
        >>> head_module_names(model_skeleton(AutoModelForTokenClassification, model_path, num_labels=9))
        ('classifier',)
    """
    prefix = getattr(model, "base_model_prefix", "")
    return tuple(
        name
        for name, child in model.named_children()
        if name != prefix and next(child.parameters(), None) is not None
    )


def model_skeleton(auto_class: type, model_name: str, **config_kwargs: Any) -> nn.Module:
    """The modules of ``auto_class.from_pretrained(model_name)`` on the meta device: its config is
    read, no weight is loaded or allocated (for checks before any run).

    Example:
        >>> from transformers import AutoModelForMaskedLM
        >>> [name for name, _ in model_skeleton(AutoModelForMaskedLM, model_path).named_children()]
        ['bert', 'cls']
    """
    config = AutoConfig.from_pretrained(model_name, **config_kwargs)
    with torch.device("meta"):
        return auto_class.from_config(config)


def position_limit(model: nn.Module, tokenizer: Any) -> int | None:
    """The most tokens one input of ``model`` may hold: its ``max_position_embeddings``, or the
    tokenizer's ``model_max_length`` where that is smaller (RoBERTa's 514 positions hold 512 tokens);
    ``None`` when neither says (relative positions, e.g. T5).

    Example:
        >>> from transformers import AutoModelForMaskedLM
        >>> position_limit(model_skeleton(AutoModelForMaskedLM, model_path), tokenizer)  # the tiny BERT's
        128
    """
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    limits = [limit for limit in limits if isinstance(limit, int) and 0 < limit < 10**9]
    return min(limits) if limits else None


def check_length(option: str, value: int, model: nn.Module, tokenizer: Any) -> None:
    """Raise ``ValueError`` naming ``option`` when ``value`` tokens exceed :func:`position_limit`
    (the embedding lookup would fail mid-run, on the first input that long).

    Example:
        >>> check_length("--max-length", 600, base_model, tokenizer)
        Traceback (most recent call last):
        ValueError: --max-length 600: BertForTokenClassification embeds at most 64 positions; use ...
    """
    limit = position_limit(model, tokenizer)
    if limit is not None and value > limit:
        raise ValueError(
            f"{option} {value}: {type(model).__name__} embeds at most {limit} positions; "
            f"use {option} <= {limit}"
        )


def check_head_modules(model: nn.Module, head_modules: Sequence[str], option: str = "--head-modules") -> None:
    """Raise ``ValueError`` naming ``option`` and the names no module of ``model`` matches.

    peft's ``modules_to_save`` trains every module whose name ends with one of the names and skips a
    name that matches none, silently: that head would stay at its random initialisation (and with the
    plain head under FE nothing would train at all).

    Example:
        >>> check_head_modules(base_model, ["clasifier"])
        Traceback (most recent call last):
        ValueError: --head-modules ['clasifier']: no module of BertForTokenClassification ends with ...
    """
    names = [name for name, _ in model.named_modules() if name]
    missing = [head for head in head_modules if not any(name.endswith(head) for name in names)]
    if missing:
        top = ", ".join(name for name, _ in model.named_children())
        raise ValueError(
            f"{option} {missing}: no module of {type(model).__name__} ends with that name; "
            f"its top-level modules: {top}"
        )


def eval_frozen_subtrees(model: nn.Module) -> nn.Module:
    """``model.train()``, then eval mode for every part of it that does not train.

    * a sub-tree whose parameters are all frozen: eval mode, all of it;
    * a module whose trainable parameters all sit in a layer-fusion layer (the block container the
      fusion is attached to, and the modules above it inside the base model: the frozen encoder of
      the FE regime): eval mode for itself and for its parameter-less children (an embedding dropout
      beside the blocks: GPT-2's ``transformer.drop``, GPT-NeoX's ``emb_dropout``, T5's
      ``encoder.dropout``; a functional dropout or layer drop that reads the container's flag);
      the fusion layer trains;
    * everything else trains, a parameter-less module as its parent does (the head's dropout beside
      the classifier; dropout inside a LoRA layer or a block that trains).

    In the FE regime the frozen encoder's outputs are then deterministic, and identical to a feature
    cache's (filled in eval mode), while the fusion module and the head train; the runs on the
    cache and without it train on the same inputs.

    Example:
        >>> from transformers import GPT2Config, GPT2ForSequenceClassification
        >>> gpt2 = GPT2ForSequenceClassification(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
        >>> model = eval_frozen_subtrees(apply_regime(gpt2, "dwatt", "fe", head_modules=("score",)))
        >>> model.base_model.model.transformer.drop.training, model.base_model.model.score.training
        (False, True)
    """
    model.train()

    def visit(module: nn.Module, parent_trains: bool) -> None:
        params = list(module.parameters())
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            # frozen weights, or none: a parameter-less module (dropout) follows its parent
            module.train(parent_trains and not params)
            return
        trains = isinstance(module, LayerFusionLayer) or not _trains_fusion_only(module, trainable)
        module.training = trains
        for child in module.children():
            visit(child, trains)

    visit(model, True)
    return model


def _trains_fusion_only(module: nn.Module, trainable: Sequence[nn.Parameter]) -> bool:
    """Whether every trainable parameter of ``module`` (``trainable``) is a layer-fusion layer's."""
    layers = [layer for layer in module.modules() if isinstance(layer, LayerFusionLayer)]
    fused = {id(p) for layer in layers for p in layer.parameters()}
    return all(id(p) in fused for p in trainable)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def regime_options(regime: str, method_options: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of :func:`apply_regime` for ``regime`` out of an experiment's ``method_options``.

    An AdapterHub regime takes the :data:`ADAPTER_OPTIONS` (renamed), every other regime the
    rest: one grid can size LoRA (``lora_r``) and the adapters side by side.

    Args:
        regime: A PEFT or AdapterHub regime (:data:`~layerfusion_recipes.ner.models.NER_REGIME_NAMES`).
        method_options: The ``method_options`` of the experiment (YAML ``method_options``).

    Example:
        >>> regime_options("adapter_seqbn", {"lora_r": 114, "adapter_reduction_factor": 1.5})
        {'reduction_factor': 1.5}
        >>> regime_options("lora", {"lora_r": 114, "adapter_reduction_factor": 1.5})
        {'lora_r': 114}
    """
    if regime in ADAPTER_REGIME_NAMES:
        return {ADAPTER_OPTIONS[key]: method_options[key] for key in ADAPTER_OPTIONS if key in method_options}
    return {key: value for key, value in method_options.items() if key not in ADAPTER_OPTIONS}


def check_adapter_grid(
    methods: Sequence[str], regimes: Sequence[str], method_options: Mapping[str, Any]
) -> None:
    """Refuse, before any run, a grid whose AdapterHub regimes cannot train as asked.

    Args:
        methods: The grid's methods (every one pairs with every regime).
        regimes: The grid's regimes.
        method_options: The experiment's method options.

    Raises:
        ValueError: an AdapterHub regime paired with a fusion method; :data:`ADAPTER_OPTIONS` in a
            grid without AdapterHub regimes, or other options in a grid of AdapterHub regimes only
            (nothing would use them); an ``adapter_reduction_factor`` that is not a number > 0.
        UserError: AdapterHub regimes asked for where ``adapters`` cannot be imported: one line
            naming the stack they need (checked last, so the errors above show without it).

    Example:
        >>> check_adapter_grid(["none", "dwatt"], ["adapter_seqbn"], {})
        Traceback (most recent call last):
        ValueError: --methods dwatt with --regimes adapter_seqbn: the AdapterHub regimes ...
    """
    adapter_regimes = [regime for regime in regimes if regime in ADAPTER_REGIME_NAMES]
    fused = [method for method in methods if method != PLAIN_HEAD]
    if adapter_regimes and fused:
        raise ValueError(
            f"--methods {' '.join(fused)} with --regimes {' '.join(adapter_regimes)}: the AdapterHub "
            f"regimes ({', '.join(ADAPTER_REGIME_NAMES)}) train with the method none only (the plain "
            "last-layer head; AdapterHub cannot host a fusion module) and every method of a grid runs "
            f"every regime: put them in a grid of `methods: [none]`, and {', '.join(fused)} in one of "
            f"the regimes {', '.join(REGIME_NAMES)}"
        )
    sizing = [key for key in method_options if key in ADAPTER_OPTIONS]
    if sizing and not adapter_regimes:
        raise ValueError(
            f"method_options {sizing} size the AdapterHub regimes ({', '.join(ADAPTER_REGIME_NAMES)}), "
            "which this grid does not run: add one to its regimes or remove the option"
        )
    others = [key for key in method_options if key not in ADAPTER_OPTIONS]
    if others and adapter_regimes and len(adapter_regimes) == len(regimes):
        raise ValueError(
            f"method_options {others} do not apply to the AdapterHub regimes {adapter_regimes}; "
            f"allowed: {', '.join(ADAPTER_OPTIONS)}"
        )
    factor = method_options.get("adapter_reduction_factor")
    is_number = isinstance(factor, int | float) and not isinstance(factor, bool)
    if factor is not None and not (is_number and factor > 0):
        raise ValueError(
            "method_options adapter_reduction_factor must be a number > 0 (the bottleneck width is "
            f"hidden size // it), got {factor!r}"
        )
    if adapter_regimes:
        try:
            require_adapters()
        except ImportError as error:
            raise UserError(f"--regimes {' '.join(adapter_regimes)}: {error}") from error


def adapter_summary(model: nn.Module) -> dict[str, Any] | None:
    """What an AdapterHub regime made ``model`` train, for its record; ``None`` for other regimes.

    Returns:
        ``{"kind", "reduction_factor", "params"}``: the adapter type (``seqbn``, ``double_seqbn``),
        its reduction factor and its new parameters (the head excluded, as the audit counts them).

    Example:
        >>> adapter_summary(base_model) is None  # no AdapterHub adapters
        True
    """
    spec = getattr(model, SPEC_ATTR, None)
    if spec is None:
        return None
    return {
        "kind": spec["kind"],
        "reduction_factor": spec["reduction_factor"],
        "params": adapter_parameter_count(model),
    }


__all__ = [
    "ADAPTER_OPTIONS",
    "METHOD_NAMES",
    "REGIME_NAMES",
    "adapter_summary",
    "apply_regime",
    "check_adapter_grid",
    "check_head_modules",
    "check_length",
    "eval_frozen_subtrees",
    "head_module_names",
    "load_pretrained",
    "model_skeleton",
    "peft_alias_quiet",
    "position_limit",
    "regime_options",
]
