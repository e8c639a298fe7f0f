"""Budget matching: size a baseline so it trains as many new parameters as a target.

The paper compares methods at (nearly) equal numbers of new parameters. Given a target
count (e.g. DWAtt's), each ``match_*`` function picks the one integer knob of a baseline
that comes closest and reports the residual mismatch:

* LoRA: the rank ``r`` (LoRA adds ``r (d_in + d_out)`` per adapted linear);
* R+n: the number ``n`` of extra blocks (each the size of the model's last block);
* Concat: the rank ``r`` of its per-layer maps (``map_rank``; ``2 K d r + d``);
* DWAtt: one hidden width ``w`` for its query and value MLPs (the paper uses one ``γ`` for both);
* bottleneck adapters (AdapterHub): the bottleneck width ``b = d // reduction_factor``;
  one adapter ``d -> b -> d`` has ``2 d b + b + d`` parameters, Pfeiffer (``seqbn``) puts
  one per block, Houlsby (``double_seqbn``) two.

Counts are exact and analytic (no model is adapted), so they work on meta-device models.

Example:
    >>> match = match_lora_rank(base_model, 5_000, ["query", "value"])  # a tiny BERT: 3 x 2 x 64 per rank
    >>> match.value, f"{match.relative:+.2%}"
    (13, '-0.16%')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from peft import LoraConfig
from peft.tuners.tuners_utils import check_target_module_exists
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..config import LayerFusionConfig, invalid
from ..discovery import find_encoder_blocks, hidden_size_of
from ..methods.concat import ConcatConfig
from ..methods.dwatt import DWAttConfig

BOTTLENECK_KINDS: dict[str, int] = {"seqbn": 1, "double_seqbn": 2}  # adapters per block
DEFAULT_TOLERANCE = 0.05  # pairs further apart than this are flagged


@dataclass(frozen=True)
class BudgetMatch:
    """The knob value chosen for a baseline and how far its size is from the target.

    Args:
        knob: What was chosen (``"lora_r"``, ``"num_extra_layers"``, ``"reduction_factor"``).
        value: The chosen value.
        params: New trainable parameters at that value.
        target: The target count.
        options: The method config fields that give this size (``{"map_rank": 52}``); empty for
            baselines that are not fusion methods (LoRA, bottleneck adapters).
    """

    knob: str
    value: float
    params: int
    target: int
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def residual(self) -> int:
        """``params - target`` (positive: the baseline is larger)."""
        return self.params - self.target

    @property
    def relative(self) -> float:
        """``residual / target`` (0.0 for a zero target matched exactly)."""
        return self.residual / self.target if self.target else float(self.residual != 0)


def _closest(candidates: Sequence[int], size_of) -> int:
    return min(candidates, key=lambda value: (abs(size_of(value)), value))


def count_parameters(module: nn.Module) -> int:
    """Number of parameters of ``module`` (works on the meta device)."""
    return sum(p.numel() for p in module.parameters())


def lora_params_per_rank(model: nn.Module, target_modules: Sequence[str] | str) -> int:
    """Parameters LoRA adds per unit of rank: ``Σ (d_in + d_out)`` over the modules it adapts.

    The modules LoRA wraps as a linear: ``nn.Linear`` (weight ``(d_out, d_in)``) and transformers'
    ``Conv1D`` (GPT-2's ``c_attn``, ``c_proj``...: weight ``(d_in, d_out)``); an ``nn.Embedding``
    (``r (num_embeddings + embedding_dim)``). Another module a name matches counts nothing (peft
    cannot wrap it); targets that match none of these kinds are refused.

    Args:
        model: The base model (any device, meta included).
        target_modules: LoRA's ``target_modules`` (names or a regex), matched as peft does.

    Example:
        >>> lora_params_per_rank(base_model, ["query", "value"])  # 2 L (d + d): L = 3 blocks, d = 32
        384
    """
    config = LoraConfig(target_modules=target_modules)
    total = 0
    for name, module in model.named_modules():
        if check_target_module_exists(config, name):
            total += _lora_width(module)
    if total == 0:
        raise invalid(
            "target_modules",
            target_modules,
            f"names of linear (nn.Linear, Conv1D) modules of {type(model).__name__}",
        )
    return total


def _lora_width(module: nn.Module) -> int:
    """``d_in + d_out`` of a module LoRA adapts (its parameters per unit of rank); 0 for any other."""
    if isinstance(module, nn.Linear):
        return module.in_features + module.out_features
    if isinstance(module, Conv1D):
        return sum(module.weight.shape)  # (d_in, d_out)
    if isinstance(module, nn.Embedding):
        return module.num_embeddings + module.embedding_dim
    return 0


def match_lora_rank(model: nn.Module, target: int, target_modules: Sequence[str] | str) -> BudgetMatch:
    """The LoRA rank ``r >= 1`` whose size is closest to ``target``.

    Example:
        >>> match_lora_rank(base_model, 5_000, ["query", "value"]).value  # 384 per rank
        13
    """
    per_rank = lora_params_per_rank(model, target_modules)
    rank = max(1, round(target / per_rank))
    return BudgetMatch("lora_r", rank, rank * per_rank, target)


def match_extra_layers(model: nn.Module, target: int, blocks_path: str | None = None) -> BudgetMatch:
    """The number of extra blocks ``n >= 1`` (R+n) whose size is closest to ``target``.

    Example:
        >>> from transformers import RobertaConfig
        >>> from peft_layerfusion.comparison.audit import meta_model
        >>> roberta_large = RobertaConfig(
        ...     hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ... )
        >>> roberta_large = meta_model(roberta_large)
        >>> match_extra_layers(roberta_large, 26_353_152).value  # DWAtt's count: two blocks
        2
    """
    block = count_parameters(find_encoder_blocks(model, blocks_path).blocks[-1])
    n = max(1, round(target / block))
    return BudgetMatch("num_extra_layers", n, n * block, target, {"num_extra_layers": n})


def _linear_knob(size_of: Callable[[int], int], target: int) -> int:
    """The integer ``v >= 1`` closest to ``target`` for a size linear in ``v`` (``a v + b``, ``a > 0``)."""
    slope = size_of(2) - size_of(1)
    return max(1, 1 + round((target - size_of(1)) / slope))


def _fused_and_width(model: nn.Module, config: LayerFusionConfig) -> tuple[int, int]:
    """``(K, d)``: how many states ``config`` fuses on ``model``, and their width."""
    located = find_encoder_blocks(model, config.blocks_path)
    return len(config.resolve_layers(located.num_blocks)), hidden_size_of(model, located)


def match_concat_rank(model: nn.Module, target: int, **config_options: Any) -> BudgetMatch:
    """Concat's ``map_rank`` ``1 <= r < d`` whose size ``2 K d r + d`` is closest to ``target`` (a rank
    of ``d`` or more is refused by Concat: the full map is smaller there, so a larger target gets ``d - 1``).

    Args:
        model: The base model (meta device is fine).
        target: New parameters to match.
        **config_options: Other :class:`ConcatConfig` fields (``layers``, ``blocks_path``...).

    Example:
        >>> from peft_layerfusion.comparison.audit import load_model_config, meta_model
        >>> llama_8b = meta_model(load_model_config("llama-3.1-8b"))  # no weights
        >>> match_concat_rank(llama_8b, 13_631_488).options  # LoRA r=16 on q, k, v, o
        {'map_rank': 52}
    """
    num_fused, d = _fused_and_width(model, ConcatConfig(**config_options))

    def size_of(rank: int) -> int:
        return ConcatConfig(map_rank=rank, **config_options).num_parameters(num_fused, d)

    rank = min(_linear_knob(size_of, target), d - 1)
    return BudgetMatch("map_rank", rank, size_of(rank), target, {"map_rank": rank})


def match_dwatt_width(model: nn.Module, target: int, **config_options: Any) -> BudgetMatch:
    """DWAtt's bottleneck width ``w >= 1`` (query and value MLPs alike) closest to ``target``.

    Args:
        model: The base model (meta device is fine).
        target: New parameters to match.
        **config_options: Other :class:`DWAttConfig` fields (``layers``, ``d_pos``...).

    Example:
        >>> from peft_layerfusion.comparison.audit import load_model_config, meta_model
        >>> llama_8b = meta_model(load_model_config("llama-3.1-8b"))
        >>> match_dwatt_width(llama_8b, 13_631_488).options
        {'query_bottleneck_width': 49, 'value_bottleneck_width': 49}
    """
    num_fused, d = _fused_and_width(model, DWAttConfig(**config_options))

    def widths(width: int) -> dict[str, int]:
        return {"query_bottleneck_width": width, "value_bottleneck_width": width}

    def size_of(width: int) -> int:
        return DWAttConfig(**widths(width), **config_options).num_parameters(num_fused, d)

    width = _linear_knob(size_of, target)
    return BudgetMatch("bottleneck_width", width, size_of(width), target, widths(width))


# The budget knob of every fusion method sized to a budget (``sized_to_budget``), by method name.
METHOD_SIZERS: dict[str, Callable[..., BudgetMatch]] = {
    "dwatt": match_dwatt_width,
    "scaled_dwatt": match_dwatt_width,  # DWAtt's parameters (other options, the same count)
    "concat": match_concat_rank,
    "extra_layers": match_extra_layers,
}


def bottleneck_params(hidden_size: int, num_blocks: int, bottleneck: int, kind: str = "seqbn") -> int:
    """New parameters of AdapterHub bottleneck adapters of width ``bottleneck``.

    Args:
        hidden_size: ``d``.
        num_blocks: ``L``, blocks that get adapters.
        bottleneck: ``b = int(d // reduction_factor)``.
        kind: ``"seqbn"`` (Pfeiffer, one adapter per block) or ``"double_seqbn"`` (Houlsby, two).

    Example:
        >>> bottleneck_params(1024, 24, 64)  # 24 * (2*1024*64 + 64 + 1024)
        3171840
    """
    if kind not in BOTTLENECK_KINDS:
        raise invalid("kind", kind, f"one of {list(BOTTLENECK_KINDS)}")
    per_adapter = 2 * hidden_size * bottleneck + bottleneck + hidden_size
    return BOTTLENECK_KINDS[kind] * num_blocks * per_adapter


def reduction_factor_for(hidden_size: int, bottleneck: int) -> float:
    """A ``reduction_factor`` for which AdapterHub's ``int(d // rf)`` gives ``bottleneck``."""
    factor = hidden_size / bottleneck
    if int(hidden_size // factor) != bottleneck:  # float rounding: aim at the middle instead
        factor = hidden_size / (bottleneck + 0.5)
    return factor


def match_bottleneck(
    model: nn.Module, target: int, kind: str = "seqbn", blocks_path: str | None = None
) -> BudgetMatch:
    """The bottleneck-adapter reduction factor whose size is closest to ``target``.

    Example:
        >>> from transformers import RobertaConfig
        >>> from peft_layerfusion.comparison.audit import meta_model
        >>> roberta_large = RobertaConfig(
        ...     hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ... )
        >>> match = match_bottleneck(meta_model(roberta_large), 26_353_152, "seqbn")
        >>> round(match.value, 2), 1024 // 1.91  # the reduction factor, and its bottleneck width
        (1.91, 536.0)
    """
    d = hidden_size_of(model)
    num_blocks = find_encoder_blocks(model, blocks_path).num_blocks
    width = _closest(range(1, d + 1), lambda b: bottleneck_params(d, num_blocks, b, kind) - target)
    return BudgetMatch(
        "reduction_factor",
        reduction_factor_for(d, width),
        bottleneck_params(d, num_blocks, width, kind),
        target,
    )


def mismatched_pairs(
    totals: dict[str, int], tolerance: float = DEFAULT_TOLERANCE
) -> list[tuple[str, str, float]]:
    """Every pair of ``totals`` whose sizes differ by more than ``tolerance`` (of the larger).

    Example:
        >>> mismatched_pairs({"a": 100, "b": 104, "c": 120})
        [('a', 'c', 0.1666...), ('b', 'c', 0.1333...)]
    """
    names = list(totals)
    pairs = []
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            larger = max(totals[first], totals[second])
            gap = abs(totals[first] - totals[second]) / larger if larger else 0.0
            if gap > tolerance:
                pairs.append((first, second, gap))
    return pairs
