"""`vllm-edge compare` (skeleton): a grid spec of vLLM and llama.cpp arms on matched builds.

Matched builds come from one bf16 directory: vLLM runs it as bf16 and as
``cpu_int4``; llama.cpp runs our BF16 GGUF export of the same directory and
llama.cpp's own Q4_K_M, Q4_0 and Q8_0 quantizations of that export. Both
engines get the same threads and core set; `vllm-edge grid` runs the arms one
at a time, rotated over passes.

Not done yet (issue 6): fidelity arms, docs/comparisons.md tables and plots,
``--synthetic-1b``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_edge import envs

# (vLLM build, llama.cpp build) pairs the ratios are quoted for.
PAIRS = (("vllm-bf16", "llamacpp-BF16"), ("vllm-cpu_int4", "llamacpp-Q4_K_M"))
GGUF_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")


def gguf_dir(key: str) -> Path:
    return envs.home() / "models" / f"{key}-gguf"


def builds(model: str = "default") -> dict[str, Path]:
    """Where each matched build lives (whether or not it exists yet)."""
    from vllm_edge.models import default
    from vllm_edge.models.gguf_export import quantized_path

    m = default.resolve_key(model)
    bf16_gguf = gguf_dir(m.key) / f"{m.key}.bf16.gguf"
    out = {"vllm-bf16": default.prepared_dir(m), "vllm-cpu_int4": default.quantized_dir(m, "cpu_int4", 64),
           "llamacpp-BF16": bf16_gguf}
    out.update({f"llamacpp-{q}": quantized_path(bf16_gguf, q) for q in GGUF_QUANTS})
    return out


def prepare(model: str = "default", progress: bool = True) -> dict[str, Path]:
    """Create every missing build (bf16 import, cpu_int4, GGUF export and quantizations)."""
    from vllm_edge.models import default
    from vllm_edge.models.gguf_export import export_gguf, quantize

    paths = builds(model)
    bf16 = default.prepare(model, progress=progress)
    default.prepare_quantized(model, "cpu_int4", 64, progress=progress)
    if not paths["llamacpp-BF16"].exists():
        export_gguf(bf16, paths["llamacpp-BF16"], progress=progress)
    for q in GGUF_QUANTS:
        if not paths[f"llamacpp-{q}"].exists():
            quantize(paths["llamacpp-BF16"], paths[f"llamacpp-{q}"], q)
    return paths


def build_spec(paths: dict[str, Path], *, threads: int, cores: list[int] | None = None,
               prompt_len: int = 512, tg_tokens: int = 128, batch: int = 8, reps: int = 1,
               python: str = sys.executable) -> dict:
    common = ["--threads", str(threads), "--prompt-len", str(prompt_len), "--tg-tokens", str(tg_tokens),
              "--reps", str(reps), "--batch", str(batch)]
    arms = []
    for name, path in paths.items():
        if name.startswith("vllm-"):
            cmd = [python, "-m", "vllm_edge.cli", "bench", "speed", "--model", str(path), *common]
        else:
            cmd = [python, "-m", "vllm_edge.harness.llamacpp_arm", "--gguf", str(path), *common]
        arms.append({"name": name, "cmd": cmd})
    spec = {"name": "compare-vllm-llamacpp", "threads": threads,
            "metrics": [f"pp{prompt_len}_tps", f"tg{tg_tokens}_tps", f"b{batch}_tg_tps", "load_s",
                        "peak_rss_anon_mb"],
            "pairs": [list(p) for p in PAIRS], "arms": arms}
    if cores:
        spec["cores"] = cores
    return spec


def _cmd_compare(args: argparse.Namespace) -> int:
    import os

    from vllm_edge import atomic

    if args.synthetic_1b:
        print("error: --synthetic-1b is not implemented yet", file=sys.stderr)
        return 2
    paths = prepare(args.model) if args.prepare else builds(args.model)
    missing = [f"{k}: {v}" for k, v in paths.items() if not v.exists()]
    threads = args.threads or len(os.sched_getaffinity(0))
    spec = build_spec(paths, threads=threads, reps=args.reps)
    atomic.write_json(args.spec_out, spec)
    print(f"wrote {args.spec_out}; run it with: vllm-edge grid {args.spec_out} --passes 3", file=sys.stderr)
    if missing:
        print("missing builds (use --prepare):\n  " + "\n  ".join(missing), file=sys.stderr)
    print(json.dumps({"spec": str(args.spec_out), "arms": [a["name"] for a in spec["arms"]],
                      "missing": len(missing)}))
    return 0 if not missing else 1


def add_compare_commands(sub: "argparse._SubParsersAction") -> None:
    c = sub.add_parser("compare", help="(skeleton) grid spec of vLLM vs llama.cpp on matched builds",
                       description=__doc__.split("\n\n")[0])
    c.add_argument("--model", default="default", help="embedded model key, or 'default'")
    c.add_argument("--synthetic-1b", action="store_true", help="(not implemented) a 1B random-weight Llama")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--reps", type=int, default=1, help="reps per arm run (passes come from the grid)")
    c.add_argument("--prepare", action="store_true", help="create missing builds first")
    c.add_argument("--spec-out", default="benchmarks/specs/compare.json")
    c.set_defaults(func=_cmd_compare)
