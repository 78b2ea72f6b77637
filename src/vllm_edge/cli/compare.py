"""`vllm-edge compare`: vLLM against llama.cpp on matched builds -> docs/results/comparisons.md."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from vllm_edge.bench import compare
from vllm_edge.cli.args import add_cpus, add_model, add_out, add_threads
from vllm_edge.common.errors import EdgeError

NAME = "compare"
HELP = "vLLM vs llama.cpp on matched builds -> docs/results/comparisons.md"
DESCRIPTION = (compare.__doc__.split("\n\n")[0] + " Default budget: under 30 minutes on 2 "
               "cores (see docs/guide/llama-cpp.md). Needs the [baselines] extra.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p, help="embedded model key, 'default', a GGUF file (llama.cpp also runs the file itself, "
                      "vLLM its repack, the file's own types kept) or a bf16 model folder")
    p.add_argument("--synthetic-1b", action="store_true",
                   help="a 1B random-weight Llama (hidden 2048, 16 layers): speed and memory only; "
                        "builds ~5 GB of checkpoints once; well over 30 minutes")
    p.add_argument("--passes", type=int, default=compare.DEFAULT_PASSES,
                   help="rotated passes (default %(default)s)")
    p.add_argument("--reps", type=int, default=compare.DEFAULT_REPS,
                   help="reps per arm run (default %(default)s)")
    add_threads(p, help="first N cores of the core set (default all)")
    add_cpus(p)
    p.add_argument("--batch", type=int, default=compare.DEFAULT_BATCH,
                   help="concurrent sequences (default %(default)s)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--tg-tokens", type=int, default=128)
    p.add_argument("--skip-fidelity", action="store_true")
    p.add_argument("--arms", default=None, metavar="A,B,...",
                   help="run only these arms (names as in the tables: vllm-bf16, vllm-cpu_int4, "
                        "vllm-cpu_int4-g64 (1B only), llamacpp-BF16, llamacpp-file (a GGUF model "
                        "only), llamacpp-Q4_K_M, llamacpp-Q4_0, llamacpp-Q8_0, and on a CPU with AMX "
                        "once scripts/install.sh --llamacpp-amx built it, llamacpp-amx-Q4_K_M etc.: "
                        "the same files under llama.cpp with its AMX kernels); fidelity scores the "
                        "pairs the selected arms make (vllm-cpu_int4 and llamacpp-file: the same-file row)")
    p.add_argument("--quick", action="store_true",
                   help="the 4-bit arms only (" + ", ".join(compare.QUICK_ARMS) + "; those that exist "
                        "for the model), no fidelity: one sitting, the 1B included")
    p.add_argument("--fidelity-greedy-tokens", type=int, default=compare.FIDELITY_GREEDY_TOKENS,
                   help="greedy tokens per prompt, both engines (default %(default)s)")
    p.add_argument("--fidelity-chunks", type=int, default=compare.FIDELITY_CHUNKS,
                   help="512-token corpus chunks for teacher-forced KL, both engines (default %(default)s)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM speed arms without torch.compile (for smoke runs; results are compiled)")
    p.add_argument("--allow-busy", action="store_true", help="measure even if the cores are busy")
    p.add_argument("--wait-lock", action="store_true", help="queue behind a running measurement")
    p.add_argument("--lock-file", default=None, help="advisory host lock (default: the grid's)")
    p.add_argument("--smoke", action="store_true", help="mark the document as a pipeline smoke, not results")
    add_out(p, default=None, help=f"artifact directory (default {compare.DEFAULT_OUT}/<host>, "
                                  f"{compare.DEFAULT_OUT_1B}/<host> with --synthetic-1b, or "
                                  f"{compare.DEFAULT_OUT}_<name> for a GGUF file or folder)")
    p.add_argument("--doc", default=None, help=f"markdown file to update (default {compare.DEFAULT_DOC}, "
                                               "every host's section; a GGUF file or folder gets its "
                                               "own page, <out>/comparisons.md)")
    p.add_argument("--render-only", action="store_true", help="redraw --doc from --out without measuring")


def run(args: argparse.Namespace) -> int:
    """HostBusy and LockHeld leave with the grid's exit codes (3, 4)."""
    from vllm_edge.bench import speed
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.cli.args import reported
    from vllm_edge.common import pinning

    user = compare.is_user_model(args.model) and not args.synthetic_1b
    doc = Path(args.doc) if args.doc else None
    if args.render_only:
        with reported(FileNotFoundError):
            if args.out is None and not user:  # the shared page: every host's run, redrawn whole
                res = compare.write_page("benchmarks/results", doc or compare.DEFAULT_DOC)
            else:
                out_dir = Path(args.out or Path(f"{compare.DEFAULT_OUT}_{compare.user_slug(args.model)}")
                               / compare.host_slug(compare.this_host()))
                shared = compare.is_shared_page(out_dir, Path(compare.DEFAULT_DOC))
                res = compare.draw(out_dir, doc or (Path(compare.DEFAULT_DOC) if shared else
                                                    out_dir / "comparisons.md"),
                                   synthetic_1b=args.synthetic_1b, title=args.model if user else None)
        print(json.dumps(res))
        return 0
    if not llamacpp_runner.available():
        raise EdgeError(llamacpp_runner.SKIP_REASON)
    allowed = sorted(os.sched_getaffinity(0))
    cpus = pinning.parse_int_list(args.cpus, "--cpus", minimum=0) or None
    cores = pinning.core_set(cpus, args.threads, allowed)
    # every run lives in one directory per host: a run here never replaces another machine's
    default_out = (Path(f"{compare.DEFAULT_OUT}_{compare.user_slug(args.model)}") if user else
                   Path(compare.DEFAULT_OUT_1B if args.synthetic_1b else compare.DEFAULT_OUT)
                   ) / compare.host_slug(compare.this_host(cores))
    out_dir = Path(args.out or default_out)
    doc = doc or (out_dir / "comparisons.md" if user else Path(compare.DEFAULT_DOC))
    title = args.model if user else None
    if min(args.passes, args.reps, args.fidelity_greedy_tokens, args.fidelity_chunks) < 1:
        raise speed.SpeedArgError("--passes, --reps, --fidelity-greedy-tokens and --fidelity-chunks "
                                  "must be at least 1")
    arms = args.arms.split(",") if args.arms else None
    every = compare.builds(args.model, args.synthetic_1b)  # hashes a GGUF file: once
    if args.quick:
        arms = [a for a in compare.QUICK_ARMS if a in every and (arms is None or a in arms)]
    paths = compare.prepare(args.model, args.synthetic_1b, arms=arms)
    if user and "llamacpp-BF16" not in every and not args.skip_fidelity:
        print(f"compare: {Path(args.model).name} is not a Llama file, which our GGUF export does not "
              "write: llama.cpp runs the file alone, and fidelity is vLLM's repack against llama.cpp "
              "on the file (the same-file row)", file=sys.stderr)
    missing = [f"{k}: {v}" for k, v in paths.items() if not v.exists()]
    if missing:
        raise EdgeError("missing builds:\n  " + "\n  ".join(missing))
    command = "vllm-edge " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] \
        else "vllm-edge compare"
    res = compare.run(paths, out_dir=out_dir, doc=doc, passes=args.passes, reps=args.reps,
                      threads=len(cores), cores=cores, batch=args.batch, prompt_len=args.prompt_len,
                      tg_tokens=args.tg_tokens, fidelity=not (args.skip_fidelity or args.synthetic_1b or args.quick),
                      allow_busy=args.allow_busy, enforce_eager=args.enforce_eager,
                      greedy_tokens=args.fidelity_greedy_tokens, chunks=args.fidelity_chunks,
                      lock_path=args.lock_file, wait_lock=args.wait_lock, command=command,
                      smoke=args.smoke, synthetic_1b=args.synthetic_1b, title=title)
    print(grid.format_summary(res["speed"]), file=sys.stderr)
    print(f"wrote {res['doc']} and {', '.join(res['plots'])}; artifacts in {out_dir}", file=sys.stderr)
    failed = {a: c["failed"] for s in (res["speed"], res["fidelity"]) if s for a, c in s["runs"].items()
              if c["failed"]}
    print(json.dumps({"doc": res["doc"], "out": str(out_dir), "wall_s": res["meta"]["wall_s"],
                      "failed_runs": failed}))
    return grid.EXIT_ARM_FAILED if failed else 0
