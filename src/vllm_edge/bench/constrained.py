"""`vllm-edge bench constrained`: what a decoding constraint costs a request on `serve`, and
whether the server really enforced it.

Sequential streamed requests, one at a time, against one server, in three kinds:

- ``cold``: the first request with a schema the server has never seen (a nonce inside the
  schema makes each one new to xgrammar's compiler cache), so its grammar is compiled;
- ``warm``: the same schema again (the compiled grammar comes from the cache);
- ``free``: the same prompt with no constraint at all.

Each is done in two modes: ``json_schema`` (``response_format`` over the union of the agent's
actions) and ``tool_required`` (``tool_choice="required"`` over the agent's tools, which vLLM
turns into a structural tag for the hermes format). Every request gets a fresh prompt nonce
at the very start, so the prefix cache never hands one kind a cheaper prefill than another.

Per request the client records its time to first token and the server's own view: the
change of vLLM's ``vllm:request_queue_time_seconds`` histogram over that request. A request
waits in the queue while its grammar compiles (vLLM compiles asynchronously and schedules
the request once the grammar is ready), and with one request at a time nothing else waits,
so that delta is the grammar wait as vLLM measured it. The very first constrained request of
a server also builds xgrammar's tokenizer tables, which a ``first`` row shows apart.

Which backend compiled the grammars: vLLM's ``auto`` structured-output backend (the setting
the engine core logs at start) tries xgrammar first and keeps it unless xgrammar rejects the
schema (then guidance). The bench records that setting from the server log and runs vLLM's own
xgrammar check on every ``json_schema`` schema it sent. Which native libraries a process has
mapped proves nothing: vLLM imports xgrammar and guidance at server start.

The same requests run on llama.cpp in this process (:class:`LlamaCppTarget`), so the two
engines' grammar costs sit in one table: there the wait is the grammar build itself, timed
before the prompt is evaluated.
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

from vllm_edge.bench import soak, toolcalls
from vllm_edge.common import phone_tools
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.schema import schema_errors

MODES = ("json_schema", "tool_required")
# Room for a whole answer: the grammar lets the model put whitespace between any two tokens, and
# SmolLM2-135M does (about 44 tokens for an action object of about 20).
MAX_TOKENS = 96
_BACKEND_SETTING = re.compile(r"StructuredOutputsConfig\(backend='([^']+)'")
SCREEN = """App: com.android.settings
[0] ImageButton "Navigate up"
[1] TextView "Wi-Fi"
[2] Switch "Use Wi-Fi" [off]
[3] TextView "To see available networks, turn Wi-Fi on."
[4] LinearLayout "Network preferences\""""
TASK = "Make sure Wi-Fi is turned on."


class ConstrainedBenchError(EdgeError):
    pass


def action_schema(nonce: str) -> dict:
    """One JSON object per agent action: ``{"id": NONCE, "action": NAME, "args": {...}}``.

    The const ``id`` makes the schema new to the compiler cache; everything else is the same
    union of the six tools every time.
    """
    options = []
    for t in phone_tools.TOOLS:
        fn = t["function"]
        options.append({"type": "object", "additionalProperties": False,
                        "properties": {"id": {"const": nonce}, "action": {"const": fn["name"]},
                                       "args": fn["parameters"]},
                        "required": ["id", "action", "args"]})
    return {"anyOf": options}


def tool_set(nonce: str) -> list[dict]:
    """The agent's tools plus one whose name carries the nonce, so the structural tag vLLM
    builds from them is new to the compiler cache."""
    extra = {"type": "function", "function": {
        "name": f"note_{nonce}", "description": "Write a note for later.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    return [*phone_tools.TOOLS, extra]


def request_body(mode: str, kind: str, nonce: str, prompt_nonce: str, model: str, max_tokens: int) -> dict:
    """A streamed chat request; ``kind`` "free" drops the constraint and keeps everything else."""
    system = (f"[{prompt_nonce}] You operate an Android phone. Each turn choose one action: tap, "
              "type_text, swipe, press_key, open_app or task_complete.")
    user = f"Task: {TASK}\n\nCurrent screen:\n{SCREEN}\n\nWhat is the next action?"
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    if mode == "json_schema":
        if kind != "free":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "action", "schema": action_schema(nonce)}}
    elif mode == "tool_required":
        body["tools"] = tool_set(nonce)
        body["tool_choice"] = "auto" if kind == "free" else "required"
    else:
        raise ConstrainedBenchError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    return body


def verdict(mode: str, body: dict, message: dict, finish: str | None, nonce: str) -> str:
    """``valid`` when the answer satisfies the constraint the request had (or, for a free
    request, the one its constrained twin had), else why not."""
    if mode == "json_schema":
        try:
            value = json.loads(message.get("content") or "")
        except ValueError:
            return "length" if finish == "length" else "invalid_json"
        if schema_errors(value, {"type": "object"}) or _union_errors(value, nonce):
            return "schema_invalid"
        return "valid"
    return toolcalls.judge(message, finish, "required", body["tools"])


def _union_errors(value: dict, nonce: str) -> list[str]:
    """Errors against the action union (our checker has no anyOf/const: match the option)."""
    name = value.get("action")
    fn = next((t["function"] for t in phone_tools.TOOLS if t["function"]["name"] == name), None)
    if fn is None or value.get("id") != nonce or set(value) != {"id", "action", "args"}:
        return ["not one of the actions"]
    return schema_errors(value["args"], fn["parameters"], "$.args")


_HIST = re.compile(r"^vllm:request_queue_time_seconds_(sum|count)\{[^}]*\} (\S+)$", re.M)


def queue_time(base_url: str) -> tuple[float, int]:
    """(sum of seconds, count) of vLLM's request queue-time histogram on the server."""
    import httpx

    return parse_queue_time(httpx.get(base_url + "/metrics", timeout=60, trust_env=False).text)


def parse_queue_time(text: str) -> tuple[float, int]:
    """(sum, count) of ``vllm:request_queue_time_seconds`` in Prometheus text, over all labels."""
    total, count = 0.0, 0
    for which, value in _HIST.findall(text):
        if which == "sum":
            total += float(value)
        else:
            count += int(float(value))
    return total, count


def stream_once(base_url: str, body: dict, timeout_s: float = 600) -> dict:
    """One streamed request: TTFT, total, usage, the assembled message, and the server's
    queue time for it."""
    import httpx

    q0, n0 = queue_time(base_url)
    chunks: list[dict] = []
    t0 = time.perf_counter()
    ttft = None
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=timeout_s,
                      trust_env=False) as resp:
        if resp.status_code != 200:
            resp.read()
            raise ConstrainedBenchError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line[6:] == "[DONE]":
                continue
            obj = json.loads(line[6:])
            chunks.append(obj)
            if ttft is None and any((ch.get("delta") or {}).get("content") or (ch.get("delta") or {}).get("tool_calls")
                                    for ch in obj.get("choices") or []):
                ttft = time.perf_counter() - t0
    total = time.perf_counter() - t0
    message, finish = toolcalls.assemble_stream(chunks)
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), {}) or {}
    q1, n1 = queue_time(base_url)
    deadline = time.perf_counter() + 5
    while n1 == n0 and time.perf_counter() < deadline:  # the stats may land just after the last chunk
        time.sleep(0.05)
        q1, n1 = queue_time(base_url)
    tokens = usage.get("completion_tokens")
    return {"ttft_s": None if ttft is None else round(ttft, 4), "total_s": round(total, 4),
            "queue_s": round(q1 - q0, 4) if n1 - n0 == 1 else None,
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": tokens,
            "decode_tps": (round((tokens - 1) / (total - ttft), 2)
                           if tokens and tokens > 1 and ttft is not None and total > ttft else None),
            "finish_reason": finish, "message": message}


def backend_setting(server_log: str) -> str | None:
    """The structured-output backend the engine core was started with (its config log line)."""
    m = _BACKEND_SETTING.search(server_log)
    return m.group(1) if m else None


def xgrammar_accepts(schema: dict) -> bool:
    """vLLM's own check, the one ``auto`` runs first: True when xgrammar takes the schema."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        validate_xgrammar_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(json=schema)))
    except (VLLMValidationError, ValueError):
        return False
    return True


def resolved_backend(setting: str | None, schemas: list[dict]) -> str | None:
    """The backend vLLM compiles ``schemas`` with under ``setting`` (None when unknown)."""
    if setting is None or not schemas:
        return setting
    if setting != "auto":
        return setting
    return "xgrammar" if all(xgrammar_accepts(s) for s in schemas) else "guidance"


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarize(rows: list[dict]) -> dict:
    """Per mode and kind: medians and verdicts. The grammar wait is vLLM's queue time on a
    server, and the grammar build (``grammar_s``) measured in-process on llama.cpp."""
    out: dict[str, Any] = {}
    wait = "queue_s" if any("queue_s" in r for r in rows) else "grammar_s"
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        by_kind = {}
        for kind in ("first", "cold", "warm", "free"):
            rs = [r for r in mine if r["kind"] == kind]
            by_kind[kind] = {"n": len(rs), "ttft_s_median": _median([r["ttft_s"] for r in rs]),
                             f"{wait}_median": _median([r.get(wait) for r in rs]),
                             wait: [r.get(wait) for r in rs],
                             "decode_tps_median": _median([r["decode_tps"] for r in rs]),
                             "valid": sum(r["verdict"] == "valid" for r in rs),
                             "verdicts": _count(r["verdict"] for r in rs)}
        cold, warm = by_kind["cold"][f"{wait}_median"], by_kind["warm"][f"{wait}_median"]
        first = by_kind["first"][f"{wait}_median"]
        out[mode] = {**by_kind,
                     # the compile itself: a new grammar's wait minus a cached grammar's wait
                     "compile_s_estimate": None if cold is None or warm is None else round(cold - warm, 4),
                     "first_s_estimate": None if first is None or warm is None else round(first - warm, 4),
                     "constrained_valid_rate": _rate(by_kind, ("first", "cold", "warm")),
                     "free_valid_rate": _rate(by_kind, ("free",))}
    return out


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _rate(by_kind: dict, kinds: tuple[str, ...]) -> float | None:
    n = sum(by_kind[k]["n"] for k in kinds)
    return sum(by_kind[k]["valid"] for k in kinds) / n if n else None


def _rows(send, *, schemas: int, repeats: int, modes: tuple[str, ...], max_tokens: int, model: str,
          log, wait_key: str, sent_schemas: list[dict] | None = None) -> list[dict]:
    """Every mode: ``schemas`` fresh schemas, each sent cold, ``repeats`` times warm, once
    free, through ``send(mode, kind, body) -> result``; one unconstrained request first, so
    the target's own first-request costs stay out of the rows."""
    rows: list[dict] = []

    def one(mode: str, kind: str, nonce: str, index: int) -> None:
        body = request_body(mode, kind, nonce, secrets.token_hex(4), model, max_tokens)
        if kind in ("first", "cold") and "response_format" in body and sent_schemas is not None:
            sent_schemas.append(body["response_format"]["json_schema"]["schema"])
        r = send(mode, kind, body)
        r["verdict"] = verdict(mode, body, r["message"], r["finish_reason"], nonce)
        row = {"mode": mode, "kind": kind, "schema": index, **r}
        rows.append(row)
        if log:
            log(f"{mode:13s} {kind:5s} schema {index}: ttft {r['ttft_s']} s, {wait_key} {r[wait_key]} s, "
                f"{r['completion_tokens']} tokens, {row['verdict']}")

    send("json_schema", "free", request_body("json_schema", "free", "warmup", "warmup", model, 8))
    first = True
    for mode in modes:
        for i in range(schemas):
            nonce = secrets.token_hex(4)
            one(mode, "first" if first else "cold", nonce, i)
            first = False
            for _ in range(repeats):
                one(mode, "warm", nonce, i)
            one(mode, "free", nonce, i)
    for r in rows:  # the text is evidence; keep it short
        msg = r.pop("message")
        r["output"] = (msg.get("content") or json.dumps(msg.get("tool_calls")))[:300]
    return rows


def run_against(base_url: str, server_log: str | Path | None, *, schemas: int = 4, repeats: int = 3,
                modes: tuple[str, ...] = MODES, max_tokens: int = MAX_TOKENS, model: str = "default",
                log=print) -> dict:
    """:func:`_rows` against a server; ``server_log`` (the server's output) tells the backend
    setting."""
    base_url = soak.require_loopback(base_url)
    sent_schemas: list[dict] = []
    rows = _rows(lambda mode, kind, body: stream_once(base_url, body), schemas=schemas, repeats=repeats,
                 modes=modes, max_tokens=max_tokens, model=model, log=log, wait_key="queue_s",
                 sent_schemas=sent_schemas)
    setting = backend_setting(Path(server_log).read_text(errors="replace")) if server_log else None
    return {"rows": rows, "summary": summarize(rows),
            "structured_outputs": {"setting": setting,
                                   "json_schema_backend": resolved_backend(setting, sent_schemas)}}


class LlamaCppTarget:
    """The same requests on llama.cpp in this process, as the agent suite's llama.cpp arm
    serves them: the prompt rendered with the chat template serve would use, ``json_schema``
    through llama-cpp-python's JSON-schema-to-GBNF converter, ``tool_required`` through the
    hermes-block grammar of :func:`vllm_edge.bench.engines.llamacpp_chat.tool_grammar`
    (``auto`` for the free twin, as vLLM's ``auto`` still holds an opened ``<tool_call>`` to
    the format),
    greedy decoding that checks the argmax against the grammar first.

    llama.cpp has no compiled-grammar cache: every request parses its GBNF into a new sampler.
    The warm requests reuse the GBNF text (kept here, as the agent chat keeps it), so a new
    schema costs the conversion plus the parse and a cached one the parse alone; ``grammar_s``
    is that time, spent before the prompt is evaluated.
    """

    def __init__(self, gguf: str | Path, *, chat_template: str | Path | None = None,
                 n_threads: int | None = None, n_ctx: int = 2048):
        from vllm_edge.bench.engines import llamacpp_chat as lc

        self.chat = lc.llamacpp_chat(gguf, n_ctx=n_ctx, n_threads=n_threads, chat_template=chat_template)
        self._gbnf: dict[str, str] = {}

    def describe(self) -> dict:
        d = self.chat.describe()
        d.pop("tool_choice", None)
        d.pop("grammar_s", None)
        return d

    def _grammar_text(self, mode: str, kind: str, body: dict) -> str | None:
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        from vllm_edge.bench.engines import llamacpp_chat as lc

        if mode == "json_schema":
            if kind == "free":
                return None
            schema = body["response_format"]["json_schema"]["schema"]
            key = json.dumps(schema, sort_keys=True)
            if key not in self._gbnf:
                self._gbnf[key] = json_schema_to_gbnf(json.dumps(schema))
        else:
            choice = "auto" if kind == "free" else "required"
            key = choice + json.dumps(body["tools"], sort_keys=True)
            if key not in self._gbnf:
                self._gbnf[key] = lc.tool_grammar(body["tools"], choice)
        return self._gbnf[key]

    def send(self, mode: str, kind: str, body: dict) -> dict:
        from vllm_edge.bench.engines import llamacpp_chat as lc
        from vllm_edge.bench.engines.llamacpp import GrammarGreedy, decode_until_eog

        llm, max_tokens = self.chat.llm, body["max_tokens"]
        t0 = time.perf_counter()
        gbnf = self._grammar_text(mode, kind, body)
        picker = GrammarGreedy(llm.model, gbnf) if gbnf is not None else None
        grammar_s = time.perf_counter() - t0 if picker is not None else None
        try:
            text = lc.render(self.chat.template, body["messages"], body.get("tools") or [])
            prompt = llm.tokenize(text.encode(), add_bos=False, special=True)
            llm.reset()
            llm.eval(prompt)
            out, finish, first = decode_until_eog(llm, max_tokens, picker)
            ttft = None if first is None else first - t0
        finally:
            if picker is not None:
                picker.close()
        total = time.perf_counter() - t0
        reply = llm.detokenize(out).decode("utf-8", errors="replace")
        if mode == "tool_required":
            content, calls = lc.parse_reply(reply)
            message = {"role": "assistant", "content": content,
                       "tool_calls": [{"type": "function", "function": c} for c in calls]}
        else:
            message = {"role": "assistant", "content": reply}
        n = len(out)
        return {"ttft_s": None if ttft is None else round(ttft, 4), "total_s": round(total, 4),
                "grammar_s": None if grammar_s is None else round(grammar_s, 5),
                "prompt_tokens": len(prompt), "completion_tokens": n,
                "decode_tps": (round((n - 1) / (total - ttft), 2)
                               if n > 1 and ttft is not None and total > ttft else None),
                "finish_reason": finish, "message": message}

    def close(self) -> None:
        self.chat.close()


def run_llamacpp(gguf: str | Path, *, chat_template: str | Path | None = None, n_threads: int | None = None,
                 out: str | None = None, label: str = "", schemas: int = 4, repeats: int = 3,
                 modes: tuple[str, ...] = MODES, max_tokens: int = MAX_TOKENS, log=print) -> dict:
    """The requests of :func:`run_against` on llama.cpp (:class:`LlamaCppTarget`); writes
    ``out`` atomically with provenance."""
    from vllm_edge.common import atomic, provenance

    target = LlamaCppTarget(gguf, chat_template=chat_template, n_threads=n_threads)
    try:
        rows = _rows(target.send, schemas=schemas, repeats=repeats, modes=modes,
                     max_tokens=max_tokens, model="default", log=log, wait_key="grammar_s")
        engine = target.describe()
    finally:
        target.close()
    result = {"rows": rows, "summary": summarize(rows),
              "structured_outputs": {"setting": "llama.cpp GBNF", "json_schema_backend": "llama.cpp GBNF"},
              "benchmark": "constrained", "label": label, "engine": "llamacpp", "model_root": str(gguf),
              "config": {**engine, "schemas": schemas, "repeats": repeats, "modes": list(modes),
                         "max_tokens": max_tokens},
              "provenance": provenance.collect(model=str(gguf), threads=engine["n_threads"])}
    if out:
        atomic.write_json(out, result)
    return result


def run(model: str = "default", *, serve_args: list[str] | None = None, base_url: str | None = None,
        server_log: str | None = None, out: str | None = None, label: str = "", **kw) -> dict:
    """Start a server (unless ``base_url``), measure, stop it, write ``out`` atomically with
    provenance; the server log lands beside ``out``."""
    import httpx

    from vllm_edge.common import atomic, provenance

    proc = None
    fresh = base_url is None
    log_path = Path(out).with_suffix(".server.log") if out else Path("constrained.server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = None
    if base_url is None:
        port = soak.free_port()
        args = [model, *(serve_args or [])]
        proc = soak.start_server(args, port, log_path)
        base_url, server_log = f"http://127.0.0.1:{port}", str(log_path)
    try:
        try:
            models = httpx.get(base_url + "/v1/models", timeout=30, trust_env=False).json()
            root = models["data"][0].get("root")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConstrainedBenchError(f"{base_url}/v1/models: not a vLLM server answering "
                                        f"({type(exc).__name__}: {exc})") from None
        result = run_against(base_url, server_log, model=model, **kw)
    finally:
        if proc is not None:
            soak.stop_server(proc)
    result.update(
        benchmark="constrained", label=label, model_root=root,
        config={"model": model, "serve_args": args, "base_url": base_url, "server_fresh": fresh,
                **{k: v for k, v in kw.items() if k != "log"}},
        provenance=provenance.collect(model=root, threads=None))
    if out:
        atomic.write_json(out, result)
    return result
