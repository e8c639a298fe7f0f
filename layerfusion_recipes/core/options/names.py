"""The registry's names and labels as plain data (standard library only), for the command line.

GENERATED from peft_layerfusion's registry by ``python -m layerfusion_recipes.reporting.registry_names``:
do not edit (tests/recipes/reporting/test_methods_command.py fails while it is out of date).
"""

# ruff: noqa: E501
# fmt: off

PLAIN_HEAD = "none"
METHOD_NAMES = ("none", "dwatt", "concat", "average", "scalar_mix", "scaled_dwatt", "layer_mix", "extra_layers", "probe_ensemble", "stacked")
REGIME_NAMES = ("fe", "ft", "lora", "bitfit")
ADAPTER_REGIME_NAMES = ("adapter_seqbn", "adapter_double_seqbn")
METHOD_LABELS = {
    "none": "last layer (plain head)",
    "dwatt": "DWAtt",
    "concat": "Concat",
    "average": "Average",
    "scalar_mix": "ScalarMix",
    "scaled_dwatt": "Scaled DWAtt",
    "layer_mix": "LayerMix",
    "extra_layers": "R+n",
    "probe_ensemble": "Probe ensemble",
    "stacked": "Stacked combiner",
    "surface_fusion": "SurfaceFusion",
    "encoder_fusion": "EncoderFusion",
}
REGIME_LABELS = {
    "fe": "frozen encoder",
    "ft": "full fine-tuning",
    "lora": "LoRA",
    "bitfit": "BitFit",
    "adapter_seqbn": "bottleneck adapter (Pfeiffer)",
    "adapter_double_seqbn": "bottleneck adapters (Houlsby)",
}
METHOD_ROWS = (
    ("dwatt", "DWATT", "True", "False", "DWAtt: depth-wise attention over every block's output"),
    ("concat", "CONCAT", "True", "False", "Concat: one learned linear map of every fused layer's output"),
    ("average", "AVERAGE", "True", "False", "Average: the plain mean of the fused layers' outputs (no parameters)"),
    ("scalar_mix", "SCALAR_MIX", "True", "False", "ScalarMix: a softmax-normalised, scaled mix of the layers (ELMo; Bapna et al. 2018)"),
    ("scaled_dwatt", "DWATT", "True", "False", "Scaled DWAtt: depth-wise attention that keeps its spread over depth"),
    ("layer_mix", "SCALAR_MIX", "True", "False", "recommended: LayerMix: a ScalarMix of unit-RMS states, its blend kept in [0, 1], the method we recommend"),
    ("extra_layers", "EXTRA_LAYERS", "False", "False", "R+n, the \"deeper baseline\": n extra blocks of the base model's own kind on top"),
    ("probe_ensemble", "CONCAT", "True", "False", "Probe ensemble: the mean of the top-k blocks' probe scores, fitted in closed form on the training sample (few_shot.choose + deploy); trained from scratch, a Concat"),
    ("stacked", "CONCAT", "True", "False", "Stacked combiner: the blocks' probe scores combined by least squares on their out-of-fold scores, fitted in closed form on the training sample (few_shot.choose + deploy); trained from scratch, a Concat"),
    ("surface_fusion", "SURFACE_FUSION", "False", "True", "SurfaceFusion: the source embeddings fused into the decoder's output distribution"),
    ("encoder_fusion", "ENCODER_FUSION", "False", "True", "EncoderFusion: transparent attention from every decoder layer to all encoder layers"),
    ("bitfit", "BITFIT", "-", "False", "BitFit (Ben Zaken et al., 2022) as a PEFT type: train the base model's bias terms only"),
    ("none", "-", "True", "False", "the plain last-layer head, no fusion (recipes only)"),
)
