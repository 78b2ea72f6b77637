"""One chat turn with an image on the real engine, in its own process; prints one JSON
line: prompt and output token ids, and the first token's top-5 logprobs.

Usage: python vlm_probe.py MODEL_DIR IMAGE PROMPT SYSTEM MAX_TOKENS
"""

import json
import sys

if __name__ == "__main__":
    model, image, prompt, system, max_tokens = sys.argv[1:6]
    from vllm_edge.runtime import images
    from vllm_edge.runtime.engine import edge_engine

    img = images.load(image).image
    edge = edge_engine(model, max_model_len=1024, max_num_seqs=1, enforce_eager=True)
    edge.kwargs["limit_mm_per_prompt"] = {"image": 1}
    edge.apply_env()
    from vllm import LLM, SamplingParams

    llm = LLM(**edge.kwargs)
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": [{"type": "image_pil", "image_pil": img},
                                             {"type": "text", "text": prompt}]}]
    sp = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), logprobs=5)
    out = llm.chat(messages, sp, use_tqdm=False)[0]
    first = out.outputs[0].logprobs[0]
    print(json.dumps({"prompt_token_ids": list(out.prompt_token_ids),
                      "token_ids": list(out.outputs[0].token_ids),
                      "text": out.outputs[0].text,
                      "first_logprobs": {str(k): v.logprob for k, v in first.items()}}))
