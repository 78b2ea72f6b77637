"""One real engine (one process) for the fused-KV attention tests; prints one JSON line.

Usage: python fused_attention_engine_probe.py MODEL_DIR eager|compiled
(VLLM_EDGE_FUSED_KV_ATTENTION decides the backend; VLLM_CACHE_ROOT the compile cache)

The engine runs in this process, so a torch profiler around ``generate`` sees every custom
op the model dispatched, compiled graph included: ``vllm::unified_kv_cache_update`` runs
only with vLLM's own backend.
"""

import json
import sys
from collections import Counter

OPS = ("vllm::unified_kv_cache_update", "vllm::unified_attention_with_output",
       "_C::cpu_attn_reshape_and_cache", "_C::cpu_attention_with_kv_cache")
# Over one 128-token block, so the last prompt reuses cached blocks written by the first call.
PREFIX = ("You are a careful assistant. Answer in plain English, keep answers short, and say "
          "when you do not know. ") * 8
BATCHES = [
    ["The capital of France is", "Write a haiku about the sea.", PREFIX + "Name a primary colour."],
    [PREFIX + "What is 12 times 12?"],
]


def _layers(model) -> list[dict]:
    from vllm.model_executor.layers.attention import Attention

    return [{"backend": layer.attn_backend.__name__,
             "impl": type(layer.impl).__name__,
             "includes_update": layer.attn_backend.forward_includes_kv_cache_update,
             "isa": getattr(layer, "isa", None),
             # the fused impl keeps its views of the cache bound to the layer
             "views_of_bound_cache": getattr(layer.impl, "_kv_cache", None) is layer.kv_cache}
            for layer in model.modules() if isinstance(layer, Attention)]


if __name__ == "__main__":
    import torch
    from vllm import LLM, SamplingParams

    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(sys.argv[1], max_model_len=512, max_num_seqs=4,
                       enforce_eager=sys.argv[2] == "eager")
    edge.apply_env()
    llm = LLM(**edge.kwargs)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)  # every sequence decodes
    llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        outs = [llm.generate(batch, sp, use_tqdm=False) for batch in BATCHES]
    counts = Counter(e.name for e in prof.events() if e.name in OPS)
    worker = llm.collective_rpc("vllm_edge_report")[0]
    print(json.dumps({
        "tokens": [list(o.outputs[0].token_ids) for batch in outs for o in batch],
        "text": [o.outputs[0].text for batch in outs for o in batch],
        "cached_prompt_tokens": [o.num_cached_tokens for batch in outs for o in batch],
        "op_calls": {op: counts.get(op, 0) for op in OPS},
        "layers": llm.apply_model(_layers)[0],
        "worker": {k: worker[k] for k in ("patches", "registration_states", "compilation_counter")},
    }))
