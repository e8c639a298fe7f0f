"""peft_layerfusion: layer fusion (DWAtt, Concat and baselines) as PEFT tuner types.

Importing the package registers every method with peft::

    import peft_layerfusion
    from peft import get_peft_model
    model = get_peft_model(base_model, peft_layerfusion.DWAttConfig())

The house: plumbing at the top (``discovery`` finds the blocks, ``hooks`` captures their
states, ``fusion`` is the method interface, ``layer`` the tuner layer, ``model`` the tuner,
``names`` THE list of names, ``registration`` the methods with their classes), one file per
method in ``methods/``, the sequence-to-sequence methods in ``seq2seq/``, fair comparisons in
``comparison/``.
"""

from . import names  # a module attribute even when names.py was loaded alone first (layerfusion_recipes)
from .bitfit import BitFitConfig, BitFitModel
from .config import DepthMixConfig, LayerFusionConfig
from .discovery import EncoderBlocks, find_encoder_blocks
from .fusion import FusionContext, FusionModule
from .hooks import count_hooks
from .layer import LayerFusionLayer, active_fusion_module, fused_positions
from .methods.average import AverageConfig, AverageModel
from .methods.concat import ConcatConfig, ConcatModel
from .methods.dwatt import DWAttConfig, DWAttModel
from .methods.extra_layers import ExtraLayersConfig, ExtraLayersModel
from .methods.scalar_mix import ScalarMixConfig, ScalarMixModel
from .model import LayerFusionModel
from .optim import mixing_multipliers, parameter_groups
from .probing import (
    CrossValidatedProbe,
    LayerProbes,
    Probe,
    best_layer,
    cross_validated_probe,
    dev_standard_error,
    fit_probe,
    keep_fusion,
    layer_probe_scores,
    layer_probes,
)
from .registration import METHODS, RECOMMENDED, Method, method_named, register_all
from .seq2seq.encoder_fusion import EncoderFusionConfig, EncoderFusionModel
from .seq2seq.surface_fusion import SurfaceFusionConfig, SurfaceFusionModel

register_all()

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "RECOMMENDED",
    "AverageConfig",
    "AverageModel",
    "BitFitConfig",
    "BitFitModel",
    "ConcatConfig",
    "ConcatModel",
    "CrossValidatedProbe",
    "DWAttConfig",
    "DWAttModel",
    "DepthMixConfig",
    "EncoderBlocks",
    "EncoderFusionConfig",
    "EncoderFusionModel",
    "ExtraLayersConfig",
    "ExtraLayersModel",
    "FusionContext",
    "FusionModule",
    "LayerFusionConfig",
    "LayerFusionLayer",
    "LayerFusionModel",
    "LayerProbes",
    "Method",
    "Probe",
    "ScalarMixConfig",
    "ScalarMixModel",
    "SurfaceFusionConfig",
    "SurfaceFusionModel",
    "active_fusion_module",
    "best_layer",
    "count_hooks",
    "cross_validated_probe",
    "dev_standard_error",
    "find_encoder_blocks",
    "fit_probe",
    "fused_positions",
    "keep_fusion",
    "layer_probe_scores",
    "layer_probes",
    "method_named",
    "names",
    "mixing_multipliers",
    "parameter_groups",
    "register_all",
]
