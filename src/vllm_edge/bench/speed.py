"""llama-bench-style throughput: prompt processing (pp) and token generation (tg).

* ``pp{P}_tps``: one prompt of P tokens, ``max_tokens=1``; P / wall time.
* ``tg{N}_tps``: N tokens with ``ignore_eos`` minus a 1-token run on the same
  prompt, over N - 1 tokens, so the prefill cost cancels.
* ``tg{N}_at_d{D}_tps``: the same on a D-token prompt (decode at depth).
* ``b{B}_tg_tps``: the tg difference with B distinct prompts submitted at once;
  total tokens over all sequences.
* with ``image_px`` (a vision-language model): ``img{px}_prefill_s``, the wall time of
  a 1-token run on one px-by-px image plus a TG_PROMPT_LEN-token text (image
  preprocessing, vision encoder, connector and the language model's prefill), and
  ``tg{N}_img_tps``, the tg difference on such a prompt (decode with the image in
  context). Every call gets a new image, so vLLM's encoder cache never serves a repeat.

:func:`measure` is the single measurement core: ``bench speed``, grid arms and
``compare`` all go through it with an engine-backed ``generate`` callable.
Prefix caching must be off in the engine, or a repeated prompt would skip its
prefill and the 1-token run would stop cancelling it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from vllm_edge.common import stats
from vllm_edge.common.errors import UsageError
from vllm_edge.quant.groups import DEFAULT_GROUP

# Prompt length of the depth-0 tg and batch runs: llama-bench's tg128 decodes on an
# empty context; we need at least a few tokens to have a prompt at all.
TG_PROMPT_LEN = 16

# generate(prompts, max_tokens) -> wall seconds of one timed call. A prompt is a list of
# token ids, or a dict vLLM takes as is (token ids plus multi_modal_data).
Prompt = list[int] | dict
Generate = Callable[[list[Prompt], int], float]


class SpeedArgError(UsageError):
    """Bad arguments, caught before any engine starts."""


@dataclass
class SpeedConfig:
    model: str = "default"
    prompt_len: int = 512
    tg_tokens: int = 128
    context_lens: tuple[int, ...] = ()
    batches: tuple[int, ...] = ()
    reps: int = 3
    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    enforce_eager: bool = False
    dtype: str = "bfloat16"
    max_model_len: int | None = None
    warmup: bool = True
    # the read-bandwidth ceiling: "auto" (this host's benchmarks/results/bandwidth/ file if it was
    # measured on the same cores), "measure" (a `vllm-edge bandwidth` child first),
    # "off", or a path to a bandwidth result
    bandwidth: str = "auto"
    # an embedded model's quantized build, made once and cached as `vllm-edge run` does
    quant: str | None = None
    group: int = DEFAULT_GROUP
    image_px: int | None = None
    # ranks of vLLM's multiprocess executor, each bound to its share of the pinned cores
    tensor_parallel_size: int = 1
    # decode every run under this JSON schema: "long-text" or a schema file
    json_schema: str | None = None


# --- keys and arithmetic -----------------------------------------------------

def pp_key(prompt_len: int) -> str:
    return f"pp{prompt_len}_tps"


def tg_key(tg_tokens: int, depth: int | None = None) -> str:
    return f"tg{tg_tokens}_tps" if depth is None else f"tg{tg_tokens}_at_d{depth}_tps"


def batch_key(batch: int) -> str:
    return f"b{batch}_tg_tps"


def img_prefill_key(px: int) -> str:
    return f"img{px}_prefill_s"


def img_tg_key(tg_tokens: int) -> str:
    return f"tg{tg_tokens}_img_tps"


def pp_tps(prompt_tokens: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"non-positive pp time {seconds}")
    return prompt_tokens / seconds


def tg_tps(tg_tokens: int, t_n: float, t_1: float, seqs: int = 1) -> float:
    """(N - 1) generated tokens per sequence over (t_N - t_1), times the sequences."""
    if tg_tokens < 2:
        raise ValueError("tg needs at least 2 tokens: the first one is the prefill's")
    dt = t_n - t_1
    if dt <= 0:
        raise ValueError(f"the {tg_tokens}-token run ({t_n:.4f} s) was not slower than the "
                         f"1-token run ({t_1:.4f} s): decode time is inside the noise")
    return seqs * (tg_tokens - 1) / dt


def required_len(cfg: SpeedConfig) -> int:
    """Positions the longest sequence of this run needs."""
    need = [cfg.prompt_len + 1, TG_PROMPT_LEN + cfg.tg_tokens]
    need += [d + cfg.tg_tokens for d in cfg.context_lens]
    if cfg.image_px:
        # an image expands to up to 17 tiles of 64 tokens plus markers in Idefics3; the
        # engine checks the real count, this only has to leave room for it
        need.append(TG_PROMPT_LEN + cfg.tg_tokens + 1200)
    return max(need)


def validate(cfg: SpeedConfig, model_max_len: int | None = None) -> int:
    """Check the arguments; return the max_model_len to start the engine with."""
    if cfg.prompt_len < 1:
        raise SpeedArgError("--prompt-len must be at least 1")
    if cfg.tg_tokens < 2:
        raise SpeedArgError("--tg-tokens must be at least 2 (the first token is the prefill's)")
    if cfg.reps < 1:
        raise SpeedArgError("--reps must be at least 1")
    if cfg.threads is not None and cfg.threads < 1:
        raise SpeedArgError("--threads must be at least 1")
    if cfg.max_model_len is not None and cfg.max_model_len < 2:
        raise SpeedArgError("--max-model-len must be at least 2")
    if cfg.image_px is not None and cfg.image_px < 1:
        raise SpeedArgError("--image-px must be at least 1")
    if cfg.json_schema is not None:
        constraint_schema(cfg.json_schema)  # a missing or malformed file fails here
    limit, source = cfg.max_model_len, "--max-model-len"
    if model_max_len is not None and (limit is None or model_max_len < limit):
        limit, source = model_max_len, "the model's max_position_embeddings"
    if limit is not None:
        for d in cfg.context_lens:
            if d + cfg.tg_tokens > limit:
                raise SpeedArgError(
                    f"--context-len {d} needs {d + cfg.tg_tokens} positions ({d} context + "
                    f"{cfg.tg_tokens} generated), but max_model_len is {limit} ({source})")
        if cfg.prompt_len + 1 > limit:
            raise SpeedArgError(f"--prompt-len {cfg.prompt_len} does not fit max_model_len "
                                f"{limit} ({source})")
        if TG_PROMPT_LEN + cfg.tg_tokens > limit:
            raise SpeedArgError(f"--tg-tokens {cfg.tg_tokens} does not fit max_model_len "
                                f"{limit} ({source})")
    if cfg.max_model_len is not None:
        return cfg.max_model_len
    return required_len(cfg)


# --- cores and threads -------------------------------------------------------

# --- prompts -----------------------------------------------------------------

class TokenSource:
    """Consecutive windows of a token stream, so every prompt is distinct."""

    def __init__(self, ids: Sequence[int]):
        if len(ids) < 2:
            raise ValueError("token source is empty")
        self.ids = list(ids)
        self.pos = 0

    def take(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            chunk = self.ids[self.pos:self.pos + n - len(out)]
            out += chunk
            self.pos = (self.pos + len(chunk)) % len(self.ids)
        return out


class ImagePrompts:
    """Prompts of one image token plus text; each call builds a new seeded image (so no
    cache in vLLM can serve a repeat), outside the timed region."""

    def __init__(self, image_token_id: int, px: int, source: TokenSource):
        self.image_token_id, self.px, self.source = image_token_id, px, source
        self.count = 0

    def image(self):
        import numpy as np
        from PIL import Image

        self.count += 1
        rng = np.random.default_rng(self.count)
        return Image.fromarray(rng.integers(0, 256, (self.px, self.px, 3), dtype=np.uint8))

    def take(self, text_tokens: int) -> dict:
        return {"prompt_token_ids": [self.image_token_id, *self.source.take(text_tokens)],
                "multi_modal_data": {"image": self.image()}}


def corpus_source(tokenizer: Any) -> TokenSource:
    from vllm_edge.bench import prompts

    return TokenSource(tokenizer.encode(prompts.corpus_text(), add_special_tokens=False))


# --- the measurement core ----------------------------------------------------

def measure(generate: Generate, cfg: SpeedConfig, source: TokenSource,
            log: Callable[[str], None] = lambda s: None,
            images: ImagePrompts | None = None) -> dict:
    """Run every metric ``cfg.reps`` times, interleaved per rep.

    Returns ``{"runs": {metric: [tps per rep]}, "timings": [raw records]}``.
    """
    runs: dict[str, list[float]] = {}
    timings: list[dict] = []
    n = cfg.tg_tokens

    def tg_pair(prompts: list[Prompt], again: Callable[[], list[Prompt]] | None = None) -> tuple[float, float]:
        t1 = generate(prompts, 1)
        tn = generate(again() if again else prompts, n)
        return t1, tn

    if cfg.image_px and images is None:
        raise ValueError("image_px is set but no image prompts were given")

    if cfg.warmup:
        # First calls pay lazy initialisation (and compile shapes); keep them out of the numbers.
        generate([source.take(cfg.prompt_len)], 1)
        generate([source.take(TG_PROMPT_LEN)], 2)
        for b in cfg.batches:
            generate([source.take(TG_PROMPT_LEN) for _ in range(b)], 2)
        if images:
            generate([images.take(TG_PROMPT_LEN)], 2)

    for rep in range(cfg.reps):
        t = generate([source.take(cfg.prompt_len)], 1)
        key = pp_key(cfg.prompt_len)
        runs.setdefault(key, []).append(pp_tps(cfg.prompt_len, t))
        timings.append({"rep": rep, "metric": key, "prompt_tokens": cfg.prompt_len, "t_s": t})

        for depth in (None, *cfg.context_lens):
            plen = TG_PROMPT_LEN if depth is None else depth
            t1, tn = tg_pair([source.take(plen)])
            key = tg_key(n, depth)
            runs.setdefault(key, []).append(tg_tps(n, tn, t1))
            timings.append({"rep": rep, "metric": key, "prompt_tokens": plen, "t_1_s": t1, "t_n_s": tn})

        for b in cfg.batches:
            t1, tn = tg_pair([source.take(TG_PROMPT_LEN) for _ in range(b)])
            key = batch_key(b)
            runs.setdefault(key, []).append(tg_tps(n, tn, t1, seqs=b))
            timings.append({"rep": rep, "metric": key, "seqs": b, "prompt_tokens": TG_PROMPT_LEN,
                            "t_1_s": t1, "t_n_s": tn})

        if images:
            t = generate([images.take(TG_PROMPT_LEN)], 1)
            key = img_prefill_key(images.px)
            runs.setdefault(key, []).append(t)
            timings.append({"rep": rep, "metric": key, "text_tokens": TG_PROMPT_LEN, "t_s": t})
            # same text, a new image: both runs pay the encoder, so it cancels
            text = images.source.take(TG_PROMPT_LEN)
            mk = lambda: [{"prompt_token_ids": [images.image_token_id, *text],  # noqa: E731
                           "multi_modal_data": {"image": images.image()}}]
            t1, tn = tg_pair(mk(), mk)
            key = img_tg_key(n)
            runs.setdefault(key, []).append(tg_tps(n, tn, t1))
            timings.append({"rep": rep, "metric": key, "text_tokens": TG_PROMPT_LEN,
                            "t_1_s": t1, "t_n_s": tn})
        log(f"rep {rep + 1}/{cfg.reps}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in runs.items()))
    return {"runs": runs, "timings": timings}


def summarize(runs: dict[str, list[float]]) -> dict[str, dict]:
    return {k: stats.summarize(v, k) for k, v in runs.items()}


# No valid output is shorter than 4000 characters (over 128 tokens for any tokenizer we
# run), so a constrained tg run decodes all its tokens inside the grammar.
LONG_TEXT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000}},
                    "required": ["text"], "additionalProperties": False}


def constraint_schema(spec: str) -> dict:
    """``long-text`` or the path of a JSON schema file."""
    import json

    if spec == "long-text":
        return LONG_TEXT_SCHEMA
    try:
        schema = json.loads(Path(spec).read_text())
    except OSError as exc:
        raise SpeedArgError(f"--json-schema {spec}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SpeedArgError(f"--json-schema {spec}: not JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise SpeedArgError(f"--json-schema {spec}: a JSON schema is an object, got {type(schema).__name__}")
    return schema


def vllm_generate(llm: Any, json_schema: dict | None = None) -> Generate:
    """Time ``llm.generate`` on token-id prompts, greedy, EOS ignored; under ``json_schema``
    when given (vLLM's structured outputs)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    constraint = StructuredOutputsParams(json=json_schema) if json_schema else None

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            structured_outputs=constraint)
        batch = [p if isinstance(p, dict) else {"prompt_token_ids": p} for p in prompts]
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        short = [len(o.outputs[0].token_ids) for o in outs if len(o.outputs[0].token_ids) != max_tokens]
        if short:
            raise RuntimeError(f"asked for {max_tokens} tokens, got {short}: the run stopped early")
        return dt

    return generate


# --- bytes per token and the bandwidth ceiling ---------------------------------

def tg_contexts(cfg: SpeedConfig) -> list[tuple[str, float]]:
    """Each tg metric and the mean KV context its timed decode steps read."""
    from vllm_edge.bench.bytes_per_token import mean_context

    return [(tg_key(cfg.tg_tokens, d), mean_context(TG_PROMPT_LEN if d is None else d, cfg.tg_tokens))
            for d in (None, *cfg.context_lens)]


def resolve_ceiling(spec: str, cores: list[int] | None,
                    log: Callable[[str], None] = lambda s: None) -> dict:
    """The bandwidth ceiling for this run's cores, or why there is none.

    ``auto`` never fails the run (a missing or mismatched file is reported as the
    reason); an explicit path or ``measure`` that cannot give a ceiling is an error,
    raised before the engine starts.
    """
    import subprocess
    import tempfile

    from vllm_edge.bench import bandwidth as bw

    if spec == "off":
        return {"ceiling_gb_per_s": None, "reason": "--bandwidth off"}
    if cores is None:
        cores = sorted(os.sched_getaffinity(0))
    if spec == "auto":
        try:
            return bw.load_ceiling(bw.default_out(cores), cores)
        except bw.BandwidthError as exc:
            log(f"no bandwidth ceiling: {exc}")
            return {"ceiling_gb_per_s": None, "reason": str(exc)}
    if spec == "measure":
        # A child process: its buffer (hundreds of MB) never counts in our RssAnon.
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bandwidth.json"
            cmd = [sys.executable, "-m", "vllm_edge.cli", "bandwidth", "--cpus",
                   ",".join(map(str, cores)), "--out", str(out)]
            log(f"measuring the read bandwidth on cores {cores}")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SpeedArgError(f"--bandwidth measure: `vllm-edge bandwidth` failed "
                                    f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
            got = bw.load_ceiling(out, cores)
        got["source"] = "measured before this run (--bandwidth measure)"
        return got
    try:
        return bw.load_ceiling(spec, cores)
    except bw.BandwidthError as exc:
        raise SpeedArgError(f"--bandwidth {spec}: {exc}") from None


def traffic(result: dict, acc: Any, contexts: list[tuple[str, float]], ceiling: dict) -> dict:
    """Per tg metric: bytes per token, the bandwidth they imply at the measured rate,
    and that as a share of the ceiling."""
    from vllm_edge.bench.bytes_per_token import summary

    out: dict[str, dict] = {}
    top = ceiling.get("ceiling_gb_per_s")
    for key, row in summary(acc, contexts).items():
        s = result["metrics"].get(key)
        if not s or s.get("median") is None:
            continue
        eff = row["bytes_per_token"] * s["median"] / 1e9
        eff_best = row["bytes_per_token"] * s["best"] / 1e9
        out[key] = {**row, "gb_per_s_effective": round(eff, 3),
                    "gb_per_s_effective_best": round(eff_best, 3),
                    "pct_of_ceiling": round(100 * eff / top, 1) if top else None,
                    "pct_of_ceiling_best": round(100 * eff_best / top, 1) if top else None}
    return out


# --- a whole run -------------------------------------------------------------

def weight_bytes(llm: Any) -> dict[str, float]:
    """The workers' model tensors (deduplicated storages, resident by mincore) and the
    cpu_int4 dequantization workspace, from the memory ledger, summed over the ranks; taken
    after the runs so the workspace has reached its size. Empty if the engine has no edge
    worker extension."""
    try:
        ledgers = llm.collective_rpc("vllm_edge_ledger")
    except Exception as exc:  # a plain engine: report the gap, do not fail the speed run
        print(f"[speed] no weight ledger: {exc}", file=sys.stderr)
        return {}
    out = {"weights_resident_mb": 0.0, "weights_allocated_mb": 0.0, "weights_opaque_est_mb": 0.0,
           "dequant_workspace_mb": 0.0}
    for led in ledgers:
        roles = {k: v for k, v in led["roles"].items() if k != "workspace"}
        out["weights_resident_mb"] += sum(r["resident_mb"] for r in roles.values())
        out["weights_allocated_mb"] += sum(r["allocated_mb"] for r in roles.values())
        # oneDNN handles hold packed bf16 weights we cannot address: counted from shapes
        out["weights_opaque_est_mb"] += led.get("opaque_packed_handles", {}).get("estimated_mb", 0.0)
        out["dequant_workspace_mb"] += led["roles"].get("workspace", {}).get("resident_mb", 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def rank_memory(llm: Any) -> list[dict[str, Any]]:
    """RssAnon of each rank's own process (the pid its plugin reports from inside it)."""
    from vllm_edge.common.procmem import rss_anon_kb

    ranks = []
    for rank, rep in enumerate(llm.collective_rpc("vllm_edge_report")):
        kb = rss_anon_kb(rep["pid"])
        ranks.append({"rank": rank, "pid": rep["pid"], "rss_anon_mb": round(kb / 1024, 1) if kb else None})
    return ranks


def model_max_len(path: Path) -> int | None:
    import json

    cfg = json.loads((path / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    v = cfg.get("max_position_embeddings")
    return int(v) if v else None


def model_path(cfg: SpeedConfig) -> Path:
    """The directory to load: a path, an embedded model, or its ``--quant`` build."""
    from vllm_edge.models import store
    from vllm_edge.models.resolver import ensure_model, own_scheme

    if cfg.quant and not (cfg.model == "default" or cfg.model in store.MODELS or store.is_gguf(cfg.model)):
        raise SpeedArgError(f"--quant {cfg.quant} needs an embedded model name, not {cfg.model!r}; "
                            "pass a quantized directory as --model instead")
    quant = cfg.quant or own_scheme(cfg.model)
    return Path(ensure_model(cfg.model, quant, cfg.group if quant else None))


def image_token_id(path: Path) -> int:
    import json

    cfg = json.loads((path / "config.json").read_text())
    if "vision_config" not in cfg or "image_token_id" not in cfg:
        raise SpeedArgError(f"--image-px: {path} is not a vision-language model "
                            "(no vision_config / image_token_id in config.json)")
    return int(cfg["image_token_id"])


def build_label(path: Path, cfg: SpeedConfig) -> str:
    tp = f", TP={cfg.tensor_parallel_size}" if cfg.tensor_parallel_size > 1 else ""
    js = f", JSON schema {cfg.json_schema}" if cfg.json_schema else ""
    return f"{path.name} ({cfg.dtype}, {'eager' if cfg.enforce_eager else 'compiled'}{tp}{js})"


def engine_for(cfg: SpeedConfig, path: Path, max_model_len: int) -> Any:
    """The edge engine a speed run starts (``bench profile`` starts the same one): one
    process, KV priced from the config, prefix caching off (a repeated prompt would skip
    its prefill), no periodic stats logging."""
    from vllm_edge.bench import WORKER_EXTENSION
    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(path, max_model_len=max_model_len, max_num_seqs=max((1, *cfg.batches)),
                       dtype=cfg.dtype, enforce_eager=cfg.enforce_eager,
                       enable_prefix_caching=False, worker_extension=WORKER_EXTENSION,
                       tensor_parallel_size=cfg.tensor_parallel_size)
    edge.kwargs["disable_log_stats"] = True
    if cfg.image_px:
        edge.kwargs["limit_mm_per_prompt"] = {"image": 1}
        # a new image per call already defeats it; off, so preprocessing is always timed
        edge.kwargs["mm_processor_cache_gb"] = 0
    return edge


def start_one_process(cfg: SpeedConfig, path: Path, max_model_len: int, tag: str,
                      error: type[Exception], log: Callable[[str], None]) -> tuple[Any, Any, float]:
    """The :func:`engine_for` engine, checked to run the model in this process (``bench profile``
    and ``bench step`` instrument it from here): the LLM, its EdgeEngine and the seconds to ready.
    Raises ``error`` when the edge mode would spawn a worker."""
    edge = engine_for(cfg, path, max_model_len)
    edge.apply_env()  # before vLLM is imported
    if edge.env.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise error(f"bench {tag} needs the one-process edge engine")
    t0 = time.perf_counter()
    from vllm import LLM

    llm = LLM(**edge.kwargs)
    load_s = time.perf_counter() - t0
    log(f"[{tag}] engine ready in {load_s:.1f} s; {build_label(path, cfg)}")
    return llm, edge, load_s


def run(cfg: SpeedConfig, pinning: dict | None = None, out: str | os.PathLike | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Start one engine, measure, and return (and optionally write) the result."""
    from vllm_edge.bench import bytes_per_token
    from vllm_edge.common import atomic, provenance
    from vllm_edge.common.procmem import TreeSampler, tree_rss_anon_mb

    path = Path(model_path(cfg))
    mml = validate(cfg, model_max_len(path))
    # Both before the engine: a bad checkpoint or --bandwidth fails fast, and the
    # bandwidth child never shares the cores with a running engine.
    acc = bytes_per_token.account_dir(path, dtype=cfg.dtype)
    ceiling = resolve_ceiling(cfg.bandwidth, (pinning or {}).get("cores"),
                              log=lambda s: log(f"[speed] {s}"))
    edge = engine_for(cfg, path, mml)
    image_token = image_token_id(path) if cfg.image_px else None
    edge.apply_env()  # before vLLM is imported

    memory: dict[str, float] = {}
    with TreeSampler(interval=0.1) as load_mem:
        t0 = time.perf_counter()
        from vllm import LLM

        import_s = time.perf_counter() - t0
        llm = LLM(**edge.kwargs)
        load_s = time.perf_counter() - t0
    memory["load_peak_rss_anon_mb"] = round(load_mem.peak_mb, 1)
    memory["after_load_rss_anon_mb"] = round(tree_rss_anon_mb()[0], 1)
    log(f"[speed] engine ready in {load_s:.1f} s (vLLM import {import_s:.1f} s); {build_label(path, cfg)}")

    source = corpus_source(llm.get_tokenizer())
    images = ImagePrompts(image_token, cfg.image_px, source) if cfg.image_px else None
    # Coarse sampling: a busy sampler thread would steal time from the run it measures.
    with TreeSampler(interval=0.5) as bench_mem:
        schema = constraint_schema(cfg.json_schema) if cfg.json_schema else None
        measured = measure(vllm_generate(llm, schema), cfg, source, log=lambda s: log(f"[speed] {s}"),
                           images=images)
    memory["bench_peak_rss_anon_mb"] = round(bench_mem.peak_mb, 1)
    weights = weight_bytes(llm)
    ranks = rank_memory(llm)
    del llm

    result = {
        "benchmark": "speed",
        "build": build_label(path, cfg),
        "model": str(path),
        "config": {**asdict(cfg), "tg_prompt_len": TG_PROMPT_LEN, "max_model_len_used": mml},
        "metrics": summarize(measured["runs"]),
        "runs": measured["runs"],
        "load_s": round(load_s, 3),
        "import_vllm_s": round(import_s, 3),
        "memory_phases": memory,
        "ranks": ranks,
        "weights": weights,
        "timings": measured["timings"],
        "engine": edge.describe(),
        "pinning": pinning,
        "bytes_per_token": acc.to_dict(),
        "bandwidth": ceiling,
        "provenance": provenance.collect(model=path, threads=(pinning or {}).get("threads"),
                                         extra={"core_set_pinned": (pinning or {}).get("cores")}),
    }
    result["traffic"] = traffic(result, acc, tg_contexts(cfg), ceiling)
    return atomic.write_result(out, result)


def metric_line(result: dict) -> dict:
    """The one JSON object a grid arm prints: medians, load time and peak memory only,
    so the grid does not rank configuration numbers."""
    line: dict[str, Any] = {"benchmark": "speed", "build": result["build"]}
    for k, s in result["metrics"].items():
        line[k] = s["median"]
    line["load_s"] = result["load_s"]
    line["peak_rss_anon_mb"] = max(result["memory_phases"].values())
    rank_mb = [r["rss_anon_mb"] for r in result.get("ranks") or [] if r.get("rss_anon_mb") is not None]
    if rank_mb:  # what one machine of a split would have to hold
        line["largest_rank_rss_anon_mb"] = max(rank_mb)
    # Derived figures, named so that the grid gives them no direction and never ranks them.
    for i, (key, t) in enumerate((result.get("traffic") or {}).items()):
        prefix = "" if i == 0 else key[:-len("_tps")] + "_"
        for field in ("bytes_per_token", "gb_per_s_effective", "pct_of_ceiling"):
            line[prefix + field] = t[field]
    for k, v in (result.get("weights") or {}).items():
        line[k] = v
    if result.get("out"):
        line["out"] = result["out"]
    return line


def format_table(result: dict) -> str:
    rows = stats.summary_rows(result["metrics"], "metric", 24, 10)
    rows.append(f"load {result['load_s']:.1f} s | memory " + ", ".join(
        f"{k}={v:.0f}" for k, v in result["memory_phases"].items()))
    bw = result.get("bandwidth") or {}
    ceiling = bw.get("ceiling_gb_per_s")
    for key, t in (result.get("traffic") or {}).items():
        pct = f" = {t['pct_of_ceiling']:.0f}% of {ceiling:.1f} GB/s" if ceiling else ""
        rows.append(f"{key}: {t['bytes_per_token'] / 1e6:.1f} MB/token (weights "
                    f"{t['weight_bytes'] / 1e6:.1f} + KV {t['kv_bytes'] / 1e6:.2f} at "
                    f"{t['context_tokens']:g} tokens) x median -> {t['gb_per_s_effective']:.2f} GB/s{pct}")
    if result.get("traffic") and not ceiling:
        rows.append(f"no bandwidth ceiling: {bw.get('reason', 'none given')}")
    elif ceiling:
        rows.append(f"ceiling from {bw.get('source')} ({bw.get('threads')} threads, cores {bw.get('cores')})")
    return "\n".join(rows)
