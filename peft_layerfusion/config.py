"""The configuration every layer-fusion method shares.

`LayerFusionConfig` subclasses peft's `LoraConfig`, so each fusion config also accepts
LoRA's own fields with LoRA's meaning (`target_modules`, `r`, `lora_alpha`,
`lora_dropout`, `bias`, ...). The one difference is the default of `target_modules`:
empty, meaning *no LoRA*; fusion alone is the default.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from peft import LoraConfig
from peft.utils.peft_types import PeftType
from torch import nn

from .discovery import is_decoder_only

# Values of `fusion_init` (see its help text).
INIT_CHOICES: tuple[str, ...] = ("auto", "paper", "identity")
# Values of `state_norm` (DepthMixConfig): the raw stream; every state at unit RMS per position, the mix
# put back on z_L's scale before the final norm; or unit-RMS states mixed after the final norm, z_L as F(z_L).
STATE_NORMS: tuple[str, ...] = ("none", "rms", "rms_after_norm")


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
        ...
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


@dataclass(frozen=True)
class Preset:
    """A named variant of a method: values for some fields of its config (not a PEFT type of its own;
    its name, label and summary are an entry of :mod:`peft_layerfusion.names`).

    Args:
        values: The field values it sets, e.g. ``{"state_norm": "rms"}``.
    """

    values: Mapping[str, Any]


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
        fusion_init: How the fusion module starts. ``"paper"``: the method's published init.
            ``"identity"``: the module's output at initialisation is exactly the base model's
            last hidden state ``z_L``, so training starts from the base model's behaviour (as
            LoRA's zero ``B`` does); each method's docstring gives its formula, and methods
            without one refuse it. ``"auto"`` (default): ``"identity"`` on decoder-only (causal)
            models when the method has one and can build it for ``layers``, ``"paper"``
            otherwise (so encoders keep the paper's init).
        modules_to_save: Modules besides the fusion module to train and save, typically
            the task head (``["classifier"]``); set automatically by ``task_type``.
        target_modules: LoRA targets; empty (default) means no LoRA.

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> config = DWAttConfig(include_embeddings=True, modules_to_save=["classifier"])
    """

    PEFT_TYPE: ClassVar[str] = ""  # set by each method, e.g. "DWATT"
    # Set by each method that has an init whose output equals the base model's (`fusion_init`).
    IDENTITY_INIT: ClassVar[bool] = False
    # The method's named variants (`from_preset`), e.g. ScalarMixConfig's "layer_mix".
    PRESETS: ClassVar[Mapping[str, Preset]] = {}
    # PEFT types of earlier versions that load as this config: a preset that was a type of its own
    # (adapter_config.json's "peft_type": "LAYER_MIX" loads as ScalarMixConfig, its fields as saved).
    FORMER_PEFT_TYPES: ClassVar[tuple[str, ...]] = ()
    # Fields of earlier versions, each with the value that computes what this version does: a saved
    # adapter_config.json holding one at that value loads (the field dropped), at another is refused.
    RETIRED_FIELDS: ClassVar[Mapping[str, object]] = {}

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
    fusion_init: str = field(
        default="auto",
        metadata={
            "help": "How the fusion module starts: 'paper' (the method's published init), 'identity' (its "
            "output at initialisation equals the base model's; methods without such an init refuse it), "
            "'auto' (identity on decoder-only models where the method has it, paper otherwise)."
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
        if self.fusion_init not in INIT_CHOICES:
            raise invalid("fusion_init", self.fusion_init, f"one of {list(INIT_CHOICES)}")
        if self.fusion_init == "identity" and not self.IDENTITY_INIT:
            name = type(self).__name__
            allowed = f"'auto' or 'paper' ({name} has no init whose output is the base model's)"
            raise invalid("fusion_init", "identity", allowed)

    @classmethod
    def from_preset(cls, preset: str, **kwargs: Any) -> LayerFusionConfig:
        """The config of the variant ``preset`` (one of :attr:`PRESETS`), ``kwargs`` set over its values.

        Raises:
            ValueError: naming the presets of this method when there is none of that name.

        Example:
            >>> from peft_layerfusion import ScalarMixConfig
            >>> config = ScalarMixConfig.from_preset("layer_mix", start_layer=2)
            >>> type(config).__name__, config.state_norm, config.start_layer
            ('ScalarMixConfig', 'rms', 2)
        """
        if preset not in cls.PRESETS:
            raise invalid("preset", preset, f"one of {list(cls.PRESETS)} for {cls.__name__}")
        return cls(**{**cls.PRESETS[preset].values, **kwargs})

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """The fields of a saved ``adapter_config.json`` as this version reads them (peft calls it in
        ``from_pretrained``): a former PEFT type (:attr:`FORMER_PEFT_TYPES`) becomes this method's, and a
        retired field (:attr:`RETIRED_FIELDS`) is dropped where its value is what this version computes.

        Raises:
            ValueError: for a retired field saved at another value (this version cannot compute it).

        Example:
            >>> from peft_layerfusion import DWAttConfig
            >>> DWAttConfig.check_kwargs(peft_type="SCALED_DWATT", prenorm_scaling=False)
            {'peft_type': 'DWATT'}
        """
        kwargs = super().check_kwargs(**kwargs)
        if kwargs.get("peft_type") in cls.FORMER_PEFT_TYPES:
            kwargs["peft_type"] = cls.PEFT_TYPE
        for name, value in cls.RETIRED_FIELDS.items():
            saved = kwargs.pop(name, value)
            if saved != value:
                allowed = f"{value!r} (the option was removed: this version computes only that)"
                raise invalid(name, saved, allowed)
        return kwargs

    def identity_fits(self, layers: Sequence[int], num_blocks: int) -> bool:
        """Whether the identity init can be built for these fused layers (default: ``z_L`` is fused).

        Methods whose identity init reads ``z_L`` directly (DWAtt) override this.
        """
        return num_blocks in layers

    def starts_at_base(
        self, model: nn.Module, layers: Sequence[int], num_blocks: int, warn: bool = False
    ) -> bool:
        """Whether the fusion module starts at the base model's output (resolves ``fusion_init``).

        Args:
            model: The model the fusion is attached to ("auto" asks whether it is decoder-only).
            layers: The resolved fused indices (:meth:`resolve_layers`).
            num_blocks: ``L``.
            warn: Warn when ``"auto"`` falls back to the paper's init on a decoder-only model because
                ``layers`` leave out ``z_L`` (the injection asks with ``warn=True``, once).

        Raises:
            ValueError: for ``fusion_init="identity"`` when the method cannot start at the base
                output with these ``layers`` (e.g. Concat without ``z_L``).

        Example:
            >>> from peft_layerfusion import ConcatConfig
            >>> ConcatConfig(fusion_init="identity").starts_at_base(base_model, [1, 2, 3], 3)
            True
        """
        if self.fusion_init == "paper" or not self.IDENTITY_INIT:
            return False
        fits = self.identity_fits(layers, num_blocks)
        if self.fusion_init == "identity":
            if not fits:
                allowed = f"a list with the last state ({num_blocks} or -1) when fusion_init='identity'"
                raise invalid("layers", self.layers, allowed)
            return True
        if not is_decoder_only(model):
            return False
        if not fits and warn:
            method = type(self).__name__.removesuffix("Config")
            warnings.warn(
                f"Layer fusion: {method} with fusion_init='auto' starts from the paper's init on this "
                f"decoder-only model, not the identity init: layers={self.layers!r} leaves out the last "
                f"state z_L ({num_blocks} or -1) that the identity init starts from. Add {num_blocks} to "
                "`layers`, or set fusion_init='paper' to silence this.",
                UserWarning,
                stacklevel=4,
            )
        return fits

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


@dataclass
class DepthMixConfig(LayerFusionConfig):
    """Options of the token-wise methods that mix states across depth (Average, ScalarMix, Concat, DWAtt).

    Args:
        state_norm: ``"none"`` (default, the published methods) mixes the residual stream as the
            blocks pass it on. ``"rms"`` mixes every state at unit RMS per position,
            ``ẑ_n = z_n / sqrt(mean_i z_{n,i}^2 + ε)`` (a parameter-free RMS norm, no gain), and puts
            the mix back on ``z_L``'s scale: ``h = z_L + rms(z_L) (mix(ẑ) - ẑ_L)``, which is
            ``rms(z_L) mix(ẑ)`` for weights summing to one and exactly ``z_L`` at an identity start.
            On a pre-norm decoder the stream's RMS grows with depth, by orders of magnitude in deep LLMs,
            so a raw mix is decided by the deepest blocks' scale, not by its weights.
            ``"rms_after_norm"`` mixes them where the head reads: after a pre-norm stack's final norm
            ``F``, ``z_L`` entering as ``F(z_L)`` (as ``z_L`` on a post-norm stack), every other state
            as ``ẑ_n``, with no rescaling, and ``F`` does not run again
            (``h_head = mix(ẑ_0, .., ẑ_{L-1}, F(z_L))``). ``F``'s learned gain is fitted to ``z_L``
            (it can span orders of magnitude per channel); with this option a mix started on block ``b``,
            or a one-layer mix of ``b``, gives the head exactly ``ẑ_b``, what a linear probe of ``b``
            on unit-RMS states reads, where ``"rms"`` gives it ``F(ẑ_b)``. Exactly ``F(z_L)`` at an
            identity start.
        mixing_lr_multiplier: The parameters that decide the mix (weights, logits, queries, maps:
            each method's ``mixing_parameters()``) train at ``lr * mixing_lr_multiplier``; the head
            and LoRA at ``lr``. Applied by :func:`peft_layerfusion.parameter_groups` (plain optimizers
            and ``Trainer(optimizers=...)``) and by the recipes.
        (every option of :class:`LayerFusionConfig` and of LoRA)

    Example:
        >>> from peft_layerfusion import ScalarMixConfig
        >>> config = ScalarMixConfig(state_norm="rms", mixing_lr_multiplier=10.0)
        >>> config.state_norm, config.mixing_lr_multiplier
        ('rms', 10.0)
    """

    state_norm: str = field(
        default="none",
        metadata={
            "help": "'none' (the published methods) mixes the residual stream as it is; 'rms' mixes every "
            "block's state at unit RMS per position (a parameter-free RMS norm) and rescales the mix "
            "to z_L's RMS, so depth scale cannot decide the mix; 'rms_after_norm' mixes them where the "
            "head reads, z_L as F(z_L) after a pre-norm stack's final norm F (F's gain is not applied "
            "to the other blocks), without rescaling. Exact identity starts are kept."
        },
    )
    mixing_lr_multiplier: float = field(
        default=1.0,
        metadata={
            "help": "Learning-rate multiplier of the mixing parameters (layer weights and logits, depth "
            "queries and keys, maps); the head and LoRA keep the base LR. Applied by "
            "peft_layerfusion.parameter_groups and by the recipes."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.state_norm not in STATE_NORMS:
            raise invalid("state_norm", self.state_norm, f"one of {list(STATE_NORMS)}")
        require_number("mixing_lr_multiplier", self.mixing_lr_multiplier, low=0.0, low_open=True)

    @property
    def normalizes_states(self) -> bool:
        """Whether the states are mixed at unit RMS (every ``state_norm`` but ``"none"``)."""
        return self.state_norm != "none"

    @property
    def mixes_after_norm(self) -> bool:
        """Whether the mix is taken after a pre-norm stack's final norm (``"rms_after_norm"``)."""
        return self.state_norm == "rms_after_norm"
