"""A small engine run in its own process, for lever tests: prints one JSON line.

Usage: python engine_probe.py MODEL_DIR KV_BYTES  (env decides the rest)
"""

import inspect
import json
import sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(sys.argv[1], max_model_len=512, max_num_seqs=2, enforce_eager=True,
                       kv_cache_memory_bytes=int(sys.argv[2]))
    llm = LLM(**edge.kwargs)
    binds = []  # inspect.Signature.bind calls while generating (one process: the worker's too)
    real_bind = inspect.Signature.bind

    def counting_bind(self, *args, **kwargs):
        binds.append(sys._getframe(1).f_code.co_filename)
        return real_bind(self, *args, **kwargs)

    inspect.Signature.bind = counting_bind
    try:
        out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    finally:
        inspect.Signature.bind = real_bind
    report = llm.collective_rpc("vllm_edge_report")[0]
    cc = llm.llm_engine.vllm_config.cache_config
    print(json.dumps({"kv_cache_memory_bytes": cc.kv_cache_memory_bytes, "num_blocks": cc.num_gpu_blocks,
                      "block_size": cc.block_size, "text": out[0].outputs[0].text,
                      "token_ids": list(out[0].outputs[0].token_ids), "binds_in_generate": binds,
                      "worker": report}))
