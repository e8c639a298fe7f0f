"""Sequence-to-sequence fusion: SurfaceFusion, EncoderFusion, their decoder hooks, generation.

``hooks`` finds a model's decoder parts and passes fused encoder states to them;
``surface_fusion`` fuses the source embeddings into the output distribution (and wraps
``generate`` so beam search ranks by the fused scores); ``encoder_fusion`` gives each decoder
layer its own mix of encoder layers.
"""
