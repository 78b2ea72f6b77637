"""The security probes, run against whichever vllm_edge is first on the path, engine-free:
the serve gate driven as the ASGI middleware it is (a tiny app behind it stands for vLLM and
says whether a request reached it), and the library functions the other probes target.

    python scripts/security_probes.py run [NAME ...] > outcomes.json   # one tree's outcomes
    python scripts/security_probes.py table BEFORE.json AFTER.json OUT.json

``table`` writes the artifact: each probe's name, what it sends, the outcome before and
after, the test that holds it, and provenance of the tree that ran ``after``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import struct
import sys
import tempfile
import threading
from pathlib import Path

KEY = "K"
REPO = Path(__file__).resolve().parents[1]

PROBES: dict[str, tuple[str, str]] = {
    # name: (what it sends, the test that holds it)
    "invocations_without_key": ("POST /invocations, a completion body, no key, to a server with --api-key",
                                "tests/serving/test_gate_security.py::test_the_key_guards_every_route_vllm_mounts"),
    "tokenize_without_key": ("POST /tokenize without the key",
                             "tests/serving/test_gate_security.py::test_the_key_guards_every_route_vllm_mounts"),
    "status_without_key": ("GET /vllm-edge/status without the key",
                           "tests/serving/test_gate_security.py::test_status_needs_the_key"),
    "metrics_without_key": ("GET /metrics without the key",
                            "tests/serving/test_gate_security.py::test_the_key_guards_every_route_vllm_mounts"),
    "chat_without_key": ("POST /v1/chat/completions without the key (vLLM's own check: the control)",
                         "tests/serving/test_gate.py::test_the_api_key_is_checked_before_anything_else"),
    "n_as_string": ('"n": "16" on --max-num-seqs 4',
                    "tests/serving/test_gate_security.py::test_n_is_read_as_vllm_reads_it"),
    "n_as_float": ('"n": 16.0 on --max-num-seqs 4',
                   "tests/serving/test_gate_security.py::test_n_is_read_as_vllm_reads_it"),
    "completions_fan_out": ("/v1/completions with 200 prompts and n 4 (800 sequences) on --max-num-seqs 4",
                            "tests/serving/test_gate_security.py::test_fan_out_over_the_cap_gets_a_400_naming_it"),
    "chat_batch_fan_out": ("/v1/chat/completions/batch with 64 conversations on --max-num-seqs 4",
                           "tests/serving/test_gate_security.py::test_fan_out_over_the_cap_gets_a_400_naming_it"),
    "anthropic_url_beside_data": ("an Anthropic image source with a good data URL in url and bad bytes "
                                  "in data (type neither url nor base64)",
                                  "tests/serving/test_gate_security.py::"
                                  "test_anthropic_image_url_and_data_are_both_checked"),
    "schema_deep": ("response_format json_schema nested 40 levels",
                    "tests/serving/test_gate_security.py::test_schemas_over_the_bounds_get_a_400"),
    "schema_large": ("response_format json_schema of 2000 properties (~260 KB)",
                     "tests/serving/test_gate_security.py::test_schemas_over_the_bounds_get_a_400"),
    "schema_compile_time": ("response_format json_schema of 12 strings with maxLength ~1000 (400 bytes), "
                            "budget 10 s",
                            "tests/serving/test_gate_compile.py::"
                            "test_a_schema_slow_to_compile_gets_a_400_naming_the_limit"),
    "dns_rebinding_host": ("Host: evil.example to a keyless loopback server",
                           "tests/serving/test_gate_security.py::"
                           "test_a_keyless_loopback_server_answers_only_loopback_host_names"),
    "slow_body": ("a POST whose body never arrives (probe waits 3 s)",
                  "tests/serving/test_gate_security.py::test_a_slow_body_gets_a_408"),
    "clean_stale_other_writer": ("a write to out beside out.v2's temp dir, its .old and a user's .out.bak.old",
                                 "tests/common/test_atomic.py::test_clean_stale_touches_only_its_own_names"),
    "force_through_symlink": ("--force to a destination that is a link to another folder",
                              "tests/common/test_atomic.py::test_a_symlinked_destination_is_refused"),
    "source_link_out": ("quantize a source whose notes.txt links to a file outside it",
                        "tests/quant/test_quantize.py::test_a_link_out_of_the_source_is_refused_naming_it"),
    "kv_pattern_zero": ('config with sliding_window_pattern "0"',
                        "tests/runtime/test_kv.py::test_zero_or_negative_sizes_are_refused_naming_the_field"),
    "config_deep": ("a config.json nested 100,000 levels, to the engine's reader",
                    "tests/common/test_model_config.py::test_the_engine_reader_refuses_a_deep_config"),
    "gguf_overlap": ("a GGUF of 3000 tensors all on block 0's data",
                     "tests/models/test_gguf_fuzz.py::test_tensors_that_share_data_are_refused_naming_one"),
    "gguf_metadata_memory": ("a GGUF whose uint8 metadata array costs over 256 MiB as Python objects",
                             "tests/models/test_gguf_fuzz.py::test_metadata_is_capped_by_its_cost_in_memory"),
    "loopback_via_proxy": ("keep-alive status and health with HTTP_PROXY set to a listener",
                           "tests/serving/test_keepalive.py::test_loopback_calls_ignore_proxies_from_the_environment"),
}


# --- the gate ---------------------------------------------------------------------------

def _gate_call(config_kw: dict, method: str, path: str, body: bytes | None = None,
               headers: list | None = None, wait_s: float = 10.0, never_send: bool = False) -> str:
    from vllm_edge.serving.gate import GateConfig, RequestGate

    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    accepted = {k: v for k, v in config_kw.items() if k in GateConfig.__dataclass_fields__}
    gate = RequestGate(app, GateConfig(**accepted))
    sent = []

    async def receive():
        if never_send:
            await asyncio.sleep(3600)
        return {"type": "http.request", "body": body or b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    hdrs = [(b"content-type", b"application/json")] + (headers or [])
    scope = {"type": "http", "method": method, "path": path, "headers": hdrs,
             "root_path": "", "query_string": b""}
    try:
        asyncio.run(asyncio.wait_for(gate(scope, receive, send), wait_s))
    except asyncio.TimeoutError:
        return f"no answer within {wait_s:g} s"
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    who = "reached vLLM" if reached else "answered by the gate" if status == 200 else "refused by the gate"
    return f"{status} ({who})"


def _default_dir() -> str:
    from vllm_edge.models import store

    return str(store.prepare("default", progress=False))


def _keyed(method: str, path: str, body: dict | None = None) -> str:
    return _gate_call({"api_keys": (KEY,)}, method, path, json.dumps(body).encode() if body else None)


def _body(body: dict, path: str = "/v1/chat/completions", wait_s: float = 10.0, **kw) -> str:
    return _gate_call({"max_n": 4, **kw}, "POST", path, json.dumps(body).encode(), wait_s=wait_s)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _png() -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# --- the library ------------------------------------------------------------------------

def _outcome(fn) -> str:
    try:
        out = fn()
    except RecursionError:
        return "crashed: RecursionError"
    except ZeroDivisionError:
        return "crashed: ZeroDivisionError"
    except Exception as exc:  # noqa: BLE001  (the probe reports what happened)
        from vllm_edge.common.errors import EdgeError

        kind = "refused" if isinstance(exc, EdgeError) else "crashed"
        # no temporary paths in the artifact: the reason, with paths as PATH
        why = re.sub(r"(?:/[\w.\-]+)+", "PATH", str(exc).split(": ", 1)[-1])
        return f"{kind}: {type(exc).__name__}: {why[:100]}"
    return out if isinstance(out, str) else "accepted"


def _clean_stale() -> str:
    from vllm_edge.common import atomic

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        theirs = [".out.v2.abcd1234.partial", ".out.v2.old", ".out.bak.old"]
        for name in theirs:
            (root / name).mkdir()
        atomic.clean_stale(root / "out")
        gone = [n for n in theirs if not (root / n).exists()]
        return f"removed {len(gone)} of 3 not its own" if gone else "kept all 3"


def _force_symlink() -> str:
    from vllm_edge.common import atomic, manifest

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "precious").mkdir()
        (root / "precious" / "f").write_text("keep")
        (root / "out").symlink_to(root / "precious")

        def write():
            with atomic.directory(root / "out", kind="quantize", force=True) as tmp:
                (tmp / "x").write_text("new")
                manifest.write(tmp, {"converter": "quantize/1"})
        result = _outcome(write)
        if result == "accepted":
            return ("replaced the link's target" if not (root / "precious" / "f").exists()
                    else "accepted")
        return result


def _source_link() -> str:
    sys.path.insert(0, str(REPO / "tests"))
    from support.checkpoints import tiny_llama_dir

    from vllm_edge.quant.quantize import quantize_model

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        secret = root / "id_ed25519"
        secret.write_text("PRIVATE KEY")
        src = tiny_llama_dir(root / "tiny")
        (src / "notes.txt").symlink_to(secret)
        result = _outcome(lambda: quantize_model(src, root / "q", progress=False))
        copied = root / "q" / "notes.txt"
        if copied.exists() and copied.read_text() == "PRIVATE KEY":
            return "the secret was copied into the build"
        return result


def _config_deep() -> str:
    from vllm_edge.runtime.engine import edge_engine

    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_bytes(b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        return _outcome(lambda: edge_engine(d, max_model_len=128))


def _gguf(tensors: list, meta: bytes = b"", n_meta: int = 0, data: int = 128) -> bytes:
    sys.path.insert(0, str(REPO / "tests"))
    from support.gguf_bytes import handmade

    return handmade(tensors, meta=meta, n_meta=n_meta, data=data)


def _inspect(blob: bytes) -> str:
    from vllm_edge.models.gguf_import import inspect_gguf

    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "m.gguf")
        path.write_bytes(blob)
        return _outcome(lambda: f"accepted ({inspect_gguf(path).tensor_count} tensors)")


def _proxy() -> str:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from vllm_edge.serving import keepalive

    hits = []

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(502)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    saved = {k: os.environ.get(k) for k in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")}
    try:
        os.environ["HTTP_PROXY"] = os.environ["http_proxy"] = f"http://127.0.0.1:{srv.server_address[1]}"
        os.environ.pop("NO_PROXY", None)
        os.environ.pop("no_proxy", None)
        keepalive.status(9, timeout=1)
        keepalive._healthy(9)
    finally:
        srv.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return f"the proxy saw {len(hits)} loopback calls" if hits else "the proxy saw none"


def run() -> dict[str, str]:
    png = _png()
    mime, data = png[5:].split(";base64,")
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100}
                                            for i in range(2000)}}
    probes = {
        "invocations_without_key": lambda: _keyed("POST", "/invocations", {"prompt": "hi"}),
        "tokenize_without_key": lambda: _keyed("POST", "/tokenize", {"prompt": "hi"}),
        "status_without_key": lambda: _keyed("GET", "/vllm-edge/status"),
        "metrics_without_key": lambda: _keyed("GET", "/metrics"),
        "chat_without_key": lambda: _keyed("POST", "/v1/chat/completions", CHAT),
        "n_as_string": lambda: _body({**CHAT, "n": "16"}),
        "n_as_float": lambda: _body({**CHAT, "n": 16.0}),
        "completions_fan_out": lambda: _body({"prompt": ["p"] * 200, "n": 4}, "/v1/completions"),
        "chat_batch_fan_out": lambda: _body({"messages": [CHAT["messages"]] * 64},
                                            "/v1/chat/completions/batch"),
        "anthropic_url_beside_data": lambda: _body({"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "weird", "url": png, "media_type": mime, "data": "QUFB" * 50}}]}]},
            "/v1/messages"),
        "schema_deep": lambda: _body({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": _nested(40)}}}),
        "schema_large": lambda: _body({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": big}}}),
        "schema_compile_time": lambda: _body({**CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                f"p{i}": {"type": "string", "maxLength": 1000 + i} for i in range(12)}}}}},
            tokenizer=_default_dir(), schema_compile_s=10.0, wait_s=60.0),
        "dns_rebinding_host": lambda: _gate_call({"loopback_hosts_only": True}, "POST", "/v1/completions",
                                                 b"{}", [(b"host", b"evil.example")]),
        "slow_body": lambda: _gate_call({"body_timeout_s": 1.0}, "POST", "/v1/completions",
                                        wait_s=3.0, never_send=True),
        "clean_stale_other_writer": _clean_stale,
        "force_through_symlink": _force_symlink,
        "source_link_out": _source_link,
        "kv_pattern_zero": lambda: _outcome(lambda: __import__("vllm_edge.runtime.kv", fromlist=["x"])
                                            .kv_budget_for({"num_hidden_layers": 4, "num_attention_heads": 4,
                                                            "hidden_size": 256, "sliding_window": 64,
                                                            "sliding_window_pattern": "0"}, 512)),
        "config_deep": _config_deep,
        "gguf_overlap": lambda: _inspect(_gguf([(f"blk.{i}.w", 0) for i in range(3000)])),
        "gguf_metadata_memory": lambda: _inspect(_gguf([], struct.pack("<Q", 5) + b"x.big" + struct.pack(
            "<IIQ", 9, 0, (256 << 20) // 32) + b"\0" * ((256 << 20) // 32), n_meta=1)),
        "loopback_via_proxy": _proxy,
    }
    assert set(probes) == set(PROBES)
    only = [n for n in sys.argv[2:] if n in probes]
    return {name: _outcome(fn) for name, fn in probes.items() if not only or name in only}


def table(before_path: str, after_path: str, out: str) -> None:
    from vllm_edge.common import atomic, provenance

    before = json.loads(Path(before_path).read_text())
    after = json.loads(Path(after_path).read_text())
    rows = [{"name": name, "sends": sends, "before": before["outcomes"].get(name),
             "after": after["outcomes"][name], "test": test}
            for name, (sends, test) in PROBES.items()]
    atomic.write_json(out, {
        "what": "security probes against the serve gate (as the ASGI middleware vLLM loads, a "
                "tiny app standing for vLLM) and the library functions each targets, run on the "
                "branch point (before) and on this tree (after)",
        "before_commit": before.get("commit"), "probes": rows,
        "provenance": provenance.collect(model=None, threads=None)})


def main() -> int:
    if sys.argv[1:2] == ["run"]:
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(sys.modules["vllm_edge"].__file__ if "vllm_edge" in sys.modules
                                         else __import__("vllm_edge").__file__).parent).stdout.strip()
        json.dump({"commit": commit, "outcomes": run()}, sys.stdout, indent=2)
        print()
        return 0
    if sys.argv[1:2] == ["table"] and len(sys.argv) == 5:
        table(*sys.argv[2:5])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
