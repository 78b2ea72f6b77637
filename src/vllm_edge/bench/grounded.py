"""`vllm-edge bench grounded`: decode speed on answers that copy from their input, with and
without speculative decoding.

One engine per call (one arm of a grid: a ``--speculative`` method, or llama.cpp on the model's
GGUF, plain or with llama-cpp-python's prompt lookup). Each prompt of
:data:`PROMPTS` is a chat turn whose answer takes much of its text from the prompt (a summary,
fields extracted as JSON, a rewrite, a fixed function, a quotation, a tool call whose arguments
are in the prompt), or, for the ``chat`` category, takes nothing from it: where speculation
cannot help and must not hurt.

Per prompt, greedy, stopping at the model's end of turn (the answer is what a user gets, not a
forced length: past its end a small model repeats itself, which a prompt lookup would find and
flatter): the wall time of the answer minus the wall time of a one-token answer on the same
prompt, so the prefill cancels; decode tok/s is the answer's tokens after the first over that
difference, summed per category. ``batch_tps``: every prompt submitted at once to an engine of
:data:`BATCH` sequences, all generated tokens over the wall time (what speculation costs when
the steps are already wide). vLLM's counters give the proposals made and kept. Each prompt's
greedy tokens are digested, so a grid of both arms shows whether speculation changed an answer.

Prefix caching is off: a repeated prompt would skip its prefill, and the one-token run would
stop cancelling it.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable


BATCH = 4
# llama.cpp on the model's GGUF, plain and with llama-cpp-python's prompt lookup
LLAMACPP_ARMS = ("llamacpp", "llamacpp-lookup")
MAX_TOKENS = 192
REPS = 1  # timed repetitions in one engine; the grid's passes give the spread

_REPORT = ("The city council met on Tuesday to discuss the new bus routes. After two hours of debate, "
           "members voted seven to two to add a night line between the station and the hospital, "
           "starting in March. The line will run every thirty minutes from 11 pm to 5 am. The cost, "
           "about 400,000 euros a year, will be paid from the parking fund. Councillor Ana Ruiz said "
           "the line would help nurses and cleaners who work late shifts.")
_ORDER = ("Order #58213 was placed by Maria Lopez on 12 March 2025. She ordered two blue ceramic "
          "mugs at 9.50 each and one teapot at 24.00. Shipping to 14 Harbour Street, Lisbon, cost "
          "4.90. Payment was made by card.")
_FUNC = ("def average(values):\n"
         "    total = 0\n"
         "    for v in values:\n"
         "        total += v\n"
         "    return total / len(value)\n")
_FUNC2 = ("def count_words(text):\n"
          "    counts = {}\n"
          "    for word in text.split():\n"
          "        counts[word] = counts.get(word, 0) + 1\n"
          "    retrun counts\n")
_POLICY = ("Refunds: items may be returned within 30 days of delivery for a full refund, provided they "
           "are unused and in their original packaging. Sale items can be exchanged but not refunded. "
           "Shipping costs are refunded only when the item arrived damaged.")
_MAIL = ("hey team, just a heads up that the server upgrade is moved to friday at 6pm because the "
         "vendor cant come thursday, please save your work before 5:30 and dont start long jobs "
         "that afternoon, thanks, sam")

# (category, user message). The categories the issue names, two prompts each where the answer
# length allows, and plain chat.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("summarise", "Summarise this news report in three sentences, keeping the numbers:\n\n" + _REPORT),
    ("summarise", "Write a short summary of this policy for a customer:\n\n" + _POLICY),
    ("extract", "Extract the order as JSON with the keys order_id, customer, date, items (name, "
                "quantity, price), address and shipping:\n\n" + _ORDER),
    ("extract", "From this report, give a JSON object with the keys meeting_day, vote, new_line, "
                "start, frequency, hours, cost and quote:\n\n" + _REPORT),
    ("rewrite", "Rewrite this message with correct capitals and punctuation, changing nothing "
                "else:\n\n" + _MAIL),
    ("rewrite", "Rewrite this paragraph in the past tense:\n\n" + _POLICY),
    ("fix_code", "This Python function has a bug. Give the corrected function:\n\n" + _FUNC),
    ("fix_code", "Fix the typo in this Python function and show the whole function:\n\n" + _FUNC2),
    ("quote", "Quote the sentence of this policy that says when shipping is refunded, word for "
              "word:\n\n" + _POLICY),
    ("quote", "What did Councillor Ana Ruiz say? Answer with her words from the report:\n\n" + _REPORT),
    ("tool_call", "Call the function create_event with the arguments from this message, as JSON "
                  '{"name": "create_event", "arguments": {"title": ..., "day": ..., "time": ..., '
                  '"note": ...}}:\n\n' + _MAIL),
    ("tool_call", "Call the function refund_order as JSON {\"name\": \"refund_order\", \"arguments\": "
                  '{"order_id": ..., "customer": ..., "address": ...}} for this order:\n\n' + _ORDER),
    ("chat", "Tell me a short story about a fox who learns to swim."),
    ("chat", "What are three good habits for staying healthy?"),
    ("chat", "Explain why the sky is blue to a ten-year-old."),
    ("chat", "Give me some ideas for a rainy weekend."),
)
GROUNDED = tuple(sorted({c for c, _ in PROMPTS} - {"chat"}))


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def digest(tokens: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def decode_tps(tokens: list[int], t_n: list[float], t_1: list[float]) -> list[float]:
    """Per rep: the answers' tokens after the first over their summed decode time.
    ``tokens[i]`` is prompt i's answer length; ``t_n[r][i]`` / ``t_1[r][i]`` its wall times."""
    out = []
    for long, short in zip(t_n, t_1):
        dt = sum(a - b for a, b in zip(long, short))
        n = sum(max(k - 1, 0) for k in tokens)
        if dt <= 0:
            raise RuntimeError(f"answers of {n} tokens took no longer than one-token answers: "
                               "the timing is not usable")
        out.append(n / dt)
    return out


def chat_ids(tokenizer: Any, prompts: tuple[tuple[str, str], ...] = PROMPTS) -> list[list[int]]:
    """Each prompt as one user turn in the model's chat template, as token ids: every engine
    reads the same sequence."""
    # the template's text, then its ids: apply_chat_template(tokenize=True) returns a mapping in
    # some transformers versions; the template writes its own special tokens
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=False),
                             add_special_tokens=False) for _, text in prompts]


def _timed_answers(answer: Callable[[list[int], int], list[int]], ids: list[list[int]],
                   prompts: tuple[tuple[str, str], ...], reps: int, max_tokens: int,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Each prompt answered in full and to one token, ``reps`` times (see the module's
    docstring): the rates per category and over the grounded ones, and each answer's digest."""
    def timed(p: list[int], n: int) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        toks = answer(p, n)
        return time.perf_counter() - t0, toks

    # one untimed answer first: the engine's first steps pay one-time costs (lazy kernels,
    # allocator growth) that would land on whichever prompt came first
    timed(ids[0], max_tokens)
    answers: list[list[int]] = [[] for _ in prompts]
    t_n: list[list[float]] = []
    t_1: list[list[float]] = []
    for r in range(reps):
        long_r, short_r = [], []
        for i, p in enumerate(ids):
            s, _ = timed(p, 1)
            t, toks = timed(p, max_tokens)
            if r == 0:
                answers[i] = toks
            elif toks != answers[i]:
                raise RuntimeError(f"prompt {i} ({prompts[i][0]}): greedy answer changed between reps")
            short_r.append(s)
            long_r.append(t)
        t_n.append(long_r)
        t_1.append(short_r)
        log(f"rep {r + 1}/{reps} done")

    def rates(keep: Callable[[str], bool]) -> list[float]:
        """Per rep, the decode rate over the prompts whose category ``keep`` takes."""
        idx = [i for i, (c, _) in enumerate(prompts) if keep(c)]
        return decode_tps([len(answers[i]) for i in idx], [[row[i] for i in idx] for row in t_n],
                          [[row[i] for i in idx] for row in t_1])

    per_cat: dict[str, dict[str, Any]] = {}
    for cat in sorted({c for c, _ in prompts}):
        runs = rates(lambda c, cat=cat: c == cat)
        per_cat[cat] = {"tps": _median(runs), "runs": runs,
                        "tokens": sum(len(a) for (c, _), a in zip(prompts, answers) if c == cat)}
    g_runs = rates(lambda c: c != "chat")
    return {
        "grounded_tps": _median(g_runs), "grounded_runs": g_runs,
        "chat_tps": per_cat["chat"]["tps"] if "chat" in per_cat else None,
        "categories": per_cat,
        "answers": [{"category": c, "tokens": len(a), "digest": digest(a)}
                    for (c, _), a in zip(prompts, answers)],
    }


def measure(llm: Any, tokenizer: Any, *, reps: int = REPS, max_tokens: int = MAX_TOKENS,
            prompts: tuple[tuple[str, str], ...] = PROMPTS,
            log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Time every prompt (see the module's docstring) on a started vLLM ``LLM``. ``prompts``:
    (category, user message) pairs, :data:`PROMPTS` unless a test passes fewer."""
    from vllm import SamplingParams

    from vllm_edge.serving.run import spec_decode_counts

    ids = chat_ids(tokenizer, prompts)
    params = {n: SamplingParams(temperature=0.0, max_tokens=n) for n in (1, max_tokens)}

    def answer(p: list[int], n: int) -> list[int]:
        out = llm.generate([{"prompt_token_ids": p}], params[n], use_tqdm=False)[0]
        return list(out.outputs[0].token_ids)

    before = spec_decode_counts(llm.get_metrics()) or {}
    timed = _timed_answers(answer, ids, prompts, reps, max_tokens, log)
    after = spec_decode_counts(llm.get_metrics()) or {}
    counts = {k: after.get(k, 0) - before.get(k, 0) for k in after}

    # every prompt at once, on an engine of BATCH sequences
    batch_runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in ids], params[max_tokens], use_tqdm=False)
        dt = time.perf_counter() - t0
        batch_runs.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
    return {**timed, "batch_tps": _median(batch_runs), "batch_runs": batch_runs,
            "spec_decode": counts or None}


def measure_llamacpp(gen: Any, tokenizer: Any, *, reps: int = REPS, max_tokens: int = MAX_TOKENS,
                     prompts: tuple[tuple[str, str], ...] = PROMPTS,
                     log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The same timings on llama.cpp (a :class:`~vllm_edge.bench.engines.llamacpp_lookup.
    LlamaCppGenerator`), fed the same token ids. No batch figure: llama-cpp-python's generation
    loop decodes one sequence."""
    timed = _timed_answers(gen.answer, chat_ids(tokenizer, prompts), prompts, reps, max_tokens, log)
    return {**timed, "batch_tps": None, "batch_runs": [], "spec_decode": None}


def model_gguf(model: str) -> Path:
    """The GGUF file llama.cpp runs for ``model``: the file itself, or an embedded model's
    shipped GGUF (the file its default build is repacked from)."""
    from vllm_edge.common.errors import UsageError
    from vllm_edge.models import store

    if store.is_gguf(model):
        return Path(model).expanduser().resolve()
    try:
        key = store.resolve_key(model)
    except store.ModelNotAvailable:
        raise UsageError(f"--model {model}: the llama.cpp arms need a GGUF file or an embedded "
                         "model (one ships its GGUF)") from None
    return store.source_gguf(key)


def run_llamacpp(model: str = "default", arm: str = "llamacpp", *, reps: int = REPS,
                 max_tokens: int = MAX_TOKENS,
                 log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """The llama.cpp arms on ``model``'s GGUF: ``llamacpp`` (plain) or ``llamacpp-lookup``."""
    from transformers import AutoTokenizer

    from vllm_edge.bench.engines.llamacpp_lookup import LlamaCppGenerator
    from vllm_edge.common import provenance
    from vllm_edge.common.procmem import TreeSampler
    from vllm_edge.runtime import weight_path

    gguf = model_gguf(model)
    path, _ = weight_path.model_for_engine(model)  # its tokenizer and template, as vLLM reads them
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    with TreeSampler(interval=0.5) as mem:
        t0 = time.perf_counter()
        gen = LlamaCppGenerator(gguf, lookup=arm == "llamacpp-lookup")
        load_s = time.perf_counter() - t0
        prov = provenance.collect(model=gguf)  # llama.cpp loaded: its build is recorded
        log(f"[grounded] llama.cpp ready in {load_s:.1f} s ({gguf.name}, {arm})")
        try:
            measured = measure_llamacpp(gen, tokenizer, reps=reps, max_tokens=max_tokens,
                                        log=lambda s: log(f"[grounded] {s}"))
        finally:
            gen.close()
    return {"benchmark": "grounded", "model": str(gguf), "speculative": arm,
            "speculative_config": gen.settings(), "reps": reps, "max_tokens": max_tokens,
            "batch": None, "enforce_eager": None, "load_s": round(load_s, 2),
            "peak_rss_anon_mb": round(mem.peak_mb, 1), **measured, "provenance": prov}


def run(model: str = "default", speculative: str = "off", *, reps: int = REPS,
        max_tokens: int = MAX_TOKENS, enforce_eager: bool = False, out: str | Path | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Start one engine with ``speculative`` and measure it; the result (written to ``out``).
    ``speculative`` may also name a llama.cpp arm (:data:`LLAMACPP_ARMS`)."""
    from vllm_edge.common import atomic

    if speculative in LLAMACPP_ARMS:
        result = run_llamacpp(model, speculative, reps=reps, max_tokens=max_tokens, log=log)
    else:
        result = _run_vllm(model, speculative, reps=reps, max_tokens=max_tokens,
                           enforce_eager=enforce_eager, log=log)
    if out:
        atomic.write_json(out, result)
    return result


def _run_vllm(model: str, speculative: str, *, reps: int, max_tokens: int, enforce_eager: bool,
              log: Callable[[str], None]) -> dict:
    from vllm_edge.bench import WORKER_EXTENSION
    from vllm_edge.common import provenance
    from vllm_edge.common.procmem import TreeSampler
    from vllm_edge.runtime import weight_path
    from vllm_edge.runtime.engine import edge_engine

    path, _ = weight_path.model_for_engine(model)  # the build `run` and `serve` load
    path = Path(path)
    prov = provenance.collect(model=path)  # before the run: a tree edited meanwhile is not this run's
    edge = edge_engine(path, max_model_len=1024, max_num_seqs=BATCH, enforce_eager=enforce_eager,
                       enable_prefix_caching=False, worker_extension=WORKER_EXTENSION,
                       max_num_batched_tokens=512, speculative=speculative)
    edge.apply_env()  # before vLLM is imported
    with TreeSampler(interval=0.5) as mem:
        t0 = time.perf_counter()
        from vllm import LLM

        llm = LLM(**edge.kwargs, disable_log_stats=False)
        load_s = time.perf_counter() - t0
        log(f"[grounded] engine ready in {load_s:.1f} s ({path.name}, speculative {speculative})")
        measured = measure(llm, llm.get_tokenizer(), reps=reps, max_tokens=max_tokens,
                           log=lambda s: log(f"[grounded] {s}"))
    del llm
    return {"benchmark": "grounded", "model": str(path), "speculative": speculative,
            "speculative_config": edge.kwargs.get("speculative_config"),
            "reps": reps, "max_tokens": max_tokens, "batch": BATCH,
            "enforce_eager": enforce_eager, "load_s": round(load_s, 2),
            "peak_rss_anon_mb": round(mem.peak_mb, 1), **measured, "provenance": prov}


def metric_line(result: dict) -> dict:
    """The JSON object a grid arm prints: the speeds, acceptance and each answer's digest."""
    spec = result.get("spec_decode") or {}
    line = {"grounded_tps": result["grounded_tps"], "chat_tps": result["chat_tps"],
            "batch_tps": result["batch_tps"], "load_s": result["load_s"],
            "peak_rss_anon_mb": result["peak_rss_anon_mb"],
            **{f"{c}_tps": v["tps"] for c, v in result["categories"].items()}}
    if line["batch_tps"] is None:  # a llama.cpp arm: one sequence at a time
        del line["batch_tps"]
    if spec.get("draft_tokens"):
        line["accepted_share"] = spec["accepted_tokens"] / spec["draft_tokens"]
    line["digests"] = [a["digest"] for a in result["answers"]]
    return line


def same_answers(records: list[dict], arms: tuple[str, str]) -> dict[str, Any]:
    """Whether two arms of a grid gave the same greedy answers, prompt by prompt (the first
    successful run of each; a run checks its own reps agree)."""
    first: dict[str, list[str]] = {}
    for rec in records:
        if rec.get("ok") and rec["arm"] in arms and rec["arm"] not in first:
            first[rec["arm"]] = rec["output"]["digests"]
    if len(first) < 2:
        return {"compared": 0}
    a, b = (first[x] for x in arms)
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return {"compared": len(a), "identical": len(a) - len(differ),
            "differ": [{"prompt": i, "category": PROMPTS[i][0]} for i in differ]}
