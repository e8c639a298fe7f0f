"""Registration of the fusion methods as PEFT types, in one place.

peft keeps its method types in the closed str-Enum ``PeftType`` and refuses to register a
name that is not a member. :func:`register_all` adds the members (``DWATT``, ``CONCAT``,
...), then calls ``peft.utils.peft_types.register_peft_method`` for each. It is
idempotent (importing the package twice, or reloading it, changes nothing) and fails with
a message naming the installed peft version if peft's internals moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import peft
from peft.utils import peft_types
from peft.utils.peft_types import PeftType

from .average import Average, AverageConfig
from .bitfit import BitFitConfig, BitFitModel
from .concat import Concat, ConcatConfig
from .config import LayerFusionConfig
from .dwatt import DWAtt, DWAttConfig
from .encoder_fusion import EncoderFusion, EncoderFusionConfig
from .extra_layers import ExtraLayers, ExtraLayersConfig
from .fusion import FusionModule
from .scalar_mix import ScalarMix, ScalarMixConfig
from .surface_fusion import SurfaceFusion, SurfaceFusionConfig
from .tuner import LayerFusionModel


@dataclass(frozen=True)
class Method:
    """One registered fusion method."""

    name: str  # lower case, e.g. "dwatt"; the PEFT type is name.upper()
    config_cls: type[LayerFusionConfig]
    module_cls: type[FusionModule]

    @property
    def prefix(self) -> str:
        return f"{self.name}_"


METHODS: tuple[Method, ...] = (
    Method("dwatt", DWAttConfig, DWAtt),
    Method("concat", ConcatConfig, Concat),
    Method("average", AverageConfig, Average),
    Method("scalar_mix", ScalarMixConfig, ScalarMix),
    Method("extra_layers", ExtraLayersConfig, ExtraLayers),
    Method("surface_fusion", SurfaceFusionConfig, SurfaceFusion),
    Method("encoder_fusion", EncoderFusionConfig, EncoderFusion),
)

TUNER_CLASSES: dict[str, type[LayerFusionModel]] = {}

# PEFT types that are not fusion methods (no fusion module): (name, config class, tuner class).
BASELINE_TYPES: tuple[tuple[str, type, type], ...] = (("bitfit", BitFitConfig, BitFitModel),)


def fusion_module_class(config: LayerFusionConfig) -> type[FusionModule]:
    """The fusion module class for a config."""
    for method in METHODS:
        if isinstance(config, method.config_cls):
            return method.module_cls
    raise TypeError(f"No fusion method is registered for {type(config).__name__}.")


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


def _tuner_class(method: Method) -> type[LayerFusionModel]:
    if method.name not in TUNER_CLASSES:
        class_name = method.config_cls.__name__.removesuffix("Config") + "Model"
        TUNER_CLASSES[method.name] = type(class_name, (LayerFusionModel,), {"prefix": method.prefix})
    return TUNER_CLASSES[method.name]


def register_all() -> None:
    """Register every fusion method with peft (idempotent)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    if not hasattr(peft_types, "register_peft_method"):
        raise _peft_internals_error("peft.utils.peft_types.register_peft_method is missing")
    entries = [(method.name, method.config_cls, _tuner_class(method)) for method in METHODS]
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
