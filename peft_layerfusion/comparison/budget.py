"""Budget matching: size a baseline so it trains as many new parameters as a target.

The paper compares methods at (nearly) equal numbers of new parameters. Given a target
count (e.g. DWAtt's), each ``match_*`` function picks the one integer knob of a baseline
that comes closest and reports the residual mismatch:

* LoRA: the rank ``r`` (LoRA adds ``r (d_in + d_out)`` per adapted linear);
* R+n: the number ``n`` of extra blocks (each the size of the model's last block);
* bottleneck adapters (AdapterHub): the bottleneck width ``b = d // reduction_factor``;
  one adapter ``d -> b -> d`` has ``2 d b + b + d`` parameters, Pfeiffer (``seqbn``) puts
  one per block, Houlsby (``double_seqbn``) two.

Counts are exact and analytic (no model is adapted), so they work on meta-device models.

Example:
    >>> match = match_lora_rank(model, target=26_353_152)
    >>> match.value, f"{match.relative:+.2%}"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peft import LoraConfig
from peft.tuners.tuners_utils import check_target_module_exists
from torch import nn

from ..config import invalid
from ..discovery import find_encoder_blocks, hidden_size_of

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
    """

    knob: str
    value: float
    params: int
    target: int

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
    """Parameters LoRA adds per unit of rank: ``Σ (d_in + d_out)`` over the adapted linears.

    Args:
        model: The base model (any device, meta included).
        target_modules: LoRA's ``target_modules`` (names or a regex), matched as peft does.

    Example:
        >>> lora_params_per_rank(bert, ["query", "value"])  # 2 L (d + d) for BERT
    """
    config = LoraConfig(target_modules=target_modules)
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and check_target_module_exists(config, name):
            total += module.in_features + module.out_features
    if total == 0:
        raise invalid(
            "target_modules", target_modules, f"names of nn.Linear modules of {type(model).__name__}"
        )
    return total


def match_lora_rank(model: nn.Module, target: int, target_modules: Sequence[str] | str) -> BudgetMatch:
    """The LoRA rank ``r >= 1`` whose size is closest to ``target``.

    Example:
        >>> match_lora_rank(bert, 26_000_000, ["query", "value"]).value
    """
    per_rank = lora_params_per_rank(model, target_modules)
    rank = max(1, round(target / per_rank))
    return BudgetMatch("lora_r", rank, rank * per_rank, target)


def match_extra_layers(model: nn.Module, target: int, blocks_path: str | None = None) -> BudgetMatch:
    """The number of extra blocks ``n >= 1`` (R+n) whose size is closest to ``target``.

    Example:
        >>> match_extra_layers(roberta_large, 26_353_152).value  # 2
    """
    block = count_parameters(find_encoder_blocks(model, blocks_path).blocks[-1])
    n = max(1, round(target / block))
    return BudgetMatch("num_extra_layers", n, n * block, target)


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
        >>> match = match_bottleneck(roberta_large, 26_353_152, "seqbn")
        >>> match.value  # reduction factor, bottleneck width 1024 / value
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
