"""The configuration every layer-fusion method shares.

`LayerFusionConfig` subclasses peft's `LoraConfig`, so each fusion config also accepts
LoRA's own fields with LoRA's meaning (`target_modules`, `r`, `lora_alpha`,
`lora_dropout`, `bias`, ...). The one difference is the default of `target_modules`:
empty, meaning *no LoRA*; fusion alone is the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Union

from peft import LoraConfig
from peft.utils.peft_types import PeftType


def invalid(field_name: str, value: object, allowed: str) -> ValueError:
    """A `ValueError` that names the field, the value given and what is allowed."""
    return ValueError(f"`{field_name}`={value!r} is not allowed: expected {allowed}.")


def _range_text(low: Optional[float], high: Optional[float], low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def require_number(
    field_name: str,
    value: object,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise :func:`invalid` unless ``value`` is a finite number (an int if ``integer``) in range.

    Strings (``"0.1"``), booleans, ``nan`` and ``inf`` are refused with a ``ValueError`` naming
    the field, never a ``TypeError`` from a comparison deeper down.

    Args:
        field_name: The config field, named in the error.
        value: The value given.
        low, high: Bounds (``None``: unbounded).
        low_open, high_open: Exclude the bound itself.
        integer: Require an ``int``.

    Example:
        >>> require_number("attention_dropout", 0.1, low=0.0, high=1.0, high_open=True)
        >>> require_number("temperature", float("inf"), low=0.0, low_open=True)
        Traceback (most recent call last):
        ValueError: `temperature`=inf is not allowed: expected a finite number > 0.0.
    """
    allowed = ("an int" if integer else "a finite number") + _range_text(low, high, low_open, high_open)
    number_types = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_types) or not math.isfinite(value):
        raise invalid(field_name, value, allowed)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise invalid(field_name, value, allowed)


@dataclass
class LayerFusionConfig(LoraConfig):
    """Options every fusion method has (see the method configs for their own).

    Args:
        layers: Which hidden states to fuse, as indices into ``z_0 .. z_L`` (0 is the
            embedding output, ``n`` the output of block ``n``; negative indices count from
            the end). ``None`` (default) fuses every block output ``z_1 .. z_L``.
        include_embeddings: Also fuse the embedding output ``z_0`` (only when ``layers``
            is ``None``).
        blocks_path: Name (or suffix of the name) of the ``nn.ModuleList`` holding the
            encoder blocks, for models the automatic discovery does not know.
        modules_to_save: Modules besides the fusion module to train and save, typically
            the task head (``["classifier"]``); set automatically by ``task_type``.
        target_modules: LoRA targets; empty (default) means no LoRA.

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> config = DWAttConfig(include_embeddings=True, modules_to_save=["classifier"])
    """

    PEFT_TYPE: ClassVar[str] = ""  # set by each method, e.g. "DWATT"

    target_modules: Optional[Union[list[str], str]] = field(
        default_factory=list,
        metadata={
            "help": "LoRA target modules (LoRA's meaning). Empty (the default) means no LoRA: only the "
            "fusion module (and `modules_to_save`) train."
        },
    )
    layers: Optional[list[int]] = field(
        default=None,
        metadata={
            "help": "Indices of the hidden states to fuse: 0 = embedding output, n = output of block n, "
            "negative = from the end. None fuses every block output 1..L."
        },
    )
    include_embeddings: bool = field(
        default=False,
        metadata={"help": "Also fuse the embedding output z_0 (used when `layers` is None)."},
    )
    blocks_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "Name or name suffix of the nn.ModuleList of encoder blocks (e.g. 'encoder.layer'), "
            "for architectures the automatic discovery does not know."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.PEFT_TYPE:
            raise TypeError(f"{type(self).__name__} is abstract: use a method config such as DWAttConfig.")
        self.peft_type = PeftType(self.PEFT_TYPE)
        if self.layers is not None:
            if (
                not isinstance(self.layers, (list, tuple))
                or not self.layers
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in self.layers)
            ):
                raise invalid("layers", self.layers, "None or a non-empty list of ints")
            if len(set(self.layers)) != len(self.layers):
                raise invalid("layers", self.layers, "distinct indices")
            self.layers = list(self.layers)
        if not isinstance(self.include_embeddings, bool):
            raise invalid("include_embeddings", self.include_embeddings, "True or False")
        if self.include_embeddings and self.layers is not None:
            allowed = f"False when `layers`={self.layers!r} is given (put 0 in `layers`)"
            raise invalid("include_embeddings", True, allowed)
        if self.blocks_path is not None and (not isinstance(self.blocks_path, str) or not self.blocks_path):
            raise invalid("blocks_path", self.blocks_path, "None or a dotted module name")

    def resolve_layers(self, num_blocks: int) -> list[int]:
        """The fused hidden-state indices for an encoder of ``num_blocks`` blocks.

        Raises:
            ValueError: if an index of ``layers`` is outside ``-(L + 1) .. L``.
        """
        if self.layers is None:
            first = 0 if self.include_embeddings else 1
            return list(range(first, num_blocks + 1))
        resolved = []
        for index in self.layers:
            if not -(num_blocks + 1) <= index <= num_blocks:
                allowed = f"indices in -{num_blocks + 1}..{num_blocks} for {num_blocks} blocks"
                raise invalid("layers", self.layers, allowed)
            resolved.append(index % (num_blocks + 1))
        if len(set(resolved)) != len(resolved):
            raise invalid("layers", self.layers, "indices naming distinct hidden states")
        return resolved
