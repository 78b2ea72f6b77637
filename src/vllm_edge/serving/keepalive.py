"""Keep-alive model servers: `run` talks to a `vllm-edge serve` that stays loaded.

One record per server under ``$VLLM_EDGE_HOME/servers/`` (model, port, pid, keep-alive,
log, token). A record counts only while it is the owner's alone (a file of this user with
mode 0600 in a 0700 directory) and its process answers ``/vllm-edge/status`` on loopback,
with the record's token, with its own pid; anything else is not used, and a dead one is
removed by whoever finds it. Starting a server holds a per-model file lock until it is
healthy, so two `run`s started together start one server and the second reuses it.

Only its owner can reach a server: it gets a random token (``secrets.token_urlsafe``) as its
API key, through the environment (``VLLM_API_KEY``, so it never shows in ``ps``), and asks
for it on every route but ``/health``, ``/ping`` and ``/version``. The parent binds
127.0.0.1:0 itself and hands the listening socket to the child (no window in which another
process could take the port), and the client checks the server's pid and token before each
turn. Servers stop themselves after their keep-alive without a request (``serve
--idle-exit``).

The server is one process: vLLM's API server with its engine core on an engine thread of the
same process (:mod:`.inproc_core`), not a second process with its own torch and vLLM.

Nothing here imports torch or vLLM: a `run` that finds its server starts in a fraction
of a second.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from vllm_edge.common.errors import EdgeError

HOST = "127.0.0.1"
DEFAULT_KEEP_ALIVE_S = 300.0
STATUS_PATH = "/vllm-edge/status"  # answered by serving.gate
# vLLM's own variable for its API key: how the server gets its token without a flag in `ps`
SERVER_KEY_ENV = "VLLM_API_KEY"
# Tokens per engine step: vLLM's server default (2048 on CPU) sizes the dummy forward of every
# start; 512 reached the first token 2.3 s sooner on a 2-core EPYC, at the same memory, and a
# longer prompt prefills in chunks (bench server: benchmarks/results/server_start/).
BATCH_TOKENS = 512
# Answers a server decodes at once when its caller does not say (`run --num-parallel`, as
# Ollama's OLLAMA_NUM_PARALLEL): a chat is one user's, and the KV of every further sequence is
# resident for the server's whole life (bench server: benchmarks/results/server_start/).
NUM_PARALLEL = 1


class KeepAliveError(EdgeError):
    pass


@dataclass
class Record:
    key: str  # what `run` asked for: model and weight path
    model: str
    quant: str
    port: int
    pid: int
    keep_alive_s: float
    log: str
    started: float = field(default_factory=time.time)
    token: str = ""  # the server's API key; the record file is the owner's alone

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def state_dir() -> Path:
    from vllm_edge import envs

    return envs.home() / "servers"


def model_id(model: str) -> str:
    """An embedded key as is, a path made absolute."""
    if model != "default" and ("/" in model or os.path.exists(model)):
        return str(Path(model).expanduser().resolve())
    return model


def server_key(model: str, quant: str, ranks: tuple[int, int] = (1, 1)) -> str:
    """The identity of a server: the model, its weight path, and its (tensor, pipeline)
    parallel sizes when they are not one rank."""
    key = f"{model_id(model)}|{quant}"
    return key if ranks == (1, 1) else f"{key}|tp{ranks[0]}pp{ranks[1]}"


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")[-120:]


def parse_duration(text: str) -> float:
    """``300``, ``30s``, ``5m``, ``1h`` -> seconds; ``0`` means no server."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m:
        raise KeepAliveError(f"--keep-alive {text!r}: write seconds or a number with s, m or h "
                             "(e.g. 300, 5m, 0)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def status(port: int, timeout: float = 2.0, token: str = "") -> dict[str, Any] | None:
    """The server's own view (pid, idle_s, in_flight, requests), or None; ``token`` is its
    API key. Loopback calls never go through a proxy from the environment."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"http://{HOST}:{port}{STATUS_PATH}", timeout=timeout, headers=headers,
                      trust_env=False)
        st = r.json() if r.status_code == 200 else None
        return st if isinstance(st, dict) else None
    except (httpx.HTTPError, ValueError):
        return None


def verify(rec: Record) -> None:
    """The server on ``rec.port`` is still ``rec``'s: it answers the record's token with the
    record's pid. A KeepAliveError otherwise (it stopped, or another process has the port)."""
    st = status(rec.port, token=rec.token)
    if not st or st.get("pid") != rec.pid:
        raise KeepAliveError(f"the model server on port {rec.port} (pid {rec.pid}) is gone or "
                             "no longer answers with its token; run the command again to start "
                             "a new one")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_only(path: Path) -> bool:
    """``path`` is a regular file of this user that nobody else may read or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def _read(path: Path) -> Record | None:
    if not owner_only(path):
        return None
    try:
        return Record(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _state_dir_ready() -> Path:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.chmod(0o700)
    return d


def write_record(path: Path, rec: Record) -> None:
    """The record, created 0600 from its first byte, then renamed into place."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(rec), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def records(clean: bool = True) -> list[tuple[Record, dict[str, Any]]]:
    """Live servers with their status; stale or unreadable records are removed."""
    out = []
    for path in sorted(state_dir().glob("*.json")) if state_dir().is_dir() else []:
        rec = _read(path)
        st = status(rec.port, token=rec.token) if rec and rec.token and _pid_alive(rec.pid) else None
        if rec and st and st.get("pid") == rec.pid:
            out.append((rec, st))
        elif clean and owner_only(path) and (rec is None or not _pid_alive(rec.pid)):
            path.unlink(missing_ok=True)  # a starting server is alive but not answering yet
    return out


def find(key: str) -> Record | None:
    for rec, _ in records():
        if rec.key == key:
            return rec
    return None


def _listening_socket() -> socket.socket:
    """127.0.0.1 on a port the kernel picks, listening: handed to the server as it is."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, 0))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def ensure(model: str, quant: str, keep_alive_s: float, options: dict[str, Any] | None = None,
           *, say: Callable[[str], None] = lambda _: None,
           progress: Callable[[Any], None] | None = None,
           ready_timeout_s: float = 3600, ranks: tuple[int, int] = (1, 1)) -> tuple[Record, bool]:
    """A live server for ``model``: the running one, or one started now. Returns (record,
    started). ``quant`` is `run`'s ``--quant`` (``auto`` or ``none``); ``options`` are more
    keywords of :func:`vllm_edge.serving.serve.main` (``max_model_len``, ``enforce_eager``, ...).
    ``progress`` gets a :class:`~vllm_edge.serving.startup_phases.Update` four times a second
    while the server starts (the phases read from its log)."""
    from vllm_edge.common import atomic
    from vllm_edge.serving import engine_log
    from vllm_edge.serving.startup_phases import PhaseTracker

    key = server_key(model, quant, ranks)
    record_path = _state_dir_ready() / f"{_slug(key)}.json"
    with atomic.lock(record_path):
        rec = find(key)
        if rec is not None:
            return rec, False
        sock = _listening_socket()
        port = sock.getsockname()[1]
        token = secrets.token_urlsafe(32)
        log = engine_log.new_path("serve")
        spec = {**(options or {}), "model": model, "host": HOST, "port": port,
                "dtype": "bf16" if quant == "none" else "auto", "idle_exit_s": keep_alive_s,
                "sock_fd": sock.fileno()}
        if ranks != (1, 1):
            spec["parallel"] = {"tensor": ranks[0], "pipeline": ranks[1]}
        else:  # one process, not an API server beside an engine core (docs/guide/run.md)
            spec.setdefault("core_in_process", True)
            # eager until its compiled graph is cached, built beside it (serving/graph_cache.py)
            spec.setdefault("graph", "background")
        spec.setdefault("max_num_batched_tokens", BATCH_TOKENS)
        spec.setdefault("max_num_seqs", NUM_PARALLEL)
        cmd = [sys.executable, "-m", "vllm_edge.serving.keepalive_server", json.dumps(spec)]
        # the key by environment (owner-only /proc/PID/environ), never on the command line
        env = {**os.environ, SERVER_KEY_ENV: token}
        try:
            with open(log, "w") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        pass_fds=(sock.fileno(),), env=env)
        finally:
            sock.close()  # the child holds its own copy
        rec = Record(key=key, model=model, quant=quant, port=port, pid=proc.pid,
                     keep_alive_s=keep_alive_s, log=str(log), token=token)
        write_record(record_path, rec)
        say(f"starting a model server for {model} (pid {proc.pid})")
        phases = PhaseTracker(log)
        t0 = time.time()
        while time.time() - t0 < ready_timeout_s:
            if progress is not None:
                progress(phases.poll())
            if proc.poll() is not None:
                record_path.unlink(missing_ok=True)
                tail = "".join(Path(log).read_text(errors="replace").splitlines(True)[-5:])
                raise KeepAliveError(f"the model server exited with {proc.returncode} before it "
                                     f"was ready; its log: {log}\n{tail}")
            st = status(port, timeout=1.0, token=token)
            if st and st.get("pid") == proc.pid and _healthy(port):
                if progress is not None:
                    progress(phases.finish())
                return rec, True
            time.sleep(0.25)
        stop(rec)
        raise KeepAliveError(f"the model server was not ready after {ready_timeout_s:.0f} s; "
                             f"its log: {log}")


def _healthy(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://{HOST}:{port}/health", timeout=2,
                         trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def stop(rec: Record, grace_s: float = 30) -> bool:
    """SIGTERM to the server's process group (vLLM's graceful shutdown), SIGKILL after
    ``grace_s``; the record is removed. False if it was already gone."""
    path = state_dir() / f"{_slug(rec.key)}.json"
    try:
        os.killpg(rec.pid, signal.SIGTERM)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
        return False
    deadline = time.time() + grace_s
    while time.time() < deadline and _pid_alive(rec.pid):
        time.sleep(0.2)
        _reap(rec.pid)
    if _pid_alive(rec.pid):
        try:
            os.killpg(rec.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    path.unlink(missing_ok=True)
    return True


def _reap(pid: int) -> None:
    try:  # our own child (started by this process): collect it so it stops being "alive"
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _served_model(rec: Record) -> dict[str, Any]:
    """The first entry of the server's /v1/models."""
    import httpx

    try:
        return httpx.get(rec.url + "/v1/models", timeout=10, headers=rec.headers,
                         trust_env=False).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise KeepAliveError(f"the server on port {rec.port} did not list its model ({exc})") from None


def served_name(rec: Record) -> str:
    return _served_model(rec)["id"]


def served_root(rec: Record) -> Path | None:
    """The folder of the build the server loaded (its model's root on /v1/models)."""
    root = _served_model(rec).get("root")
    return Path(root) if root else None


def serves_base_model(rec: Record) -> bool:
    """Whether the server's model has no chat template (a base model): its prompts are then
    completed as plain text, since its chat endpoint refuses every conversation."""
    from vllm_edge.serving.serve import has_chat_template

    root = served_root(rec)
    return root is not None and not has_chat_template(root)


def served_build(rec: Record) -> str | None:
    """The directory name of the build the server loaded (its model's root): what a
    measurement through the server ran, when a model argument can name another build later."""
    root = served_root(rec)
    return root.name if root else None
