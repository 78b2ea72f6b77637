"""`vllm-edge bench step`: where the wall time of one batch-1 decode step goes.

One engine in edge mode (one process, so the scheduler, the runner and the model all run
here), compiled by default (the graph `run` and `serve` use), built as ``bench speed``
builds it (:func:`speed.engine_for`). After a warm-up it drives one greedy request step by
step and times, with wall-clock wrappers around bound methods of the live engine:

* ``schedule`` and ``update_from_output``: vLLM's scheduler;
* ``prepare``: the runner's ``execute_model`` minus the forward and the head (state
  updates, input ids, positions, slot mappings, attention metadata);
* ``forward``: the model's forward (the compiled graph);
* ``head``: ``compute_logits`` (the LM head and the logits processor);
* ``sampler``: vLLM's sampler;
* ``bookkeeping``: the runner's ``sample_tokens`` minus the sampler;
* ``output``: the engine's output processing with detokenization;
* ``rest``: the step's wall time no wrapper covers (engine-core glue, request bookkeeping).

``outside_forward`` is the step minus ``forward``. Medians are over the measured steps.

Then two counts that say why: one step under torch.profiler, counting calls per op name
(``vllm::`` ops run a Python implementation; ``_C::`` and ``aten::`` ops are C++), with
microseconds per call (the profiler's own overhead is in them: compare, do not add); and
the dispatcher round trip of the cpu_int4 linear op on the model's first int4 layer, at one
row: the registered op against its implementation called directly.

Voluntary context switches of this process's threads per step show the OpenMP wait
policy at work; ``gc_collections`` counts Python collector runs during the timed steps.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from vllm_edge.bench import speed
from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4
from vllm_edge.quant.groups import DEFAULT_GROUP

SECTIONS = ("schedule", "prepare", "forward", "head", "sampler", "bookkeeping",
            "update_from_output", "output", "rest")
SECTION_HELP = {
    "schedule": "vLLM's scheduler picks the batch",
    "prepare": "runner: state updates, input ids, positions, slot mappings, attention metadata",
    "forward": "the model's forward (the compiled graph unless --eager)",
    "head": "compute_logits: the LM head and the logits processor",
    "sampler": "vLLM's sampler",
    "bookkeeping": "runner: sample_tokens minus the sampler (token bookkeeping, output object)",
    "update_from_output": "scheduler: request states after the step",
    "output": "engine: output processing and detokenization",
    "rest": "the step's wall time no section covers (engine-core glue)",
}
PYTHON_OP_PREFIX = "vllm::"


class StepError(EdgeError, RuntimeError):
    """The step breakdown could not be taken."""


@dataclass
class StepConfig:
    model: str = "default"
    quant: str | None = CPU_INT4
    group: int = DEFAULT_GROUP
    dtype: str = "bfloat16"
    steps: int = 64
    warmup: int = 16
    enforce_eager: bool = False
    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    max_model_len: int | None = None
    dispatch_calls: int = 2000

    def speed_config(self) -> speed.SpeedConfig:
        return speed.SpeedConfig(model=self.model, quant=self.quant, group=self.group, dtype=self.dtype,
                                 prompt_len=speed.TG_PROMPT_LEN, tg_tokens=self.steps + 1, reps=1,
                                 threads=self.threads, cpus=self.cpus, enforce_eager=self.enforce_eager,
                                 max_model_len=self.max_model_len, bandwidth="off")


def validate(cfg: StepConfig) -> None:
    if cfg.steps < 4:
        raise speed.SpeedArgError("--steps must be at least 4")
    if cfg.warmup < 1:
        raise speed.SpeedArgError("--warmup must be at least 1")
    if cfg.dispatch_calls < 0:
        raise speed.SpeedArgError("--dispatch-calls must be at least 0")


# --- the timers ----------------------------------------------------------------

class Timers:
    """Per-step wall time of wrapped bound methods; wrappers are removed by :meth:`close`."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, obj: Any, attr: str, section: str) -> None:
        original = getattr(obj, attr)
        had_own = attr in vars(obj)
        current = self.current
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                current[section] = current.get(section, 0.0) + clock() - t0

        setattr(obj, attr, timed)
        self._undo.append(lambda: setattr(obj, attr, original) if had_own else delattr(obj, attr))

    def end_step(self, wall_s: float) -> None:
        row = dict(self.current)
        row["step"] = wall_s
        self.steps.append(row)
        self.current.clear()

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()


def engine_parts(llm: Any) -> dict[str, Any]:
    """The live objects of a one-process engine: scheduler, model runner, model, output
    processor. Raises :class:`StepError` naming what is missing."""
    engine = llm.llm_engine
    parts: dict[str, Any] = {"engine": engine}
    try:
        core = engine.engine_core.engine_core
        parts["scheduler"] = core.scheduler
        parts["runner"] = core.model_executor.driver_worker.worker.model_runner
        parts["output_processor"] = engine.output_processor
    except AttributeError as exc:
        raise StepError(f"not a one-process vLLM engine ({exc}); bench step needs "
                        "VLLM_ENABLE_V1_MULTIPROCESSING=0 (edge mode)") from None
    parts["model"] = parts["runner"].model
    return parts


def install_timers(parts: dict[str, Any]) -> Timers:
    t = Timers()
    runner = parts["runner"]
    t.wrap(parts["scheduler"], "schedule", "schedule")
    t.wrap(parts["scheduler"], "update_from_output", "update_from_output")
    t.wrap(runner, "execute_model", "execute_model")
    t.wrap(runner, "_model_forward", "forward")
    t.wrap(parts["model"], "compute_logits", "head")
    t.wrap(runner, "sample_tokens", "sample_tokens")
    t.wrap(runner, "_sample", "sampler")
    t.wrap(parts["output_processor"], "process_outputs", "output")
    return t


def sections_of(row: dict[str, float]) -> dict[str, float]:
    """One step's raw timers as the published sections (ms)."""
    g = row.get
    out = {
        "schedule": g("schedule", 0.0),
        "prepare": g("execute_model", 0.0) - g("forward", 0.0) - g("head", 0.0),
        "forward": g("forward", 0.0),
        "head": g("head", 0.0),
        "sampler": g("sampler", 0.0),
        "bookkeeping": g("sample_tokens", 0.0) - g("sampler", 0.0),
        "update_from_output": g("update_from_output", 0.0),
        "output": g("output", 0.0),
    }
    out["rest"] = row["step"] - sum(out.values())
    out["step"] = row["step"]
    out["outside_forward"] = row["step"] - out["forward"]
    return {k: v * 1e3 for k, v in out.items()}


def _ctx_switches() -> tuple[int, int]:
    vol = invol = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    invol += int(line.split()[1])
        except OSError:
            continue
    return vol, invol


def drive(engine: Any, prompt: list[int], tokens: int, timers: Timers | None = None,
          on_step: Callable[[], None] | None = None) -> int:
    """One greedy request, stepped until done; with ``timers``, every step after the one
    that produced the first token is recorded. Returns the decode steps taken."""
    from vllm import SamplingParams

    if engine.has_unfinished_requests():
        raise StepError("the engine has unfinished requests; bench step needs it idle")
    rid = f"edge-step-{uuid.uuid4().hex[:8]}"
    engine.add_request(rid, {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=tokens + 1, ignore_eos=True))
    produced = 0
    steps = 0
    while engine.has_unfinished_requests():
        first = produced == 0
        if timers is not None:
            timers.current.clear()
        t0 = time.perf_counter()
        for out in engine.step():
            if out.request_id == rid:
                produced = len(out.outputs[0].token_ids)
        dt = time.perf_counter() - t0
        if not first:
            steps += 1
            if timers is not None:
                timers.end_step(dt)
            if on_step is not None:
                on_step()
    if produced != tokens + 1:
        raise StepError(f"the request produced {produced} tokens, expected {tokens + 1}")
    return steps


def op_counts(engine: Any, prompt: list[int], steps: int = 4) -> dict:
    """Calls per decode step and µs per call of every dispatcher op, from torch.profiler
    over ``steps`` steps (the prefill step runs unprofiled)."""
    from torch.profiler import ProfilerActivity, profile

    state: dict[str, Any] = {"prof": None, "left": steps}
    prof = profile(activities=[ProfilerActivity.CPU])

    def on_step() -> None:  # start after the first decode step, stop after `steps`
        if state["prof"] is None:
            prof.__enter__()
            state["prof"] = prof
        else:
            state["left"] -= 1
            if state["left"] == 0:
                prof.__exit__(None, None, None)

    drive(engine, prompt, steps + 1, on_step=on_step)
    if state["left"] != 0:
        raise StepError("the profiled steps did not complete")
    ops: dict[str, dict] = {}
    for e in prof.events():
        if "::" not in e.name:
            continue
        row = ops.setdefault(e.name, {"calls": 0, "cpu_us": 0.0})
        row["calls"] += 1
        row["cpu_us"] += e.cpu_time_total
    table = {name: {"calls_per_step": round(r["calls"] / steps, 2),
                    "us_per_call": round(r["cpu_us"] / r["calls"], 2),
                    "python_impl": name.startswith(PYTHON_OP_PREFIX)}
             for name, r in sorted(ops.items(), key=lambda kv: -kv[1]["cpu_us"])}
    python_calls = sum(r["calls_per_step"] for n, r in table.items() if r["python_impl"])
    return {"profiled_steps": steps, "python_op_calls_per_step": round(python_calls, 2),
            "op_calls_per_step": round(sum(r["calls_per_step"] for r in table.values()), 2),
            "ops": table,
            "note": "µs per call include the profiler's own overhead; compare, do not add"}


def run(cfg: StepConfig, pinning: dict | None = None, out: str | os.PathLike | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Start one engine, warm up, time the steps, count the ops; return (and write) the result."""
    from vllm_edge.common import atomic, provenance

    validate(cfg)
    scfg = cfg.speed_config()
    path = Path(speed.model_path(scfg))
    mml = speed.validate(scfg, speed.model_max_len(path))
    mml = max(mml, speed.TG_PROMPT_LEN + cfg.steps + cfg.warmup + 8)
    llm, edge, load_s = speed.start_one_process(scfg, path, mml, "step", StepError, log)
    parts = engine_parts(llm)
    engine = parts["engine"]
    source = speed.corpus_source(llm.get_tokenizer())
    drive(engine, source.take(speed.TG_PROMPT_LEN), cfg.warmup)

    dispatch = llm.collective_rpc("vllm_edge_int4_dispatch", args=(cfg.dispatch_calls,))[0] \
        if cfg.dispatch_calls else None

    timers = install_timers(parts)
    gc0 = sum(s["collections"] for s in gc.get_stats())
    ctx0 = _ctx_switches()
    c0 = time.process_time()
    try:
        steps = drive(engine, source.take(speed.TG_PROMPT_LEN), cfg.steps, timers=timers)
    finally:
        timers.close()
    cpu_s = time.process_time() - c0
    ctx1 = _ctx_switches()
    gc_runs = sum(s["collections"] for s in gc.get_stats()) - gc0
    rows = [sections_of(r) for r in timers.steps]
    keys = (*SECTIONS, "outside_forward", "step")
    median = {k: round(statistics.median(r[k] for r in rows), 4) for k in keys}
    mean = {k: round(statistics.fmean(r[k] for r in rows), 4) for k in keys}
    log(f"[step] {steps} steps: median {median['step']:.2f} ms, forward {median['forward']:.2f} ms, "
        f"outside the forward {median['outside_forward']:.2f} ms")

    counts = op_counts(engine, source.take(speed.TG_PROMPT_LEN))
    log(f"[step] {counts['python_op_calls_per_step']:.0f} Python-implemented op calls per step "
        f"(of {counts['op_calls_per_step']:.0f} dispatcher ops)")
    del llm

    result = {
        "benchmark": "step",
        "build": speed.build_label(path, scfg),
        "model": str(path),
        "config": {**asdict(cfg), "prompt_len": speed.TG_PROMPT_LEN, "max_model_len_used": mml},
        "sections_help": SECTION_HELP,
        "steps": steps,
        "median_ms": median,
        "mean_ms": mean,
        "tokens_per_s": round(1e3 / median["step"], 2),
        "process_cpu_ms_per_step": round(cpu_s * 1e3 / steps, 3),
        "voluntary_ctx_switches_per_step": round((ctx1[0] - ctx0[0]) / steps, 2),
        "involuntary_ctx_switches_per_step": round((ctx1[1] - ctx0[1]) / steps, 2),
        "gc_collections": gc_runs,
        "op_counts": counts,
        "int4_dispatch": dispatch,
        "per_step_ms": [{k: round(v, 4) for k, v in r.items()} for r in rows],
        "load_s": round(load_s, 3),
        "engine": edge.describe(),
        "switches": switches(),
        "pinning": pinning,
        "note": "wall-clock sections of a live engine; on a shared host compare medians "
                "from one interleaved grid, not across runs",
        "provenance": provenance.collect(model=path, threads=(pinning or {}).get("threads"),
                                         extra={"core_set_pinned": (pinning or {}).get("cores")}),
    }
    return atomic.write_result(out, result)


def switches() -> dict[str, Any]:
    """Our decode-path switches as this run saw them, so an A/B artifact says which arm it is."""
    from vllm_edge import envs

    return {name: envs.get(name) for name in envs.DECLARED
            if name.startswith(("VLLM_EDGE_PATCH_", "VLLM_EDGE_INT4_", "VLLM_EDGE_FUSED"))}


def metric_line(result: dict) -> dict:
    """The JSON object a grid arm prints: the medians only."""
    line: dict[str, Any] = {"benchmark": "step", "build": result["build"]}
    for k in ("step", "forward", "outside_forward", "prepare", "sampler", "output"):
        line[f"{k}_ms"] = result["median_ms"][k]
    line["tg_tps"] = result["tokens_per_s"]
    line["python_op_calls_per_step"] = result["op_counts"]["python_op_calls_per_step"]
    line["voluntary_ctx_switches_per_step"] = result["voluntary_ctx_switches_per_step"]
    if result.get("out"):
        line["out"] = result["out"]
    return line


def default_out(path: Path, cfg: StepConfig) -> Path:
    mode = "eager" if cfg.enforce_eager else "compiled"
    return Path("benchmarks/results/step") / f"{path.name}_{mode}.json"


def format_table(result: dict) -> str:
    med = result["median_ms"]
    lines = [f"{result['build']}: {result['steps']} decode steps, median {med['step']:.2f} ms/step "
             f"({result['tokens_per_s']:.1f} tok/s), process CPU {result['process_cpu_ms_per_step']:.2f} ms/step",
             f"{'section':<20} {'median ms':>10} {'% step':>7}"]
    for k in SECTIONS:
        lines.append(f"{k:<20} {med[k]:>10.3f} {100 * med[k] / med['step']:>7.1f}")
    lines.append(f"{'outside the forward':<20} {med['outside_forward']:>10.3f} "
                 f"{100 * med['outside_forward'] / med['step']:>7.1f}")
    c = result["op_counts"]
    lines.append(f"dispatcher ops per step: {c['op_calls_per_step']:.0f}, of which Python-implemented "
                 f"({PYTHON_OP_PREFIX}*): {c['python_op_calls_per_step']:.0f}")
    lines.append(f"{'op':<44} {'calls/step':>10} {'µs/call':>9}")
    for name, r in list(c["ops"].items())[:12]:
        lines.append(f"{name[:44]:<44} {r['calls_per_step']:>10.1f} {r['us_per_call']:>9.1f}")
    d = result.get("int4_dispatch")
    if d:
        paths = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in d.items() if k.endswith("_us"))
        lines.append(f"int4 linear at 1 row, {d['layer']} {d['shape']}, µs per call by entry point: {paths}")
    lines.append(f"context switches per step: {result['voluntary_ctx_switches_per_step']:.1f} voluntary, "
                 f"{result['involuntary_ctx_switches_per_step']:.1f} involuntary; "
                 f"GC runs during the steps: {result['gc_collections']}")
    return "\n".join(lines)


def int4_dispatch(model: Any, calls: int) -> dict | None:
    """Time one-row calls of the first cpu_int4 linear's product through each layer of its
    path: the registered op (what the compiled graph calls), its Python implementation, the
    native wrapper, and the C product through ctypes alone. Medians of 5 rounds."""
    import torch
    from vllm.model_executor.layers.linear import LinearBase

    from vllm_edge.quant import native, ops

    layer = name = None
    for n, mod in model.named_modules():
        if isinstance(mod, LinearBase) and getattr(mod, "cpu_int4_mode", None) == "tinygemm":
            layer, name = mod, n
            break
    if layer is None or calls == 0:
        return None
    packed, sz, kg = layer.weight_packed, layer.weight_sz, layer.cpu_int4_kgroup
    k = sz.shape[0] * kg
    n_out = sz.shape[1]
    x = torch.randn(1, k, dtype=torch.bfloat16)
    args = (x, packed, sz, kg, layer.cpu_int4_threshold, None, None, None, layer.cpu_int4_group,
            layer.cpu_int4_workspace_mb)
    paths: dict[str, Callable[[], Any]] = {
        "op": lambda: getattr(torch.ops.vllm, ops.OP_NAME)(*args),
        "impl": lambda: ops.int4_linear_impl(*args),
        "native_gemv": lambda: native.gemv(x, packed, sz, kg),
    }
    lib = native.library() if native.gemv_supported() else None
    if lib is not None:
        y = torch.empty(1, n_out, dtype=torch.bfloat16)
        threads = torch.get_num_threads()
        paths["ctypes_c"] = lambda: lib.edge_int4_gemv(packed.data_ptr(), sz.data_ptr(), x.data_ptr(),
                                                        y.data_ptr(), 1, n_out, k, kg, threads)
    cxx = getattr(getattr(torch.ops, "vllm_edge", None), "int4_gemv", None)
    if cxx is not None:
        paths["native_op"] = lambda: cxx(x, packed, sz, kg)
    out: dict[str, Any] = {"layer": name, "shape": [n_out, k], "calls": calls}
    with torch.inference_mode():
        for key, fn in paths.items():
            for _ in range(min(calls, 100)):
                fn()
            rounds = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                rounds.append((time.perf_counter() - t0) * 1e6 / calls)
            out[f"{key}_us"] = round(statistics.median(rounds), 2)
    return out
