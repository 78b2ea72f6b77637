"""The gate's bound on grammar compile time: every JSON schema, regex and grammar a request
carries is compiled by xgrammar, the compiler vLLM's engine uses, in a worker process under
a time budget, before vLLM sees the request.

Size and depth bounds do not bound compile time: a few hundred bytes can cost minutes (each
string with a ``maxLength`` of 100 or more costs xgrammar about 2 s against a 49k-token
vocabulary, and a 128 KiB schema holds thousands of them; 15 levels of ``anyOf`` ran past
120 s). No static rule keeps such schemas out without refusing real ones, so the gate
measures: the compile runs in a child process, and past the budget the child is killed (a
thread cannot be stopped, and would burn a core until the compile ends) and the request gets
a 400 naming the limit. The engine would otherwise spend that time on its own compile thread,
with every other structured request waiting behind it.

The child compiles on one thread, so its time is an upper bound on the engine's (which uses
several) and the gate never takes more than one core. Specs that passed are remembered by
hash, so a client that sends the same tools every turn pays once. A spec xgrammar refuses is
left to vLLM, which answers it with its own 400; a spec that kills the compiler gets a 400
here, since it would kill the engine's too.

The child holds xgrammar, torch and transformers (xgrammar imports both), about 300 MB of
RssAnon: it starts with the first request that carries a schema, not with the server, and is
stopped after :data:`IDLE_STOP_S` without one, so a server that never sees a schema never
pays for it. After a kill the next request with a schema starts a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

from vllm_edge.common.errors import EdgeError

# What vLLM compiles as a JSON schema, a regex or a grammar, by the key that holds it.
JSON_KEYS = frozenset({"schema", "parameters", "input_schema", "json", "guided_json"})
REGEX_KEYS = frozenset({"regex", "guided_regex"})
GRAMMAR_KEYS = frozenset({"grammar", "guided_grammar"})
# Long enough for the child's imports and tokenizer on a slow device; not a request's budget.
START_TIMEOUT_S = 120.0
PASSED_CACHE = 512
IDLE_STOP_S = 300.0
# The worker's module, on its command line: how a memory sampler tells it from the server.
WORKER_MODULE = "vllm_edge.serving.gate_compile"


class CompileRefused(EdgeError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def targets(schemas: list[tuple[str, Any]]) -> list[tuple[str, str, str]]:
    """(where, kind, spec) for every schema, regex and grammar in the schema subtrees of a
    body (the gate's ``(path, value)`` list), as the engine would compile them: kind is
    ``json``, ``regex`` or ``grammar``, spec the text. Each spec once."""
    found: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for path, value in schemas:
        for where, kind, spec in _find(value, path, path.rsplit(".", 1)[-1]):
            if (kind, spec) not in seen:
                seen.add((kind, spec))
                found.append((where.removeprefix("$."), kind, spec))
    return found


def _find(node: Any, path: str, key: str | None) -> Iterator[tuple[str, str, str]]:
    stack: list[tuple[Any, str, str | None]] = [(node, path, key)]
    while stack:
        node, path, key = stack.pop()
        if key in JSON_KEYS and isinstance(node, (dict, str)) and node not in ("", {}) and not (
                isinstance(node, dict) and key == "schema" and _is_wrapper(node)):
            # the engine compiles the text it is given; a dict is dumped as vLLM dumps it
            yield path, "json", node if isinstance(node, str) else json.dumps(node)
        elif key in REGEX_KEYS and isinstance(node, str):
            yield path, "regex", node
        elif key in GRAMMAR_KEYS and isinstance(node, str):
            yield path, "grammar", node
        elif isinstance(node, dict):
            for k, v in reversed(list(node.items())):
                stack.append((v, f"{path}.{k}", k))
        elif isinstance(node, list):
            for i in reversed(range(len(node))):
                stack.append((node[i], f"{path}[{i}]", None))


def _is_wrapper(node: dict) -> bool:
    """``{"schema": {"name": ..., "schema": {...}}}``: the schema is one level down."""
    return "schema" in node and not ({"type", "properties", "anyOf", "$ref"} & node.keys())


class SchemaCompiler:
    """A worker process that compiles specs with xgrammar for ``tokenizer``, one at a time,
    started on first use (or by :meth:`start`) and again after it was killed."""

    def __init__(self, tokenizer: str | os.PathLike, budget_s: float) -> None:
        self.tokenizer = str(tokenizer)
        self.budget_s = budget_s
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.passed: OrderedDict[bytes, None] = OrderedDict()
        self.buf = b""
        self.broken: str | None = None  # the child cannot start here: the check is off
        self.last_used = time.monotonic()
        self.idle_watch: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            self._ensure()

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _stop_when_idle(self) -> None:
        while True:
            time.sleep(min(IDLE_STOP_S / 4, 30.0))
            with self.lock:
                if self.proc is not None and time.monotonic() - self.last_used >= IDLE_STOP_S:
                    self._kill()

    def _ensure(self) -> bool:
        self.last_used = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            return True
        if self.broken:
            return False
        if self.idle_watch is None:
            self.idle_watch = threading.Thread(target=self._stop_when_idle, daemon=True,
                                               name="vllm-edge-schema-compiler-idle")
            self.idle_watch.start()
        self.buf = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, self.tokenizer],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        ready = self._read(START_TIMEOUT_S)
        if not (ready or {}).get("ready"):
            self._kill()
            self.broken = (ready or {}).get("error", "no answer within "
                                            f"{START_TIMEOUT_S:g} s")
            print(f"[vllm-edge] WARNING: the gate's schema compile check is off: the compiler "
                  f"did not start ({self.broken})", file=sys.stderr, flush=True)
            return False
        return True

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        with self.lock:
            self._kill()

    def _read(self, timeout_s: float) -> dict | None:
        """One answer line from the child, or None when it died or took longer."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def check(self, specs: list[tuple[str, str, str]]) -> float:
        """Compile every spec within one budget; the seconds spent. CompileRefused past the
        budget or when a spec kills the compiler."""
        spent = 0.0
        for where, kind, spec in specs:
            digest = hashlib.sha256(f"{kind}\0{spec}".encode("utf-8", "surrogatepass")).digest()
            with self.lock:
                if digest in self.passed:
                    self.passed.move_to_end(digest)
                    continue
                if not self._ensure():
                    return spent
                assert self.proc is not None and self.proc.stdin is not None
                t0 = time.monotonic()
                try:
                    self.proc.stdin.write(json.dumps({"kind": kind, "spec": spec}).encode() + b"\n")
                    self.proc.stdin.flush()
                    answer = self._read(self.budget_s - spent)
                except (BrokenPipeError, OSError):
                    answer = None
                spent += time.monotonic() - t0
                if answer is None:
                    died = self.proc.poll() is not None
                    self._kill()
                    if died:
                        raise CompileRefused(f"{where}: this {_noun(kind)} crashed the grammar "
                                             "compiler", param=where)
                    raise CompileRefused(
                        f"{where}: compiling this {_noun(kind)} for structured output took over "
                        f"{self.budget_s:g} s (VLLM_EDGE_SCHEMA_COMPILE_S, the budget for all of "
                        "a request's schemas); simplify it (fewer maxLength/minLength bounds, "
                        "less anyOf nesting, smaller repetition counts)", param=where)
                if answer.get("ok"):
                    self.passed[digest] = None
                    if len(self.passed) > PASSED_CACHE:
                        self.passed.popitem(last=False)
                # a spec xgrammar refuses is vLLM's to answer, with its own 400
        return spent


def _noun(kind: str) -> str:
    return {"json": "JSON schema", "regex": "regex", "grammar": "grammar"}[kind]


def _vocab_size(tokenizer_dir: Path, fallback: int) -> int:
    """The model's vocabulary size as vLLM hands it to xgrammar (the config's, which may be
    padded past the tokenizer's)."""
    try:
        cfg = json.loads((tokenizer_dir / "config.json").read_text())
        size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        return int(size) if size else fallback
    except (OSError, ValueError, TypeError):
        return fallback


def _serve(tokenizer_dir: str) -> int:
    out = sys.stdout.buffer
    try:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        info = xgr.TokenizerInfo.from_huggingface(
            tok, vocab_size=_vocab_size(Path(tokenizer_dir), len(tok)))
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    except Exception as exc:  # noqa: BLE001  (the parent reports why the check is off)
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]}).encode()
                  + b"\n")
        out.flush()
        return 1
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        job = json.loads(line)
        t0 = time.perf_counter()
        try:
            if job["kind"] == "json":
                compiler.compile_json_schema(job["spec"])
            elif job["kind"] == "regex":
                compiler.compile_regex(job["spec"])
            else:
                try:
                    compiler.compile_grammar(job["spec"])
                except Exception:  # noqa: BLE001  (vLLM reads a non-EBNF grammar as Lark)
                    compiler.compile_lark(job["spec"])
            answer = {"ok": True}
        except Exception as exc:  # noqa: BLE001  (refused by xgrammar: vLLM answers it)
            answer = {"ok": False, "error": str(exc)[:200]}
        answer["s"] = round(time.perf_counter() - t0, 4)
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1]))
