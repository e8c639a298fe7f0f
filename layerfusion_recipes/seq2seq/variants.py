"""The models ``layerfusion seq2seq`` compares: the plain model, then each seq2seq method of the
registry in its variants (a run name and the options its config is built with), and the part of a
run's key that says those options (:func:`variant_key`), so that a record is never served for a
variant whose options or config defaults changed since it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from peft_layerfusion import EncoderFusionConfig, SurfaceFusionConfig
from peft_layerfusion.config import LayerFusionConfig
from peft_layerfusion.names import PLAIN_HEAD
from peft_layerfusion.registration import SEQ2SEQ_METHODS

from ..core.results.cells import config_defaults
from ..core.results.records import fingerprint

PLAIN_MODEL = PLAIN_HEAD  # the model alone, no fusion method
# The compared variants of a seq2seq method of the registry, by its config class: run name -> options.
# A registered seq2seq method not named here is compared once, under its own name, with its defaults.
VARIANTS: dict[type[LayerFusionConfig], dict[str, dict[str, Any]]] = {
    EncoderFusionConfig: {"encoder_fusion": {"include_embeddings": True}},
    SurfaceFusionConfig: {
        "surface_hard": {"fusion": "hard", "fusion_lambda": 0.8},
        "surface_soft": {"fusion": "soft", "temperature": 1.0},
    },
}


def method_configs() -> dict[str, Callable[[], LayerFusionConfig] | None]:
    """Every compared model by run name: the plain model (``None``), then each seq2seq method of the
    registry in its :data:`VARIANTS` (in their order, then any other), as a function building its config.

    Example:
        >>> list(method_configs())
        ['none', 'encoder_fusion', 'surface_hard', 'surface_soft']
    """
    declared = list(VARIANTS)
    rank = {cls: position for position, cls in enumerate(declared)}
    configs: dict[str, Callable[[], LayerFusionConfig] | None] = {PLAIN_MODEL: None}
    for method in sorted(SEQ2SEQ_METHODS, key=lambda m: rank.get(m.config_cls, len(declared))):
        variants = VARIANTS.get(method.config_cls, {method.name: {}})
        configs |= {name: partial(method.config_cls, **options) for name, options in variants.items()}
    return configs


def variant_options(name: str) -> dict[str, Any] | None:
    """The options the config of the compared model ``name`` is built with: its class's defaults
    (:func:`~layerfusion_recipes.core.results.cells.config_defaults`), the variant's own over them; ``None``
    for the plain model or a name not compared.

    Example:
        >>> variant_options("surface_hard")["fusion_lambda"], variant_options("none")
        (0.8, None)
    """
    make = method_configs().get(name)
    if not isinstance(make, partial):
        return None
    return config_defaults(make.func) | make.keywords


def variant_key(name: str) -> str | None:
    """The fingerprint of :func:`variant_options` (a run's key ends in ``|defaults=...``), ``None`` for
    the plain model.

    Example:
        >>> len(variant_key("surface_hard")), variant_key("none") is None
        (12, True)
    """
    options = variant_options(name)
    return None if options is None else fingerprint(options)
