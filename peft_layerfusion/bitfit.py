"""BitFit (Ben Zaken et al., 2022) as a PEFT type: train the base model's bias terms only.

peft has no BitFit type (its ``bias="all"`` option makes every bias trainable *next to*
another adapter). :class:`BitFitConfig` is that option on its own: no LoRA, no fusion
module, every bias of the base trainable, saved and restored with the adapter. The
registered PEFT type is ``BITFIT``. With ``bias="none"`` it trains ``modules_to_save``
only: the "frozen encoder + head" baseline (regime ``fe`` without fusion).

The tuner reuses LoRA's machinery (marking biases trainable, wrapping
``modules_to_save``, saving biases) through ``model.inject_lora`` with no LoRA target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from peft import LoraConfig
from peft.tuners.lora import LoraModel
from peft.utils.peft_types import PeftType
from torch import nn

from .config import invalid
from .model import inject_lora

BITFIT_BIAS_OPTIONS = ("all", "none")


@dataclass
class BitFitConfig(LoraConfig):
    """Configuration of BitFit: every bias of the base model trains (and the task head).

    Args:
        bias: ``"all"`` (default) trains every bias of the base model; ``"none"`` trains
            only ``modules_to_save`` (a frozen encoder with a trainable head).
        modules_to_save: Modules trained and saved in full, typically the task head.

    Example:
        >>> from peft import get_peft_model
        >>> model = get_peft_model(base_model, BitFitConfig(modules_to_save=["classifier"]))
    """

    PEFT_TYPE: ClassVar[str] = "BITFIT"

    bias: Literal["all", "none"] = field(
        default="all",
        metadata={
            "help": "'all' trains every bias of the base model (BitFit); 'none' trains only modules_to_save."
        },
    )
    target_modules: Optional[list[str]] = field(
        default_factory=list,
        metadata={
            "help": "Must stay empty: BitFit injects no LoRA (use a fusion config or LoraConfig for LoRA)."
        },
    )

    def __post_init__(self) -> None:
        if self.target_modules:
            raise invalid("target_modules", self.target_modules, "an empty list (BitFit adds no LoRA layers)")
        if self.bias not in BITFIT_BIAS_OPTIONS:
            raise invalid("bias", self.bias, f"one of {list(BITFIT_BIAS_OPTIONS)}")
        super().__post_init__()
        self.peft_type = PeftType(self.PEFT_TYPE)


class BitFitModel(LoraModel):
    """The BitFit tuner: LoRA's plumbing with no LoRA layer injected.

    Args:
        model: The model to adapt.
        config: A :class:`BitFitConfig` (or a dict of them).
        adapter_name: Name of the adapter.

    Example:
        >>> model = get_peft_model(base_model, BitFitConfig())  # builds a BitFitModel
    """

    prefix: str = "bitfit_"

    def inject_adapter(self, model: nn.Module, adapter_name: str, **kwargs: Any) -> None:
        """LoRA's injection with no LoRA target: marks the biases (``bias``) and ``modules_to_save``."""
        config = self.peft_config[adapter_name]
        if not isinstance(config, BitFitConfig):
            raise TypeError(f"BitFitModel needs a BitFitConfig, got {type(config).__name__}.")
        inject_lora(self, model, adapter_name, **kwargs)

    def merge_and_unload(self, *args, **kwargs) -> nn.Module:
        """BitFit changes the base biases in place: the base model is the merged model."""
        return self.unload()
