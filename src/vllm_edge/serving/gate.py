"""The request gate of `vllm-edge serve`: an ASGI middleware that answers a request vLLM
should not see with a clear 4xx, before vLLM parses it.

vLLM loads it from its own ``--middleware vllm_edge.serving.gate.RequestGate`` flag
(serve.py always adds it), so nothing of vLLM is forked. In order, for every request:

1. **Authentication first, on every route.** vLLM's own API-key check guards only paths
   under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``; the gate asks for the key on
   every path but :data:`OPEN_PATHS` (``/health``, ``/ping``, ``/version``), websockets
   included (SageMaker's ``/invocations``, ``/tokenize``, ``/metrics``, ``/vllm-edge/status``
   ...). A client without the key gets a 401 and no body is read.
2. **Host, on a keyless loopback server.** Only loopback ``Host`` names (``localhost``,
   ``127.x.x.x``, ``[::1]``, with any port) are answered, so a web page that rebinds its
   DNS name to 127.0.0.1 cannot reach the model through the user's browser (403).
3. **Body size and time.** A ``Content-Length`` over the cap gets a 413 before a byte is
   read; a chunked body is counted as it arrives and cut off at the cap; a body not
   complete within :data:`BODY_READ_TIMEOUT_S` gets a 408.
4. **JSON shape.** A body nested deeper than :data:`MAX_DEPTH` gets a 400 (Python's JSON
   decoder would raise ``RecursionError`` deeper down, which vLLM answers with a 500); a
   JSON schema or grammar (tools, ``response_format``, ``structured_outputs``) over
   :data:`MAX_SCHEMA_BYTES` in all or nested deeper than :data:`MAX_SCHEMA_DEPTH` gets a
   400 before xgrammar compiles it. A string or key holding a lone UTF-16 surrogate
   (``"\\ud800"``, which UTF-8 cannot encode) gets a 400 naming where it is, and so does
   ``kv_transfer_params`` on a server without a KV connector: vLLM passes both on to its
   engine, where they were 500s.
5. **Fan-out.** ``n`` is read the way vLLM's pydantic models read it (``"16"`` and ``16.0``
   are 16); over the server's ``max_num_seqs`` gets a 400, and so does a request whose
   sequences (prompts of ``/v1/completions`` or conversations of
   ``/v1/chat/completions/batch``, times ``n``) are over :data:`FANOUT` × ``max_num_seqs``.
6. **Compile time.** Every schema, regex and grammar is compiled by xgrammar in a worker
   process (:mod:`vllm_edge.serving.gate_compile`); past ``VLLM_EDGE_SCHEMA_COMPILE_S`` for
   the request the worker is killed and the request gets a 400 naming the limit.
7. **Media parts, on every route.** The whole body is walked (minus the subtrees that hold
   JSON schemas, where a property may be called ``image_url``), so every part shape
   vLLM's chat parser accepts is seen wherever it sits: typed ``image_url``, typeless
   ``{"image_url": ...}``, Responses ``input_image``, Anthropic ``image`` blocks (both
   their ``url`` and their ``data``, whichever vLLM would decode). Images
   go through :mod:`vllm_edge.runtime.images` (data URLs only, byte/pixel/format/count
   limits); any other media (audio, video, embeddings tensors, files) gets a 400, and so
   does any image for a model without a vision encoder.

A request that passes is replayed to vLLM byte for byte. Bodies that are not JSON are
left to vLLM's own validation, inside the size cap.

The gate also keeps the server's activity (requests in flight, time since the last one),
answers it on ``GET /vllm-edge/status`` (behind the key) for `vllm-edge ps`, and with ``idle_exit_s`` stops
the server (SIGTERM to itself, vLLM's graceful shutdown) after that long without a request:
the keep-alive server that `run` starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import hmac
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

from vllm_edge.common.errors import EdgeError
from vllm_edge.runtime.images import ImageInputError, ImageLimits, validate_image_urls
from vllm_edge.serving.gate_compile import CompileRefused, SchemaCompiler, targets

from vllm_edge.serving.speech import SPEECH_PATH, SpeechError  # the route the gate answers itself

# The OpenAI-style error "type" per status, as vLLM names them (HTTP phrase + "Error").
ERROR_TYPES = {400: "BadRequestError", 401: "UnauthorizedError", 403: "ForbiddenError",
               404: "NotFoundError", 408: "RequestTimeoutError", 413: "RequestEntityTooLargeError",
               415: "UnsupportedMediaTypeError", 503: "ServiceUnavailableError"}
# The only paths answered without the key: liveness probes that say nothing about the model.
OPEN_PATHS = frozenset({"/health", "/ping", "/version"})
# Sequences one request may start, in units of the server's --max-num-seqs: n up to
# max_num_seqs, and prompts x n (completions) or conversations x n (chat batch) up to
# FANOUT x max_num_seqs. More would only queue behind each other on a small CPU.
FANOUT = 4
# JSON schemas and grammars reach xgrammar, whose compile time grows with their size.
MAX_SCHEMA_BYTES = 128 << 10
MAX_SCHEMA_DEPTH = 32
# A request body must arrive whole within this long (a slow sender holds a buffer).
BODY_READ_TIMEOUT_S = 60.0
# Deeper than any real request: a chat body is about 6 levels, a nested tool schema 20.
MAX_DEPTH = 64
# Room for the text of a request beside its images.
TEXT_BODY_BYTES = 4 << 20
# Subtrees that hold JSON schemas or tool definitions, not content.
SCHEMA_KEYS = frozenset({"tools", "functions", "tool_choice", "response_format",
                         "structured_outputs", "guided_json", "json_schema", "schema",
                         "parameters", "input_schema", "properties", "$defs", "definitions",
                         "guided_regex", "guided_grammar"})
IMAGE_TYPES = frozenset({"image_url", "input_image", "image"})
# Part keys vLLM's chat parser reads even without a "type" (or with a uuid), in its order.
TYPELESS_KEYS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds",
                 "prompt_embeds", "audio_url", "input_audio", "video_url")
OTHER_MEDIA_TYPES = frozenset({"image_pil", "image_embeds", "audio_embeds", "video_embeds",
                               "prompt_embeds", "audio_url", "input_audio", "video_url",
                               "input_file", "file", "document"})

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class GateError(EdgeError):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True)
class GateConfig:
    images: ImageLimits = ImageLimits()
    accepts_images: bool = True
    max_body_bytes: int = 0  # 0: derived from the image limit (see body_cap)
    max_n: int | None = None
    api_keys: tuple[str, ...] = ()
    model: str | None = None
    idle_exit_s: float | None = None  # stop the server after this long without a request
    loopback_hosts_only: bool = False  # answer only loopback Host names (keyless loopback)
    body_timeout_s: float = BODY_READ_TIMEOUT_S
    # the sampling vLLM applies where a request sets none, and where it came from (for /show)
    sampling: dict | None = None
    sampling_source: str | None = None
    # the tokenizer xgrammar compiles schemas against (the model's folder); None: no
    # compile-time check (the size and depth bounds still hold)
    tokenizer: str | None = None
    schema_compile_s: float = 10.0
    # vLLM sends kv_transfer_params to a KV connector; without one (serve configures none
    # unless the user passes --kv-transfer-config) the field can do nothing but harm
    kv_connector: bool = False

    @property
    def max_seqs(self) -> int | None:
        """Sequences one request may start (prompts or conversations times n)."""
        return None if self.max_n is None else FANOUT * self.max_n

    @property
    def body_cap(self) -> int:
        if self.max_body_bytes:
            return self.max_body_bytes
        # one image at the byte limit, base64-encoded, plus the text around it
        return TEXT_BODY_BYTES + (-(-self.images.max_bytes * 4 // 3) if self.accepts_images else 0)

    @classmethod
    def from_env(cls, **fields: Any) -> "GateConfig":
        """Limits from the environment, the rest from ``fields``; API keys as vLLM finds
        them when none are given (``VLLM_API_KEY``)."""
        from vllm_edge import envs

        cap = envs.get("VLLM_EDGE_MAX_BODY_BYTES")
        if cap < 0:
            raise ValueError(f"VLLM_EDGE_MAX_BODY_BYTES={cap}: must be 0 (auto) or more")
        if "api_keys" not in fields:
            from vllm import envs as vllm_envs

            fields["api_keys"] = tuple(k for k in [vllm_envs.VLLM_API_KEY] if k)
        fields.setdefault("schema_compile_s", float(envs.get("VLLM_EDGE_SCHEMA_COMPILE_S")))
        return cls(images=ImageLimits.from_env(), max_body_bytes=cap, **fields)


_configured: GateConfig | None = None
STATUS_PATH = "/vllm-edge/status"


class Activity:
    """Requests in flight and the time of the last one, for this server process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.requests = 0
        self.last = time.monotonic()

    def begin(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.requests += 1
            self.last = time.monotonic()

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.last = time.monotonic()

    def idle_s(self) -> float:
        with self.lock:
            return 0.0 if self.in_flight else time.monotonic() - self.last


def _watch_idle(activity: Activity, limit_s: float, poll_s: float = 1.0) -> None:
    while True:
        time.sleep(poll_s)
        if activity.idle_s() >= limit_s:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def configure(config: GateConfig) -> None:
    """Set the configuration the next :class:`RequestGate` is built with. vLLM builds the
    middleware with the app alone, in this process, after serve.py has called this."""
    global _configured
    _configured = config


def error_body(exc: GateError | ImageInputError) -> dict[str, Any]:
    return {"error": {"message": str(exc), "type": ERROR_TYPES.get(exc.status, "BadRequestError"),
                      "param": exc.param, "code": exc.status}}


def _walk(value: Any, schemas: list[tuple[str, Any]] | None = None) -> Iterator[tuple[str, dict]]:
    """(path, dict) for every dict outside schema subtrees; GateError past MAX_DEPTH. The
    schema subtrees found are appended to ``schemas`` as (path, value)."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise GateError(f"the request body is nested deeper than {MAX_DEPTH} levels "
                            f"(at {path[:120]}…)", param=None)
        if isinstance(node, dict):
            yield path, node
            for key, child in reversed(list(node.items())):
                if key in SCHEMA_KEYS:
                    if schemas is not None and child is not None:
                        schemas.append((f"{path}.{key}", child))
                elif isinstance(child, (dict, list)):
                    stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(node, list):
            for i in reversed(range(len(node))):
                if isinstance(node[i], (dict, list)):
                    stack.append((node[i], f"{path}[{i}]", depth + 1))


def _depth(value: Any) -> int:
    """Levels of dicts and lists in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth + 1)
            if depth + 1 > MAX_DEPTH:  # json.loads already bounded it; stop early anyway
                return depth + 1
            stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


def check_schemas(schemas: list[tuple[str, Any]]) -> None:
    """JSON schemas, grammars and tool definitions: bounded in size and depth before
    xgrammar compiles them."""
    total = 0
    for path, value in schemas:
        where = path.removeprefix("$.")
        depth = _depth(value)
        if depth > MAX_SCHEMA_DEPTH:
            raise GateError(f"{where}: the schema is nested {depth} levels deep, over the limit "
                            f"of {MAX_SCHEMA_DEPTH} (MAX_SCHEMA_DEPTH) for structured output",
                            param=where)
        # surrogatepass: JSON may escape a lone surrogate, which plain UTF-8 cannot encode
        total += len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(
            json.dumps(value, separators=(",", ":")))
        if total > MAX_SCHEMA_BYTES:
            raise GateError(f"{where}: the request's schemas, grammars and tool definitions "
                            f"take over {MAX_SCHEMA_BYTES} bytes (MAX_SCHEMA_BYTES), the limit "
                            "for structured output", param=where)


def _url(value: Any) -> Any:
    return value.get("url") if isinstance(value, dict) else value


def media_part(part: dict) -> tuple[str, Any] | None:
    """(kind, image url or None) for a content part vLLM would read as media, else None.
    ``kind`` is ``"image"`` or the name of the other medium. For an Anthropic image the url
    is the one vLLM decodes; :func:`extra_urls` gives the others it carries."""
    typ = part.get("type")
    for key in TYPELESS_KEYS:  # vLLM reads these keys whatever the type says
        if key in part and (typ is None or "uuid" in part or typ == key):
            return ("image", _url(part[key])) if key == "image_url" else (key, None)
    if not isinstance(typ, str):
        return None
    if typ == "input_image":
        if part.get("file_id") is not None and part.get("image_url") is None:
            return "file_id", None
        return "image", _url(part.get("image_url"))
    if typ == "image":  # Anthropic: {"type": "image", "source": {...}}
        source = part.get("source")
        if not isinstance(source, dict):
            return ("image", None) if "source" in part else None
        # as vLLM's Anthropic adapter reads it: the url when type is "url", else the data
        if source.get("type") == "url":
            return "image", source.get("url")
        return "image", _anthropic_data_url(source)
    if typ in IMAGE_TYPES:
        return "image", _url(part.get(typ))
    if typ in OTHER_MEDIA_TYPES:
        return typ, None
    return None


def _anthropic_data_url(source: dict) -> str:
    media = source.get("media_type", "image/jpeg")
    return f"data:{media if isinstance(media, str) else ''};base64,{source.get('data', '')}"


def extra_urls(part: dict) -> list[Any]:
    """Image references a part carries beside the one :func:`media_part` returns, checked
    too so that no shape hides a second image behind a small first one (an Anthropic
    source with both a ``url`` and ``data``)."""
    source = part.get("source") if part.get("type") == "image" else None
    if not isinstance(source, dict):
        return []
    if source.get("type") == "url":
        return [_anthropic_data_url(source)] if source.get("data") is not None else []
    return [source["url"]] if source.get("url") is not None else []


_int_adapter: Any = None


def as_int(value: Any, name: str) -> int | None:
    """``value`` read as vLLM's pydantic request models read an ``int | None`` field (lax:
    ``"16"``, ``16.0`` and ``True`` are ints); a GateError when they would refuse it."""
    global _int_adapter
    if _int_adapter is None:
        from pydantic import TypeAdapter

        _int_adapter = TypeAdapter(int | None)
    try:
        return _int_adapter.validate_python(value)
    except Exception:  # pydantic.ValidationError and anything a strange value raises
        raise GateError(f"{name}={json.dumps(value)[:60]}: expected an integer", param=name) from None


def prompt_count(request: dict) -> tuple[int, str]:
    """(prompts, what they are) one request runs: the prompts of a completions body (a list
    of strings or of token lists), the conversations of a chat batch, else 1."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt), "prompts"
    messages = request.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, list) for m in messages):
        return len(messages), "conversations"
    return 1, "prompt"


def check_fanout(request: dict, config: GateConfig) -> None:
    if config.max_n is None:
        return
    params = request.get("sampling_params")  # /inference/v1/generate
    for where, holder in (("n", request), ("sampling_params.n", params)):
        if not isinstance(holder, dict) or holder.get("n") is None:
            continue
        n = as_int(holder["n"], where)
        if n is not None and n > config.max_n:
            raise GateError(f"{where}={n}: this server decodes at most {config.max_n} sequences "
                            f"together (its --max-num-seqs); ask for n <= {config.max_n}",
                            param=where)
    n = as_int(request.get("n"), "n") if request.get("n") is not None else 1
    prompts, what = prompt_count(request)
    seqs = prompts * max(n or 1, 1)
    if seqs > config.max_seqs:
        raise GateError(f"{prompts} {what} x n={n or 1} = {seqs} sequences: this server starts at "
                        f"most {config.max_seqs} per request ({FANOUT} x its --max-num-seqs "
                        f"{config.max_n}); split the request",
                        param="prompt" if what == "prompts" else "messages")


INT64_MAX = 2**63 - 1
# A UTF-16 surrogate code point: json.loads joins an escaped pair into one character, so any
# left in a decoded string stands alone
SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped(key: str) -> str:
    return json.dumps(key)[1:-1]  # ASCII: the error that names it must itself encode


def check_text(value: Any) -> None:
    """No lone surrogate in any string or key of the body. UTF-8 cannot encode one, and
    vLLM 0.32 encodes request fields as UTF-8 on the way to its engine (msgpack): a lone
    surrogate in kv_transfer_params was a 500 with an empty message, found by the fuzz."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if SURROGATE.search(node):
                where = path.removeprefix("$.") if path != "$" else "the body"
                raise GateError(f"{where}: the string holds a lone UTF-16 surrogate "
                                "(\\ud800-\\udfff without its pair), which is not text",
                                param=None if path == "$" else where)
        elif isinstance(node, dict):
            for key, child in node.items():
                if SURROGATE.search(key):  # checked before its subtree: paths below are text
                    where = f"{path}.{_escaped(key)}".removeprefix("$.")
                    raise GateError(f"{where}: the key holds a lone UTF-16 surrogate "
                                    "(\\ud800-\\udfff without its pair), which is not text",
                                    param=where)
                if isinstance(child, (str, dict, list)):
                    stack.append((child, f"{path}.{key}"))
        elif isinstance(node, list):  # token lists run to many thousands of ints: no paths for them
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node)
                         if isinstance(child, (str, dict, list)))


def _check_ints(path: str, node: dict) -> None:
    """No integer outside 64 bits in a field or in a list a field holds: vLLM hands them to
    C code (top_k of 2**64+1 was a 500 with an empty message, found by the fuzz)."""
    for key, value in node.items():
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > INT64_MAX:
                where = f"{path}.{key}".removeprefix("$.")
                raise GateError(f"{where}: {str(item)[:30]} is outside the 64-bit integer range",
                                param=where)


def check_request(request: Any, config: GateConfig,
                  compiler: SchemaCompiler | None = None) -> None:
    """Raise :class:`GateError` / :class:`ImageInputError` for a parsed body the server
    must refuse. With ``compiler``, its schemas are also compiled within the budget."""
    if isinstance(request, dict):
        so = request.get("structured_outputs")
        if so is not None and not isinstance(so, dict):
            # vLLM's chat and completions validators call .get on it before pydantic checks
            # its type: a string, list or bool there was a 500 (found by the fuzz)
            raise GateError(f"structured_outputs={json.dumps(so)[:60]}: expected an object "
                            '(e.g. {"json": {...}} or {"regex": "..."})', param="structured_outputs")
        if request.get("kv_transfer_params") is not None and not config.kv_connector:
            raise GateError("kv_transfer_params: this server has no KV connector "
                            "(--kv-transfer-config), so it takes no KV transfer parameters",
                            param="kv_transfer_params")
        check_fanout(request, config)
    check_text(request)
    images: list[tuple[str, Any]] = []
    extras: list[tuple[str, Any]] = []
    schemas: list[tuple[str, Any]] = []
    for path, node in _walk(request, schemas):
        _check_ints(path, node)
        found = media_part(node)
        if found is None:
            continue
        kind, url = found
        where = path.removeprefix("$.")
        if kind != "image":
            raise GateError(f"{where}: {kind} parts are not accepted by vllm-edge serve (text "
                            "and data:image/...;base64 images only)", param=where)
        images.append((where, url))
        extras += [(where, u) for u in extra_urls(node)]
    check_schemas(schemas)
    if images:
        validate_image_urls(images, config.images, model=config.model,
                            accepts_images=config.accepts_images)
    for where, url in extras:  # one part, one image: counted above, each reference checked
        validate_image_urls([(where, url)], config.images, model=config.model,
                            accepts_images=config.accepts_images)
    if compiler is not None and schemas:  # last: the only check that may take seconds
        try:
            compiler.check(targets(schemas))
        except CompileRefused as exc:
            raise GateError(str(exc), param=exc.param) from None


def check_body(body: bytes, config: GateConfig, compiler: SchemaCompiler | None = None) -> None:
    """:func:`check_request` on a raw body; a body that is not JSON is left to vLLM."""
    try:
        request = json.loads(body)
    except RecursionError:
        raise GateError(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        return
    check_request(request, config, compiler)


def _hashed(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_matches(scope: Scope, hashes: tuple[bytes, ...]) -> bool:
    """The request's ``Authorization: Bearer KEY`` is one of the keys (as vLLM reads it),
    compared in constant time."""
    auth = _header(scope, b"authorization")
    if auth is None:
        return False
    scheme, _, param = auth.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    h, ok = _hashed(param), False
    for want in hashes:
        ok |= hmac.compare_digest(h, want)
    return ok


LOOPBACK_HOST = re.compile(r"(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])(?::\d{1,5})?", re.I)


def loopback_host(scope: Scope) -> bool:
    """The request's Host header names this machine's loopback (or there is none: not a
    browser, which always sends one)."""
    host = _header(scope, b"host")
    return host is None or LOOPBACK_HOST.fullmatch(host.decode("latin-1").strip()) is not None


class RequestGate:
    def __init__(self, app: ASGIApp, config: GateConfig | None = None) -> None:
        self.app = app
        self.config = config or _configured or GateConfig.from_env()
        self.activity = Activity()
        if self.config.idle_exit_s:
            threading.Thread(target=_watch_idle, args=(self.activity, self.config.idle_exit_s),
                             name="vllm-edge-idle-exit", daemon=True).start()
        self._key_hashes = tuple(_hashed(k) for k in self.config.api_keys)
        self.compiler: SchemaCompiler | None = None
        if self.config.tokenizer and self.config.schema_compile_s > 0:
            self.compiler = SchemaCompiler(self.config.tokenizer, self.config.schema_compile_s)
        self._speech: Any = None  # serving.speech.SpeechRoute, made on the first speech request

    def __repr__(self) -> str:  # no keys in logs
        cfg = dataclasses.replace(self.config, api_keys=("***",) * len(self.config.api_keys))
        return f"RequestGate({cfg})"

    def refusal(self, scope: Scope) -> GateError | None:
        """Why this connection is refused before anything is read: no key, or a foreign
        Host on a keyless loopback server."""
        if self.config.loopback_hosts_only and not loopback_host(scope):
            return GateError("this server answers only requests addressed to localhost, "
                             "127.0.0.1 or [::1] (Host header); start it with --api-key to "
                             "serve other names", status=403)
        if not self._key_hashes:
            return None
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if path in OPEN_PATHS:
            return None
        if (scope["type"] == "http" and scope.get("method") == "OPTIONS"
                and _header(scope, b"access-control-request-method") is not None):
            return None  # a CORS preflight carries no credentials by design; it runs nothing
        if key_matches(scope, self._key_hashes):
            return None
        return GateError("missing or wrong API key: send 'Authorization: Bearer KEY'",
                         status=401)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        refused = self.refusal(scope)
        if refused is not None:
            if scope["type"] == "websocket":  # before accept: the server answers 403
                await send({"type": "websocket.close", "code": 1008})
            else:
                await _refuse(send, refused)
            return
        if scope["type"] == "http" and scope.get("path") == STATUS_PATH:
            await self._status(send)
            return
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self._gate(scope, receive, send)  # health checks and listings are not use
            return
        self.activity.begin()
        try:
            await self._gate(scope, receive, send)
        finally:
            self.activity.end()

    async def _status(self, send: Send) -> None:
        payload = json.dumps({"pid": os.getpid(), "idle_s": round(self.activity.idle_s(), 1),
                              "in_flight": self.activity.in_flight,
                              "requests": self.activity.requests,
                              "idle_exit_s": self.config.idle_exit_s,
                              "sampling": self.config.sampling,
                              "sampling_source": self.config.sampling_source,
                              # Python's own once the engine is up (runtime/gc_freeze.py)
                              "gc_threshold": gc.get_threshold()}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once a refusal was sent (or the client left)."""
        cap = self.config.body_cap
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before it finished sending
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                await _refuse(send, self._too_large(size, at_least=True))
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _gate(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.config.body_cap:
            await _refuse(send, self._too_large(declared))
            return
        try:
            body = await asyncio.wait_for(self._read_body(receive, send),
                                          self.config.body_timeout_s)
        except asyncio.TimeoutError:
            await _refuse(send, GateError(
                f"the request body did not arrive within {self.config.body_timeout_s:g} s "
                "(BODY_READ_TIMEOUT_S)", status=408))
            return
        if body is None:
            return
        if _is_json(scope):
            try:
                # decoding an image is CPU work: off the event loop, so other requests go on
                await asyncio.to_thread(check_body, body, self.config, self.compiler)
            except (GateError, ImageInputError) as exc:
                await _refuse(send, exc)
                return

        if _route(scope) == SPEECH_PATH:  # vLLM has no such route: answered here, after the checks
            await self._speak(scope, body, receive, send)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    async def _speak(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        from vllm_edge.serving import speech

        try:
            if self._speech is None:
                if not speech.SpeechRoute.speaks(self.config.tokenizer):
                    raise GateError(f"{SPEECH_PATH}: this server's model does not speak (its "
                                    "config.json has no speech block); serve a speech model, e.g. "
                                    "`vllm-edge serve --model speech`", status=404)
                self._speech = await asyncio.to_thread(speech.SpeechRoute, self.config.tokenizer)
            await self._speech(scope, body, send, receive)
        except SpeechError as exc:
            await _refuse(send, GateError(str(exc), exc.status, exc.param))
        except GateError as exc:
            await _refuse(send, exc)

    def _too_large(self, size: int, at_least: bool = False) -> GateError:
        return GateError(f"request body of {'over ' if at_least else ''}{size} bytes is over the "
                         f"limit of {self.config.body_cap} bytes (VLLM_EDGE_MAX_BODY_BYTES)",
                         status=413)


def _route(scope: Scope) -> str:
    """The request's path below the server's root path."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _is_json(scope: Scope) -> bool:
    ctype = (_header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
    return ctype in (b"", b"application/json") or ctype.endswith(b"+json")


async def _refuse(send: Send, exc: GateError | ImageInputError) -> None:
    payload = json.dumps(error_body(exc)).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})

