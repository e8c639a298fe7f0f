"""The sentence classifier of ``layerfusion classify``: the model's own head, or mean pooling.

Pooling ``model`` (the default) is the model's own ``AutoModelForSequenceClassification``: a
BERT-like encoder reads its first token (``[CLS]``, through its pooler where it has one), a decoder
its last real token (found by the pad id: :func:`set_pad_token` makes the tokenizer, the config and
the batches agree). Pooling ``mean`` is :class:`MeanPooledClassifier`: the mean of the final states
(fused, with a fusion method) over the real tokens, then a linear head.

The head is what the checkpoint lacks (:func:`new_modules`): the modules whose every weight the
loading drew at random (BERT's ``classifier``, RoBERTa's ``classifier`` with its dense layer, a
decoder's ``score``, BERT's ``pooler`` where a checkpoint has none). They train with the fusion in
every regime; the rest is the regime's.

:func:`read_positions` says which positions the head reads, so that token-wise fusion runs there only
(the rest of the sequence keeps ``z_L``, which nothing reads) and the feature cache may keep only
those: ``first``, ``last`` or ``all`` (mean pooling, a head of unknown reading, or a method that mixes
positions).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from peft_layerfusion.discovery import is_decoder_only

from ..core.models.models import load_pretrained, model_skeleton

POOLINGS = ("model", "mean")
# encoder types whose *ForSequenceClassification reads the first token only (its state, or its pooler's)
FIRST_TOKEN_TYPES = frozenset(
    {
        "albert",
        "bert",
        "camembert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "mpnet",
        "nomic_bert",
        "roberta",
        "roformer",
        "xlm-roberta",
        "xlm-roberta-xl",
    }
)


class MeanPooledClassifier(nn.Module):
    """A backbone (``AutoModel``), the mean of its final states over the real tokens, dropout and a
    linear ``classifier``: ``logits = W · mean_t(h_t) + b`` over the positions where
    ``attention_mask`` is 1.

    Args:
        backbone: The pretrained model without a head (its ``last_hidden_state`` is pooled).
        num_labels: Classes.
        dropout: Dropout before the classifier.

    Example:
        >>> from transformers import AutoModel
        >>> model = MeanPooledClassifier(AutoModel.from_pretrained(model_path), num_labels=2)
        >>> words = torch.randint(5, 30, (2, 8))  # ids in the tiny vocabulary
        >>> model(input_ids=words, attention_mask=torch.ones_like(words)).logits.shape  # (batch, labels)
        torch.Size([2, 2])
    """

    def __init__(self, backbone: nn.Module, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config  # model type, sizes: what peft and the fusion discovery read
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(backbone.config.hidden_size, num_labels)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return SequenceClassifierOutput(
            logits=self.classifier(self.dropout(mean_pool(hidden, attention_mask)))
        )


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(batch, seq, d)`` over the positions where ``attention_mask`` is 1:
    ``(batch, d)``."""
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def new_modules(model: nn.Module, missing: Sequence[str]) -> tuple[str, ...]:
    """The outermost modules of ``model`` whose every parameter is in ``missing`` (drawn at random by
    the loading, not in the checkpoint): the task head.

    Example:
        >>> new_modules(base_model, ["classifier.weight", "classifier.bias"])
        ('classifier',)
    """
    missing = set(missing)
    found: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(f"{parent}.") for parent in found):
            continue
        names = [f"{name}.{parameter}" for parameter, _ in module.named_parameters()]
        if names and all(parameter in missing for parameter in names):
            found.append(name)
    return tuple(found)


def dropout_of(config) -> float:
    """The head dropout a config names (``classifier_dropout``, else ``hidden_dropout_prob``), else 0.1."""
    for name in ("classifier_dropout", "hidden_dropout_prob", "hidden_dropout", "dropout"):
        value = getattr(config, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return 0.1


def load_sequence_classifier(
    model_name: str, num_labels: int, seed: int, pooling: str, pad_token_id: int | None
) -> tuple[nn.Module, tuple[str, ...]]:
    """The classifier of ``model_name`` with its head drawn from ``seed`` (same seed, same head), and
    its head modules (:func:`new_modules`).

    Args:
        model_name: Encoder or decoder name or path.
        num_labels: Classes.
        seed: Seed of the new weights.
        pooling: ``model`` (its own ``*ForSequenceClassification``) or ``mean``
            (:class:`MeanPooledClassifier`).
        pad_token_id: The tokenizer's pad id, set in the config (a decoder's head finds the last real
            token by it).

    Example:
        >>> model, head = load_sequence_classifier(model_path, 2, seed=0, pooling="model", pad_token_id=0)
        >>> head
        ('classifier',)
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    if pooling not in POOLINGS:
        raise ValueError(f"--pooling {pooling!r}: allowed {', '.join(POOLINGS)}")
    if pooling == "model":
        model, info = load_pretrained(
            AutoModelForSequenceClassification,
            model_name,
            seed,
            num_labels=num_labels,
            output_loading_info=True,
        )
        model.config.pad_token_id = pad_token_id
        return model, new_modules(model, info["missing_keys"])
    backbone = load_pretrained(AutoModel, model_name, seed)
    backbone.config.pad_token_id = pad_token_id
    torch.manual_seed(seed)
    return MeanPooledClassifier(backbone, num_labels, dropout_of(backbone.config)), ("classifier",)


def classifier_skeleton(model_name: str, num_labels: int, pooling: str) -> nn.Module:
    """The modules of the classifier :func:`load_sequence_classifier` builds, on the meta device (no
    weight read): for the checks before any run.

    Example:
        >>> read_positions(classifier_skeleton(model_path, 2, "model"), "model")
        'first'
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    if pooling == "mean":
        with torch.device("meta"):
            return MeanPooledClassifier(model_skeleton(AutoModel, model_name), num_labels)
    return model_skeleton(AutoModelForSequenceClassification, model_name, num_labels=num_labels)


def read_positions(model: nn.Module, pooling: str) -> str:
    """The positions the head of ``model`` reads: ``first`` (an encoder type of
    :data:`FIRST_TOKEN_TYPES`), ``last`` (a decoder's last real token), else ``all`` (mean pooling,
    ModernBERT's mean pooling, or a head this function does not know: every position is fused,
    exact whatever the head reads).

    Example:
        >>> from transformers import BertForSequenceClassification
        >>> bert_classifier = BertForSequenceClassification(base_model.config)
        >>> read_positions(bert_classifier, "model"), read_positions(bert_classifier, "mean")
        ('first', 'all')
    """
    config = model.config
    if pooling == "mean":
        return "all"
    if is_decoder_only(model):
        return "last"
    if config.model_type == "modernbert":
        return "first" if getattr(config, "classifier_pooling", "cls") == "cls" else "all"
    return "first" if config.model_type in FIRST_TOKEN_TYPES else "all"


def position_mask(positions: str, attention_mask: torch.Tensor) -> torch.Tensor:
    """The ``(batch, seq)`` positions of a right-padded batch a head reads: the first token, the last
    real token (``attention_mask`` summed, minus one), or every real token.

    Example:
        >>> position_mask("last", torch.tensor([[1, 1, 1], [1, 1, 0]])).int().tolist()
        [[0, 0, 1], [0, 1, 0]]
    """
    if positions == "all":
        return attention_mask.bool()
    mask = torch.zeros_like(attention_mask, dtype=torch.bool)
    rows = torch.arange(attention_mask.shape[0], device=attention_mask.device)
    columns = attention_mask.sum(1) - 1 if positions == "last" else torch.zeros_like(rows)
    mask[rows, columns] = True
    return mask
