"""The fixed fidelity prompt set and the teacher-forced corpus (docs/design/fidelity.md).

Everything here is built from text that ships with CPython (``pydoc_data.topics``),
so a reference saved on one machine can be compared on another without a
download. The corpus differs between Python versions: :func:`corpus_id` goes
into every reference and a comparison refuses a mismatch.
"""

from __future__ import annotations

import hashlib
import platform
from typing import Callable, Sequence

# At least this many whitespace-separated words per long-context document. Byte-level
# BPE tokenizers split on whitespace first, so words are a lower bound on tokens.
LONG_CONTEXT_WORDS = 1550

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"},
            "from_currency": {"type": "string", "description": "ISO 4217 code"},
            "to_currency": {"type": "string", "description": "ISO 4217 code"}},
            "required": ["amount", "from_currency", "to_currency"]}}},
    {"type": "function", "function": {
        "name": "search_files",
        "description": "Find files under a directory whose name matches a glob pattern.",
        "parameters": {"type": "object", "properties": {
            "directory": {"type": "string"},
            "pattern": {"type": "string", "description": "Glob, e.g. *.py"}},
            "required": ["directory", "pattern"]}}},
    {"type": "function", "function": {
        "name": "create_calendar_event",
        "description": "Create a calendar event.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"},
            "date": {"type": "string", "description": "YYYY-MM-DD"},
            "time": {"type": "string", "description": "HH:MM, 24-hour"},
            "duration_minutes": {"type": "integer"}},
            "required": ["title", "date", "time"]}}},
]

SYSTEM = "You are a helpful assistant. Answer concisely."


def tool_system() -> str:
    """Tools are spelled out in the system message, not left to the chat template:
    some templates drop ``tools`` silently, and then the model never sees them."""
    import json

    return ("You are a helpful assistant with access to these tools (OpenAI function format):\n"
            + json.dumps(TOOLS, indent=1)
            + "\nWhen a tool can answer, reply with only a tool call: "
              '<tool_call>{"name": ..., "arguments": {...}}</tool_call>')

_CHAT = [
    ("chat-capital", "What is the capital of France, and what river runs through it?"),
    ("chat-explain", "Explain in three sentences why the sky is blue."),
    ("chat-code", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    ("chat-list", "List five tips for writing clear technical documentation."),
]

# (id, pydoc topics concatenated in this order, question about them)
_LONG = [
    ("long-scoping", ("execmodel", "naming", "global", "nonlocal"),
     "Using only the documentation above, explain how Python resolves a free variable "
     "inside a nested function."),
    ("long-exceptions", ("exceptions", "try", "raise", "with"),
     "Using only the documentation above, what happens when an exception is raised inside "
     "a finally clause?"),
    ("long-import", ("import", "function", "class"),
     "Using only the documentation above, list the steps of an import statement."),
    ("long-format", ("formatstrings", "strings"),
     "Using only the documentation above, what does the format specification '>10.3f' do?"),
]

_TOOL = [
    ("tool-weather", "What's the weather like in Lisbon right now, in celsius?"),
    ("tool-currency", "How much is 250 US dollars in euros?"),
    ("tool-files", "Find all the YAML files in /etc/myapp."),
    ("tool-calendar", "Put a 30 minute meeting called 'Design review' on 2025-03-14 at 15:00."),
]


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return topics


def long_document(keys: Sequence[str], min_words: int = LONG_CONTEXT_WORDS) -> str:
    """The named topics in order (then the rest, sorted, if short), cut at the first
    line end after ``min_words`` words."""
    topics = _topics()
    order = [k for k in keys if k in topics] + [k for k in sorted(topics) if k not in keys]
    lines: list[str] = []
    words = 0
    for k in order:
        for line in topics[k].splitlines():
            lines.append(line)
            words += len(line.split())
            if words >= min_words:
                return "\n".join(lines).strip() + "\n"
        lines.append("")
    raise ValueError("pydoc_data.topics is shorter than the requested document")


def fidelity_prompts() -> list[dict]:
    """The 12 prompts: 4 chat, 4 long-context, 4 tool-call. Each has ``id``, ``kind``,
    ``messages`` (OpenAI chat format) and ``tools``. Tool prompts already carry the tools
    in their system message; ``tools`` is there for OpenAI-API clients and should not
    also be handed to the chat template."""
    out: list[dict] = []
    for pid, text in _CHAT:
        out.append({"id": pid, "kind": "chat", "tools": None, "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]})
    for pid, keys, question in _LONG:
        doc = long_document(keys)
        out.append({"id": pid, "kind": "long", "tools": None, "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Documentation:\n\n{doc}\n{question}"}]})
    for pid, text in _TOOL:
        out.append({"id": pid, "kind": "tool", "tools": TOOLS, "messages": [
            {"role": "system", "content": tool_system()}, {"role": "user", "content": text}]})
    return out


def select_fidelity_prompts(ids: Sequence[str] | None) -> list[dict]:
    """The fidelity prompts named by ``ids``, in their own order (None: all 12); an unknown id
    is refused with the known ones."""
    ps = fidelity_prompts()
    if ids is None:
        return ps
    known = [p["id"] for p in ps]
    unknown = sorted(set(ids) - set(known))
    if unknown or not ids:
        raise ValueError(f"unknown fidelity prompt ids {unknown or '(none given)'}; known: {', '.join(known)}")
    return [p for p in ps if p["id"] in ids]


# --- teacher-forced corpus ----------------------------------------------------

def corpus_text() -> str:
    topics = _topics()
    return "\n\n".join(topics[k].strip() for k in sorted(topics)) + "\n"


def corpus_id() -> dict:
    """Identifies the corpus text: it changes with the Python version."""
    text = corpus_text()
    return {"source": "pydoc_data.topics", "python": platform.python_version(),
            "sha256": hashlib.sha256(text.encode()).hexdigest(), "chars": len(text)}


def corpus_chunks(tokenize: Callable[[str], list[int]], chunk_len: int = 512,
                  max_chunks: int | None = None, text: str | None = None) -> list[list[int]]:
    """Tokenize the corpus once and cut it into non-overlapping chunks of
    ``chunk_len`` tokens (the short remainder is dropped), like llama-perplexity."""
    if chunk_len < 2:
        raise ValueError("chunk_len must be at least 2")
    ids = list(tokenize(corpus_text() if text is None else text))
    n = len(ids) // chunk_len
    if max_chunks is not None:
        n = min(n, max_chunks)
    return [ids[i * chunk_len:(i + 1) * chunk_len] for i in range(n)]


def scored_range(chunk_len: int) -> range:
    """Positions whose next-token prediction is scored: the second half of the
    chunk, as llama-perplexity does, so every scored token has at least
    chunk_len/2 tokens of context. Position t predicts token t+1."""
    return range(chunk_len // 2, chunk_len - 1)
