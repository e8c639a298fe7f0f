"""peft_layerfusion: layer fusion (DWAtt, Concat and baselines) as PEFT tuner types.

Importing the package registers every method with peft::

    import peft_layerfusion
    from peft import get_peft_model
    model = get_peft_model(base_model, peft_layerfusion.DWAttConfig())
"""

from .average import AverageConfig
from .bitfit import BitFitConfig
from .concat import ConcatConfig
from .config import LayerFusionConfig
from .discovery import EncoderBlocks, find_encoder_blocks
from .dwatt import DWAttConfig
from .encoder_fusion import EncoderFusionConfig
from .extra_layers import ExtraLayersConfig
from .hooks import count_hooks
from .positions import fused_positions
from .registration import METHODS, register_all
from .scalar_mix import ScalarMixConfig
from .surface_fusion import SurfaceFusionConfig
from .tuner import LayerFusionLayer, LayerFusionModel

register_all()

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "AverageConfig",
    "BitFitConfig",
    "ConcatConfig",
    "DWAttConfig",
    "EncoderBlocks",
    "EncoderFusionConfig",
    "ExtraLayersConfig",
    "LayerFusionConfig",
    "LayerFusionLayer",
    "LayerFusionModel",
    "ScalarMixConfig",
    "SurfaceFusionConfig",
    "count_hooks",
    "find_encoder_blocks",
    "fused_positions",
    "register_all",
]
