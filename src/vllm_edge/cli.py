"""`vllm-edge <subcommand>`."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_doctor(args: argparse.Namespace) -> int:
    from vllm_edge import doctor

    return doctor.main(as_json=args.json)


def _cmd_models_prepare(args: argparse.Namespace) -> int:
    from vllm_edge.models import default
    from vllm_edge.models.gguf_import import GgufImportError

    try:
        if args.quant:
            path = default.prepare_quantized(args.name, args.quant, args.group, force=args.force)
        else:
            path = default.prepare(args.name, force=args.force)
    except (default.ModelNotAvailable, GgufImportError) as exc:
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
        from vllm_edge.models.gguf_cli import run_verify

        return run_verify(args.file, path, args.verify_out)
    return 0


def _cmd_models_synthetic(args: argparse.Namespace) -> int:
    from vllm_edge.models import default, synthetic

    try:
        shape = synthetic.Shape.derive(args.hidden, args.layers, args.vocab, args.intermediate,
                                       args.heads, args.kv_heads, args.tied)
        tok = args.tokenizer_from or default.prepare("default")
        path = synthetic.build(args.out, shape, tokenizer_from=tok, seed=args.seed)
    except (ValueError, FileNotFoundError, default.ModelNotAvailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _cmd_models_build_vlm(args: argparse.Namespace) -> int:
    from vllm_edge.models import default, vlm

    try:
        if args.out:
            shape = vlm.VisionShape(args.vision_hidden, args.vision_layers, args.vision_intermediate,
                                    args.vision_heads, args.patch, args.image_size, args.scale_factor,
                                    args.longest_edge or args.image_size)
            if args.quant:
                raise ValueError("--quant builds the cached default VLM; quantize a custom OUT "
                                 "with `vllm-edge quantize OUT DST --quantize-vision/--no-quantize-vision`")
            path = vlm.build(args.out, text_dir=default.prepare("default"), vision=shape,
                             seed=args.seed)
        elif args.quant:
            path = vlm.prepare_quantized(args.quant, args.group, quantize_vision=args.quantize_vision,
                                         force=args.force)
        else:
            path = vlm.prepare(force=args.force)
    except (ValueError, FileNotFoundError, default.ModelNotAvailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    from vllm_edge.models import default

    for key, m in default.MODELS.items():
        path = default.prepared_dir(m)
        state = "prepared" if (path / "config.json").exists() else "not prepared"
        tag = " (default)" if key == default.DEFAULT else ""
        print(f"{key}{tag}: {m.description}; package {m.package}; {state} at {path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from vllm_edge import chat
    from vllm_edge.models.default import ModelNotAvailable
    from vllm_edge.models.gguf_import import GgufImportError

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


def _cmd_bench_aot(args: argparse.Namespace) -> int:
    from vllm_edge.harness import aot_bench

    result = aot_bench.run(model=args.model, starts=args.starts, out=args.out,
                           cache_root=args.cache_root, unpatched=not args.no_unpatched,
                           multiprocess=not args.one_process)
    print(json.dumps(result["summary"], indent=2))
    return 0 if result["summary"]["direct_load_on_warm_starts"] else 1


def _cmd_bench_init_memory(args: argparse.Namespace) -> int:
    from vllm_edge.harness import init_memory

    try:
        records = init_memory.run(model=args.model, reps=args.reps, context_len=args.context_len,
                                  max_model_len=args.max_model_len, multiprocess=args.multiprocess,
                                  enforce_eager=args.enforce_eager, out=args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if all(r["returncode"] == 0 for r in records) else 1


def _cmd_bench_ledger(args: argparse.Namespace) -> int:
    from vllm_edge.harness import ledger

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
    from vllm_edge.harness import import_cost

    result = import_cost.run(reps=args.reps, out=args.out)
    print(json.dumps(result["summary"], indent=2))
    return 0


def vlm_shape_defaults():
    from vllm_edge.models.vlm import VisionShape

    return VisionShape()


def build_parser() -> argparse.ArgumentParser:
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
    mp.add_argument("--group", type=int, choices=(64, 128), default=64)
    mp.set_defaults(func=_cmd_models_prepare)
    mi = msub.add_parser("import-gguf", help="convert a GGUF file into a bf16 safetensors directory")
    mi.add_argument("file")
    mi.add_argument("out")
    mi.add_argument("--force", action="store_true", help="convert again even if OUT is up to date")
    from vllm_edge.models.gguf_cli import add_export_command, add_verify_flags

    add_verify_flags(mi)
    mi.set_defaults(func=_cmd_models_import)
    add_export_command(msub)
    ms = msub.add_parser("synthetic", help="a Llama-shaped bf16 checkpoint with random weights")
    ms.add_argument("out")
    ms.add_argument("--hidden", type=int, default=2048)
    ms.add_argument("--layers", type=int, default=16)
    ms.add_argument("--vocab", type=int, default=49152)
    ms.add_argument("--intermediate", type=int, default=None, help="default: 2.75x hidden")
    ms.add_argument("--heads", type=int, default=None, help="default: hidden / 64")
    ms.add_argument("--kv-heads", type=int, default=None, help="default: heads / 4")
    ms.add_argument("--tied", action=argparse.BooleanOptionalAction, default=True,
                    help="tie the head to the embedding (default)")
    ms.add_argument("--seed", type=int, default=0)
    ms.add_argument("--tokenizer-from", default=None,
                    help="model directory whose tokenizer to reuse (default: the embedded model)")
    ms.set_defaults(func=_cmd_models_synthetic)
    mv = msub.add_parser("build-vlm", help="an Idefics3 (SmolVLM-shaped) checkpoint: SmolLM2's real "
                         "weights, a seeded random vision encoder (docs/multimodal.md)")
    mv.add_argument("out", nargs="?", default=None,
                    help="output directory (default: the cached build under VLLM_EDGE_HOME)")
    mv.add_argument("--quant", choices=("cpu_int4",), default=None,
                    help="also quantize the cached build (language model, embedding and head)")
    mv.add_argument("--group", type=int, choices=(64, 128), default=64)
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
    bi = bsub.add_parser("plugin-import", help="what the plugin adds to vLLM's import and plugin load")
    bi.add_argument("--reps", type=int, default=5)
    bi.add_argument("--out", default="benchmarks/results/plugin_import.json")
    bi.set_defaults(func=_cmd_bench_import)
    from vllm_edge.agent.cli import add_agent_commands
    from vllm_edge.harness.compare import add_compare_commands
    from vllm_edge.harness.fidelity_cli import add_fidelity_commands
    from vllm_edge.harness.grid_cli import add_grid_commands
    from vllm_edge.harness.report import add_report_commands
    from vllm_edge.harness.speed_cli import add_speed_commands
    from vllm_edge.quant.cli import add_quant_commands

    for add in (add_quant_commands, add_speed_commands, add_grid_commands, add_fidelity_commands,
                add_report_commands, add_agent_commands, add_compare_commands):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "prompt", "x") is None:
        from vllm_edge.chat import DEFAULT_PROMPT

        args.prompt = DEFAULT_PROMPT
    if getattr(args, "system", "x") is None:
        from vllm_edge.chat import DEFAULT_SYSTEM

        args.system = DEFAULT_SYSTEM
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
