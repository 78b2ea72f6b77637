"""A chat callable on llama.cpp (llama-cpp-python), in this process: the agent loop's llama.cpp
engine and ``bench constrained``'s llama.cpp target.

Same contract (:mod:`vllm_edge.bench.engines.chat`) as :func:`vllm_edge.agent.client.openai_chat`,
so the loop and the suite are the same code for both engines. Each piece mirrors what
``vllm-edge serve`` makes vLLM do:

- the prompt: the chat template serve would pick for the model (for SmolLM2,
  ``data/smollm2_tools.jinja``), rendered by transformers' Jinja renderer, the one vLLM uses,
  with the tools passed to the template and assistant call arguments parsed to objects first;
- the constraint: vLLM 0.32 constrains its ``hermes`` parser through a structural tag, not a
  JSON array. ``required`` is one or more ``<tool_call>\\n{"name": "NAME", "arguments": ARGS}
  \\n</tool_call>`` blocks (or the same without the two newlines), ARGS held to the tool's
  parameters schema. ``auto`` at serve's strict level ``parameter`` is free text, but a
  ``<tool_call>`` the model opens must be such a block. Here both are a GBNF grammar, the
  argument rules from llama-cpp-python's JSON-schema converter;
- the decoding: greedy (temperature 0) with a grammar checks the argmax first and masks the
  whole vocabulary only when the grammar rejects it, as llama.cpp's own sampler does;
  ``create_completion`` masks every step first, which cost 200 ms a token inside a long string
  argument here. Other temperatures go through ``create_completion``;
- the reply: read as vLLM's hermes parser reads it (with the ``hermes_json_end`` patch): every
  block must parse, else no ``tool_calls`` and the whole text is the content.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from vllm_edge.bench.engines.chat import TOOL_CHOICES, ContextOverflow

START, END, NL = "<tool_call>", "</tool_call>", "\n"
# JSON forbids raw control characters in strings; the converter's own rule lets them through,
# and a call holding one would not parse.
_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _cls(chars: list[str]) -> str:
    return "".join("\\" + c if c in "\\]^-[" else c for c in chars)


def _free_text_rules(word: str, name: str) -> dict[str, str]:
    """``name-0``: any text that never contains ``word``, one rule per matched prefix length
    (a KMP automaton; every state may end)."""
    rules = {}
    for i in range(len(word)):
        moves: dict[int, list[str]] = {}
        for c in sorted(set(word)):
            seen = word[:i] + c
            j = next(k for k in range(min(len(seen), len(word)), -1, -1) if seen.endswith(word[:k]))
            if j < len(word):
                moves.setdefault(j, []).append(c)
        # characters that lead back to state 0 join the "any other character" class
        other = [c for c in sorted(set(word)) if c not in moves.get(0, [])]
        alts = []
        for j, cs in moves.items():
            if j:
                atom = _lit(cs[0]) if len(cs) == 1 else f"[{_cls(cs)}]"
                alts.append(f"{atom} {name}-{j}")
        alts.append(f"[^{_cls(other)}] {name}-0")
        rules[f"{name}-{i}"] = "( " + " | ".join(alts) + " )?"
    return rules


def tool_grammar(tools: list[dict], tool_choice: str) -> str:
    """GBNF for replies under ``tool_choice`` (see the module doc)."""
    from llama_cpp.llama_grammar import SchemaConverter

    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")
    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alts = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool)
        params = copy.deepcopy(fn.get("parameters") or {})  # none: any JSON value, as vLLM
        args = conv.visit(conv.resolve_refs(params, f"tool{i}"), f"tool{i}-args")
        alts.append(_lit(fn["name"] + '", "arguments": ') + " " + args)
    if not alts:
        raise ValueError("no tools to constrain the reply to")
    rules = dict(conv._rules)
    if "char" in rules:
        rules["char"] = _CHAR
    # the common prefix written once: fewer parse stacks for llama.cpp to follow per token
    rules["call-body"] = _lit('{"name": "') + " ( " + " | ".join(alts) + " )"
    rules["call"] = (f"{_lit(START)} ( {_lit(NL)} call-body {_lit('}' + NL + END)} "
                     f"| call-body {_lit('}' + END)} )")
    if tool_choice == "required":
        rules["root"] = "call+"
    else:
        rules.update(_free_text_rules(START, "text"))
        rules["root"] = "text-0 ( call text-0 )*"
    return "\n".join(f"{name} ::= {rule}" for name, rule in sorted(rules.items()))


def parse_reply(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) as vLLM's hermes parser returns them for ``text``."""
    from vllm_edge.patches.hermes_json_end import call_regions

    if START not in text:
        return text, []
    calls = []
    try:
        for body, _closed in call_regions(text, START, END):
            obj = json.loads(body)
            calls.append({"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)})
    except (ValueError, KeyError, TypeError):
        return text, []
    return text[: text.find(START)] or None, calls


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as vLLM hands them to the template: call arguments as objects (unparseable
    ones as {}), an empty ``tool_calls`` dropped. The caller's messages are not changed."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("role") != "assistant" or "tool_calls" not in m:
            continue
        if not m["tool_calls"]:
            m.pop("tool_calls")
            continue
        for tc in m["tool_calls"]:
            fn = tc.get("function") or {}
            raw = fn.get("arguments")
            if isinstance(raw, str):
                try:
                    fn["arguments"] = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    fn["arguments"] = {}
            elif not raw:
                fn["arguments"] = {}
    return out


def choose_template(metadata: dict[str, str], chat_template: str | os.PathLike | None) -> tuple[str, str]:
    """(template text, where it came from): the given file; else the one serve ships for this
    model; else the GGUF's own, when it writes hermes calls."""
    from vllm_edge.serving.serve import HERMES_MARKER, TOOL_TEMPLATES

    if chat_template:
        return Path(chat_template).read_text(), str(chat_template)
    key = f"{metadata.get('general.basename', '')}-{metadata.get('general.size_label', '')}".lower()
    if key in TOOL_TEMPLATES:
        return TOOL_TEMPLATES[key].read_text(), str(TOOL_TEMPLATES[key])
    own = metadata.get("tokenizer.chat_template")
    if own and HERMES_MARKER in own:
        return own, "gguf:tokenizer.chat_template"
    raise ValueError(f"no tool-call chat template known for this GGUF ({key or 'unnamed'}): its own "
                     f"template does not write {HERMES_MARKER} calls; give one with --chat-template")


def render(template: str, messages: list[dict], tools: list[dict]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([template_messages(messages)], tools=tools or None,
                                        chat_template=template, add_generation_prompt=True)
    return rendered[0]


class LlamaCppChat:
    """``chat(messages, tools) -> assistant message dict`` on one loaded GGUF."""

    def __init__(self, model_path: str | os.PathLike, *, temperature: float = 0.0, max_tokens: int = 256,
                 seed: int | None = None, tool_choice: str = "auto", n_ctx: int = 2048,
                 n_threads: int | None = None, chat_template: str | os.PathLike | None = None):
        import llama_cpp

        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")
        self.path = Path(model_path)
        if not self.path.is_file():
            raise ValueError(f"{self.path}: no such GGUF file")
        self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed
        self.tool_choice, self.n_ctx = tool_choice, n_ctx
        self.n_threads = n_threads or len(os.sched_getaffinity(0))
        self.llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=self.n_threads,
                                   n_threads_batch=self.n_threads, verbose=False)
        try:
            self.template, self.template_source = choose_template(self.llm.metadata, chat_template)
        except BaseException:
            self.llm.close()
            raise
        self._grammars: dict[str, tuple[str, Any]] = {}  # tools -> (GBNF, its LlamaGrammar)
        self.grammar_s: float | None = None  # first grammar: GBNF built and parsed by llama.cpp
        self._calls = 0

    def describe(self) -> dict[str, Any]:
        import llama_cpp

        from vllm_edge.models.gguf_import import sha256_file

        return {"engine": "llamacpp", "gguf": str(self.path), "gguf_sha256": sha256_file(self.path),
                "llama_cpp_version": llama_cpp.__version__, "n_threads": self.n_threads,
                "n_ctx": self.n_ctx, "tool_choice": self.tool_choice,
                "chat_template": self.template_source, "grammar_s": self.grammar_s}

    def _grammar(self, tools: list[dict]) -> tuple[str, Any]:
        import llama_cpp

        key = json.dumps(tools, sort_keys=True)
        if key not in self._grammars:
            t = time.perf_counter()
            text = tool_grammar(tools, self.tool_choice)
            # an unparseable grammar would crash the sampler; llama.cpp returns NULL for it here
            vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
            probe = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
            if not probe:
                raise ValueError("llama.cpp rejected the tool grammar")
            llama_cpp.llama_sampler_free(probe)
            self._grammars[key] = (text, llama_cpp.LlamaGrammar.from_string(text, verbose=False))
            if self.grammar_s is None:
                self.grammar_s = round(time.perf_counter() - t, 4)
        return self._grammars[key]

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict[str, Any]:
        text = render(self.template, messages, tools)
        prompt = self.llm.tokenize(text.encode(), add_bos=False, special=True)
        if len(prompt) + self.max_tokens > self.n_ctx:
            raise ContextOverflow(f"This model's maximum context length is {self.n_ctx} tokens; the prompt "
                                  f"has {len(prompt)} and max_tokens is {self.max_tokens}")
        gbnf, grammar = self._grammar(tools) if tools else (None, None)
        if gbnf is not None and self.temperature == 0:
            text, finish = self._greedy(prompt, gbnf)
        else:
            # OpenAI's (and vLLM's) sampling defaults: no top-k, top-p or min-p cut; no seed, a fresh one
            seed = self.seed if self.seed is not None else random.getrandbits(32)
            out = self.llm.create_completion(prompt, max_tokens=self.max_tokens, temperature=self.temperature,
                                             top_k=0, top_p=1.0, min_p=0.0, seed=seed, grammar=grammar)
            choice = out["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
        content, calls = parse_reply(text) if tools else (text, [])
        msg: dict[str, Any] = {"role": "assistant", "content": content, "finish_reason": finish}
        if calls:
            msg["finish_reason"] = "tool_calls"
            msg["tool_calls"] = []
            for c in calls:
                self._calls += 1
                msg["tool_calls"].append({"id": f"call_{self._calls}", "type": "function", "function": c})
        elif self.tool_choice == "required" and finish == "stop":
            msg["finish_reason"] = "tool_calls"  # as vLLM reports a finished required reply
        return msg

    def _greedy(self, prompt: list[int], grammar: str) -> tuple[str, str]:
        """Greedy decoding under ``grammar`` the way llama.cpp's own sampler checks a grammar
        (the argmax first, the whole vocabulary only when it is rejected), reusing the cached
        prefix of the previous turn as ``create_completion`` does."""
        from vllm_edge.bench.engines.llamacpp import GrammarGreedy, decode_until_eog

        llm = self.llm
        keep = 0
        for a, b in zip(llm.input_ids[: llm.n_tokens], prompt[:-1]):
            if a != b:
                break
            keep += 1
        llm.n_tokens = keep  # eval drops the cache past it
        llm.eval(prompt[keep:])
        picker = GrammarGreedy(llm.model, grammar)
        try:
            out, finish, _ = decode_until_eog(llm, self.max_tokens, picker)
        finally:
            picker.close()
        return llm.detokenize(out).decode("utf-8", errors="replace"), finish

    def close(self) -> None:
        self.llm.close()


def llamacpp_chat(model_path: str | os.PathLike, *, temperature: float = 0.0, max_tokens: int = 256,
                  seed: int | None = None, tool_choice: str = "auto", n_ctx: int = 2048,
                  n_threads: int | None = None,
                  chat_template: str | os.PathLike | None = None) -> LlamaCppChat:
    """Load ``model_path`` (a GGUF) once and return its chat callable (see :class:`LlamaCppChat`);
    ``close()`` it when done."""
    return LlamaCppChat(model_path, temperature=temperature, max_tokens=max_tokens, seed=seed,
                        tool_choice=tool_choice, n_ctx=n_ctx, n_threads=n_threads,
                        chat_template=chat_template)
