"""The request gate of `vllm-edge serve`: an ASGI middleware that answers a request vLLM
should not see with a clear 4xx, before vLLM parses it.

vLLM loads it from its own ``--middleware vllm_edge.serving.gate.RequestGate`` flag
(serve.py always adds it), so nothing of vLLM is forked. In order, for every request:

1. **Authentication first.** vLLM adds ``--middleware`` classes outside its own API-key
   check, so the gate runs vLLM's :class:`AuthenticationMiddleware` itself, ahead of any
   other check: a client without the key gets vLLM's 401 and no body is read.
2. **Body size.** A ``Content-Length`` over the cap gets a 413 before a byte is read; a
   chunked body is counted as it arrives and cut off at the cap.
3. **JSON shape.** A body nested deeper than :data:`MAX_DEPTH` gets a 400 (Python's JSON
   decoder would raise ``RecursionError`` deeper down, which vLLM answers with a 500).
4. **``n``** over the server's ``max_num_seqs`` gets a 400.
5. **Media parts, on every route.** The whole body is walked (minus the subtrees that hold
   JSON schemas, where a property may be called ``image_url``), so every part shape
   vLLM's chat parser accepts is seen wherever it sits: typed ``image_url``, typeless
   ``{"image_url": ...}``, Responses ``input_image``, Anthropic ``image`` blocks. Images
   go through :mod:`vllm_edge.runtime.images` (data URLs only, byte/pixel/format/count
   limits); any other media (audio, video, embeddings tensors, files) gets a 400, and so
   does any image for a model without a vision encoder.

A request that passes is replayed to vLLM byte for byte. Bodies that are not JSON are
left to vLLM's own validation, inside the size cap.

The gate also keeps the server's activity (requests in flight, time since the last one),
answers it on ``GET /vllm-edge/status`` for `vllm-edge ps`, and with ``idle_exit_s`` stops
the server (SIGTERM to itself, vLLM's graceful shutdown) after that long without a request:
the keep-alive server that `run` starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

from vllm_edge.common.errors import EdgeError
from vllm_edge.runtime.images import ImageInputError, ImageLimits, validate_image_urls

# The OpenAI-style error "type" per status, as vLLM names them (HTTP phrase + "Error").
ERROR_TYPES = {400: "BadRequestError", 413: "RequestEntityTooLargeError",
               415: "UnsupportedMediaTypeError"}
# Deeper than any real request: a chat body is about 6 levels, a nested tool schema 20.
MAX_DEPTH = 64
# Room for the text of a request beside its images.
TEXT_BODY_BYTES = 4 << 20
# Subtrees that hold JSON schemas or tool definitions, not content.
SCHEMA_KEYS = frozenset({"tools", "functions", "tool_choice", "response_format",
                         "structured_outputs", "guided_json", "json_schema", "schema",
                         "parameters", "input_schema", "properties", "$defs", "definitions"})
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


def _walk(value: Any) -> Iterator[tuple[str, dict]]:
    """(path, dict) for every dict outside schema subtrees; GateError past MAX_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise GateError(f"the request body is nested deeper than {MAX_DEPTH} levels "
                            f"(at {path[:120]}…)", param=None)
        if isinstance(node, dict):
            yield path, node
            for key, child in reversed(list(node.items())):
                if key not in SCHEMA_KEYS and isinstance(child, (dict, list)):
                    stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(node, list):
            for i in reversed(range(len(node))):
                if isinstance(node[i], (dict, list)):
                    stack.append((node[i], f"{path}[{i}]", depth + 1))


def _url(value: Any) -> Any:
    return value.get("url") if isinstance(value, dict) else value


def media_part(part: dict) -> tuple[str, Any] | None:
    """(kind, image url or None) for a content part vLLM would read as media, else None.
    ``kind`` is ``"image"`` or the name of the other medium."""
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
        if source.get("type") == "base64":
            return "image", f"data:{source.get('media_type') or ''};base64,{source.get('data') or ''}"
        return "image", source.get("url")
    if typ in IMAGE_TYPES:
        return "image", _url(part.get(typ))
    if typ in OTHER_MEDIA_TYPES:
        return typ, None
    return None


def check_request(request: Any, config: GateConfig) -> None:
    """Raise :class:`GateError` / :class:`ImageInputError` for a parsed body the server
    must refuse."""
    if isinstance(request, dict) and config.max_n is not None:
        n = request.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > config.max_n:
            raise GateError(f"n={n}: this server decodes at most {config.max_n} sequences "
                            f"together (its --max-num-seqs); ask for n <= {config.max_n}",
                            param="n")
    images: list[tuple[str, Any]] = []
    for path, node in _walk(request):
        found = media_part(node)
        if found is None:
            continue
        kind, url = found
        where = path.removeprefix("$.")
        if kind != "image":
            raise GateError(f"{where}: {kind} parts are not accepted by vllm-edge serve (text "
                            "and data:image/...;base64 images only)", param=where)
        images.append((where, url))
    if images:
        validate_image_urls(images, config.images, model=config.model,
                            accepts_images=config.accepts_images)


def check_body(body: bytes, config: GateConfig) -> None:
    """:func:`check_request` on a raw body; a body that is not JSON is left to vLLM."""
    try:
        request = json.loads(body)
    except RecursionError:
        raise GateError(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        return
    check_request(request, config)


class RequestGate:
    def __init__(self, app: ASGIApp, config: GateConfig | None = None) -> None:
        self.app = app
        self.config = config or _configured or GateConfig.from_env()
        self.activity = Activity()
        if self.config.idle_exit_s:
            threading.Thread(target=_watch_idle, args=(self.activity, self.config.idle_exit_s),
                             name="vllm-edge-idle-exit", daemon=True).start()
        self.entry: ASGIApp = self._gate
        if self.config.api_keys:
            from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

            self.entry = AuthenticationMiddleware(self._gate, tokens=list(self.config.api_keys))

    def __repr__(self) -> str:  # no keys in logs
        cfg = dataclasses.replace(self.config, api_keys=("***",) * len(self.config.api_keys))
        return f"RequestGate({cfg})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == STATUS_PATH:
            await self._status(send)
            return
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.entry(scope, receive, send)  # health checks and listings are not use
            return
        self.activity.begin()
        try:
            await self.entry(scope, receive, send)
        finally:
            self.activity.end()

    async def _status(self, send: Send) -> None:
        payload = json.dumps({"pid": os.getpid(), "idle_s": round(self.activity.idle_s(), 1),
                              "in_flight": self.activity.in_flight,
                              "requests": self.activity.requests,
                              "idle_exit_s": self.config.idle_exit_s}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _gate(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        cap = self.config.body_cap
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _refuse(send, self._too_large(declared))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                await _refuse(send, self._too_large(size, at_least=True))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if _is_json(scope):
            try:
                # decoding an image is CPU work: off the event loop, so other requests go on
                await asyncio.to_thread(check_body, body, self.config)
            except (GateError, ImageInputError) as exc:
                await _refuse(send, exc)
                return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    def _too_large(self, size: int, at_least: bool = False) -> GateError:
        return GateError(f"request body of {'over ' if at_least else ''}{size} bytes is over the "
                         f"limit of {self.config.body_cap} bytes (VLLM_EDGE_MAX_BODY_BYTES)",
                         status=413)


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

