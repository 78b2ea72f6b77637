"""Fidelity defaults, torch-free so `vllm-edge fidelity --help` needs no torch."""

DEFAULT_K = 20        # reference ids saved per position
DEFAULT_KL_K = 10     # ids the KL uses; the rest of the saved 20 raises candidate coverage
DEFAULT_CHUNK = 512
DEFAULT_GREEDY_TOKENS = 64
DEFAULT_CORPUS_CHUNKS = 8  # 8 x 255 scored positions: about a minute of prefill on 2 cores
