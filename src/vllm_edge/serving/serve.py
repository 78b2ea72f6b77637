"""`vllm-edge serve`: vLLM's own OpenAI-compatible server, started with the edge defaults.

Nothing of the server is re-implemented. This module picks the weights (the hardware
probe's path, prepared and quantized on first use), prices the KV budget and the threads
through :func:`vllm_edge.runtime.engine.edge_engine`, chooses the tool-call parser and chat
template, turns all of that into vLLM's own command-line arguments, and hands vLLM a socket
it has already bound, so that a busy port fails in a fraction of a second instead of after
the engine has loaded.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_edge.common.errors import EdgeError

DATA = Path(__file__).resolve().parents[1] / "data"
# The embedded model's own template has no tools; this one renders them for `hermes`.
TOOL_TEMPLATES = {"smollm2-135m": DATA / "smollm2_tools.jinja"}
# A chat template that writes calls between these markers is parsed by vLLM's `hermes`.
HERMES_MARKER = "<tool_call>"
# Authenticates, caps and checks every request before vLLM parses it (docs/guide/serve.md).
GATE = "vllm_edge.serving.gate.RequestGate"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# vLLM's default ("auto") pins argument schemas only for tools marked strict.
TOOL_STRICT_LEVEL = "parameter"
INPROC_WHY = ("vLLM's async server otherwise starts the engine core as a second process with "
              "its own copy of torch and vLLM (docs/guide/run.md)")
TOOL_STRICT_WHY = ("once the model opens a call, its arguments are held to the tool's JSON "
                   "schema; unconstrained, SmolLM2-135M forced to call get_weather(city) wrote "
                   "{\"type\": \"object\", \"properties\": ...} until max_tokens and no call "
                   "came back. tool_choice=auto may still answer in prose")


class ServeError(EdgeError):
    """A problem the user can fix (busy port, bad flag); printed without a traceback."""


@dataclass
class ServePlan:
    model_path: Path
    served_names: list[str]
    host: str
    port: int
    argv: list[str]  # vLLM's own serve arguments
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)  # what was chosen, and why
    describe: dict[str, Any] = field(default_factory=dict)
    gate: Any = None  # serving.gate.GateConfig, completed from vLLM's parsed arguments
    headless: bool = False  # a node after the first: its ranks only, no API server
    core_in_process: bool = False  # the engine core runs in the API server's process


@dataclass(frozen=True)
class Parallel:
    """Ranks and machines: vLLM's multiprocess executor spread over ``nnodes`` machines that
    meet at ``master_addr:master_port``; node 0 serves the API, the others run ``headless``."""
    tensor: int = 1
    pipeline: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        if self.tensor < 1 or self.pipeline < 1:
            raise ServeError("--tensor-parallel-size and --pipeline-parallel-size must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ServeError(f"--node-rank {self.node_rank} must be between 0 and --nnodes - 1 "
                             f"({self.nnodes - 1})")
        if self.nnodes > 1 and not self.master_addr:
            raise ServeError("--nnodes > 1 needs --master-addr: the address of node 0 that "
                             "every node can reach")

    @property
    def headless(self) -> bool:
        return self.node_rank > 0

    def flags(self) -> list[str]:
        if self.nnodes == 1:
            return []
        argv = ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--master-addr", self.master_addr]
        if self.master_port:
            argv += ["--master-port", str(self.master_port)]
        return argv + (["--headless"] if self.headless else [])

    def explain(self) -> list[str]:
        if self.nnodes == 1:
            return []
        port = self.master_port or "vLLM's default port"
        role = ("headless: this node runs its ranks for node 0, which serves the API"
                if self.headless else "node 0: serves the API once every node has joined")
        return [f"node {self.node_rank} of {self.nnodes}, meeting at {self.master_addr}:{port}; {role}"]


def port_holder(port: int) -> str | None:
    """Who listens on ``port`` (pid and command line), when the kernel lets us see it."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid}: {' '.join(proc.cmdline())[:200]}"
    except Exception:  # AccessDenied, a process that just exited: the hint is optional
        return None
    return None


def bind(host: str, port: int) -> socket.socket:
    """Bind and listen now, before vLLM is even imported; vLLM serves on this socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as vLLM does: a port left in TIME_WAIT by an earlier server is free to take
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            who = port_holder(port)
            raise ServeError(
                f"port {port} on {host} is already in use"
                + (f" (by {who})" if who else "")
                + "; stop that server or choose another port with --port") from None
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    # Listen at once: a bound socket that is not listening does not keep a second
    # SO_REUSEADDR bind off the port. Connections made while the engine loads wait in
    # the backlog and are answered once the server is up.
    sock.listen(128)
    return sock


def choose_tools(key: str | None, model_path: Path, parser: str | None,
                 template: str | None) -> tuple[str | None, str | None, str]:
    """(tool-call parser or None, chat template path or None, why)."""
    if parser == "none":
        return None, template, "off (--tool-call-parser none): requests with tools get no tool_calls"
    if key in TOOL_TEMPLATES and parser in (None, "hermes"):
        chosen = template or str(TOOL_TEMPLATES[key])
        why = ("hermes: the model speaks ChatML but its own template ignores tools; "
               f"{'the given template' if template else 'vllm-edge ships ' + TOOL_TEMPLATES[key].name}"
               " lists them in the system turn and asks for <tool_call>{json}</tool_call>, "
               "which is what vLLM's hermes parser reads")
        return "hermes", chosen, why
    if parser:
        return parser, template, f"{parser}: given with --tool-call-parser"
    text = Path(template).read_text() if template else own_template(model_path)
    if text and HERMES_MARKER in text:
        return "hermes", template, (f"hermes: the chat template writes calls as {HERMES_MARKER}"
                                    "{json}</tool_call>, the format vLLM's hermes parser reads")
    return None, template, ("off: no parser known for this model's chat template; pass "
                            "--tool-call-parser NAME (see docs/guide/serve.md)")


def own_template(model_path: Path) -> str | None:
    """The chat template the model folder carries (``chat_template.jinja``, else
    ``tokenizer_config.json``), as text."""
    jinja = model_path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    cfg = model_path / "tokenizer_config.json"
    if cfg.exists():
        from vllm_edge.common import model_config

        tmpl = model_config.loads(cfg.read_bytes(), str(cfg)).get("chat_template")
        if tmpl is None:  # a base model's tokenizer: no template, not the text "null"
            return None
        return tmpl if isinstance(tmpl, str) else json.dumps(tmpl)
    return None


# what `run` says before it completes a base model's prompt
BASE_MODEL_LINE = ("the model has no chat template (a base model): the prompt is completed as "
                   "plain text, without a system message")


def has_chat_template(model_path: Path) -> bool:
    """Whether the model folder carries a chat template anywhere vLLM looks for one: its own
    (:func:`own_template`) or a processor's (``chat_template.json``). Without one, vLLM's chat
    endpoint refuses every conversation: the model is a base model, for plain completions. A
    tokenizer_config.json that cannot be read counts as a template: vLLM then names what is
    wrong with it, as it did before base models were told apart."""
    try:
        return own_template(model_path) is not None or (model_path / "chat_template.json").exists()
    except (OSError, ValueError):
        return True


def vllm_flags(kwargs: dict[str, Any]) -> list[str]:
    """Engine keyword arguments as vLLM's own command-line flags."""
    argv: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, dict):  # a config vLLM parses as JSON (speculative_config)
            argv += [flag, json.dumps(value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def plan(model: str = "default", *, host: str = "127.0.0.1", port: int = 8000,
         max_model_len: int = 2048, max_num_seqs: int = 4, enforce_eager: bool = False,
         dtype: str = "auto", priority: str = "speed", multiprocess: bool = False,
         tool_call_parser: str | None = None, chat_template: str | None = None,
         served_model_name: list[str] | None = None, api_key: str | None = None,
         idle_exit_s: float | None = None, extra: list[str] | None = None,
         parallel: Parallel | None = None, speculative: str = "off",
         core_in_process: bool = False, max_num_batched_tokens: int | None = None) -> ServePlan:
    from vllm_edge.models import store
    from vllm_edge.runtime import images, weight_path
    from vllm_edge.runtime.engine import edge_engine
    from vllm_edge.serving import sampling
    from vllm_edge.serving.gate import FANOUT, MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, GateConfig

    if idle_exit_s is not None and idle_exit_s <= 0:
        raise ServeError(f"--idle-exit {idle_exit_s:g}: must be more than 0 seconds")
    path, wpath = weight_path.model_for_engine(model, priority, dtype)
    key = store.resolve_key(model).key if (model == "default" or model in store.MODELS) else None
    par = parallel or Parallel()
    if core_in_process and (multiprocess or par.nnodes > 1):
        raise ServeError("an engine core in the server's process runs on one machine without "
                         "--multiprocess")
    edge = edge_engine(path, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       enforce_eager=enforce_eager, one_process=not multiprocess,
                       server=not core_in_process, max_num_batched_tokens=max_num_batched_tokens,
                       tensor_parallel_size=par.tensor, pipeline_parallel_size=par.pipeline,
                       nnodes=par.nnodes, speculative=speculative, priority=priority)
    names = served_model_name or ([key, "default"] if key else [model])
    parser, template, tools_why = choose_tools(key, Path(path), tool_call_parser, chat_template)

    argv = vllm_flags(edge.kwargs)
    argv += par.flags()
    argv += ["--served-model-name", *names, "--host", host, "--port", str(port)]
    if api_key:
        argv += ["--api-key", api_key]
    if template:
        argv += ["--chat-template", template]
    if parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser,
                 "--tool-strict-level", TOOL_STRICT_LEVEL]
    samp = sampling.for_model(model, Path(path))
    samp_lines = [samp.explain()]
    if speculative != "off":
        from vllm_edge.runtime import speculative as spec

        values, replaced = spec.accepted_defaults(samp.values)
        if replaced:
            samp = sampling.Defaults(values, samp.source)
            samp_lines = [samp.explain(), "with speculative decoding: " + ", ".join(
                f"{k} {spec.NEUTRAL_DEFAULTS[k]:g} instead of {v:g}" for k, v in replaced.items())
                + " (vLLM refuses a request that carries it, and a default is in every request)"]
    argv += ["--override-generation-config", json.dumps(samp.values)]
    accepts = images.model_accepts_images(path)
    # a bad VLLM_EDGE_MAX_IMAGE* or VLLM_EDGE_MAX_BODY_BYTES fails here, not at start
    gate = GateConfig.from_env(accepts_images=accepts, model=model, api_keys=(), tokenizer=str(path),
                               idle_exit_s=idle_exit_s, sampling=samp.values, sampling_source=samp.source,
                               kv_connector=kv_connector_flag(extra or []))
    limits = gate.images
    argv += ["--middleware", GATE]
    if accepts:
        argv += ["--limit-mm-per-prompt", json.dumps({"image": limits.max_images})]
    gate_lines = [
        f"request gate: {GATE} checks the API key first, on every route but /health, /ping "
        "and /version (on loopback without a key: only loopback Host names), refuses bodies "
        f"over {gate.body_cap} bytes (VLLM_EDGE_MAX_BODY_BYTES) or slower than "
        f"{gate.body_timeout_s:g} s, JSON nested over 64 levels, schemas over "
        f"{MAX_SCHEMA_BYTES} bytes or {MAX_SCHEMA_DEPTH} levels or slower to compile than "
        f"{gate.schema_compile_s:g} s (VLLM_EDGE_SCHEMA_COMPILE_S), n over max_num_seqs, more "
        f"than {FANOUT} x max_num_seqs sequences (prompts or conversations x n), and "
        "audio/video/embedding/file parts on every route",
        (f"images: data URLs only, {'/'.join(limits.formats)}, up to {limits.max_bytes} bytes "
         f"(VLLM_EDGE_MAX_IMAGE_BYTES) and {limits.max_pixels} pixels "
         f"(VLLM_EDGE_MAX_IMAGE_PIXELS), {limits.max_images} per request; a bad one gets a "
         "400/413/415 naming it"
         if accepts else "images: refused with a 400 (the model has no vision encoder)")]
    if accepts:
        gate_lines.append(f"limit_mm_per_prompt={{image: {limits.max_images}}} (VLLM_EDGE_MAX_IMAGES)")
    argv += list(extra or [])  # after ours, so a user's vLLM flag wins

    lines = [f"model: {path}", *wpath.explain(), *edge.explain(),
             f"served model names: {', '.join(names)} (requests may use any of them)",
             f"tool calls: {tools_why}", *samp_lines, *gate_lines]
    lines += par.explain()
    if core_in_process:
        lines.append(f"engine core: in this process, on one engine thread ({INPROC_WHY})")
    if idle_exit_s:
        lines.append(f"idle exit: stops after {idle_exit_s:g} s without a request (--idle-exit)")
    if parser:
        lines.append(f"tool strict level: {TOOL_STRICT_LEVEL}: {TOOL_STRICT_WHY}")
    if template:
        lines.append(f"chat template: {template}")
    if extra:
        lines.append(f"extra vLLM arguments: {' '.join(extra)}")
    describe = {"engine": edge.describe(), "weight_path": wpath.to_dict(),
                "tool_call_parser": parser, "chat_template": template,
                "vllm_argv": [("***" if i and argv[i - 1] == "--api-key" else a)
                              for i, a in enumerate(argv)],
                "image_limits": dataclasses.asdict(limits) if accepts else None,
                "sampling_defaults": {**samp.values, "source": samp.source},
                "max_body_bytes": gate.body_cap}
    describe["core_in_process"] = core_in_process
    return ServePlan(Path(path), names, host, port, argv, dict(edge.env), lines, describe, gate,
                     headless=par.headless, core_in_process=core_in_process)


def kv_connector_flag(extra: list[str]) -> bool:
    """The user's vLLM flags configure a KV connector (so requests may carry
    kv_transfer_params)."""
    return any(a.split("=", 1)[0] in ("--kv-transfer-config", "--kv_transfer_config")
               for a in extra)


def run_vllm(p: ServePlan, sock: socket.socket | None, *, on_ready: Any = None,
             build_only: bool = False) -> None:
    """Parse ``p.argv`` with vLLM's own serve parser and run its server on ``sock``.
    ``on_ready``: called once the engine is built (an in-process core only). ``build_only``:
    build the engine as the server would, then shut it down (fills vLLM's compile cache)."""
    import os
    import signal

    os.environ.update(p.env)

    def _stop_during_start(*_: object) -> None:
        # uvicorn installs its own handler once it serves; before that, stop loading
        raise KeyboardInterrupt("terminated")

    signal.signal(signal.SIGTERM, _stop_during_start)

    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server_worker
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_edge.runtime import gc_freeze

    cli_env_setup()  # as `vllm serve` does: spawn, not fork, for the engine-core process
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm-edge serve (vLLM arguments)"))
    args = parser.parse_args(p.argv)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    validate_api_server_args(args)
    if p.headless:
        from vllm.entrypoints.cli.serve import run_headless

        args.api_server_count = 0  # as `vllm serve --headless` sets it
        gc_freeze.end_start()  # its engine starts in processes of its own
        run_headless(args)
        return
    if build_only or not p.core_in_process:
        # a compile (the graph builder), or an engine core in a process of its own: what this
        # process still has to build is small, or not its own
        gc_freeze.end_start()
    if p.core_in_process:
        from vllm_edge.serving import inproc_core

        def ready() -> None:
            gc_freeze.end_start()  # nothing left to give back after a compile's early end
            if on_ready is not None:
                on_ready()

        inproc_core.install(on_ready=ready)
    if build_only:
        uvloop.run(_build_engine(args))
        return
    configure_gate(p, args)
    host = f"[{p.host}]" if ":" in p.host else p.host
    uvloop.run(run_server_worker(f"http://{host}:{p.port}", sock, args))


async def _build_engine(args: Any) -> None:
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client

    async with build_async_engine_client(args):
        pass  # built (and compiled) with the server's own arguments; now shut down


def api_keys(args: Any) -> tuple[str, ...]:
    """The keys vLLM's server will demand, found as vLLM finds them (--api-key wins over
    VLLM_API_KEY)."""
    from vllm import envs as vllm_envs

    return tuple(k for k in (args.api_key or [vllm_envs.VLLM_API_KEY]) if k)


def configure_gate(p: ServePlan, args: Any) -> None:
    """Hand the gate what only vLLM's parsed arguments say (keys, max_num_seqs), and warn
    when the server is open to the network with no key."""
    from vllm_edge.serving import gate

    keys = api_keys(args)
    gate.configure(dataclasses.replace(p.gate, api_keys=keys, max_n=args.max_num_seqs,
                                       loopback_hosts_only=p.host in LOOPBACK and not keys))
    if p.host not in LOOPBACK and not keys:
        print(f"[vllm-edge] WARNING: listening on {p.host}, beyond this machine, with no API "
              "key: anyone who can reach the port can use the model. Pass --api-key KEY (or "
              "set VLLM_API_KEY); see docs/guide/serve.md#security", file=sys.stderr, flush=True)


def main(model: str, *, sock: socket.socket | None = None, graph: str = "now",
         graph_spec: dict[str, Any] | None = None, **options: Any) -> int:
    """``sock``: a socket already bound to ``host:port`` and listening (the keep-alive
    server's, bound by its parent); otherwise one is bound here. ``graph``: ``now`` compiles
    before serving, as vLLM does; ``background`` (a keep-alive server, whose options and start
    environment are ``graph_spec``: {"options": ..., "env": ...}) serves eager while no compiled
    graph is cached for its arguments and starts a builder of it once its engine is ready
    (:mod:`.graph_cache`); ``build`` is that builder (``graph_spec``: {"lock_fd": ...}): it
    builds the engine compiled, leaves the marker and exits without serving."""
    from vllm_edge.runtime import gc_freeze, triton_hide

    if graph not in ("now", "background", "build"):
        raise ServeError(f"graph={graph!r}: expected now, background or build")
    triton = triton_hide.hide()  # before anything here imports torch (runtime/triton_hide.py)
    host, port = options["host"], options["port"]
    par = options.get("parallel") or Parallel()
    # ServeError on a busy port, before any engine work; a headless node serves no API
    if sock is None and not par.headless and graph != "build":
        sock = bind(host, port)
    gc_start = gc_freeze.hold_for_start()  # before the imports it is for; ended once the engine is up
    try:
        p = plan(model, **options)
        if graph == "build":
            return build_graph(p, triton, (graph_spec or {}).get("lock_fd"))
        on_ready = None
        if graph == "background" and not options.get("enforce_eager") and p.core_in_process:
            p, on_ready = _eager_until_built(p, model, options, graph_spec or {})
        for line in [*p.lines, f"triton: {triton} (VLLM_EDGE_HIDE_TRITON)",
                     f"garbage collector while starting: {gc_start} (VLLM_EDGE_GC_START)"]:
            print(f"[vllm-edge] {line}", file=sys.stderr, flush=True)
        if sock is not None:
            print(f"[vllm-edge] listening on http://{host}:{port}/v1 once the engine is ready "
                  "(GET /health answers 200 then)", file=sys.stderr, flush=True)
        run_vllm(p, sock, on_ready=on_ready)
    except KeyboardInterrupt:
        return 0
    finally:
        gc_freeze.end_start()
        if sock is not None:
            sock.close()
    return 0


def _eager_until_built(p: ServePlan, model: str, options: dict[str, Any],
                       spec: dict[str, Any]) -> tuple[ServePlan, Any]:
    """``p`` as it is when its compiled graph is cached; else the eager plan and the call that
    starts the builder once the engine is ready."""
    from vllm_edge.serving import engine_log, graph_cache

    gkey = graph_cache.key(p.argv, p.env)
    if graph_cache.built(gkey) is not None:
        p.lines.append(f"compiled graph: cached for these arguments (marker {graph_cache.marker(gkey)})")
        return p, None
    eager = plan(model, **{**options, "enforce_eager": True})
    eager.lines = [f"enforce_eager=True: {graph_cache.WHY_EAGER}" if line.startswith("enforce_eager=")
                   else line for line in eager.lines]
    eager.describe["graph"] = {"key": gkey, "state": "building in the background"}
    log = engine_log.new_path("graph")
    eager.lines.append(f"compiled graph: not cached yet; this server runs eager, and a process at the "
                       f"lowest CPU priority builds it for the next start once this engine is ready")
    eager.lines.append(f"compiled graph builder log: {log}")

    def start_builder() -> None:
        fd = graph_cache.claim(gkey)
        if fd is None:
            print("[vllm-edge] compiled graph: another process is building it", file=sys.stderr,
                  flush=True)
            return
        try:
            rc = graph_cache.spawn_builder(spec.get("options", {}), spec.get("env", {}), log, fd)
        finally:
            os.close(fd)  # the builder holds the lock now
        print(f"[vllm-edge] compiled graph: builder started (status {rc})", file=sys.stderr,
              flush=True)

    return eager, start_builder


def build_graph(p: ServePlan, triton: str, lock_fd: int | None = None) -> int:
    """Build the engine of ``p`` compiled (vLLM saves the graph in its compile cache), then
    leave the marker that tells the next keep-alive server to start compiled."""
    import time

    from vllm_edge.serving import graph_cache

    gkey = graph_cache.key(p.argv, p.env)
    with graph_cache.build_lock(gkey, lock_fd) as held:
        if not held:
            print("[vllm-edge] compiled graph: another process is building it", file=sys.stderr,
                  flush=True)
            return 0
        if graph_cache.built(gkey) is not None:
            print(f"[vllm-edge] compiled graph: already built ({graph_cache.marker(gkey)})",
                  file=sys.stderr, flush=True)
            return 0
        print(f"[vllm-edge] compiled graph: building {gkey} for {p.model_path} (triton: {triton})",
              file=sys.stderr, flush=True)
        before, t0 = graph_cache.aot_files(), time.monotonic()
        run_vllm(p, None, build_only=True)
        path = graph_cache.record(gkey, before, time.monotonic() - t0, p.argv)
        print(f"[vllm-edge] compiled graph: built in {time.monotonic() - t0:.0f} s; marker {path}",
              file=sys.stderr, flush=True)
    return 0
