"""The models: loading with a new head, methods and regimes, the named offline models (the demo
encoder, GGUF decoders)."""
