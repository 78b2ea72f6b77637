"""`vllm-edge bench speech`: time to first audio (ramp against none), real-time factor at one
and four streams, the talker's and the codec's shares, memory and the boundary error."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.cli.args import add_model, add_out

NAME = "speech"
HELP = "speech out, streamed: first audio with and without the ramp, real-time factor, boundary error"


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench import speech

    add_model(p, default="speech", help="a speech model: 'speech' (the embedded one) or its folder")
    p.add_argument("--passes", type=int, default=3, help="interleaved passes per arm (default: %(default)s)")
    p.add_argument("--text", default=speech.DEFAULT_TEXT, help="what every request says")
    p.add_argument("--voice", default=None, help="one of the model's voices (default: its first)")
    p.add_argument("--enforce-eager", action="store_true", help="the talker without torch.compile")
    add_out(p, default=speech.DEFAULT_OUT)


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import speech
    from vllm_edge.common import atomic
    from vllm_edge.common.errors import UsageError
    from vllm_edge.runtime import weight_path

    if args.passes < 1:
        raise UsageError(f"--passes {args.passes}: must be at least 1")
    model_dir, _ = weight_path.model_for_engine(args.model)  # the build `speak` and `serve` load
    result = speech.measure(model_dir, passes=args.passes, text=args.text, voice=args.voice,
                            enforce_eager=args.enforce_eager,
                            log=lambda m: print(f"[bench speech] {m}", file=sys.stderr))
    if args.out:
        atomic.write_json(args.out, result)
        print(f"wrote {args.out}", file=sys.stderr)
    keys = ("ttfa_s", "ttfa_ratio_ramp_over_no_ramp", "rtf", "rtf_4_streams", "boundary_max_abs_err",
            "peak_tree_rss_anon_mb", "shares")
    print(json.dumps({k: result[k] for k in keys}, indent=2))
    return 0
