"""`vllm-edge bench sampling`: how often a small model answers coherently at the sampling a
user gets without asking, in vLLM (through `run`'s keep-alive server) and in llama.cpp.

A prompt set whose answers have a checkable word (the capital of France: "Paris"), each asked
``samples`` times per arm. An answer is coherent when it names one of the prompt's words, stays
in the prompt's language (an English prompt: no accented letters, the tell of the French
detours a small model takes) and does not loop (no run of four words repeated three times).
Arms:

- ``vllm-defaults``: what the chat sends now, nothing but the messages: the server's defaults
  (serving/sampling.py) apply;
- ``vllm-defaults-eager``: the same, on an eager server, as a first start serves while its
  compiled graph is built (serving/graph_cache.py): other kernels, other rounding;
- ``vllm-defaults-bf16``: the same defaults on the model unquantized (`run --quant none`): what
  the model itself answers at its own settings, the bound the quantized build is held to;
- ``vllm-chat-before``: what the chat sent before (temperature 0.7, top_p 1.0);
- ``vllm-generic-system``: the served defaults with run's generic system message ("You are a
  helpful assistant.") in place of the model's own, where vllm-edge keeps one;
- ``llamacpp-python``: llama-cpp-python's ``create_chat_completion`` at its own defaults on a
  GGUF file (temperature 0.2, top_k 40, top_p 0.95, min_p 0.05);
- ``llamacpp-server``: the same file at llama.cpp's server and CLI defaults (temperature 0.8,
  top_k 40, top_p 0.95, min_p 0.05).

Quality, not speed: the host's load does not move these counts, so the arms need no lock.
"""

from __future__ import annotations

import functools
import io
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

FRANCE = ("What is the capital of France?", ("paris",))
PROMPTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    FRANCE,
    ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("How many days are in a week?", ("seven", "7")),
    ("What is two plus two?", ("four", "4")),
    ("What do bees make?", ("honey",)),
    ("What is the opposite of hot?", ("cold",)),
    ("Which planet do we live on?", ("earth",)),
    ("What is frozen water called?", ("ice",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("At what temperature in Celsius does water boil at sea level?", ("100",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What gas do plants take in from the air?", ("carbon dioxide", "co2")),
    ("How do you say hello in Spanish?", ("hola",)),
    ("Name a fruit that is yellow.", ("banana", "lemon", "pineapple", "mango")),
    ("What is the chemical symbol for water?", ("h2o",)),
    ("Write a Python function that returns the sum of two numbers.", ("def", "return")),
    ("Give me a word that means happy.", ("joyful", "glad", "cheerful", "content", "pleased",
                                          "delighted", "joy")),
)
OLD_CHAT = {"temperature": 0.7, "top_p": 1.0}
LLAMACPP_SERVER = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def loops(text: str, n: int = 4, times: int = 3) -> bool:
    """A run of ``n`` words that comes back ``times`` times: the answer went round in circles."""
    words = re.findall(r"\w+", text.lower())
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return bool(grams) and max(grams.values()) >= times


def foreign(text: str) -> bool:
    """Letters outside ASCII: an answer to an English prompt that left English."""
    return any(ch.isalpha() and ord(ch) > 127 for ch in text)


def coherent(text: str, words: tuple[str, ...]) -> bool:
    low = text.lower()
    named = any(re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", low) for w in words)
    return named and not loops(text) and not foreign(text)


def _score(ask: Callable[[str], str], prompts, samples: int) -> dict[str, Any]:
    rows = []
    for prompt, words in prompts:
        answers = [ask(prompt) for _ in range(samples)]
        ok = [coherent(a, words) for a in answers]
        rows.append({"prompt": prompt, "words": list(words), "coherent": sum(ok), "asked": samples,
                     "answers": [a[:300] for a in answers], "looped": sum(loops(a) for a in answers)})
    france = rows[0]
    return {"coherent": sum(r["coherent"] for r in rows), "asked": sum(r["asked"] for r in rows),
            "france": {"coherent": france["coherent"], "asked": france["asked"]}, "prompts": rows}


def vllm_arm(model: str, quant: str, sampling: dict[str, Any], max_tokens: int,
             system: str | None, eager: bool = False) -> Callable[[str], str]:
    """``eager``: on a server of its own started eager (stopped by :func:`stop_server`), as a
    first start serves; else on the running server or one started as `run` starts it."""
    from vllm_edge.serving import chat, keepalive

    if eager:
        stop_server(model, quant)
    rec, _ = keepalive.ensure(model, quant, 600, {"enforce_eager": True} if eager else {})
    name = keepalive.served_name(rec)
    settings = chat.Settings(max_tokens=max_tokens, system=system, **sampling)

    def ask(prompt: str) -> str:
        return chat.stream_answer(rec.url, name, chat.turn([{"role": "user", "content": prompt}], settings),
                                  settings, io.StringIO(), rec.headers).text
    return ask


def stop_server(model: str, quant: str) -> None:
    from vllm_edge.serving import keepalive

    rec = keepalive.find(keepalive.server_key(model, quant))
    if rec is not None:
        keepalive.stop(rec)


def server_defaults(model: str, quant: str) -> dict[str, Any]:
    from vllm_edge.serving import keepalive

    rec, _ = keepalive.ensure(model, quant, 600, {})
    st = keepalive.status(rec.port, token=rec.token) or {}
    return {"values": st.get("sampling"), "source": st.get("sampling_source"),
            "build": keepalive.served_build(rec)}


def llamacpp_arm(gguf: Path, sampling: dict[str, Any], max_tokens: int,
                 system: str | None) -> tuple[Callable[[str], str], Any]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=2048, verbose=False, seed=int(time.time()))

    def ask(prompt: str) -> str:
        # no system message: the file's chat template puts in its own default, as in vLLM
        first = [{"role": "system", "content": system}] if system is not None else []
        out = llm.create_chat_completion(first + [{"role": "user", "content": prompt}],
                                         max_tokens=max_tokens, **sampling)
        return out["choices"][0]["message"]["content"] or ""
    return ask, llm


def run(model: str = "default", *, gguf: str | None = None, samples: int = 3, france: int = 10,
        max_tokens: int = 256, arms: tuple[str, ...] = ("vllm-defaults", "vllm-chat-before",
                                                       "llamacpp-python", "llamacpp-server"),
        out: str | None = None, say: Callable[[str], None] = lambda _: None,
        system: str | None) -> dict[str, Any]:
    """``system``: the system message every arm sends (None: none, so each engine applies the
    chat template's own default; what `run` sends: ``serving.run.system_message(model)[0]``)."""
    from vllm_edge.common import atomic, provenance
    from vllm_edge.models import store
    from vllm_edge.serving.run import DEFAULT_SYSTEM

    if gguf is None and (model == "default" or model in store.MODELS):
        gguf = str(store.source_gguf(store.resolve_key(model)))
    prompts = PROMPTS
    result: dict[str, Any] = {"benchmark": "sampling_defaults", "model": model, "gguf": gguf and Path(gguf).name,
                              "samples_per_prompt": samples, "france_asked": france,
                              "max_tokens": max_tokens, "system": system,
                              "judge": "names one of the prompt's words, has no non-ASCII letter and "
                                       "repeats no 4-word run 3 times",
                              "arms": {}}
    for arm in arms:
        say(f"arm {arm}")
        t0 = time.time()
        close: Callable[[], None] | None = None  # what the arm leaves behind, undone after it
        if arm == "vllm-defaults":
            ask = vllm_arm(model, "auto", {}, max_tokens, system)
            result["server_defaults"] = server_defaults(model, "auto")
        elif arm == "vllm-defaults-eager":
            ask = vllm_arm(model, "auto", {}, max_tokens, system, eager=True)
            close = functools.partial(stop_server, model, "auto")  # the next arm gets `run`'s server
        elif arm == "vllm-defaults-bf16":
            ask = vllm_arm(model, "none", {}, max_tokens, system)
            result["server_defaults_bf16"] = server_defaults(model, "none")
            close = functools.partial(stop_server, model, "none")
        elif arm == "vllm-chat-before":
            ask = vllm_arm(model, "auto", OLD_CHAT, max_tokens, system)
        elif arm == "vllm-generic-system":
            ask = vllm_arm(model, "auto", {}, max_tokens, DEFAULT_SYSTEM)
        elif arm in ("llamacpp-python", "llamacpp-server"):
            if not gguf:
                continue
            ask, llm = llamacpp_arm(Path(gguf), {} if arm == "llamacpp-python" else LLAMACPP_SERVER,
                                    max_tokens, system)
            close = llm.close
        else:
            raise ValueError(f"unknown arm {arm!r}")
        try:
            scored = _score(ask, prompts, samples)
            # the France question alone, as many times as asked
            fr = [ask(FRANCE[0]) for _ in range(france)]
            scored["france"] = {"coherent": sum(coherent(a, FRANCE[1]) for a in fr), "asked": france,
                                "answers": [a[:300] for a in fr]}
        finally:
            if close is not None:
                close()
        scored["seconds"] = round(time.time() - t0, 1)
        result["arms"][arm] = scored
        say(f"  {arm}: coherent {scored['coherent']}/{scored['asked']}, France "
            f"{scored['france']['coherent']}/{france}")
    result["provenance"] = provenance.collect(model=model)
    if out:
        atomic.write_json(out, result)
    return result
