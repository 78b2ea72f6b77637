"""vllm-edge: stock vLLM made practical on edge CPUs (a plugin, not a fork)."""

__version__ = "0.1.0"
