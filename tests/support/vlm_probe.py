"""Chat turns with an image on the real engine, in its own process (one engine for all
prompts); prints one JSON line: per prompt, prompt and output token ids and the top-5
logprobs of every generated token.

Usage: python vlm_probe.py MODEL_DIR IMAGE PROMPTS_JSON_LIST SYSTEM MAX_TOKENS
"""

import json
import sys

if __name__ == "__main__":
    model, image, prompts, system, max_tokens = sys.argv[1:6]
    from vllm_edge.runtime import images
    from vllm_edge.runtime.engine import edge_engine

    img = images.load(image).image
    edge = edge_engine(model, max_model_len=1024, max_num_seqs=1, enforce_eager=True)
    edge.kwargs["limit_mm_per_prompt"] = {"image": 1}
    edge.apply_env()
    from vllm import LLM, SamplingParams

    llm = LLM(**edge.kwargs)
    results = []
    for prompt in json.loads(prompts):
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": [{"type": "image_pil", "image_pil": img},
                                                 {"type": "text", "text": prompt}]}]
        sp = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), logprobs=5)
        out = llm.chat(messages, sp, use_tqdm=False)[0]
        steps = [{str(k): v.logprob for k, v in step.items()} for step in out.outputs[0].logprobs]
        results.append({"prompt": prompt, "prompt_token_ids": list(out.prompt_token_ids),
                        "token_ids": list(out.outputs[0].token_ids), "text": out.outputs[0].text,
                        "first_logprobs": steps[0], "step_logprobs": steps})
    print(json.dumps({"results": results}))
