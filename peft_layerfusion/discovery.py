"""Layer discovery: find the encoder's block list and the module that runs it.

Every fusion method needs two places in a model:

* the **blocks**: the ``nn.ModuleList`` of transformer blocks whose outputs are fused
  (``bert.encoder.layer``, ``distilbert.transformer.layer``, ``model.encoder.block``...);
* the **container**: the module that owns the blocks and returns the encoder's last
  hidden state (``bert.encoder``, ``model.encoder``, ``ModernBertModel``...).

The container's output is what every head sees, so replacing its last hidden state is
enough to feed the fused representation to any head without touching model code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from .utils import WeakLink

# Suffixes of the block list, per `config.model_type`. Checked first.
KNOWN_BLOCK_PATHS: dict[str, str] = {
    "bert": "encoder.layer",
    "roberta": "encoder.layer",
    "xlm-roberta": "encoder.layer",
    "camembert": "encoder.layer",
    "electra": "encoder.layer",
    "deberta": "encoder.layer",
    "deberta-v2": "encoder.layer",
    "mpnet": "encoder.layer",
    "distilbert": "transformer.layer",
    "modernbert": "layers",
    "bart": "encoder.layers",
    "mbart": "encoder.layers",
    "marian": "encoder.layers",
    "t5": "encoder.block",
    "mt5": "encoder.block",
    "gpt2": "h",
    "falcon": "h",
    "bloom": "h",
    "gptj": "h",
    "opt": "decoder.layers",
}

# Generic suffixes tried, in this order, for any other model type.
GENERIC_BLOCK_SUFFIXES: tuple[str, ...] = (
    "encoder.layer",
    "encoder.layers",
    "encoder.block",
    "transformer.layer",
    "layers",
)


# Children of a container that project the last state to another width after the blocks (and after a
# final norm, if any), as the container's last step: OPT's `project_out` (OPT-350m: hidden_size 1024,
# word_embed_proj_dim 512). Where one reads z_L itself (no final norm), the fusion runs at its input.
OUTPUT_PROJECTIONS: tuple[str, ...] = ("project_out",)

# Children of a model that hold a task head, never an encoder (skipped by the generic search).
HEAD_MODULE_NAMES: tuple[str, ...] = ("classifier", "lm_head", "qa_outputs", "score", "cls", "head", "heads")


@dataclass(frozen=True)
class EncoderBlocks:
    """Where the blocks of an encoder live.

    Args:
        blocks_name: Qualified name of the ``nn.ModuleList`` of blocks inside the model.
        blocks: The block list itself.
        container_name: Qualified name of the module owning ``blocks`` ("" for the root).
        container: The module whose output's last hidden state the fusion replaces.
        final_norms: Norm modules inside the container, outside the blocks: whichever of them
            reads the last block's output in a forward is the stack's final norm ``F`` (a
            pre-norm stack's; see the placement rule in ``fusion.py``).
        projections: The container's output projections (children named in ``OUTPUT_PROJECTIONS``,
            e.g. OPT's ``project_out``): one that reads the last block's output takes the fused state
            in its place, and the container returns its output.
    """

    blocks_name: str
    blocks: nn.ModuleList
    container_name: str
    container: nn.Module
    final_norms: tuple[nn.Module, ...] = ()
    projections: tuple[nn.Module, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


class LinkedBlocks:
    """An :class:`EncoderBlocks` held through weak links (:class:`~.utils.WeakLink`): what the
    parts an adapter puts inside the model keep, so they never hold the model's own modules alive
    (a fusion layer is a child of the container it reads; holding it would be a reference cycle).

    Args:
        located: The blocks to link to.

    Example:
        >>> linked = LinkedBlocks(find_encoder_blocks(base_model))
        >>> linked().num_blocks  # an EncoderBlocks again, while the model lives
        3
    """

    def __init__(self, located: EncoderBlocks) -> None:
        self.blocks_name, self.container_name = located.blocks_name, located.container_name
        self.blocks, self.container = WeakLink(located.blocks), WeakLink(located.container)
        self.final_norms = tuple(WeakLink(norm) for norm in located.final_norms)
        self.projections = tuple(WeakLink(projection) for projection in located.projections)

    def __call__(self) -> EncoderBlocks:
        """The blocks (``ReferenceError`` once the model was freed)."""
        norms = tuple(norm() for norm in self.final_norms)
        projections = tuple(projection() for projection in self.projections)
        return EncoderBlocks(
            self.blocks_name, self.blocks(), self.container_name, self.container(), norms, projections
        )


def _matches_suffix(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith("." + suffix)


def _block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]


def _looks_like_blocks(name: str, blocks: nn.ModuleList, module_names: set[str] = frozenset()) -> bool:
    """Whether a list found by a generic suffix can be an encoder's blocks.

    Not inside a task head (``classifier.layers``), not in a decoder beside an encoder (of the
    modules ``module_names``), and made of composite modules of one class (transformer blocks),
    not of bare ``Linear``/``Dropout`` leaves.
    """
    if any(part in HEAD_MODULE_NAMES for part in name.split(".")[:-1]):
        return False
    if _beside_an_encoder(name, module_names):
        return False
    kinds = {type(block) for block in blocks}
    return len(kinds) == 1 and all(len(block._modules) > 0 for block in blocks)


def is_decoder_only(model: nn.Module) -> bool:
    """Whether ``model`` is a decoder-only (causal) language model: Llama, GPT-2, ``is_decoder=True`` BERT.

    Read from ``model.config``: a model type with a causal-LM class and no masked-LM class, or
    ``is_decoder``; encoder-decoder models and models without a config are not.

    Example:
        >>> is_decoder_only(causal_lm), is_decoder_only(base_model)
        (True, False)
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    model_type = getattr(config, "model_type", None)
    causal_only = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )
    return bool(getattr(config, "is_decoder", False) or causal_only)


def shares_weights(located: EncoderBlocks) -> bool:
    """Whether the blocks share weights: one module listed several times, or a parameter in two blocks.

    Example:
        >>> shares_weights(find_encoder_blocks(base_model))
        False
    """
    if len({id(block) for block in located.blocks}) < located.num_blocks:
        return True
    owners: dict[int, int] = {}
    for index, block in enumerate(located.blocks):
        for param in block.parameters():
            if owners.setdefault(id(param), index) != index:
                return True
    return False


def _beside_an_encoder(name: str, module_names: set[str]) -> bool:
    """Whether the list ``name`` sits in a ``<p>.decoder`` next to a ``<p>.encoder``.

    Such a decoder is not the encoder (Funnel's ``funnel.decoder.layers`` upsample the pooled
    encoder output): the generic search passes it over. Decoder-only stacks (no ``encoder``
    beside them) are not affected.
    """
    parts = name.split(".")
    return any(
        part == "decoder" and ".".join([*parts[:i], "encoder"]) in module_names
        for i, part in enumerate(parts[:-1])
    )


def _check_runnable(located: EncoderBlocks) -> None:
    """Raise if the blocks are groups of blocks, or their container is a list that never runs."""
    if any(isinstance(block, (nn.ModuleList, nn.ModuleDict)) for block in located.blocks):
        raise ValueError(
            f"`{located.blocks_name}` holds groups of blocks (ModuleLists), not blocks: layer fusion needs "
            "one flat list of blocks that run on states of one shape (Funnel pools the sequence between its "
            "groups, so their states have different lengths and cannot be fused)."
        )
    if isinstance(located.container, (nn.ModuleList, nn.ModuleDict)):
        raise ValueError(
            f"The blocks `{located.blocks_name}` sit in `{located.container_name}`, a "
            f"{type(located.container).__name__} that is never called itself, so the fusion could not "
            "replace its output: set `blocks_path` to a list whose parent module runs the blocks."
        )


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (``nn.LayerNorm``, ``nn.RMSNorm``, ``LlamaRMSNorm``...)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith("Norm")


def _resolve(model: nn.Module, blocks_name: str, blocks: nn.ModuleList) -> EncoderBlocks:
    container_name = blocks_name.rpartition(".")[0]
    container = model.get_submodule(container_name) if container_name else model
    in_blocks = {id(m) for m in blocks.modules()}
    final_norms = tuple(m for m in container.modules() if is_norm(m) and id(m) not in in_blocks)
    projections = tuple(
        m for name, m in container.named_children() if name in OUTPUT_PROJECTIONS and id(m) not in in_blocks
    )
    return EncoderBlocks(blocks_name, blocks, container_name, container, final_norms, projections)


def _search_order(model: nn.Module) -> tuple[str, ...]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    known = KNOWN_BLOCK_PATHS.get(model_type)
    return ((known,) if known else ()) + GENERIC_BLOCK_SUFFIXES


def find_encoder_blocks(model: nn.Module, blocks_path: str | None = None) -> EncoderBlocks:
    """Locate the encoder blocks of ``model``.

    Args:
        model: A transformers model (any head) or a bare encoder.
        blocks_path: Optional name of the ``nn.ModuleList`` holding the blocks, either the
            full qualified name (``"roberta.encoder.layer"``) or a suffix of it
            (``"encoder.layer"``). When omitted, the model type's known path is tried, then
            the generic suffixes in ``GENERIC_BLOCK_SUFFIXES``.

    Returns:
        An :class:`EncoderBlocks` record.

    Raises:
        ValueError: if nothing is found, naming what was searched and how to set
            ``blocks_path``.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> found = find_encoder_blocks(BertModel(BertConfig(num_hidden_layers=2)))
        >>> found.blocks_name, found.num_blocks
        ('encoder.layer', 2)
    """
    lists = _block_lists(model)
    module_names = {name for name, _ in model.named_modules()}
    suffixes = (blocks_path,) if blocks_path else _search_order(model)
    for suffix in suffixes:
        # The shallowest match wins: in encoder-decoder models `encoder.layers` is matched
        # before anything under the decoder because the suffix names the encoder.
        matches = [(n, m) for n, m in lists if _matches_suffix(n, suffix)]
        if not blocks_path:  # the generic search skips heads' lists and lists of bare layers
            matches = [(n, m) for n, m in matches if _looks_like_blocks(n, m, module_names)]
        if matches:
            name, blocks = min(matches, key=lambda nm: nm[0].count("."))
            located = _resolve(model, name, blocks)
            _check_runnable(located)
            return located
    candidates = [(n, m) for n, m in lists if not re.search(r"\.\d+(\.|$)", n)][:10]
    searched = f"blocks_path={blocks_path!r}" if blocks_path else f"the suffixes {list(suffixes)}"
    skipped = "; ".join(f"`{n}` {_skip_reason(n, m, module_names, suffixes)}" for n, m in candidates)
    blocks_like = [n for n, m in candidates if _looks_like_blocks(n, m, module_names)]
    example = (blocks_like or [n for n, _ in candidates] or ["encoder.layer"])[0]
    raise ValueError(
        f"Could not find the encoder blocks of {type(model).__name__}: no nn.ModuleList named by {searched} "
        f"holds them. The model's non-empty ModuleLists: {skipped or 'none'}. Name the block list yourself "
        f"with the config field `blocks_path` (e.g. blocks_path={example!r})."
    )


def _skip_reason(name: str, blocks: nn.ModuleList, module_names: set[str], suffixes: tuple[str, ...]) -> str:
    """Why the search passed over the list ``name``, in a few words (parenthesised).

    Example:
        >>> head = nn.Module()
        >>> head.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
        >>> _skip_reason("head.layers", head.layers, set(), ("layers",))
        '(inside the task head `head`)'
        >>> _skip_reason("layers", nn.ModuleList([nn.Linear(4, 4)]), set(), ("layers",))
        '(its items are bare Linear layers, not blocks)'
    """
    if not any(_matches_suffix(name, suffix) for suffix in suffixes):
        return "(not a name searched)"
    head = next((part for part in name.split(".")[:-1] if part in HEAD_MODULE_NAMES), None)
    if head is not None:
        return f"(inside the task head `{head}`)"
    if _beside_an_encoder(name, module_names):
        return "(a decoder beside the model's encoder)"
    kinds = sorted({type(block).__name__ for block in blocks})
    if len(kinds) > 1:
        return f"(its items are of several classes, {kinds}, not one kind of block)"
    return f"(its items are bare {kinds[0]} layers, not blocks)"


def hidden_size_of(model: nn.Module, located: EncoderBlocks | None = None) -> int:
    """The width ``d`` of the encoder's hidden states.

    Read from the model config (``hidden_size``, ``d_model`` or ``dim``); for a model without
    one (a custom encoder), from the last block: the width of its last ``LayerNorm`` or the
    output width of its last ``Linear``.

    Args:
        model: The model.
        located: Its encoder blocks, for the fallback.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> hidden_size_of(BertModel(BertConfig(hidden_size=64, num_attention_heads=4)))
        64
    """
    config = getattr(model, "config", None)
    for attr in ("hidden_size", "d_model", "dim"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    width = _output_width(located.blocks[-1]) if located is not None else None
    if width is not None:
        return width
    raise ValueError(
        f"Could not read the hidden size of {type(model).__name__}: its config has none of "
        "`hidden_size`, `d_model`, `dim`, and its last block has no nn.LayerNorm or nn.Linear."
    )


def _output_width(block: nn.Module) -> int | None:
    """The width of the last ``LayerNorm`` (or output width of the last ``Linear``) in ``block``."""
    for module in reversed(list(block.modules())):
        if isinstance(module, nn.LayerNorm):
            return module.normalized_shape[-1]
        if isinstance(module, nn.Linear):
            return module.out_features
    return None
