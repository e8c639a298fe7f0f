"""THE list of methods, and their registration as PEFT types.

:data:`METHODS` is the one place that names the fusion methods; everything else (regimes,
the audit, the command line, benchmarks, tests) derives its lists from it. Adding a method
is one file in ``methods/`` (its config, its module, its ``XxxModel``) and one line here.

peft keeps its method types in the closed str-Enum ``PeftType`` and refuses to register a
name that is not a member. :func:`register_all` adds the members (``DWATT``, ``CONCAT``,
...), then calls ``peft.utils.peft_types.register_peft_method`` for each. It is
idempotent (importing the package twice, or reloading it, changes nothing) and fails with
a message naming the installed peft version if peft's internals moved. Nothing inside the
library imports this module back (only ``__init__`` and ``comparison/``, which sit above it).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from .methods.layer_mix import LayerMixConfig, LayerMixModel
from .methods.scalar_mix import ScalarMixConfig, ScalarMixModel
from .methods.scaled_dwatt import ScaledDWAttConfig, ScaledDWAttModel
from .model import LayerFusionModel
from .seq2seq.encoder_fusion import EncoderFusionConfig, EncoderFusionModel
from .seq2seq.surface_fusion import SurfaceFusionConfig, SurfaceFusionModel


@dataclass(frozen=True)
class Method:
    """One registered fusion method.

    Args:
        name: Lower case, e.g. ``"dwatt"``; the PEFT type is ``name.upper()``.
        config_cls: Its PEFT config.
        model_cls: Its PEFT tuner (a :class:`LayerFusionModel` naming its fusion module).
        label: Its name in figures and tables, e.g. ``"R+n"`` for ``extra_layers``.
        recommended: The one method the project recommends (:data:`RECOMMENDED`).
    """

    name: str
    config_cls: type[LayerFusionConfig]
    model_cls: type[LayerFusionModel]
    label: str
    recommended: bool = False

    @property
    def prefix(self) -> str:
        return f"{self.name}_"

    @property
    def module_cls(self) -> type[FusionModule]:
        return self.model_cls.fusion_module_cls

    @property
    def variant_of(self) -> str | None:
        """The registered method this one is a variant of (its config subclasses that method's, with
        other defaults: ``scaled_dwatt`` of ``dwatt``, ``layer_mix`` of ``scalar_mix``), else ``None``."""
        parents = [m.name for m in METHODS if m is not self and issubclass(self.config_cls, m.config_cls)]
        return parents[0] if parents else None

    @property
    def token_wise(self) -> bool:
        """``h`` at a position depends on that position only (may run on selected positions)."""
        return self.module_cls.token_wise

    @property
    def seq2seq(self) -> bool:
        """Acts on a decoder: needs an encoder-decoder model."""
        return self.module_cls.seq2seq


METHODS: tuple[Method, ...] = (
    Method("dwatt", DWAttConfig, DWAttModel, "DWAtt"),
    Method("concat", ConcatConfig, ConcatModel, "Concat"),
    Method("average", AverageConfig, AverageModel, "Average"),
    Method("scalar_mix", ScalarMixConfig, ScalarMixModel, "ScalarMix"),
    Method("scaled_dwatt", ScaledDWAttConfig, ScaledDWAttModel, "Scaled DWAtt"),
    Method("layer_mix", LayerMixConfig, LayerMixModel, "LayerMix", recommended=True),
    Method("extra_layers", ExtraLayersConfig, ExtraLayersModel, "R+n"),
    Method("surface_fusion", SurfaceFusionConfig, SurfaceFusionModel, "SurfaceFusion"),
    Method("encoder_fusion", EncoderFusionConfig, EncoderFusionModel, "EncoderFusion"),
)

RECOMMENDED: Method = next(m for m in METHODS if m.recommended)  # the one method we recommend
ENCODER_METHODS: tuple[Method, ...] = tuple(m for m in METHODS if not m.seq2seq)  # any encoder
SEQ2SEQ_METHODS: tuple[Method, ...] = tuple(m for m in METHODS if m.seq2seq)  # encoder-decoder only

# PEFT types that are not fusion methods (no fusion module): (name, config class, tuner class).
BASELINE_TYPES: tuple[tuple[str, type, type], ...] = (("bitfit", BitFitConfig, BitFitModel),)


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
    entries = [(method.name, method.config_cls, method.model_cls) for method in METHODS]
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
    install_card_hook()  # saved adapters get a card naming peft_layerfusion (see card.py)
    install_load_guards()  # a failed load leaves no adapter behind (see loading.py)
