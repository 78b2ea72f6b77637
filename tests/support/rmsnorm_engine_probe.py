"""One real engine (one process, eager) for the norm-provider tests; prints one JSON line.

Usage: python rmsnorm_engine_probe.py MODEL_DIR  (VLLM_EDGE_RMSNORM_PROVIDER decides the state)

The engine runs in this process, so a torch profiler around ``generate`` sees
every op the model dispatched: ``_C::rms_norm`` / ``_C::fused_add_rms_norm``
appear only when vLLM's IR dispatch picked the provider.
"""

import json
import sys
from collections import Counter

KERNELS = ("_C::rms_norm", "_C::fused_add_rms_norm")

if __name__ == "__main__":
    import torch
    from vllm import LLM, SamplingParams

    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(sys.argv[1], max_model_len=512, max_num_seqs=1, enforce_eager=True)
    edge.apply_env()
    llm = LLM(**edge.kwargs)
    sp = SamplingParams(temperature=0, max_tokens=8)
    llm.generate(["Hello"], sp, use_tqdm=False)  # warm-up outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = llm.generate(["The capital of France is"], sp, use_tqdm=False)
    counts = Counter(e.name for e in prof.events() if e.name in KERNELS)
    kc = llm.llm_engine.vllm_config.kernel_config
    print(json.dumps({
        "engine_kwargs_priority": edge.kwargs.get("ir_op_priority"),
        "config_priority": {"rms_norm": list(kc.ir_op_priority.rms_norm),
                            "fused_add_rms_norm": list(kc.ir_op_priority.fused_add_rms_norm)},
        "worker": llm.collective_rpc("vllm_edge_report")[0],
        "kernel_calls": {k: counts.get(k, 0) for k in KERNELS},
        "num_layers": llm.llm_engine.vllm_config.model_config.hf_text_config.num_hidden_layers,
        "text": out[0].outputs[0].text,
    }))
