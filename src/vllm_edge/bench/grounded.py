"""`vllm-edge bench grounded`: decode speed on answers that copy from their input, with and
without speculative decoding.

One engine per call (one arm of a grid: ``--speculative off`` or ``ngram``). Each prompt of
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


def measure(llm: Any, tokenizer: Any, *, reps: int = REPS, max_tokens: int = MAX_TOKENS,
            prompts: tuple[tuple[str, str], ...] = PROMPTS,
            log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Time every prompt (see the module's docstring) on a started vLLM ``LLM``. ``prompts``:
    (category, user message) pairs, :data:`PROMPTS` unless a test passes fewer."""
    from vllm import SamplingParams

    from vllm_edge.serving.run import spec_decode_counts

    # the template's text, then its ids: apply_chat_template(tokenize=True) returns a mapping in
    # some transformers versions; the template writes its own special tokens
    ids = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False) for _, text in prompts]
    one = SamplingParams(temperature=0.0, max_tokens=1)
    full = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def timed(p: list[int], sp) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        return time.perf_counter() - t0, list(out.outputs[0].token_ids)

    # one untimed answer first: the engine's first steps pay one-time costs (lazy kernels,
    # allocator growth) that would land on whichever prompt came first
    timed(ids[0], full)
    before = spec_decode_counts(llm.get_metrics()) or {}
    answers: list[list[int]] = [[] for _ in prompts]
    t_n: list[list[float]] = []
    t_1: list[list[float]] = []
    for r in range(reps):
        long_r, short_r = [], []
        for i, p in enumerate(ids):
            s, _ = timed(p, one)
            t, toks = timed(p, full)
            if r == 0:
                answers[i] = toks
            elif toks != answers[i]:
                raise RuntimeError(f"prompt {i} ({prompts[i][0]}): greedy answer changed between reps")
            short_r.append(s)
            long_r.append(t)
        t_n.append(long_r)
        t_1.append(short_r)
        log(f"rep {r + 1}/{reps} done")
    after = spec_decode_counts(llm.get_metrics()) or {}
    counts = {k: after.get(k, 0) - before.get(k, 0) for k in after}

    def rates(keep: Callable[[str], bool]) -> tuple[list[float], int]:
        """Per rep, the decode rate over the prompts whose category ``keep`` takes; their tokens."""
        idx = [i for i, (c, _) in enumerate(prompts) if keep(c)]
        return (decode_tps([len(answers[i]) for i in idx], [[row[i] for i in idx] for row in t_n],
                           [[row[i] for i in idx] for row in t_1]),
                sum(len(answers[i]) for i in idx))

    per_cat: dict[str, dict[str, Any]] = {}
    for cat in sorted({c for c, _ in prompts}):
        runs, tokens = rates(lambda c, cat=cat: c == cat)
        per_cat[cat] = {"tps": _median(runs), "runs": runs, "tokens": tokens}
    g_runs, _ = rates(lambda c: c != "chat")

    # every prompt at once, on an engine of BATCH sequences
    batch_runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in ids], full, use_tqdm=False)
        dt = time.perf_counter() - t0
        batch_runs.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
    return {
        "grounded_tps": _median(g_runs), "grounded_runs": g_runs,
        "chat_tps": per_cat["chat"]["tps"] if "chat" in per_cat else None,
        "batch_tps": _median(batch_runs), "batch_runs": batch_runs,
        "categories": per_cat,
        "spec_decode": counts or None,
        "answers": [{"category": c, "tokens": len(a), "digest": digest(a)}
                    for (c, _), a in zip(prompts, answers)],
    }


def run(model: str = "default", speculative: str = "off", *, reps: int = REPS,
        max_tokens: int = MAX_TOKENS, enforce_eager: bool = False, out: str | Path | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Start one engine with ``speculative`` and measure it; the result (written to ``out``)."""
    from vllm_edge.bench import WORKER_EXTENSION
    from vllm_edge.common import atomic, provenance
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
    result = {"benchmark": "grounded", "model": str(path), "speculative": speculative,
              "speculative_config": edge.kwargs.get("speculative_config"),
              "reps": reps, "max_tokens": max_tokens, "batch": BATCH,
              "enforce_eager": enforce_eager, "load_s": round(load_s, 2),
              "peak_rss_anon_mb": round(mem.peak_mb, 1), **measured, "provenance": prov}
    if out:
        atomic.write_json(out, result)
    return result


def metric_line(result: dict) -> dict:
    """The JSON object a grid arm prints: the speeds, acceptance and each answer's digest."""
    spec = result.get("spec_decode") or {}
    line = {"grounded_tps": result["grounded_tps"], "chat_tps": result["chat_tps"],
            "batch_tps": result["batch_tps"], "load_s": result["load_s"],
            "peak_rss_anon_mb": result["peak_rss_anon_mb"],
            **{f"{c}_tps": v["tps"] for c, v in result["categories"].items()}}
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
