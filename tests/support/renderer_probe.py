"""vLLM's renderer for a model folder, built and warmed up as an engine start does, in its own
process: prints one JSON line with the RssAnon it added (over the process tree), its time, the
processors vLLM cached and the chat template it resolves.

Usage: python renderer_probe.py MODEL_DIR  (the patch switches come from the environment)
"""

import hashlib
import json
import sys
import time

if __name__ == "__main__":
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins
    from vllm.renderers import hf
    from vllm.renderers.params import ChatParams
    from vllm.renderers.registry import renderer_from_config
    from vllm.transformers_utils.processor import cached_get_processor

    from vllm_edge.common.procmem import tree_rss_anon_mb

    load_general_plugins()
    config = EngineArgs(model=sys.argv[1], enforce_eager=True).create_engine_config()
    before = tree_rss_anon_mb()[0]
    t0 = time.perf_counter()
    renderer = renderer_from_config(config)
    renderer.warmup(ChatParams())
    seconds = time.perf_counter() - t0
    added = tree_rss_anon_mb()[0] - before
    template = hf.resolve_chat_template(renderer.tokenizer, None, None,
                                        model_config=config.model_config)
    print(json.dumps({
        "rss_anon_mb": round(added, 1), "seconds": round(seconds, 2),
        "processors_cached": cached_get_processor.cache_info().currsize,
        "template_sha256": hashlib.sha256((template or "").encode()).hexdigest(),
        "has_template": template is not None,
        "tokens": renderer.tokenizer.encode("<start_of_turn>user\nHello, world! 123"),
    }))
