"""``gptq``: a symmetric GPTQ export for vLLM's own W4A8 (AMX) path."""

NAME = "gptq"
