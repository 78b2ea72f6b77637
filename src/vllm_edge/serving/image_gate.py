"""An ASGI middleware for `vllm-edge serve`: checks the images of a chat request with
:mod:`vllm_edge.runtime.images` and answers a bad one with a clear 4xx before vLLM sees it.

vLLM loads it from its own ``--middleware vllm_edge.serving.image_gate.ImageGate`` flag
(serve.py adds it for a model that takes images), so nothing of vLLM is forked. vLLM
builds it with the app alone, so the limits come from the environment
(``VLLM_EDGE_MAX_IMAGE_BYTES``, ``VLLM_EDGE_MAX_IMAGE_PIXELS``, ``VLLM_EDGE_MAX_IMAGES``).

Only ``POST /v1/chat/completions`` is looked at. A body that is not JSON, or has no list of
messages, is passed on untouched: vLLM's own validation answers those. A request that
passes is replayed to vLLM byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from vllm_edge.runtime.images import ImageInputError, ImageLimits, validate_openai_messages

PATHS = ("/v1/chat/completions",)
# The OpenAI-style error "type" per status, as vLLM names them (HTTP phrase + "Error").
ERROR_TYPES = {400: "BadRequestError", 413: "RequestEntityTooLargeError",
               415: "UnsupportedMediaTypeError"}

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(exc: ImageInputError) -> dict[str, Any]:
    return {"error": {"message": str(exc), "type": ERROR_TYPES.get(exc.status, "BadRequestError"),
                      "param": exc.param, "code": exc.status}}


def check_body(body: bytes, limits: ImageLimits) -> None:
    """Raise :class:`ImageInputError` for a chat request body with a bad image; anything
    that is not a chat request with messages is left to vLLM."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return
    messages = request.get("messages") if isinstance(request, dict) else None
    if isinstance(messages, list):
        validate_openai_messages(messages, limits)


class ImageGate:
    def __init__(self, app: ASGIApp, limits: ImageLimits | None = None) -> None:
        self.app = app
        self.limits = limits or ImageLimits.from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in PATHS):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            # decoding an image is CPU work: off the event loop, so other requests go on
            await asyncio.to_thread(check_body, body, self.limits)
        except ImageInputError as exc:
            await self._refuse(send, exc)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Send, exc: ImageInputError) -> None:
        payload = json.dumps(error_body(exc)).encode()
        await send({"type": "http.response.start", "status": exc.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
