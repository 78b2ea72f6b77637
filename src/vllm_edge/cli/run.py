"""`vllm-edge run`: chat with a model kept loaded in a background server, or answer one
prompt in this process."""

from __future__ import annotations

import argparse
import sys

from vllm_edge.cli.args import (add_model, add_output, add_parallel, add_speculative, add_weight_quant,
                                reported, weight_dtype)
from vllm_edge.serving import keepalive

NAME = "run"
HELP = "chat with a model (kept loaded in a background server), or answer one prompt"
DESCRIPTION = (
    "With no --prompt on a terminal: an interactive chat (/? for commands, Ctrl-D to leave). "
    "With --prompt, or text on stdin: one streamed answer. The model is served by a "
    "background `vllm-edge serve` on 127.0.0.1 that the next `run` reuses and that stops "
    "after --keep-alive without a request (`vllm-edge ps`, `vllm-edge stop`). --keep-alive 0, "
    "-o json, --image and --multiprocess load the model in this process instead and report "
    "its ready time, memory and patch states.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--prompt", default=None,
                   help="one user message to answer (default: a chat on a terminal, else stdin, "
                        "else the capital of France)")
    p.add_argument("--system", default=None,
                   help="system message ('' for none; default: the model's own where vllm-edge has "
                        "measured one, else 'You are a helpful assistant.')")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="per answer (default: 64 for one answer, 512 in the chat)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0, greedy, for one answer; in the chat, the "
                        "model's own defaults, which /show names)")
    p.add_argument("--keep-alive", default="5m", metavar="DURATION",
                   help="how long the background server stays loaded after the last request "
                        "(300, 30s, 5m, 1h); 0: load the model in this process and exit after "
                        "answering (default: %(default)s)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--num-parallel", type=int, default=keepalive.NUM_PARALLEL, metavar="N",
                   help="answers the keep-alive server decodes at once, as Ollama's "
                        "OLLAMA_NUM_PARALLEL; more wait their turn. Each costs the KV of a full "
                        "context (default: %(default)s; `serve` defaults to 4)")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    p.add_argument("--multiprocess", action="store_true",
                   help="vLLM's default engine-core and worker processes instead of one process")
    add_output(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show vLLM's own output live instead of keeping it in "
                        "$VLLM_EDGE_HOME/logs/run-*.log (-o json always shows it)")
    add_weight_quant(p)
    add_parallel(p)
    add_speculative(p)
    p.add_argument("--priority", choices=("speed", "fidelity"), default="speed",
                   help="what the weight-path choice favours (see docs/guide/quantize.md)")
    p.add_argument("--image", action="append", default=None, metavar="PATH",
                   help="an image file (or a data:image/...;base64 URL) to put before the prompt; "
                        "repeat for several. With --model default, runs the embedded VLM "
                        "smolvlm-135m (docs/guide/multimodal.md)")


def refuse_speech(model: str) -> None:
    """A speech model's tokens are codec frames: a chat with it prints noise. Sent to `speak`."""
    from vllm_edge.common.errors import EdgeError, UsageError
    from vllm_edge.models import resolver

    try:
        source = resolver.resolve(model)
    except EdgeError:
        return  # the run itself names what is wrong with the argument
    if resolver.is_speech(source):
        raise UsageError(f"--model {model}: a speech model answers in audio codes, not text; use "
                         f"`vllm-edge speak \"TEXT\" --model {model}`, or `vllm-edge serve --model "
                         f"{model}` and POST /v1/audio/speech")


def run(args: argparse.Namespace) -> int:
    refuse_speech(args.model)

    as_json = args.output == "json"
    keep_s = keepalive.parse_duration(args.keep_alive)
    if keep_s and not (as_json or args.image or args.multiprocess):
        return client(args, keep_s)
    from vllm_edge.serving import run as chat

    with reported(ValueError):
        result = chat.run(
            model=args.model, prompt=chat.DEFAULT_PROMPT if args.prompt is None else args.prompt,
            system=chat.system_message(args.model, args.system)[0],
            max_tokens=args.max_tokens or 64, max_model_len=args.max_model_len,
            enforce_eager=args.enforce_eager, one_process=not args.multiprocess, as_json=as_json,
            dtype=weight_dtype(args.quant), priority=args.priority, images=args.image,
            verbose=args.verbose or as_json, tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size, speculative=args.speculative,
        )
    chat.print_result(result, as_json)
    return 0


def serves_base_model(rec: keepalive.Record, model: str, interactive: bool) -> bool:
    """Whether the server's model has no chat template (a base model, whose prompt is then
    completed as plain text); a UsageError when a chat with it was asked for."""
    from vllm_edge.common.errors import UsageError
    from vllm_edge.serving.serve import BASE_MODEL_LINE

    if not keepalive.serves_base_model(rec):
        return False
    if interactive:
        raise UsageError(f"--model {model}: {BASE_MODEL_LINE}; a chat needs one, so pass "
                         "--prompt TEXT (or pipe the text in) for a plain completion")
    return True


def client(args: argparse.Namespace, keep_s: float) -> int:
    """`run` against a keep-alive server: started if none is up, reused if one is."""
    import time

    from vllm_edge.common.errors import UsageError
    from vllm_edge.common.procmem import process_start_epoch, tree_rss_anon_mb
    from vllm_edge.serving import chat, startup_phases
    from vllm_edge.serving.run import DEFAULT_PROMPT, system_message
    from vllm_edge.serving.serve import BASE_MODEL_LINE

    started = process_start_epoch()
    interactive = args.prompt is None and sys.stdin.isatty()
    prompt = args.prompt
    if prompt is None and not interactive:
        prompt = sys.stdin.read().strip() or DEFAULT_PROMPT
    if args.num_parallel < 1:
        raise UsageError(f"--num-parallel {args.num_parallel}: must be at least 1")
    options = {"max_model_len": args.max_model_len, "priority": args.priority,
               "enforce_eager": args.enforce_eager, "speculative": args.speculative,
               "max_num_seqs": args.num_parallel}
    ranks = (args.tensor_parallel_size, args.pipeline_parallel_size)
    t0 = time.time()
    # a pipe gets the answer alone; a terminal sees every phase of a first start
    quiet = args.prompt is None and not interactive
    display = None if quiet else startup_phases.Display(sys.stderr, sys.stderr.isatty())
    rec, new = keepalive.ensure(args.model, args.quant, keep_s, options, ranks=ranks, progress=display,
                                say=(lambda m: None) if quiet else
                                (lambda m: print(f"[vllm-edge] {m}", file=sys.stderr)))
    how = f"started, ready in {time.time() - t0:.1f} s" if new else "reused"
    name = keepalive.served_name(rec)
    st = keepalive.status(rec.port, token=rec.token) or {}
    system, system_source = system_message(args.model, args.system)
    settings = chat.Settings(
        # the chat samples with the server's defaults (the model's own); one answer is greedy
        temperature=args.temperature if args.temperature is not None else (None if interactive else 0.0),
        max_tokens=args.max_tokens or (512 if interactive else 64),
        system=system, system_source=system_source,
        server=st.get("sampling") or {}, server_source=st.get("sampling_source"))
    base = serves_base_model(rec, args.model, interactive)
    if interactive:
        return chat.repl(rec.url, name, settings, headers=rec.headers,
                         check=lambda: keepalive.verify(rec), banner=(
            f"vllm-edge chat: {args.model} on server pid {rec.pid} ({how}; it stays loaded "
            f"{rec.keep_alive_s:g} s after the last request, `vllm-edge stop` ends it). /? for commands, "
            "/bye or Ctrl-D to leave."))
    keepalive.verify(rec)
    if base:
        print(f"[vllm-edge] {BASE_MODEL_LINE}", file=sys.stderr)
        ans = chat.stream_completion(rec.url, name, prompt, settings, sys.stdout, rec.headers)
    else:
        ans = chat.stream_answer(rec.url, name, chat.turn([{"role": "user", "content": prompt}],
                                                          settings), settings, sys.stdout, rec.headers)
    print()
    if args.prompt is not None:  # a pipe gets the answer alone
        mb, procs = tree_rss_anon_mb(rec.pid)
        first = f"{ans.first_token_at - started:.2f} s" if ans.first_token_at else "n/a"
        tps = f"{ans.decode_tps:.1f} tok/s" if ans.decode_tps else "n/a"
        print(f"--- server pid {rec.pid} on 127.0.0.1:{rec.port} ({how}) | first token {first} "
              f"after the command | decode {tps} ({ans.completion_tokens} tokens) | server "
              f"RssAnon {mb:.0f} MB over {procs} processes", file=sys.stderr)
    return 0
