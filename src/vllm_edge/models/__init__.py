"""Models: the embedded default model, GGUF import, synthetic checkpoints."""
