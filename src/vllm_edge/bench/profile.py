"""`vllm-edge bench profile`: where one prefill and one decode spend their time, by op.

One engine in edge mode (one process: the model runs in this process, so torch.profiler
sees its ops), eager (so every op is its own event), built and fed exactly as
``bench speed`` does (:func:`speed.engine_for`, :func:`speed.corpus_source`). After a
warm-up it profiles, with CPU activities only:

* ``prefill``: one ``generate`` of an N-token prompt with ``max_tokens=1`` (llama-bench's
  pp: the prefill, the head on the last position, one sampled token);
* ``decode``: the M decode steps of a request on a ``TG_PROMPT_LEN``-token prompt, driven
  step by step through the engine, so its prefill step runs before the profiler starts.

Attribution. Before profiling, the worker extension marks model modules with profiler
ranges (``edge_profile/<group>``: linear layers, attention and rotary, norms,
activations, the embedding and the logits processor, vLLM's sampler). An op's group is
the innermost mark around it, or, outside every mark, a rule on its name. So a GEMM
inside the logits processor counts as the head, not as a linear, and the fp32 casts of a
norm count as the norm. Shares are of the phase's wall time; ``untraced`` is the wall
time no op covers (Python, the scheduler, detokenisation).

Times under contention stretch every op, so compare shares between runs, not milliseconds.
Eager mode runs norms and activations as separate aten ops; the compiled graph that
``bench speed`` uses by default fuses them, so their shares here are upper bounds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from vllm_edge.bench import speed
from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.groups import DEFAULT_GROUP

MARK_PREFIX = "edge_profile/"
GROUPS = ("linear", "attention", "norm", "activation", "embed_head", "sampling", "other")
UNTRACED = "untraced"
GROUP_HELP = {
    "linear": "linear layers: GEMMs, the cpu_int4 op, its dequantization and tinygemm",
    "attention": "attention, KV-cache writes, rotary embedding",
    "norm": "RMSNorm / LayerNorm (with the fused residual add)",
    "activation": "SiluAndMul and other activations",
    "embed_head": "token embedding, the head and the logits processor",
    "sampling": "vLLM's sampler",
    "other": "ops outside the model's marked modules (input preparation, copies)",
    UNTRACED: "wall time no op covers: Python, scheduling, detokenisation",
}
# For ops outside every mark (or a model whose modules were not marked): first match wins.
NAME_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("attention", "attn", "reshape_and_cache", "rotary")),
    ("embed_head", ("int4_embedding", "aten::embedding", "logits")),
    ("linear", ("int4_linear", "int4_dequant", "int4_gemv", "int4_product", "int4pack_mm", "onednn_mm",
                "weight_packed_linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")),
    ("norm", ("rms_norm", "layer_norm")),
    ("activation", ("silu", "gelu", "and_mul")),
    ("sampling", ("sample", "argmax", "topk", "top_k", "top_p")),
)


class ProfileError(EdgeError, RuntimeError):
    """The profile could not be taken or does not show what it should."""


@dataclass
class ProfileConfig:
    model: str = "default"
    quant: str | None = None
    group: int = DEFAULT_GROUP
    dtype: str = "bfloat16"
    prompt_len: int = 512
    decode_tokens: int = 32
    top: int = 15
    warmup: int = 1
    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    max_model_len: int | None = None

    def speed_config(self) -> speed.SpeedConfig:
        """The same run as ``bench speed`` would start: eager, prefix caching off."""
        return speed.SpeedConfig(model=self.model, quant=self.quant, group=self.group,
                                 dtype=self.dtype, prompt_len=self.prompt_len,
                                 tg_tokens=self.decode_tokens + 1, reps=1, threads=self.threads,
                                 cpus=self.cpus, enforce_eager=True,
                                 max_model_len=self.max_model_len, bandwidth="off")


def validate(cfg: ProfileConfig) -> None:
    if cfg.prompt_len < 1:
        raise speed.SpeedArgError("--prompt-len must be at least 1")
    if cfg.decode_tokens < 1:
        raise speed.SpeedArgError("--decode-tokens must be at least 1")
    if cfg.top < 1:
        raise speed.SpeedArgError("--top must be at least 1")
    if cfg.warmup < 0:
        raise speed.SpeedArgError("--warmup must be at least 0")


# --- module marks (run inside the worker, through the worker extension) ---------------

def module_group(module: Any) -> str | None:
    """The group a model module's forward belongs to, or None to leave it unmarked."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    name = type(module).__name__
    if isinstance(module, LinearBase):
        return "linear"
    if isinstance(module, (VocabParallelEmbedding, LogitsProcessor)):
        return "embed_head"
    if "Norm" in name:
        return "norm"
    if "Rotary" in name or "Attention" == name or name.endswith("AttentionLayer"):
        return "attention"
    if type(module).__module__.startswith("vllm.model_executor.layers.activation"):
        return "activation"
    if name == "Sampler":
        return "sampling"
    return None


def install_marks(modules: Iterable[Any]) -> tuple[list[Any], dict[str, int]]:
    """Forward pre/post hooks that open and close an ``edge_profile/<group>`` profiler
    range around each module of a known group. Returns the hook handles (remove them to
    undo) and how many modules each group got."""
    from torch.autograd.profiler import record_function

    handles: list[Any] = []
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for mod in modules:
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        group = module_group(mod)
        if group is None:
            continue
        stack: list[Any] = []

        def pre(_m, _args, _stack=stack, _name=MARK_PREFIX + group):
            rf = record_function(_name)
            rf.__enter__()
            _stack.append(rf)

        def post(_m, _args, _out, _stack=stack):
            if _stack:
                _stack.pop().__exit__(None, None, None)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
        counts[group] = counts.get(group, 0) + 1
    return handles, counts


# --- attribution --------------------------------------------------------------------

def name_group(name: str) -> str:
    low = name.lower()
    for group, needles in NAME_RULES:
        if any(n in low for n in needles):
            return group
    return "other"


def event_group(event: Any) -> str:
    """The innermost mark around (or on) the event, else the rule on its own name."""
    node = event
    while node is not None:
        if node.name.startswith(MARK_PREFIX):
            return node.name[len(MARK_PREFIX):]
        node = node.cpu_parent
    return name_group(event.name)


def summarize_events(events: Iterable[Any], wall_s: float, top: int) -> dict:
    """Self CPU time per op name and per group, as ms and % of the phase's wall time.

    ``events`` are torch.profiler FunctionEvents (``name``, ``self_cpu_time_total`` in
    µs, ``cpu_parent``, ``thread``); only the main thread's count toward the wall time
    (the model runs there; another thread's ops would overlap it)."""
    events = list(events)
    if wall_s <= 0:
        raise ProfileError(f"non-positive phase wall time {wall_s}")
    threads: dict[int, float] = {}
    for e in events:
        threads[e.thread] = threads.get(e.thread, 0.0) + e.self_cpu_time_total
    main = max(threads, key=threads.get) if threads else None
    wall_ms = wall_s * 1e3
    ops: dict[str, dict] = {}
    groups: dict[str, dict] = {g: {"self_ms": 0.0, "ops": {}} for g in GROUPS}
    traced_ms = 0.0
    marks = 0
    for e in events:
        if e.thread != main:
            continue
        ms = e.self_cpu_time_total / 1e3
        traced_ms += ms
        if e.name.startswith(MARK_PREFIX):
            marks += 1
        g = event_group(e)
        g = g if g in groups else "other"
        row = ops.setdefault(e.name, {"name": e.name, "calls": 0, "self_ms": 0.0, "groups": {}})
        row["calls"] += 1
        row["self_ms"] += ms
        row["groups"][g] = row["groups"].get(g, 0.0) + ms
        groups[g]["self_ms"] += ms
        groups[g]["ops"][e.name] = groups[g]["ops"].get(e.name, 0.0) + ms
    untraced = max(0.0, wall_ms - traced_ms)
    out_groups: dict[str, dict] = {}
    for g, v in groups.items():
        detail = sorted(v["ops"].items(), key=lambda kv: -kv[1])
        out_groups[g] = {"self_ms": round(v["self_ms"], 3), "pct": round(100 * v["self_ms"] / wall_ms, 2),
                         "top_ops": [{"name": n, "self_ms": round(ms, 3)} for n, ms in detail[:5]]}
    out_groups[UNTRACED] = {"self_ms": round(untraced, 3), "pct": round(100 * untraced / wall_ms, 2),
                            "top_ops": []}
    rows = sorted(ops.values(), key=lambda r: -r["self_ms"])
    for r in rows:
        r["pct"] = round(100 * r["self_ms"] / wall_ms, 2)
        r["self_ms"] = round(r["self_ms"], 3)
        # one op name can run in several groups (aten::copy_ in norms and elsewhere)
        r["group"] = max(r["groups"], key=r["groups"].get)
        r["groups"] = {k: round(v, 3) for k, v in sorted(r["groups"].items(), key=lambda kv: -kv[1])}
    return {"wall_ms": round(wall_ms, 3), "traced_ms": round(traced_ms, 3),
            "events": sum(1 for e in events if e.thread == main), "mark_events": marks,
            "threads_with_events": len(threads), "groups": out_groups, "top_ops": rows[:top]}


# --- the phases ---------------------------------------------------------------------

def _profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU])


def profile_prefill(llm: Any, prompt: list[int]) -> tuple[Any, float, float]:
    """One prompt, ``max_tokens=1``, timed and profiled as ``bench speed``'s pp. Returns
    the profiler, the wall time and this process's CPU time over the call."""
    generate = speed.vllm_generate(llm)
    with _profiler() as prof:
        c0 = time.process_time()
        wall = generate([prompt], 1)
        cpu = time.process_time() - c0
    return prof, wall, cpu


def profile_decode(llm: Any, prompt: list[int], tokens: int) -> tuple[Any, float, float, int]:
    """``tokens`` decode steps of one request; its prefill step runs unprofiled first.
    Returns the profiler, the wall and process CPU time of the decode steps, and the
    number of steps."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise ProfileError("the engine has unfinished requests; the decode phase needs it idle")
    rid = f"edge-profile-{uuid.uuid4().hex[:8]}"
    engine.add_request(rid, {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=tokens + 1, ignore_eos=True))
    produced = 0

    def step() -> None:
        nonlocal produced
        for out in engine.step():
            if out.request_id == rid:
                produced = len(out.outputs[0].token_ids)

    while produced < 1:  # the prefill step (and its first token)
        if not engine.has_unfinished_requests():
            raise ProfileError("the request finished before its first token")
        step()
    start = produced
    steps = 0
    with _profiler() as prof:
        t0, c0 = time.perf_counter(), time.process_time()
        while engine.has_unfinished_requests():
            step()
            steps += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if produced - start != tokens:
        raise ProfileError(f"decode produced {produced - start} tokens after the first, expected {tokens}")
    return prof, wall, cpu, steps


def phase_record(prof: Any, wall_s: float, top: int, **extra: Any) -> dict:
    rec = summarize_events(prof.events(), wall_s, top)
    if rec["mark_events"] == 0:
        raise ProfileError(
            "the profiler saw no model module ranges: the model did not run in this process "
            "(is VLLM_ENABLE_V1_MULTIPROCESSING=0 in effect?)")
    rec.update(extra)
    return rec


# --- a whole run --------------------------------------------------------------------

def default_out(path: Path, prompt_len: int, decode_tokens: int) -> Path:
    return Path("benchmarks/results") / f"profile_{path.name}_pp{prompt_len}_tg{decode_tokens}.json"


def run(cfg: ProfileConfig, pinning: dict | None = None, out: str | os.PathLike | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Start one engine, warm up, profile the two phases; return (and write) the result."""
    from vllm_edge.bench.compare import refuse_other_hosts_file
    from vllm_edge.common import atomic, provenance

    validate(cfg)
    scfg = cfg.speed_config()
    path = Path(speed.model_path(scfg))
    mml = speed.validate(scfg, speed.model_max_len(path))
    target = Path(out) if out else default_out(path, cfg.prompt_len, cfg.decode_tokens)
    refuse_other_hosts_file(target)  # before the engine starts
    llm, edge, load_s = speed.start_one_process(scfg, path, mml, "profile", ProfileError, log)
    marks = llm.collective_rpc("vllm_edge_profile_marks", args=(True,))[0]
    if marks["pid"] != os.getpid():
        raise ProfileError(f"the worker runs in process {marks['pid']}, not in this one "
                           f"({os.getpid()}): torch.profiler here would not see its ops")
    log(f"[profile] marked modules: {marks['groups']}")

    source = speed.corpus_source(llm.get_tokenizer())
    generate = speed.vllm_generate(llm)
    for _ in range(cfg.warmup):
        generate([source.take(cfg.prompt_len)], 1)
        profile_decode(llm, source.take(speed.TG_PROMPT_LEN), min(cfg.decode_tokens, 4))
    phases: dict[str, dict] = {}
    prof, wall, cpu = profile_prefill(llm, source.take(cfg.prompt_len))
    phases["prefill"] = phase_record(prof, wall, cfg.top, tokens=cfg.prompt_len,
                                     process_cpu_ms=round(cpu * 1e3, 3),
                                     tokens_per_s=round(cfg.prompt_len / wall, 2))
    log(f"[profile] prefill of {cfg.prompt_len} tokens: {wall * 1e3:.1f} ms")
    prof, wall, cpu, steps = profile_decode(llm, source.take(speed.TG_PROMPT_LEN), cfg.decode_tokens)
    phases["decode"] = phase_record(prof, wall, cfg.top, tokens=cfg.decode_tokens, steps=steps,
                                    prompt_tokens=speed.TG_PROMPT_LEN,
                                    process_cpu_ms=round(cpu * 1e3, 3),
                                    ms_per_token=round(wall * 1e3 / cfg.decode_tokens, 3),
                                    tokens_per_s=round(cfg.decode_tokens / wall, 2))
    log(f"[profile] decode of {cfg.decode_tokens} tokens: {wall * 1e3:.1f} ms")
    llm.collective_rpc("vllm_edge_profile_marks", args=(False,))
    del llm

    result = {
        "benchmark": "profile",
        "build": speed.build_label(path, scfg),
        "model": str(path),
        "config": {**asdict(cfg), "decode_prompt_len": speed.TG_PROMPT_LEN, "max_model_len_used": mml},
        "groups_help": GROUP_HELP,
        "marks": marks,
        "phases": phases,
        "load_s": round(load_s, 3),
        "engine": edge.describe(),
        "pinning": pinning,
        "note": "contended hosts stretch every op: compare shares (pct), not milliseconds",
        "provenance": provenance.collect(model=path, threads=(pinning or {}).get("threads"),
                                         extra={"core_set_pinned": (pinning or {}).get("cores")}),
    }
    return atomic.write_result(target, result)


# --- output -------------------------------------------------------------------------

def format_table(result: dict) -> str:
    lines = [f"{result['build']}"]
    for phase, rec in result["phases"].items():
        rate = f"{rec['tokens_per_s']:.1f} tok/s"
        cpu = f", process CPU {rec['process_cpu_ms']:.1f} ms" if "process_cpu_ms" in rec else ""
        lines.append(f"\n== {phase}: {rec['tokens']} tokens, wall {rec['wall_ms']:.1f} ms ({rate}){cpu}")
        lines.append(f"{'group':<12} {'ms':>10} {'%':>6}  biggest ops")
        for g, v in result_groups(rec):
            ops = ", ".join(f"{o['name']} {o['self_ms']:.1f}" for o in v["top_ops"][:3])
            lines.append(f"{g:<12} {v['self_ms']:>10.1f} {v['pct']:>6.1f}  {ops}")
        lines.append(f"{'op (self CPU)':<44} {'calls':>6} {'ms':>10} {'%':>6}  group")
        for r in rec["top_ops"]:
            more = f" (+{len(r['groups']) - 1})" if len(r.get("groups", {})) > 1 else ""
            lines.append(f"{r['name'][:44]:<44} {r['calls']:>6} {r['self_ms']:>10.1f} {r['pct']:>6.1f}  "
                         f"{r['group']}{more}")
    return "\n".join(lines)


def result_groups(rec: dict) -> list[tuple[str, dict]]:
    return [(g, rec["groups"][g]) for g in (*GROUPS, UNTRACED) if g in rec["groups"]]


def format_comparison(results: list[dict], labels: list[str] | None = None) -> str:
    """Group shares (% of each phase's wall time) side by side, one column per result."""
    labels = labels or [r["build"] for r in results]
    if len(labels) != len(results):
        raise ProfileError(f"{len(labels)} labels for {len(results)} results")
    width = max(12, *(len(lb) for lb in labels))
    lines = []
    phases = [p for p in results[0]["phases"] if all(p in r["phases"] for r in results)]

    def row(name: str, vals: list, fmt: str = ".1f") -> str:
        return f"{name:<14} " + " ".join(f"{'-' if v is None else format(v, fmt):>{width}}" for v in vals)

    for phase in phases:
        recs = [r["phases"][phase] for r in results]
        lines.append(f"\n== {phase}: group shares, % of the phase's wall time")
        lines.append(f"{'':<14} " + " ".join(f"{lb:>{width}}" for lb in labels))
        lines.append(row("wall ms", [p["wall_ms"] for p in recs], ".0f"))
        lines.append(row("process CPU ms", [p.get("process_cpu_ms") for p in recs], ".0f"))
        for g in (*GROUPS, UNTRACED):
            lines.append(row(g, [p["groups"].get(g, {}).get("pct") for p in recs]))
    return "\n".join(lines)


def load(path: str | os.PathLike) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{p}: cannot read a profile result ({exc})") from None
    if data.get("benchmark") != "profile" or "phases" not in data:
        raise ProfileError(f"{p}: not a `bench profile` result (benchmark={data.get('benchmark')!r})")
    return data
