"""The registry: every method as a :class:`Method` (its names and its classes), and their
registration as PEFT types.

The names (each method's and preset's name, label, PEFT type, summary) are plain data in
:mod:`.names`, the one list; :data:`METHODS` pairs each entry with its config and tuner classes
(:data:`TYPES`, by PEFT type), and everything else (regimes, the audit, the command line,
benchmarks, tests) derives its lists from these. Adding a method is one file in ``methods/`` (its
config, its module, its ``XxxModel``), one entry in ``names.py`` and its classes in :data:`TYPES`.
A variant of a method (LayerMix of ScalarMix, Scaled DWAtt of DWAtt) is a preset of its config
(``PRESETS``), an entry of ``names.py`` under its own name but registered with peft as its method's
type, as peft makes DoRA an option of LoRA: ``method_named("layer_mix").make_config(start_layer=4)``
is ``ScalarMixConfig.from_preset("layer_mix", start_layer=4)``, saved as ``SCALAR_MIX``.

peft keeps its method types in the closed str-Enum ``PeftType`` and refuses to register a
name that is not a member. :func:`register_all` adds the members (``DWATT``, ``CONCAT``,
...), then calls ``peft.utils.peft_types.register_peft_method`` for each. It is
idempotent (importing the package twice, or reloading it, changes nothing) and fails with
a message naming the installed peft version if peft's internals moved. Nothing inside the
library imports this module back (only ``__init__`` and ``comparison/``, which sit above it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import peft
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING
from peft.utils import peft_types
from peft.utils.peft_types import PeftType

from .bitfit import BitFitConfig, BitFitModel
from .card import install_card_hook
from .config import LayerFusionConfig
from .fusion import FusionModule
from .loading import install_load_guards
from .methods.average import AverageConfig, AverageModel
from .methods.concat import ConcatConfig, ConcatModel
from .methods.dwatt import DWAttConfig, DWAttModel
from .methods.extra_layers import ExtraLayersConfig, ExtraLayersModel
from .methods.scalar_mix import ScalarMixConfig, ScalarMixModel
from .model import LayerFusionModel
from .names import BASELINE_ENTRIES, ENTRIES, TRAINED_NAMES, Entry
from .seq2seq.encoder_fusion import EncoderFusionConfig, EncoderFusionModel
from .seq2seq.surface_fusion import SurfaceFusionConfig, SurfaceFusionModel


@dataclass(frozen=True)
class Method:
    """One registered fusion method, or a preset of one: its entry of :mod:`.names` and its classes.

    Args:
        entry: Its names (:class:`~.names.Entry`): name, label, summary, the method it is a preset of.
        config_cls: Its PEFT config.
        model_cls: Its PEFT tuner (a :class:`LayerFusionModel` naming its fusion module).
    """

    entry: Entry
    config_cls: type[LayerFusionConfig]
    model_cls: type[LayerFusionModel]

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in self.config_cls.PRESETS:
            allowed = f"one of {list(self.config_cls.PRESETS)} of {self.config_cls.__name__}"
            raise ValueError(f"{self.name}: `preset`={self.preset!r} is not allowed: expected {allowed}.")

    @property
    def name(self) -> str:
        """Lower case, e.g. ``"dwatt"``."""
        return self.entry.name

    @property
    def label(self) -> str:
        """Its name in figures and tables, e.g. ``"R+n"`` for ``extra_layers``."""
        return self.entry.label

    @property
    def summary(self) -> str:
        """One line on what it is."""
        return self.entry.summary

    @property
    def recommended(self) -> bool:
        """The one method the project recommends (:data:`RECOMMENDED`)."""
        return self.entry.recommended

    @property
    def preset(self) -> Optional[str]:
        """The preset of ``config_cls`` (one of its ``PRESETS``) this entry is, else ``None``."""
        return self.entry.preset

    @property
    def variant_of(self) -> Optional[str]:
        """The method this entry is a preset of (``scaled_dwatt`` of ``dwatt``, ``layer_mix`` of
        ``scalar_mix``), else ``None``."""
        return self.entry.variant_of

    @property
    def peft_type(self) -> str:
        """The PEFT type its configs are saved as (a preset's: its method's)."""
        return self.config_cls.PEFT_TYPE

    @property
    def prefix(self) -> str:
        return self.model_cls.prefix

    @property
    def module_cls(self) -> type[FusionModule]:
        return self.model_cls.fusion_module_cls

    def make_config(self, **fields: Any) -> LayerFusionConfig:
        """Its config, ``fields`` set (over the preset's values, for a preset).

        Example:
            >>> config = method_named("layer_mix").make_config(start_layer=2)
            >>> type(config).__name__, config.state_norm, config.start_layer
            ('ScalarMixConfig', 'rms', 2)
        """
        if self.preset is None:
            return self.config_cls(**fields)
        return self.config_cls.from_preset(self.preset, **fields)

    @property
    def token_wise(self) -> bool:
        """``h`` at a position depends on that position only (may run on selected positions)."""
        return self.module_cls.token_wise

    @property
    def seq2seq(self) -> bool:
        """Acts on a decoder: needs an encoder-decoder model."""
        return self.module_cls.seq2seq


# Each PEFT type's config and tuner class, for the entries of names.py (a preset has its method's).
TYPES: dict[str, tuple[type, type]] = {
    config_cls.PEFT_TYPE: (config_cls, model_cls)
    for config_cls, model_cls in (
        (DWAttConfig, DWAttModel),
        (ConcatConfig, ConcatModel),
        (AverageConfig, AverageModel),
        (ScalarMixConfig, ScalarMixModel),
        (ExtraLayersConfig, ExtraLayersModel),
        (SurfaceFusionConfig, SurfaceFusionModel),
        (EncoderFusionConfig, EncoderFusionModel),
        (BitFitConfig, BitFitModel),
    )
}
METHODS: tuple[Method, ...] = tuple(Method(entry, *TYPES[entry.peft_type]) for entry in ENTRIES)

RECOMMENDED: Method = next(m for m in METHODS if m.recommended)  # the one method we recommend
ENCODER_METHODS: tuple[Method, ...] = tuple(m for m in METHODS if not m.seq2seq)  # any encoder
# what a trained comparison runs, audits and pairs: the encoder methods of names.TRAINED_NAMES (not those
# fitted in closed form)
TRAINED_METHODS: tuple[Method, ...] = tuple(m for m in ENCODER_METHODS if m.name in TRAINED_NAMES)
SEQ2SEQ_METHODS: tuple[Method, ...] = tuple(m for m in METHODS if m.seq2seq)  # encoder-decoder only

# PEFT types that are not fusion methods (no fusion module): (name, config class, tuner class).
BASELINE_TYPES: tuple[tuple[str, type, type], ...] = tuple(
    (entry.name, *TYPES[entry.peft_type]) for entry in BASELINE_ENTRIES
)


def method_named(name: str) -> Method:
    """The registered :class:`Method` called ``name``.

    Raises:
        ValueError: naming the known methods when there is none of that name.

    Example:
        >>> method_named("dwatt").config_cls.__name__
        'DWAttConfig'
    """
    for method in METHODS:
        if method.name == name:
            return method
    raise ValueError(f"method={name!r} is not registered; allowed: {[m.name for m in METHODS]}")


def _peft_internals_error(what: str) -> RuntimeError:
    return RuntimeError(
        f"peft_layerfusion cannot register its methods with peft {peft.__version__}: {what}. "
        "It was written against peft 0.21 (PeftType str-Enum, register_peft_method); "
        "please report this with your peft version."
    )


def add_peft_type(value: str) -> PeftType:
    """Add ``value`` (upper case) as a member of ``PeftType``; return the member (idempotent)."""
    if value in PeftType.__members__:
        return PeftType[value]
    for attr in ("_member_map_", "_value2member_map_", "_member_names_"):
        if not hasattr(PeftType, attr):
            raise _peft_internals_error(f"PeftType has no `{attr}`")
    if not issubclass(PeftType, str):
        raise _peft_internals_error("PeftType is no longer a str Enum")
    member = str.__new__(PeftType, value)
    member._name_ = value
    member._value_ = value
    member.__objclass__ = PeftType
    member._sort_order_ = len(PeftType._member_names_)
    PeftType._member_map_[value] = member
    PeftType._value2member_map_[value] = member
    PeftType._member_names_.append(value)
    type.__setattr__(PeftType, value, member)
    if PeftType(value) is not member or PeftType[value] is not member:
        raise _peft_internals_error("a member added to PeftType is not found by value or name")
    return member


def register_all() -> None:
    """Register every fusion method (and BitFit) with peft, and the model card hook (idempotent)."""
    if not hasattr(peft_types, "register_peft_method"):
        raise _peft_internals_error("peft.utils.peft_types.register_peft_method is missing")
    # a preset is registered as its method's type
    entries = [(m.name, m.config_cls, m.model_cls) for m in METHODS if m.preset is None]
    for name, config_cls, model_cls in entries + list(BASELINE_TYPES):
        peft_type = add_peft_type(name.upper())
        registered = PEFT_TYPE_TO_CONFIG_MAPPING.get(peft_type)
        if registered is not None:
            if registered.__qualname__ != config_cls.__qualname__:
                raise RuntimeError(f"PEFT type {peft_type.value} is already registered by {registered!r}.")
            continue
        peft_types.register_peft_method(
            name=name,
            config_cls=config_cls,
            model_cls=model_cls,
            prefix=f"{name}_",
        )
    for _, config_cls, _ in entries:  # adapters saved under a former type load as this config (no new type)
        for former in config_cls.FORMER_PEFT_TYPES:
            PEFT_TYPE_TO_CONFIG_MAPPING.setdefault(former, config_cls)
    install_card_hook()  # saved adapters get a card naming peft_layerfusion (see card.py)
    install_load_guards()  # a failed load leaves no adapter behind (see loading.py)
