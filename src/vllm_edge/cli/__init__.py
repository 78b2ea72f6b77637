"""`vllm-edge <subcommand>`."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.quant.groups import DEFAULT_GROUP


def _cmd_doctor(args: argparse.Namespace) -> int:
    from vllm_edge import doctor

    return doctor.main(as_json=args.json)


def _cmd_models_prepare(args: argparse.Namespace) -> int:
    from vllm_edge.models import store
    from vllm_edge.models.gguf_import import GgufImportError

    try:
        if args.quant:
            path = store.prepare_quantized(args.name, args.quant, args.group, force=args.force)
        else:
            path = store.prepare(args.name, force=args.force)
    except (store.ModelNotAvailable, GgufImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _cmd_models_import(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_import import GgufImportError, import_gguf

    try:
        path = import_gguf(args.file, args.out, force=args.force)
    except GgufImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    if getattr(args, "verify", False):
        from vllm_edge.cli.gguf import run_verify

        return run_verify(args.file, path, args.verify_out)
    return 0


def _cmd_models_synthetic(args: argparse.Namespace) -> int:
    from vllm_edge.models import store, synthetic

    try:
        shape = synthetic.Shape.derive(args.hidden, args.layers, args.vocab, args.intermediate,
                                       args.heads, args.kv_heads, args.tied, args.arch)
        tok = args.tokenizer_from or store.prepare("default")
        path = synthetic.build(args.out, shape, tokenizer_from=tok, seed=args.seed, force=args.force)
    except (ValueError, FileNotFoundError, store.ModelNotAvailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _cmd_models_build_vlm(args: argparse.Namespace) -> int:
    from vllm_edge.models import store, vlm

    try:
        if args.out:
            shape = vlm.VisionShape(args.vision_hidden, args.vision_layers, args.vision_intermediate,
                                    args.vision_heads, args.patch, args.image_size, args.scale_factor,
                                    args.longest_edge or args.image_size)
            if args.quant:
                raise ValueError("--quant builds the cached default VLM; quantize a custom OUT "
                                 "with `vllm-edge quantize OUT DST --quantize-vision/--no-quantize-vision`")
            path = vlm.build(args.out, text_dir=store.prepare("default"), vision=shape,
                             seed=args.seed, force=args.force)
        elif args.quant:
            path = vlm.prepare_quantized(store.prepare("default"), args.quant, args.group,
                                         quantize_vision=args.quantize_vision, force=args.force)
        else:
            path = vlm.prepare(store.prepare("default"), force=args.force)
    except (ValueError, FileNotFoundError, store.ModelNotAvailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    from vllm_edge.models import store

    for key, m in store.MODELS.items():
        path = store.prepared_dir(m)
        state = "prepared" if (path / "config.json").exists() else "not prepared"
        tag = " (default)" if key == store.DEFAULT else ""
        print(f"{key}{tag}: {m.description}; package {m.package}; {state} at {path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_import import GgufImportError
    from vllm_edge.models.store import ModelNotAvailable
    from vllm_edge.serving import run as chat

    try:
        result = chat.run(
            model=args.model, prompt=args.prompt, system=args.system or None,
            max_tokens=args.max_tokens, max_model_len=args.max_model_len,
            enforce_eager=args.enforce_eager, one_process=not args.multiprocess, as_json=args.json,
            dtype=args.dtype, priority=args.priority, images=args.image,
        )
    except (ModelNotAvailable, GgufImportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    chat.print_result(result, args.json)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_import import GgufImportError
    from vllm_edge.models.store import ModelNotAvailable
    from vllm_edge.serving import serve

    try:
        return serve.main(
            args.model, host=args.host, port=args.port, max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs, enforce_eager=args.enforce_eager, dtype=args.dtype,
            priority=args.priority, multiprocess=args.multiprocess,
            tool_call_parser=args.tool_call_parser, chat_template=args.chat_template,
            served_model_name=args.served_model_name, extra=args.vllm_extra)
    except (ModelNotAvailable, GgufImportError, ValueError, serve.ServeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _cmd_bench_soak(args: argparse.Namespace) -> int:
    from vllm_edge.bench import soak

    try:
        result = soak.run(args.model, duration_s=args.duration, max_requests=args.max_requests,
                          clients=args.clients, max_model_len=args.max_model_len,
                          serve_args=["--enforce-eager"] if args.enforce_eager else [],
                          base_url=args.base_url, server_pid=args.server_pid, out=args.out,
                          warmup_s=args.warmup, seed=args.seed)
    except soak.SoakError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keys = ("requests", "wall_s", "by_class", "errors", "http_5xx", "ttft_s", "tpot_s", "rss_anon",
            "health_after", "passed")
    print(json.dumps({k: result[k] for k in keys}, indent=2))
    return 0 if result["passed"] else 1


def _cmd_bench_aot(args: argparse.Namespace) -> int:
    from vllm_edge.bench import aot_cache as aot_bench

    result = aot_bench.run(model=args.model, starts=args.starts, out=args.out,
                           cache_root=args.cache_root, unpatched=not args.no_unpatched,
                           multiprocess=not args.one_process)
    print(json.dumps(result["summary"], indent=2))
    return 0 if result["summary"]["direct_load_on_warm_starts"] else 1


def _cmd_bench_init_memory(args: argparse.Namespace) -> int:
    from vllm_edge.bench import init_memory

    try:
        records = init_memory.run(model=args.model, reps=args.reps, context_len=args.context_len,
                                  max_model_len=args.max_model_len, multiprocess=args.multiprocess,
                                  enforce_eager=args.enforce_eager, out=args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if all(r["returncode"] == 0 for r in records) else 1


def _cmd_bench_ledger(args: argparse.Namespace) -> int:
    from vllm_edge.bench import ledger

    try:
        result = ledger.bench(model=args.model, context_len=args.context_len,
                              max_model_len=args.max_model_len, multiprocess=args.multiprocess,
                              enforce_eager=args.enforce_eager, out=args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for led in result["ledgers"]:
        print(json.dumps({k: led[k] for k in ("pid", "rss_anon_mb", "roles", "tied_mb", "kv_cache",
                                              "opaque_packed_handles", "attributed_mb",
                                              "unattributed_mb")}, indent=2))
    return 0


def _cmd_bench_import(args: argparse.Namespace) -> int:
    from vllm_edge.bench import plugin_import as import_cost

    result = import_cost.run(reps=args.reps, out=args.out)
    print(json.dumps(result["summary"], indent=2))
    return 0


def vlm_shape_defaults():
    from vllm_edge.models.vlm import VisionShape

    return VisionShape()


def build_parser() -> argparse.ArgumentParser:
    from vllm_edge.quant.groups import GROUPS

    p = argparse.ArgumentParser(prog="vllm-edge", description="vLLM on edge CPUs.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="versions, CPU features, patch states, problems")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=_cmd_doctor)

    m = sub.add_parser("models", help="prepare and import models")
    msub = m.add_subparsers(dest="models_command", required=True)
    mp = msub.add_parser("prepare", help="convert an embedded model (cached, idempotent)")
    mp.add_argument("name", nargs="?", default="default", help="embedded model key, or 'default'")
    mp.add_argument("--force", action="store_true", help="convert again even if cached")
    mp.add_argument("--quant", choices=("cpu_int4", "gptq"), default=None,
                    help="also quantize it (cached beside the bf16 directory)")
    mp.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP,
                    help="input columns per scale (docs/cpu-4bit.md)")
    mp.set_defaults(func=_cmd_models_prepare)
    mi = msub.add_parser("import-gguf", help="convert a GGUF file into a bf16 safetensors directory")
    mi.add_argument("file")
    mi.add_argument("out")
    mi.add_argument("--force", action="store_true",
                    help="convert again even if OUT is up to date, and replace OUT even if it is "
                         "not a conversion vllm-edge made")
    from vllm_edge.cli.gguf import add_export_command, add_verify_flags

    add_verify_flags(mi)
    mi.set_defaults(func=_cmd_models_import)
    add_export_command(msub)
    ms = msub.add_parser("synthetic", help="a bf16 checkpoint with random weights (Llama, Qwen2 or Qwen3)")
    ms.add_argument("out")
    ms.add_argument("--arch", choices=("llama", "qwen2", "qwen3"), default="llama",
                    help="qwen2 adds q/k/v biases, qwen3 per-head q/k RMSNorm (default llama)")
    ms.add_argument("--hidden", type=int, default=2048)
    ms.add_argument("--layers", type=int, default=16)
    ms.add_argument("--vocab", type=int, default=49152)
    ms.add_argument("--intermediate", type=int, default=None, help="default: 2.75x hidden")
    ms.add_argument("--heads", type=int, default=None, help="default: hidden / 64")
    ms.add_argument("--kv-heads", type=int, default=None, help="default: heads / 4")
    ms.add_argument("--tied", action=argparse.BooleanOptionalAction, default=True,
                    help="tie the head to the embedding (default)")
    ms.add_argument("--seed", type=int, default=0)
    ms.add_argument("--force", action="store_true",
                    help="replace OUT even if it is not a synthetic build vllm-edge made")
    ms.add_argument("--tokenizer-from", default=None,
                    help="model directory whose tokenizer to reuse (default: the embedded model)")
    ms.set_defaults(func=_cmd_models_synthetic)
    mv = msub.add_parser("build-vlm", help="an Idefics3 (SmolVLM-shaped) checkpoint: SmolLM2's real "
                         "weights, a seeded random vision encoder (docs/multimodal.md)")
    mv.add_argument("out", nargs="?", default=None,
                    help="output directory (default: the cached build under VLLM_EDGE_HOME)")
    mv.add_argument("--quant", choices=("cpu_int4",), default=None,
                    help="also quantize the cached build (language model, embedding and head)")
    mv.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP,
                    help="input columns per scale (docs/cpu-4bit.md)")
    mv.add_argument("--quantize-vision", action=argparse.BooleanOptionalAction, default=False,
                    help="with --quant: quantize the vision tower's linears too (default: no; "
                         "see docs/multimodal.md for the measurement)")
    mv.add_argument("--force", action="store_true", help="build again even if cached")
    shape = vlm_shape_defaults()
    mv.add_argument("--vision-hidden", type=int, default=shape.hidden)
    mv.add_argument("--vision-layers", type=int, default=shape.layers)
    mv.add_argument("--vision-intermediate", type=int, default=shape.intermediate)
    mv.add_argument("--vision-heads", type=int, default=shape.heads)
    mv.add_argument("--patch", type=int, default=shape.patch)
    mv.add_argument("--image-size", type=int, default=shape.image_size,
                    help="the encoder's tile size in pixels")
    mv.add_argument("--scale-factor", type=int, default=shape.scale_factor,
                    help="pixel-shuffle factor of the connector")
    mv.add_argument("--longest-edge", type=int, default=None,
                    help="processor resize target; above --image-size images are split into tiles "
                         "(default: --image-size, one tile per image)")
    mv.add_argument("--seed", type=int, default=0)
    mv.set_defaults(func=_cmd_models_build_vlm)
    ml = msub.add_parser("list", help="embedded models and whether they are prepared")
    ml.set_defaults(func=_cmd_models_list)

    r = sub.add_parser("run", help="load a model and answer one chat prompt")
    r.add_argument("--model", default="default", help="'default', an embedded key, or a model directory")
    r.add_argument("--prompt", default=None, help="user message (default: the capital of France)")
    r.add_argument("--system", default=None, help="system message ('' for none)")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--max-model-len", type=int, default=2048)
    r.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    r.add_argument("--multiprocess", action="store_true",
                   help="vLLM's default engine-core and worker processes instead of one process")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--dtype", choices=("auto", "bf16"), default="auto",
                   help="auto: the weight path chosen for this CPU (4-bit); bf16: unquantized")
    r.add_argument("--priority", choices=("speed", "fidelity"), default="speed",
                   help="what the weight-path choice favours (see docs/cpu-4bit.md)")
    r.add_argument("--image", action="append", default=None, metavar="PATH",
                   help="an image file (or a data:image/...;base64 URL) to put before the prompt; "
                        "repeat for several. With --model default, runs the embedded VLM "
                        "smolvlm-135m (docs/multimodal.md)")
    r.set_defaults(func=_cmd_run)

    sv = sub.add_parser(
        "serve", help="vLLM's OpenAI-compatible server with the edge defaults",
        description="vLLM's own OpenAI-compatible server (/v1/chat/completions, /v1/completions, "
                    "/v1/models, /health, /metrics) with the edge defaults. Arguments after `--` "
                    "go to vLLM's serve parser unchanged and win over ours.")
    sv.add_argument("model", nargs="?", default="default",
                    help="'default', an embedded key, or a model directory")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-model-len", type=int, default=2048)
    sv.add_argument("--max-num-seqs", type=int, default=4,
                    help="sequences decoded together; the KV budget is priced for all of them")
    sv.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    sv.add_argument("--dtype", choices=("auto", "bf16"), default="auto",
                    help="auto: the weight path chosen for this CPU (4-bit); bf16: unquantized")
    sv.add_argument("--priority", choices=("speed", "fidelity"), default="speed")
    sv.add_argument("--multiprocess", action="store_true",
                    help="vLLM's own layout: a separate worker process beside the engine core")
    sv.add_argument("--tool-call-parser", default=None,
                    help="vLLM tool-call parser name, or 'none' (default: chosen from the chat template)")
    sv.add_argument("--chat-template", default=None, help="Jinja chat template file")
    sv.add_argument("--served-model-name", nargs="+", default=None,
                    help="names requests may use (default: the embedded key and 'default', or MODEL)")
    sv.set_defaults(func=_cmd_serve)

    b = sub.add_parser("bench", help="benchmarks (results go to benchmarks/results/)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    ba = bsub.add_parser("aot-cache", help="cold vs warm starts on one VLLM_CACHE_ROOT")
    ba.add_argument("--model", default="default")
    ba.add_argument("--starts", type=int, default=3, help="1 cold start, then warm starts")
    ba.add_argument("--cache-root", default=None, help="compile cache root (default: a fresh temp dir)")
    ba.add_argument("--one-process", action="store_true",
                    help="run the starts in the edge one-process mode (default: vLLM's processes)")
    ba.add_argument("--no-unpatched", action="store_true",
                    help="skip the final start with the patch disabled (stock vLLM behaviour)")
    ba.add_argument("--out", default="benchmarks/results/aot_cache.json")
    ba.set_defaults(func=_cmd_bench_aot)
    bm = bsub.add_parser("init-memory", help="ready time and tree RssAnon by start-up phase")
    bm.add_argument("--model", default="default")
    bm.add_argument("--reps", type=int, default=1)
    bm.add_argument("--context-len", type=int, default=1024, help="tokens that fill the KV cache")
    bm.add_argument("--max-model-len", type=int, default=2048)
    bm.add_argument("--multiprocess", action="store_true", help="vLLM's default processes")
    bm.add_argument("--enforce-eager", action="store_true")
    bm.add_argument("--out", default="benchmarks/results/init_memory.jsonl")
    bm.set_defaults(func=_cmd_bench_init_memory)
    bl = bsub.add_parser("ledger", help="attribute the weight process's RssAnon to tensors and KV")
    bl.add_argument("--model", default="default")
    bl.add_argument("--context-len", type=int, default=1024)
    bl.add_argument("--max-model-len", type=int, default=2048)
    bl.add_argument("--multiprocess", action="store_true")
    bl.add_argument("--enforce-eager", action="store_true")
    bl.add_argument("--out", default="benchmarks/results/ledger.json")
    bl.set_defaults(func=_cmd_bench_ledger)
    bs = bsub.add_parser(
        "soak", help="concurrent mixed clients against `serve`: errors by class, TTFT/TPOT, RssAnon",
        description="Starts `vllm-edge serve MODEL` on a free loopback port (or uses --base-url "
                    "with --server-pid), runs --clients concurrent clients for --duration seconds "
                    "or --max-requests requests, whichever ends first, then stops the server. "
                    "Exit 1 on any 5xx, unexpected outcome, or RssAnon not flat within 5%% after "
                    "warm-up.")
    bs.add_argument("model", nargs="?", default="default")
    bs.add_argument("--duration", type=float, default=600, help="seconds (default 600)")
    bs.add_argument("--max-requests", type=int, default=100_000)
    bs.add_argument("--clients", type=int, default=8)
    bs.add_argument("--max-model-len", type=int, default=2048)
    bs.add_argument("--warmup", type=float, default=None,
                    help="seconds excluded from the RssAnon flatness check (default: 20%% of --duration)")
    bs.add_argument("--enforce-eager", action="store_true", help="start the server without torch.compile")
    bs.add_argument("--base-url", default=None, help="a running server (loopback only)")
    bs.add_argument("--server-pid", type=int, default=None, help="its pid, root of the RssAnon tree")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--out", default="benchmarks/results/soak.json")
    bs.set_defaults(func=_cmd_bench_soak)
    bi = bsub.add_parser("plugin-import", help="what the plugin adds to vLLM's import and plugin load")
    bi.add_argument("--reps", type=int, default=5)
    bi.add_argument("--out", default="benchmarks/results/plugin_import.json")
    bi.set_defaults(func=_cmd_bench_import)
    from vllm_edge.bench.micro.rmsnorm import add_command as add_rmsnorm_bench

    add_rmsnorm_bench(bsub)
    from vllm_edge.bench.bandwidth import add_bandwidth_commands
    from vllm_edge.bench.compare import add_compare_commands
    from vllm_edge.bench.fidelity.run import add_fidelity_commands
    from vllm_edge.bench.report import add_report_commands
    from vllm_edge.cli.agent import add_agent_commands
    from vllm_edge.cli.grid import add_grid_commands
    from vllm_edge.cli.quantize import add_quant_commands
    from vllm_edge.cli.speed import add_profile_commands, add_speed_commands

    for add in (add_quant_commands, add_speed_commands, add_grid_commands, add_fidelity_commands,
                add_report_commands, add_agent_commands, add_compare_commands, add_bandwidth_commands,
                add_profile_commands):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # `serve ... -- <vLLM flags>`
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if extra and args.command != "serve":
        parser.error("arguments after `--` are only for `serve` (they go to vLLM)")
    args.vllm_extra = extra
    if getattr(args, "prompt", "x") is None:
        from vllm_edge.serving.run import DEFAULT_PROMPT

        args.prompt = DEFAULT_PROMPT
    if getattr(args, "system", "x") is None:
        from vllm_edge.serving.run import DEFAULT_SYSTEM

        args.system = DEFAULT_SYSTEM
    from vllm_edge.common.errors import EdgeError

    try:
        return int(args.func(args) or 0)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

