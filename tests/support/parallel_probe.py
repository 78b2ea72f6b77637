"""One engine at a given tensor/pipeline parallel size, in its own process: prints one JSON
line with the greedy tokens of PROMPTS (with the top two logprobs at each step), their
prompt logprobs, and what the plugin reports from inside every rank.

Usage: python parallel_probe.py MODEL_DIR TP PP [DTYPE]
"""

import json
import os
import sys

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot",
           "Water boils at"]
GEN = 16

if __name__ == "__main__":
    from vllm_edge.runtime.engine import edge_engine

    model, tp, pp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
    edge = edge_engine(model, dtype=dtype, max_model_len=256, max_num_seqs=len(PROMPTS), enforce_eager=True,
                       tensor_parallel_size=tp, pipeline_parallel_size=pp,
                       enable_prefix_caching=False)
    edge.apply_env()

    from vllm import LLM, SamplingParams

    llm = LLM(**edge.kwargs, seed=0)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=GEN, ignore_eos=True,
                                                logprobs=2, prompt_logprobs=0),
                        use_tqdm=False)
    ranks = llm.collective_rpc("vllm_edge_report")
    layers = llm.collective_rpc("vllm_edge_layers")
    print(json.dumps({
        "pid": os.getpid(), "env": edge.env,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
        "top2": [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
                 for o in outs],
        "prompt_logprobs": [[None] + [next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]]
                            for o in outs],
        "ranks": [{"pid": r["pid"], "patches": r["patches"], "registered": r["registered"],
                   "layers": lay} for r, lay in zip(ranks, layers)],
    }))
