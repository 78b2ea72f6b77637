"""Group sizes the quantizer and the cpu_int4 method accept, and the default (no torch import)."""

GROUPS = (32, 64, 128)
# g32 measured against g64 on the default model (benchmarks/results/grid/group/): tg128 and peak
# memory NOT A RANKING, KL to bf16 0.054 against 0.287 (a dequantized Q4_1 sits on a g32 grid).
DEFAULT_GROUP = 32
# what the packing and the kernels handle (the quantizer's GROUPS plus 256, for microbenchmarks)
KERNEL_GROUPS = (32, 64, 128, 256)
