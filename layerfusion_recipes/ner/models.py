"""The NER recipe's models: a token classifier of any encoder or decoder, its head drawn from a seed.

``AutoModelForTokenClassification`` where transformers has one for the model's type (encoders; decoders
such as Llama, Qwen, Mistral, GPT-2), else a :class:`DecoderTokenClassifier` (a linear head on a
decoder-only model's final states: Gemma 3, OPT). The regimes NER trains are the PEFT ones and the
AdapterHub bottleneck adapters (:data:`NER_REGIME_NAMES`); applying a method and regime, the head
modules and the checks before a run are shared (:mod:`layerfusion_recipes.core.models.models`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

from peft_layerfusion.discovery import is_decoder_only
from peft_layerfusion.names import ADAPTER_REGIME_NAMES, REGIME_NAMES

from ..core.models.models import head_module_names, load_pretrained, model_skeleton

# Every regime the NER recipe trains: the PEFT ones, then AdapterHub's (method "none" only).
NER_REGIME_NAMES: tuple[str, ...] = REGIME_NAMES + ADAPTER_REGIME_NAMES


class DecoderTokenClassifier(nn.Module):
    """A token classifier for a decoder-only model whose type has no ``*ForTokenClassification`` in
    transformers (Gemma 3, OPT): the base model (``AutoModel``, its final norm included), dropout and
    a linear ``classifier`` on every position's final state, ``logits_t = W · dropout(h_t) + b``,
    as transformers' own decoder token heads are built (theirs is named ``score``).

    A left-to-right model's ``h_t`` has read tokens ``0 .. t`` only: a token's label is predicted
    from its left context (with NER's first sub-word labels: the words before it and that sub-word).

    Args:
        backbone: The pretrained decoder without a head (``AutoModel``).
        num_labels: Labels.
        dropout: Dropout before the classifier (as transformers': ``classifier_dropout``, else
            ``hidden_dropout``, else 0.1; :func:`head_dropout`).

    Example:
        >>> from transformers import AutoModel
        >>> model = DecoderTokenClassifier(AutoModel.from_pretrained(gemma_path), num_labels=9)
        >>> words = torch.randint(5, 30, (2, 8))
        >>> model(input_ids=words, attention_mask=torch.ones_like(words)).logits.shape  # (batch, seq, labels)
        torch.Size([2, 8, 9])
    """

    base_model_prefix = "backbone"  # the attribute holding the pretrained model (transformers' name)

    def __init__(self, backbone: nn.Module, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config  # model type, sizes: what peft and the fusion discovery read
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(backbone.config.get_text_config().hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return TokenClassifierOutput(logits=self.classifier(self.dropout(hidden.last_hidden_state)))


def head_dropout(config: Any) -> float:
    """The dropout transformers' decoder token heads use: ``classifier_dropout``, else
    ``hidden_dropout``, else 0.1."""
    for name in ("classifier_dropout", "hidden_dropout"):
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    return 0.1


def has_token_class(config: Any) -> bool:
    """Whether transformers has an ``AutoModelForTokenClassification`` class for ``config``'s type."""
    return config.model_type in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES


def require_decoder(backbone: nn.Module, model_name: str) -> None:
    """Raise a one-line ``ValueError`` unless ``backbone`` is a decoder-only model (the only kind
    :class:`DecoderTokenClassifier` is built for when transformers has no token head)."""
    if not is_decoder_only(backbone):
        raise ValueError(
            f"--model {model_name}: transformers has no token-classification model for its type "
            f"{backbone.config.model_type!r} and it is not a decoder-only model (the recipes put a linear "
            "token head on those); use a model with a *ForTokenClassification class"
        )


def token_classifier_skeleton(model_name: str, num_labels: int) -> nn.Module:
    """The token classifier :func:`load_token_classifier` builds, on the meta device (config only, no
    weights): for checks before any run. Raises the one-line ``ValueError`` of
    :func:`require_decoder` for a model neither kind covers.

    Example:
        >>> token_classifier_skeleton(gemma_path, num_labels=9).classifier  # Gemma 3: no token class
        Linear(in_features=32, out_features=9, bias=True)
    """
    config = AutoConfig.from_pretrained(model_name)
    if has_token_class(config):
        return model_skeleton(AutoModelForTokenClassification, model_name, num_labels=num_labels)
    backbone = model_skeleton(AutoModel, model_name)
    require_decoder(backbone, model_name)
    with torch.device("meta"):
        return DecoderTokenClassifier(backbone, num_labels, head_dropout(config))


def load_backbone(model_name: str, seed: int) -> nn.Module:
    """The pretrained base model of ``model_name``, without a head (``AutoModel``), never silently new.

    A checkpoint saved with its LM head (``*ForCausalLM``) keeps the base model under the name the
    causal LM gives it (``model.``); where transformers names the base model's own prefix otherwise
    (Gemma 3 on transformers 4.x: ``language_model``), ``AutoModel`` loads none of its weights. The
    checkpoint is then loaded as the causal LM and its base model taken out of it; a checkpoint that
    fits neither is refused in one line.

    Example:
        >>> backbone = load_backbone(gemma_path, seed=0)  # Gemma3TextModel with the saved weights
        >>> type(backbone).__name__
        'Gemma3TextModel'
    """
    backbone, info = load_pretrained(AutoModel, model_name, seed, output_loading_info=True)
    if not info["missing_keys"]:
        return backbone
    causal, causal_info = load_pretrained(AutoModelForCausalLM, model_name, seed, output_loading_info=True)
    inner = next((m for m in causal.modules() if type(m) is type(backbone)), None)
    if inner is None or causal_info["missing_keys"]:
        missing = info["missing_keys"]
        raise ValueError(
            f"--model {model_name}: {len(missing)} weights of {type(backbone).__name__} are not in the "
            f"checkpoint (e.g. {missing[0]}); give a checkpoint of the base model or of its causal LM"
        )
    return inner


def load_token_classifier(model_name: str, num_labels: int, seed: int) -> nn.Module:
    """The token classifier of ``model_name`` with a head drawn from ``seed`` (same seed, same head):
    ``AutoModelForTokenClassification`` where transformers has one for its type (encoders; decoders
    such as Llama, Qwen, Mistral, GPT-2), else a :class:`DecoderTokenClassifier` on a decoder-only
    model (Gemma 3, OPT); anything else is refused in one line (:func:`require_decoder`).

    Example:
        >>> model = load_token_classifier(model_path, num_labels=21, seed=0)  # e.g. the demo's MiniLM folder
        >>> model.classifier.out_features
        21
    """
    config = AutoConfig.from_pretrained(model_name)
    if has_token_class(config):
        return load_pretrained(AutoModelForTokenClassification, model_name, seed, num_labels=num_labels)
    backbone = load_backbone(model_name, seed)
    require_decoder(backbone, model_name)
    torch.manual_seed(seed)
    return DecoderTokenClassifier(backbone, num_labels, head_dropout(config))


def default_token_head(model_name: str) -> tuple[str, ...]:
    """The head modules of ``model_name``'s token classifier (:func:`head_module_names` of
    :func:`token_classifier_skeleton`: ``classifier`` for encoders, ``score`` for Llama-like
    decoders), read from a config available without a download; else ``("classifier",)``, the
    encoders' name (the experiment then says what is wrong with the model, or which modules it has).

    Example:
        >>> default_token_head(decoder_path), default_token_head(model_path)
        (('score',), ('classifier',))
    """
    try:
        AutoConfig.from_pretrained(model_name, local_files_only=True)
        return head_module_names(token_classifier_skeleton(model_name, num_labels=2))
    except (OSError, ValueError):
        return ("classifier",)
