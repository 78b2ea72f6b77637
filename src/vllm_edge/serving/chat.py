"""`run` as a client of a keep-alive server: one streamed answer, the pipe mode, and the
interactive chat.

Answers stream as the server sends them (OpenAI chat completions with ``stream``), so
the first words show after one prefill. Ctrl-C while an answer streams closes the
connection, which aborts the request in the engine, and keeps the session. The REPL
keeps the history and sends it whole each turn; the server applies the model's chat
template and its prefix cache makes the repeated history cheap.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from vllm_edge.common.errors import EdgeError

HELP = """commands:
  /set temperature X | top_p X | max_tokens N | system TEXT   sampling and the system message
  /show        the current settings
  /clear       forget the conversation (keeps the system message)
  /bye         leave (or Ctrl-D); Ctrl-C stops an answer"""


class ChatError(EdgeError):
    pass


@dataclass
class Settings:
    """What the chat sends. ``temperature`` and ``top_p`` left at None are not sent, so the
    server's defaults apply (the model's own, see serving/sampling.py); ``server`` holds those
    defaults and ``server_source`` where they came from, for /show."""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int = 512
    # None: no system turn (the template's own default applies); "": an empty one
    system: str | None = None
    system_source: str | None = None
    server: dict = field(default_factory=dict)
    server_source: str | None = None

    def sampling(self) -> dict[str, float]:
        """The sampling fields a request carries: only those set here."""
        return {k: v for k in ("temperature", "top_p") if (v := getattr(self, k)) is not None}

    def show(self) -> str:
        """Each sampling value and where it comes from."""
        parts = []
        for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            mine = getattr(self, key, None)
            if mine is not None:
                parts.append(f"{key}={mine} (/set)")
            elif key in self.server:
                parts.append(f"{key}={self.server[key]} (server default)")
            elif key in ("temperature", "top_p"):
                parts.append(f"{key}=server default")
        src = f"\nserver defaults from: {self.server_source}" if self.server_source else ""
        return " ".join(parts) + src

    def set(self, name: str, value: str) -> str:
        kinds: dict[str, Callable[[str], Any]] = {"temperature": float, "top_p": float,
                                                 "max_tokens": int, "system": str}
        if name not in kinds:
            raise ChatError(f"/set {name}: unknown; one of {', '.join(kinds)}")
        try:
            v = kinds[name](value)
        except ValueError:
            raise ChatError(f"/set {name} {value!r}: expected {kinds[name].__name__}") from None
        if name == "max_tokens" and v < 1 or name in ("temperature", "top_p") and v < 0:
            raise ChatError(f"/set {name} {value}: out of range")
        setattr(self, name, v or None if name == "system" else v)
        if name == "system":
            self.system_source = "/set"
        return f"{name} = {getattr(self, name)!r}"


@dataclass
class Answer:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.time()
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None

    @property
    def decode_tps(self) -> float | None:
        if self.first_token_at is None or self.ended_at is None or self.completion_tokens < 2:
            return None
        span = self.ended_at - self.first_token_at
        return (self.completion_tokens - 1) / span if span > 0 else None


def stream_answer(base_url: str, model: str, messages: list[dict], settings: Settings,
                  out: TextIO, headers: dict[str, str] | None = None) -> Answer:
    """One chat completion, streamed to ``out`` as it arrives; ``headers`` carry the
    server's key. The server is on loopback: no proxy from the environment is used."""
    body = {"model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, **settings.sampling(),
            "max_tokens": settings.max_tokens}
    return _stream(base_url, "/v1/chat/completions", body, out, headers,
                   lambda ch: (ch.get("delta") or {}).get("content") or "")


def stream_completion(base_url: str, model: str, prompt: str, settings: Settings, out: TextIO,
                      headers: dict[str, str] | None = None) -> Answer:
    """A plain completion of ``prompt`` (a base model: no chat template to put it in a turn),
    streamed to ``out`` as :func:`stream_answer` streams a chat answer. No system message."""
    body = {"model": model, "prompt": prompt, "stream": True,
            "stream_options": {"include_usage": True}, **settings.sampling(),
            "max_tokens": settings.max_tokens}
    return _stream(base_url, "/v1/completions", body, out, headers, lambda ch: ch.get("text") or "")


def _stream(base_url: str, path: str, body: dict, out: TextIO, headers: dict[str, str] | None,
            piece_of: Callable[[dict], str]) -> Answer:
    import httpx

    ans = Answer()
    try:
        with httpx.stream("POST", base_url + path, json=body,
                          headers=headers or {}, trust_env=False,
                          timeout=httpx.Timeout(None, connect=10)) as r:
            if r.status_code != 200:
                r.read()
                try:
                    msg = r.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = r.text[:300]
                raise ChatError(f"the server answered {r.status_code}: {msg}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    ans.completion_tokens = chunk["usage"].get("completion_tokens") or 0
                for ch in chunk.get("choices") or []:
                    piece = piece_of(ch)
                    if piece:
                        if ans.first_token_at is None:
                            ans.first_token_at = time.time()
                            piece = piece.lstrip() if not ans.text else piece
                        ans.text += piece
                        out.write(piece)
                        out.flush()
                    ans.finish_reason = ch.get("finish_reason") or ans.finish_reason
    except httpx.HTTPError as exc:
        raise ChatError(f"lost the model server at {base_url} ({type(exc).__name__}: {exc})") from None
    ans.ended_at = time.time()
    return ans


def turn(messages: list[dict], settings: Settings) -> list[dict]:
    return ([{"role": "system", "content": settings.system}] if settings.system is not None else []) + messages


def repl(base_url: str, model: str, settings: Settings, *, banner: str,
         read: Callable[[str], str] = input, out: TextIO = sys.stdout,
         headers: dict[str, str] | None = None, check: Callable[[], None] | None = None) -> int:
    """The interactive chat: returns 0 on /bye or Ctrl-D. ``check`` runs before each turn
    (the keep-alive server's identity) and its EdgeError ends the chat."""
    import signal

    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    # A process started in the background of a non-interactive shell (a script, CI) inherits
    # SIGINT ignored, and Python then never raises KeyboardInterrupt: Ctrl-C in the chat would
    # be echoed and do nothing. The chat promises that Ctrl-C stops an answer, so it says so.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    out.write(banner + "\n")
    history: list[dict] = []
    while True:
        try:
            line = read(">>> ")
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /bye to leave)\n")
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd, _, rest = text.partition(" ")
            if cmd in ("/bye", "/exit", "/quit"):
                return 0
            if cmd == "/clear":
                history.clear()
                out.write("(conversation cleared)\n")
            elif cmd == "/show":
                out.write(f"{settings.show()}\nmax_tokens={settings.max_tokens} "
                          f"system={settings.system!r}"
                          + (f" ({settings.system_source})" if settings.system_source else "")
                          + f" history={len(history)} messages\n")
            elif cmd == "/set":
                name, _, value = rest.strip().partition(" ")
                try:
                    out.write(settings.set(name, value.strip()) + "\n")
                except ChatError as exc:
                    out.write(f"{exc}\n")
            else:
                out.write(HELP + "\n")
            continue
        if check is not None:
            check()
        history.append({"role": "user", "content": text})
        try:
            ans = stream_answer(base_url, model, turn(history, settings), settings, out, headers)
        except KeyboardInterrupt:
            out.write("\n(stopped)\n")
            history.pop()
            continue
        except ChatError as exc:
            out.write(f"\nerror: {exc}\n")
            history.pop()
            continue
        out.write("\n")
        history.append({"role": "assistant", "content": ans.text})
