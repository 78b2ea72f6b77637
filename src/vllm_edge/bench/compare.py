"""`vllm-edge compare`: vLLM and llama.cpp side by side on matched builds.

Matched builds come from one bf16 directory: vLLM runs it as bf16 and as
``cpu_int4``; llama.cpp runs our BF16 GGUF export of the same directory and
llama.cpp's own Q4_K_M, Q4_0 and Q8_0 quantizations of that export.

One measurement core, no forks: speed and memory arms are `vllm-edge bench
speed` and the llama.cpp arm (both :func:`speed.measure`, same keys), run by
:func:`grid.run_grid` one process at a time, pinned to the same cores, rotated
over passes. Fidelity arms are `vllm-edge fidelity` (cpu_int4 against vLLM's
bf16) and :mod:`llamacpp_fidelity` (each quantized GGUF against the BF16
GGUF), also grid runs; for a GGUF file, also vLLM's repack scored against
llama.cpp running the file itself (the same-file row). :func:`render` turns the two grid summaries into
``docs/results/comparisons.md`` with one table per metric and PNG plots.

Before the measured passes every speed arm runs once ("prime", kept in
``prime.jsonl``) so vLLM's per-arm compile cache is warm and pass 0 is not a
cold start: ready time here is a warm start, as a user sees it from the second
run on.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from vllm_edge import envs
from vllm_edge.common import llamacpp_build
from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4
from vllm_edge.quant.groups import DEFAULT_GROUP

# (vLLM build, llama.cpp build) pairs ratios are quoted for; the first two are the goals'.
# "llamacpp-file" is the user's own GGUF file, run by llama.cpp as it is, beside vLLM's
# repack of that same file ("vllm-cpu_int4" when the model is a GGUF file).
FILE_ARM = "llamacpp-file"
# The same GGUF files under llama.cpp built with its AMX kernels (install.sh --llamacpp-amx), on
# a CPU with AMX: its fastest build there, run in processes of its own (docs/guide/llama-cpp.md).
AMX_PREFIX = "llamacpp-amx-"
GGUF_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")


def amx_twin(arm: str) -> str:
    """``llamacpp-Q4_0`` -> ``llamacpp-amx-Q4_0``: the same file under the AMX build."""
    return AMX_PREFIX + arm.removeprefix("llamacpp-")


PAIRS = (("vllm-bf16", "llamacpp-BF16"), ("vllm-cpu_int4", FILE_ARM), ("vllm-cpu_int4", "llamacpp-Q4_K_M"),
         ("vllm-cpu_int4", "llamacpp-Q4_0"), ("vllm-cpu_int4-g64", "llamacpp-Q4_K_M"),
         ("vllm-cpu_int4", amx_twin(FILE_ARM)), ("vllm-cpu_int4", amx_twin("llamacpp-Q4_K_M")),
         ("vllm-cpu_int4", amx_twin("llamacpp-Q4_0")), ("vllm-cpu_int4-g64", amx_twin("llamacpp-Q4_K_M")))
REF_ARM = "vllm-bf16 (reference)"
# A GGUF file: vLLM's repack of it scored against llama.cpp running the file itself.
SAME_REF_ARM = "llamacpp-file (same-file reference)"
SAME_ARM = "vllm-cpu_int4 vs llamacpp-file"
# A quantized GGUF file: both engines scored against llama.cpp on an F32 copy of the file (every
# tensor dequantized), the file's exact weights. The same-file row adds the two engines' roundings
# (llama.cpp's int8 activations in its quantized products, vLLM's bf16 ones); these two rows tell
# them apart.
EXACT_REF_ARM = "llamacpp-f32 copy (exact-weights reference)"
EXACT_FILE_ARM = "llamacpp-file vs exact weights"
EXACT_ARM = "vllm-cpu_int4 vs exact weights"
EXACT_REF = "llamacpp-f32 copy"
# Fidelity: each quantized build against its own engine's bf16 build, and the same-file rows.
REFERENCES = {"vllm-cpu_int4": "vllm-bf16", FILE_ARM: "llamacpp-BF16", SAME_ARM: FILE_ARM,
              EXACT_FILE_ARM: EXACT_REF, EXACT_ARM: EXACT_REF,
              **{f"llamacpp-{q}": "llamacpp-BF16" for q in GGUF_QUANTS}}
# reference arms: they save what the others are scored against, and are no row of their own
REF_ARMS = (REF_ARM, SAME_REF_ARM, EXACT_REF_ARM)

DEFAULT_PASSES = 3
DEFAULT_REPS = 1
DEFAULT_BATCH = 8
DEFAULT_OUT = "benchmarks/results/compare"
DEFAULT_OUT_1B = "benchmarks/results/compare_1b"
# `--quick`: the 4-bit arms the decode targets are stated in; no bf16, no fidelity.
QUICK_ARMS = ("vllm-cpu_int4", "vllm-cpu_int4-g64", FILE_ARM, "llamacpp-Q4_K_M", "llamacpp-Q4_0",
              amx_twin(FILE_ARM), amx_twin("llamacpp-Q4_K_M"), amx_twin("llamacpp-Q4_0"))
DEFAULT_DOC = "docs/results/comparisons.md"
# Bounded fidelity: 12 prompts x 32 greedy tokens, 4 corpus chunks x 512 (1,020 scored positions).
FIDELITY_GREEDY_TOKENS = 32
FIDELITY_CHUNKS = 4
ARM_TIMEOUT_S = 900
SYNTHETIC_1B = {"hidden": 2048, "layers": 16, "vocab": 49152}

METRIC_TITLES = {"tg": "Decode, one sequence", "pp": "Prompt processing", "b": "Batch throughput",
                 "load_s": "Ready time (import + engine construction)",
                 "peak_rss_anon_mb": "Peak RssAnon over the process tree"}

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
# The default model's and the 1B's runs, one directory per host under each base: a run on one
# host never replaces another's, and the page shows each host's tables apart.
MODEL_SECTIONS = ((DEFAULT_OUT, False, "SmolLM2-135M"),
                  (DEFAULT_OUT_1B, True, "Synthetic 1B Llama (random weights: speed and memory only)"))
# The whole of docs/results/comparisons.md: generated only (tests/test_docs_numbers.py).
PAGE_HEAD = """# vLLM (vllm-edge) and llama.cpp, side by side

Generated by `vllm-edge compare` from `benchmarks/results/compare/<host>/` and
`benchmarks/results/compare_1b/<host>/`: do not edit (`vllm-edge compare --render-only` redraws it
from the artifacts without measuring). Each host has its own section: no table mixes two machines.
How to run it: docs/guide/llama-cpp.md.
"""


def unpathed(text: str) -> str:
    """``text`` with every absolute path cut to its last part: a page names the file, not the
    directory it sat in on the measuring host."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError:
        return text
    return shlex.join(Path(w).name if os.path.isabs(w) else w for w in words)


def user_doc(title: str) -> str:
    """A new page for a model the user named (a GGUF file or a folder): one section."""
    title = Path(title).name if os.path.isabs(title) else title
    return (f"# vLLM (vllm-edge) and llama.cpp, side by side: {title}\n\nGenerated by `vllm-edge "
            f"compare`: do not edit (`--render-only` redraws it from the artifacts).\n\n{BEGIN}\n{END}\n")


# where a host's directory is named and how provenance names this machine: one place,
# common/provenance.py, that bench modules below this one use too
def host_slug(host: str) -> str:
    from vllm_edge.common import provenance

    return provenance.host_slug(host)


def this_host(cores: list[int] | None = None) -> str:
    from vllm_edge.common import provenance

    return provenance.this_host(cores)


def host_artifact(folder: str | Path, suffix: str = ".json") -> Path:
    """This host's file in an artifact folder, ``<folder>/<host slug><suffix>``: one file per
    host, so a run never replaces another host's."""
    return Path(folder) / f"{host_slug(this_host())}{suffix}"


def refuse_other_hosts_file(out: str | Path | None) -> None:
    """Before any measuring: a JSON artifact measured on another host is never replaced by this
    host's numbers (a table holds one host; docs/results/ are generated from these files).
    JSONL files are appended to; a folder is :func:`refuse_other_host`'s."""
    if not out or not str(out).endswith(".json"):
        return
    from vllm_edge.common.errors import UsageError

    kept = recorded_host(Path(out).parent, Path(out).name)
    if kept is not None and kept != this_host():
        raise UsageError(f"{out} holds a measurement on {kept}, and this host is another: one "
                         f"host's artifact is never replaced by another's. Pass --out with a new "
                         f"file, for example {host_artifact(Path(out).with_suffix(''))}")


SPEED_SUMMARY = "speed/summary.json"  # where a compare run keeps the summary that names its host


def recorded_host(out_dir: Path, summary: str = SPEED_SUMMARY) -> str | None:
    """The host the run kept in ``out_dir`` was measured on (read from its ``summary`` file, a
    grid summary); None when it holds none."""
    from vllm_edge.common import provenance

    kept = _load(Path(out_dir) / summary)
    return provenance.host(kept.get("provenance")) if isinstance(kept, dict) else None


def refuse_other_host(out_dir: Path, host: str, summary: str = SPEED_SUMMARY) -> None:
    """A run never replaces another host's artifact (docs/results/README.md lists each);
    ``summary`` as for :func:`recorded_host` (other benchmarks that keep a run per host)."""
    from vllm_edge.common.errors import EdgeError

    kept = recorded_host(out_dir, summary)
    if kept is not None and kept != host:
        raise EdgeError(f"{out_dir}: holds a run measured on {kept}; this host is {host}. "
                        "A run never replaces another host's: pass --out with a directory of its own")


def host_dirs(base: Path) -> list[Path]:
    """Each host's run under ``base`` (one directory per host), by name."""
    base = Path(base)
    if not base.is_dir():
        return []
    return sorted(d for d in base.iterdir() if (d / "speed" / "summary.json").exists())


# --- builds ------------------------------------------------------------------

def gguf_dir(key: str) -> Path:
    return envs.home() / "models" / f"{key}-gguf"


def synthetic_dir(suffix: str = "") -> Path:
    # The name `vllm-edge models synthetic` users (and the 1B grid runs) give the 1B build.
    return envs.home() / "models" / f"synthetic-llama-1b{suffix}"


def is_user_model(model: str) -> bool:
    """A GGUF file or a model folder, not an embedded key."""
    from vllm_edge.models import store

    return not (model == "default" or model in store.MODELS)


def user_slug(model: str) -> str:
    """A short name for a user model's artifact directory: the file or folder name."""
    import re

    p = Path(model).expanduser()
    return re.sub(r"[^A-Za-z0-9._-]+", "-", p.stem if p.suffix.lower() == ".gguf" else p.resolve().name)


def builds(model: str = "default", synthetic_1b: bool = False) -> dict[str, Path]:
    """Where each matched build lives (whether or not it exists yet).

    A GGUF file: vLLM runs its bf16 import and its repack (the file's own types), llama.cpp runs the file
    itself (``llamacpp-file``) and its own quantizations of our BF16 export of the import. A
    bf16 model folder: as an embedded model, the folder is vLLM's bf16 build."""
    from vllm_edge.models import store
    from vllm_edge.models.gguf_export import quantized_path

    file = None
    if synthetic_1b:
        key, bf16 = "synthetic-llama-1b", synthetic_dir()
        out = {"vllm-bf16": bf16, "vllm-cpu_int4": synthetic_dir(f"-cpu_int4-g{DEFAULT_GROUP}"),
               "vllm-cpu_int4-g64": synthetic_dir("-cpu_int4-g64")}
    elif store.is_gguf(model):
        from vllm_edge.models import gguf_import

        file = Path(model).expanduser().resolve()
        if not file.is_file():
            raise store.ModelNotAvailable(f"{model}: no such GGUF file")
        sha = gguf_import.sha256_file(file)
        key = f"gguf-{sha[:16]}"
        out = {"vllm-bf16": store.gguf_build_dir(sha, None), "vllm-cpu_int4": store.gguf_build_dir(sha, CPU_INT4)}
    elif is_user_model(model):
        from vllm_edge.quant.quantize import read_source_config

        src = store.resolve_model_path(model).resolve()
        read_source_config(src)  # a bf16 folder of a supported architecture; names what is not
        sha = store.folder_sha256(src)
        key = f"hf-{sha[:16]}"
        out = {"vllm-bf16": src, "vllm-cpu_int4": store.folder_build_dir(sha, CPU_INT4, DEFAULT_GROUP)}
    else:
        m = store.resolve_key(model)
        key, bf16 = m.key, store.prepared_dir(m)
        out = {"vllm-bf16": bf16, "vllm-cpu_int4": store.quantized_dir(m, CPU_INT4, DEFAULT_GROUP)}
    if file is not None:
        out[FILE_ARM] = file
    if file is None or exports(file):
        bf16_gguf = gguf_dir(key) / f"{key}.bf16.gguf"
        out["llamacpp-BF16"] = bf16_gguf
        out.update({f"llamacpp-{q}": quantized_path(bf16_gguf, q) for q in GGUF_QUANTS})
    if llamacpp_build.amx_build_dir() is not None:
        out.update({amx_twin(k): v for k, v in list(out.items()) if k.startswith("llamacpp-") and k != "llamacpp-BF16"})
    return out


def exports(file: Path) -> bool:
    """Whether our GGUF exporter writes this file's architecture (Llama only), so llama.cpp can
    also run its own quantizations of the bf16 import; other families compare on the file alone."""
    from vllm_edge.models import gguf_import

    try:
        return gguf_import.inspect_gguf(file).architecture == "llama"
    except gguf_import.GgufImportError:
        return True  # not readable: the import names what is wrong with it, when it runs


def select(paths: dict[str, Path], arms: list[str] | None) -> dict[str, Path]:
    """The builds of the named arms (all when ``arms`` is None); unknown names are an error."""
    if arms is None:
        return paths
    unknown = [a for a in arms if a not in paths]
    if unknown:
        from vllm_edge.common.errors import UsageError

        raise UsageError(f"--arms: unknown arm(s) {', '.join(unknown)}; this run has {', '.join(paths)}")
    return {k: v for k, v in paths.items() if k in arms}


def prepare(model: str = "default", synthetic_1b: bool = False, progress: bool = True,
            arms: list[str] | None = None) -> dict[str, Path]:
    """Create every missing build the selected arms need (bf16, cpu_int4, GGUF export and
    llama.cpp's quantizations); returns the selected builds."""
    from vllm_edge.models import store
    from vllm_edge.models.gguf_export import export_gguf, quantize

    every = builds(model, synthetic_1b)
    paths = select(every, arms)
    if synthetic_1b:
        from vllm_edge.models import synthetic
        from vllm_edge.quant.quantize import quantize_model

        bf16 = every["vllm-bf16"]
        if not (bf16 / "config.json").exists():
            synthetic.build(bf16, synthetic.Shape.derive(**SYNTHETIC_1B),
                            tokenizer_from=store.prepare("default", progress=progress), progress=progress)
        for name, group in (("vllm-cpu_int4", DEFAULT_GROUP), ("vllm-cpu_int4-g64", 64)):
            if name in paths and not (paths[name] / "config.json").exists():
                quantize_model(bf16, paths[name], scheme=CPU_INT4, group=group, progress=progress)
    elif store.is_gguf(model):
        if "vllm-bf16" in paths or "llamacpp-BF16" in every:
            store.ensure_gguf(model, None)  # the llama.cpp BF16 export is made from it
        if "vllm-cpu_int4" in paths:
            store.ensure_gguf(model, CPU_INT4)
    elif is_user_model(model):
        if "vllm-cpu_int4" in paths:
            store.prepare_folder(every["vllm-bf16"], CPU_INT4, DEFAULT_GROUP, progress=progress)
    else:
        store.prepare(model, progress=progress)
        if "vllm-cpu_int4" in paths:
            store.prepare_quantized(model, CPU_INT4, DEFAULT_GROUP, progress=progress)
    bf16_gguf = every.get("llamacpp-BF16")
    if bf16_gguf is None:  # a family our exporter does not write: the file is llama.cpp's only build
        return paths
    # the file arm alone needs the BF16 export only as the fidelity reference (a full run)
    need_bf16 = any(k.startswith("llamacpp-") and k not in (FILE_ARM, amx_twin(FILE_ARM)) for k in paths) or \
        (FILE_ARM in paths and arms is None)
    if need_bf16 and not bf16_gguf.exists():
        export_gguf(every["vllm-bf16"], bf16_gguf, progress=progress)
    for q in GGUF_QUANTS:
        arm = f"llamacpp-{q}"
        if (arm in paths or amx_twin(arm) in paths) and not every[arm].exists():
            quantize(bf16_gguf, every[arm], q)
    return paths


# --- grid specs ----------------------------------------------------------------

def speed_metrics(prompt_len: int = 512, tg_tokens: int = 128, batch: int = DEFAULT_BATCH) -> list[str]:
    from vllm_edge.bench import speed

    return [speed.tg_key(tg_tokens), speed.pp_key(prompt_len), speed.batch_key(batch), "load_s",
            "peak_rss_anon_mb"]


def build_spec(paths: dict[str, Path], *, threads: int, cores: list[int] | None = None,
               prompt_len: int = 512, tg_tokens: int = 128, batch: int = DEFAULT_BATCH,
               reps: int = DEFAULT_REPS, no_mmap: bool = True, enforce_eager: bool = False,
               python: str = "python") -> dict:
    """Speed/memory arms. llama.cpp reads its weights into anonymous memory (``--no-mmap``), as
    vLLM holds them, so peak RssAnon counts the weights on both sides."""
    common = ["--threads", str(threads), "--prompt-len", str(prompt_len), "--tg-tokens", str(tg_tokens),
              "--reps", str(reps), "--batch", str(batch)]
    arms = []
    amx = llamacpp_build.amx_build_dir() if any(n.startswith(AMX_PREFIX) for n in paths) else None
    for name, path in paths.items():
        if name.startswith("vllm-"):
            cmd = [python, "-m", "vllm_edge.cli", "bench", "speed", "--model", str(path), *common]
            if enforce_eager:
                cmd.append("--enforce-eager")
        else:
            cmd = [python, "-m", "vllm_edge.cli", "bench", "llamacpp", "--gguf", str(path), *common]
            if no_mmap:
                cmd.append("--no-mmap")
        arm = {"name": name, "cmd": cmd}
        if name.startswith(AMX_PREFIX):
            if amx is None:
                from vllm_edge.common.errors import EdgeError

                raise EdgeError(f"{name}: no llama.cpp AMX build here (scripts/install.sh --llamacpp-amx, "
                                "on a CPU with AMX)")
            arm["env"] = {"LLAMA_CPP_LIB_PATH": str(amx)}
        arms.append(arm)
    spec = {"name": "compare-speed", "threads": threads, "model": str(next(iter(paths.values()))),
            "metrics": speed_metrics(prompt_len, tg_tokens, batch), "timeout_s": ARM_TIMEOUT_S,
            "arms": arms}
    if cores:
        spec["cores"] = cores
    return spec


FIDELITY_METRICS = ["exact_matches", "kept_fraction", "first_token_agreement", "top1_agreement",
                    "kl_mean", "kl_median", "kl_p99", "delta_logprob", "coverage", "kl_full_mean"]


def fidelity_spec(paths: dict[str, Path], *, ref_dir: Path, out_dir: Path, threads: int,
                  greedy_tokens: int = FIDELITY_GREEDY_TOKENS, chunks: int = FIDELITY_CHUNKS,
                  python: str = "python") -> dict:
    """Each engine's quantized builds against its own bf16 build, same prompts and corpus; for a
    GGUF file, also vLLM's repack against llama.cpp on the file itself (the same-file row, the
    only one a family our export does not write gets).

    vLLM runs eager here: fidelity does not depend on compilation, and two cold compiles
    would double the budget. Each reference arm comes before the arms it scores; one pass keeps
    spec order."""
    from vllm_edge.bench.fidelity import defaults as fidelity

    common = ["--corpus-chunks", str(chunks), "--greedy-tokens", str(greedy_tokens)]
    kl = ["--kl-k", str(fidelity.DEFAULT_KL_K)]
    arms = []
    if "vllm-bf16" in paths and "vllm-cpu_int4" in paths:
        arms += [{"name": REF_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                           str(paths["vllm-bf16"]), "--save-ref", str(ref_dir), *common,
                                           "--enforce-eager"]},
                 {"name": "vllm-cpu_int4", "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                                   str(paths["vllm-cpu_int4"]), "--ref", str(ref_dir), *kl,
                                                   "--out", str(out_dir / "vllm-cpu_int4.json"), *common,
                                                   "--enforce-eager"]}]
    if "llamacpp-BF16" in paths and "vllm-bf16" in paths:  # the bf16 build's tokenizer makes the ids
        for name in [n for n in (FILE_ARM, *(f"llamacpp-{q}" for q in GGUF_QUANTS)) if n in paths]:
            arms.append({"name": name, "cmd": [
                python, "-m", "vllm_edge.cli", "bench", "llamacpp-fidelity", "--ref",
                str(paths["llamacpp-BF16"]), "--cand", str(paths[name]), "--tokenizer", str(paths["vllm-bf16"]),
                "--greedy-tokens", str(greedy_tokens), "--chunks", str(chunks), *kl,
                "--threads", str(threads), "--out", str(out_dir / f"{name}.json")]})
    if FILE_ARM in paths and "vllm-cpu_int4" in paths:
        same_ref = ref_dir.with_name(ref_dir.name + "-same-file")
        # the repack's tokenizer makes the ids: the one vLLM serves the file with
        arms += [{"name": SAME_REF_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--engine", "llama.cpp",
                                                "--model", str(paths[FILE_ARM]), "--tokenizer",
                                                str(paths["vllm-cpu_int4"]), "--save-ref", str(same_ref),
                                                "--out", str(out_dir / fidelity_file(SAME_REF_ARM)), *common]},
                 {"name": SAME_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                            str(paths["vllm-cpu_int4"]), "--ref", str(same_ref), *kl,
                                            "--out", str(out_dir / fidelity_file(SAME_ARM)),
                                            *common, "--enforce-eager"]}]
        from vllm_edge.bench.engines.llamacpp import is_quantized

        if is_quantized(paths[FILE_ARM]):  # a float file's own weights are already exact
            exact_ref = ref_dir.with_name(ref_dir.name + "-exact-weights")
            arms += [{"name": EXACT_REF_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--engine",
                                                     "llama.cpp", "--dequantized", "--model",
                                                     str(paths[FILE_ARM]), "--tokenizer",
                                                     str(paths["vllm-cpu_int4"]), "--save-ref", str(exact_ref),
                                                     *common]},
                     {"name": EXACT_FILE_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--engine",
                                                      "llama.cpp", "--model", str(paths[FILE_ARM]), "--tokenizer",
                                                      str(paths["vllm-cpu_int4"]), "--ref", str(exact_ref), *kl,
                                                      "--out", str(out_dir / fidelity_file(EXACT_FILE_ARM))]},
                     {"name": EXACT_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                                 str(paths["vllm-cpu_int4"]), "--ref", str(exact_ref), *kl,
                                                 "--out", str(out_dir / fidelity_file(EXACT_ARM)),
                                                 "--enforce-eager"]}]
    return {"name": "compare-fidelity", "threads": threads, "model": str(next(iter(paths.values()))),
            "metrics": FIDELITY_METRICS, "timeout_s": ARM_TIMEOUT_S,
            "arms": arms}


# --- judging pairs -------------------------------------------------------------

def pair_verdict(metric: str, vllm: dict, llama: dict) -> dict:
    """Ratio of medians (vLLM / llama.cpp) and who is ahead, judged by :func:`stats.rank`:
    overlapping [min, max] ranges, or fewer than 2 runs a side, are NOT A RANKING."""
    from vllm_edge.common import stats

    if vllm.get("median") is None or llama.get("median") is None:
        return {"ratio": None, "verdict": "not measured on both engines"}
    ratio = vllm["median"] / llama["median"] if llama["median"] else None
    r = stats.rank({"vllm": copy.deepcopy(vllm), "llama.cpp": copy.deepcopy(llama)}, metric)
    # the pair's own verdict (stats.pair_flags), as everywhere a ratio is shown: it also names
    # fewer than three passes
    pair = stats.pair_flags(vllm, llama) if all(k in vllm and k in llama for k in ("min", "max")) else []
    if r["direction"] is None:
        verdict = "no direction"
    elif stats.NOT_A_RANKING in r["flags"] or stats.NOT_A_RANKING in pair:
        verdict = stats.NOT_A_RANKING
    else:
        verdict = f"{'vLLM' if r['leader'] == 'vllm' else 'llama.cpp'} ahead"
    extra = [f for f in pair if f != stats.NOT_A_RANKING]
    return {"ratio": ratio, "verdict": "; ".join([verdict, *extra])}


def fmt_ratio(v: dict) -> str:
    if v["ratio"] is None:
        return v["verdict"]
    return f"{v['ratio']:.2f}× ({v['verdict']})"


# --- the document ----------------------------------------------------------------

def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a missing file, or one that is not JSON (nor text)
        return None


def _link(path: Path, doc_path: Path) -> str:
    rel = os.path.relpath(path, doc_path.parent)
    return f"[`{path}`]({rel})"


def _metric_title(m: str) -> str:
    for prefix, title in METRIC_TITLES.items():
        if m == prefix or (m.startswith(prefix) and m[len(prefix):len(prefix) + 1].isdigit()):
            return f"{title} (`{m}`)"
    return f"`{m}`"


def _batch_note(records: list[dict]) -> str | None:
    """Why a llama.cpp arm has no batch number: artifacts from before the arm decoded
    batches carry the reason as a string ``batch`` field, shown in place of a ratio."""
    for r in records:
        note = (r.get("output") or {}).get("batch")
        if isinstance(note, str):
            return note
    return None


def _arm_build(records: list[dict], prefix: str, exclude: str | None = None) -> dict | None:
    """The llama.cpp build the first arm named ``prefix``* (not ``exclude``*) reported in its
    metric line."""
    for r in records:
        out, arm = r.get("output"), str(r.get("arm", ""))
        if (arm.startswith(prefix) and not (exclude and arm.startswith(exclude))
                and isinstance(out, dict) and out.get("llama_cpp_build")):
            return out["llama_cpp_build"]
    return None


def plain_build(prov: dict, records: list[dict]) -> dict | None:
    """The environment's llama.cpp build: as the run's provenance names it, or, where the
    compare process never loaded llama.cpp (a speed-only run), as its llama.cpp arms
    reported it."""
    return prov.get("llama_cpp") or _arm_build(records, "llamacpp-", exclude=AMX_PREFIX)


def llamacpp_build_line(build: dict | None) -> str:
    """The llama.cpp build a run's provenance names, in one line: on an AMX CPU the same
    llama.cpp is several times faster with its AMX kernels in, so a figure without this is
    not comparable."""
    if not build:
        return "not recorded"
    if build.get("error"):
        return f"not readable ({build['error']})"
    cpu = (build.get("features") or {}).get("CPU") or {}
    isa = [k for k, v in cpu.items() if v == 1 and (k.startswith("AVX") or k.startswith("AMX"))]
    amx = {True: "in", False: "not in", None: "unknown"}[build.get("amx_kernels")]
    args = build.get("cmake_args")
    shown = (f"`{args}`" if args else "none (llama-cpp-python's default build)" if args == "" else
             build.get("cmake_args_source") or "not recorded")
    head = f"ggml {build['ggml']} ({build.get('ggml_commit')})" if build.get("ggml") else \
        f"ggml {build.get('ggml_commit')}"
    compiled = f", compiled for {', '.join(isa) or 'no AVX'}" if "features" in build else ""
    return f"{head}, AMX kernels {amx}{compiled}; CMAKE_ARGS {shown}"


def render(out_dir: Path, doc_path: Path, display_dir: str | None = None) -> tuple[str, list[Path]]:
    """The generated markdown section and the PNGs written, from ``out_dir``'s grid summaries."""
    from vllm_edge.bench import render as bench_render
    from vllm_edge.common import provenance, stats

    shown = Path(display_dir or out_dir)
    speed_path, fid_path = out_dir / "speed" / "summary.json", out_dir / "fidelity" / "summary.json"
    speed = _load(speed_path)
    if speed is None:
        raise FileNotFoundError(f"{speed_path}: no compare speed summary (run `vllm-edge compare` first)")
    fid = _load(fid_path)
    run_meta = _load(out_dir / "compare.json") or {}
    spath, fpath = shown / "speed" / "summary.json", shown / "fidelity" / "summary.json"
    records = [json.loads(x) for x in (out_dir / "speed" / "results.jsonl").read_text().splitlines()
               if x.strip()] if (out_dir / "speed" / "results.jsonl").exists() else []
    llama_arms = [a["name"] for a in speed["arms"] if a["name"].startswith("llamacpp-")]
    batch_note = _batch_note([r for r in records if r.get("arm") in llama_arms])

    prov = speed.get("provenance") or {}
    vers = prov.get("versions") or {}
    lines = [f"_Generated by `vllm-edge compare` from {_link(spath, doc_path)}"
             + (f" and {_link(fpath, doc_path)}" if fid else "") + "; edit outside the markers._", ""]
    if run_meta.get("smoke"):
        lines += ["**SMOKE RUN: proves the pipeline only. These numbers are not results.**", ""]
    lines += ["### How this was run", "",
              f"- command: `{unpathed(run_meta.get('command', 'vllm-edge compare'))}`"
              + (f", {run_meta['wall_s'] / 60:.1f} min wall" if run_meta.get("wall_s") else ""),
              f"- host: **{provenance.host(prov) or 'not recorded'}** (every table below), cores "
              f"{speed.get('cores')}, {prov.get('threads')} threads for every arm; load average at the end "
              f"{prov.get('loadavg')}",
              f"- commit: `{str((prov.get('build') or {}).get('vllm_edge_git') or 'not recorded')[:7]}`"
              + "".join(f" (**{f}**)" for f in provenance.commit_flags(prov)),
              f"- started {run_meta.get('started')}; phases (s): {run_meta.get('phases')}",
              *([f"- {FILE_ARM} is `{Path(run_meta['builds'][FILE_ARM]).name}` as given, and vllm-cpu_int4 its "
                 "repack (every tensor's codes kept: cpu_int4 and cpu_int8, mixed per layer as in the file)"] if FILE_ARM in (run_meta.get("builds") or {}) else []),
              f"- {speed.get('passes')} passes over {len(speed['arms'])} arms, order rotated each pass, "
              f"each arm a fresh process (its own `VLLM_CACHE_ROOT`, warmed by one unmeasured run first)",
              f"- versions: vllm-cpu {vers.get('vllm-cpu')}, torch {vers.get('torch')}, llama-cpp-python "
              f"{vers.get('llama-cpp-python')}, vllm-edge {vers.get('vllm-edge')}",
              f"- llama.cpp build: {llamacpp_build_line(plain_build(prov, records))}",
              *([f"- {AMX_PREFIX}* arms: the same files under llama.cpp with its AMX kernels, "
                 f"{llamacpp_build_line(amx_build)}"] if (amx_build := _arm_build(records, AMX_PREFIX)) else []),
              f"- busy passes (another load on the target cores): {speed.get('busy_passes') or 'none'}", ""]
    for a, c in speed["runs"].items():
        if c["failed"]:
            lines += [f"- **{a}: {c['failed']} failed run(s)**, stderr tails in {_link(shown / 'speed' / 'results.jsonl', doc_path)}"]

    # Headline: the ratios the project's goals are stated in.
    pairs = list(PAIRS)
    metrics = list(speed["metrics"])
    lines += ["", "### Headline ratios (vLLM / llama.cpp, medians)", "",
              "Above 1 is more for vLLM: better for tokens/s, worse for seconds and MB. The verdict "
              "column says who is ahead outside the noise, or NOT A RANKING when the two arms' "
              "min–max ranges overlap.", ""]
    rows = []
    for v, l in pairs:
        for m in metrics:
            arms = speed["metrics"][m]["arms"]
            if v not in arms or l not in arms:
                continue
            if arms[l].get("median") is None and m.startswith("b") and batch_note:
                rows.append([f"{v} / {l}", m, arms[v].get("median"), None, f"llama.cpp arm: {batch_note}"])
                continue
            pv = pair_verdict(m, arms[v], arms[l])
            rows.append([f"{v} / {l}", m, arms[v].get("median"), arms[l].get("median"),
                         fmt_ratio(pv)])
    fid_rows = _fidelity_rows(fid, out_dir / "fidelity", shown / "fidelity") if fid else []
    fid_by = {r["arm"]: r for r in fid_rows}
    if "vllm-cpu_int4" in fid_by and "llamacpp-Q4_K_M" in fid_by:
        a, b = fid_by["vllm-cpu_int4"], fid_by["llamacpp-Q4_K_M"]
        for k in ("kl_mean", "top1_agreement"):
            if a.get(k) is not None and b.get(k) is not None:
                ratio = a[k] / b[k] if b[k] else None
                d = stats.direction(k)
                better = (a[k] < b[k]) if d == "lower" else (a[k] > b[k])
                who = "equal" if a[k] == b[k] else ("vLLM closer to its bf16" if better
                                                    else "llama.cpp closer to its bf16")
                rows.append(["vllm-cpu_int4 / llamacpp-Q4_K_M", f"fidelity {k} (each vs own bf16)",
                             a[k], b[k], f"{ratio:.2f}× ({who})" if ratio is not None else who])
    if SAME_ARM in fid_by:
        for k in ("top1_agreement", "kl_mean"):
            if fid_by[SAME_ARM].get(k) is not None:
                rows.append([SAME_ARM, f"same-file fidelity {k}", fid_by[SAME_ARM][k], None,
                             "vLLM's repack scored against llama.cpp on the file"])
    if EXACT_ARM in fid_by and EXACT_FILE_ARM in fid_by:
        rows += exact_rows(fid_by[EXACT_ARM], fid_by[EXACT_FILE_ARM])
    lines += bench_render.table(["pair", "metric", "vLLM", "llama.cpp", "ratio (verdict)"], rows)
    lines += ["", f"Source: {_link(spath, doc_path)}" + (f", {_link(fpath, doc_path)}" if fid else ""), ""]
    wins = [r for r in rows if "llama.cpp ahead" in str(r[-1]) or "llama.cpp closer" in str(r[-1])]
    if wins:
        lines += ["**Where llama.cpp wins:** " + "; ".join(f"{r[1]} ({r[0]}, {r[-1].split(' (')[0]})"
                                                          for r in wins) + ".", ""]
    else:
        lines += ["**Where llama.cpp wins:** nowhere outside the noise in this run.", ""]

    # One table per metric.
    written: list[Path] = []
    for m in metrics:
        block = speed["metrics"][m]
        lines += [f"### {_metric_title(m)}", ""]
        rows = []
        for arm, s in block["arms"].items():
            ratios = [f"vs {l.removeprefix('llamacpp-')}: {fmt_ratio(pair_verdict(m, s, block['arms'][l]))}"
                      for v, l in pairs if v == arm and l in block["arms"]]
            flags = [f for f in s.get("flags") or [] if f != "no successful run"]
            note = ("; ".join(ratios) if ratios else "–")
            if s.get("median") is None:
                note = f"not measured: {batch_note}" if arm in llama_arms and batch_note else "no successful run"
            rows.append([arm, s.get("best"), s.get("median"), s.get("min"), s.get("max"),
                         None if s.get("spread_pct") is None else f"{s['spread_pct']:.1f}%", s.get("n"),
                         " · ".join(flags) or "–", note])
        lines += bench_render.table(["build", "best", "median", "min", "max", "spread", "n", "flags",
                                "ratio to llama.cpp (verdict)"], rows)
        rk = block.get("ranking") or {}
        if rk.get("flags"):
            lines += ["", f"Grid ranking over all arms: {' · '.join(rk['flags'])} "
                          f"(top two: {', '.join(rk.get('order', [])[:2])})."]
        elif rk.get("leader"):
            lines += ["", f"Grid ranking over all arms: {rk['leader']} leads."]
        if m == "peak_rss_anon_mb":
            lines += ["", "llama.cpp runs with `--no-mmap`, so its weights are anonymous memory as "
                          "vLLM's are; with its default mmap they would be file-backed pages outside RssAnon."]
        lines += ["", f"Source: {_link(spath, doc_path)}", ""]

    plot_arts = [bench_render.Artifact(str(spath), {"benchmark": "speed", "build": arm,
                                              "metrics": {m: speed["metrics"][m]["arms"][arm] for m in metrics}})
                 for arm in [a["name"] for a in speed["arms"]]]
    p = out_dir / "compare_speed.png"
    bench_render.plot_speed(plot_arts, p)
    written.append(p)
    lines += [f"![speed, ready time and memory per build]({os.path.relpath(p, doc_path.parent)})", "",
              f"Source: {_link(spath, doc_path)}", ""]

    lines += ["### Fidelity, each engine against its own bf16"
              + (", and vLLM against llama.cpp on the same file" if SAME_ARM in fid_by else "")
              + (", and both against the file's exact weights" if EXACT_ARM in fid_by else ""), ""]
    if fid_rows:
        # arms scored against a saved reference take its length; the ones that save it name it
        fcmd = next((a["cmd"] for a in fid["arms"] if "--greedy-tokens" in a["cmd"]), [])
        gt = fcmd[fcmd.index("--greedy-tokens") + 1] if fcmd else "?"
        positions = next((r["positions"] for r in fid_rows if r.get("positions")), "?")
        kl_k = next((r["kl_k"] for r in fid_rows if r.get("kl_k")), "?")
        lines += [f"The 12 fidelity prompts (chat, long-context, tool calls), {gt} greedy tokens each; "
                  f"teacher-forced over {positions} corpus positions (pydoc topics), "
                  "the same token ids for every build of an engine. KL is over the reference's "
                  f"top-{kl_k} ids plus a tail bucket on both engines "
                  "(`KL full mean`, llama.cpp only, is the exact full-vocabulary KL). vLLM runs eager "
                  "for fidelity. One run per build: these are deterministic, not timings."
                  + (" The exact weights are llama.cpp on an F32 copy of the file, every tensor "
                     "dequantized: each engine's distance from them is its own arithmetic on the "
                     "weights it was given (llama.cpp rounds activations to 8 bits in its quantized "
                     "products, vLLM to bf16)." if EXACT_ARM in fid_by else ""), ""]
        rows = []
        for r in fid_rows:
            ratio = "–"
            if r["arm"] == "vllm-cpu_int4" and "llamacpp-Q4_K_M" in fid_by:
                ratio = fmt_ratio({"ratio": (r["kl_mean"] / fid_by["llamacpp-Q4_K_M"]["kl_mean"]
                                             if fid_by["llamacpp-Q4_K_M"].get("kl_mean") else None),
                                   "verdict": "KL vs Q4_K_M's"})
            elif r["arm"] == EXACT_ARM and EXACT_FILE_ARM in fid_by and r.get("kl_mean") is not None:
                ratio = fmt_ratio({"ratio": (r["kl_mean"] / fid_by[EXACT_FILE_ARM]["kl_mean"]
                                             if fid_by[EXACT_FILE_ARM].get("kl_mean") else None),
                                   "verdict": "KL vs llama.cpp's on the file"})
            rows.append([r["arm"], r["reference"], r.get("exact_str") or r.get("exact_matches"), r.get("kept_fraction"),
                         r.get("first_token_agreement"), r.get("top1_agreement"), r.get("kl_mean"),
                         r.get("kl_p99"), r.get("delta_logprob"), r.get("coverage"), r.get("kl_full_mean"),
                         ratio, f"`{r['artifact']}`" if r.get("artifact") else "–"])
        lines += bench_render.table(["build", "reference", "greedy exact", "kept", "first-token top-1", "top-1",
                                "KL mean", "KL p99", "Δ log-prob", "coverage", "KL full mean",
                                "KL ratio to llama.cpp", "artifact"], rows)
        agree = tokenizer_line(out_dir / "fidelity")
        lines += ["", *([agree, ""] if agree else []), f"Source: {_link(fpath, doc_path)}", ""]
        arts = [bench_render.Artifact(str(fpath), {"build": r["arm"], "teacher_forced": r}) for r in fid_rows
                if r.get("kl_mean") is not None]
        if arts:
            p = out_dir / "compare_fidelity.png"
            bench_render.plot_fidelity(arts, p)
            written.append(p)
            lines += [f"![fidelity per build]({os.path.relpath(p, doc_path.parent)})", "",
                      f"Source: {_link(fpath, doc_path)}", ""]
        for a, c in (fid.get("runs") or {}).items():
            if c["failed"]:
                lines += [f"- **{a}: fidelity run failed**; stderr tail in "
                          f"{_link(shown / 'fidelity' / 'results.jsonl', doc_path)}", ""]
    else:
        lines += ["Not measured in this run (`--skip-fidelity`, or random weights: `--synthetic-1b`).", ""]
    return "\n".join(lines).rstrip() + "\n", written


def tokenizer_agreement(fid_dir: Path) -> dict | None:
    """What the same-file reference arm found comparing llama.cpp's tokenizer of the file with
    ours on the prompts (None: no such run)."""
    return (_load(fid_dir / fidelity_file(SAME_REF_ARM)) or {}).get("tokenizer_agreement")


def tokenizer_line(fid_dir: Path) -> str | None:
    t = tokenizer_agreement(fid_dir)
    if not t:
        return None
    return (f"Tokenizers: llama.cpp's own tokenizer of the file gives the token ids ours gives on "
            f"{t['identical']} of {t['prompts']} prompts (the chat template's text, special tokens "
            "parsed; a base model's plain text with each side's own BOS setting)"
            + (f"; differs on {', '.join(t['differs_on'])}." if t.get("differs_on") else "."))


def exact_rows(vllm: dict, llama: dict) -> list[list]:
    """Headline rows: each engine's distance from the file's exact weights, and which is closer."""
    from vllm_edge.common import stats

    rows = []
    for k in ("top1_agreement", "kl_mean"):
        a, b = vllm.get(k), llama.get(k)
        if a is None or b is None:
            continue
        better = (a < b) if stats.direction(k) == "lower" else (a > b)
        who = "equal" if a == b else ("vLLM closer to the exact weights" if better
                                      else "llama.cpp closer to the exact weights")
        ratio = a / b if b else None
        rows.append(["vllm-cpu_int4 / llamacpp-file", f"fidelity {k} (each vs the file's exact weights)", a, b,
                     f"{ratio:.2f}× ({who})" if ratio is not None else who])
    return rows


def fidelity_file(arm: str) -> str:
    """The artifact a fidelity arm writes beside the summary."""
    return arm.replace(" ", "_") + ".json"


def _fidelity_rows(fid: dict, fid_dir: Path, shown_dir: Path) -> list[dict]:
    """One row per scored build: the grid's metric medians plus the arm's full artifact
    (``<arm>.json`` beside the fidelity summary)."""
    rows = []
    for arm in [a["name"] for a in fid.get("arms", [])]:
        if arm in REF_ARMS:
            continue
        row: dict[str, Any] = {"arm": arm, "reference": REFERENCES.get(arm, "–")}
        for m, block in fid["metrics"].items():
            row[m] = block["arms"].get(arm, {}).get("median")
        full = _load(fid_dir / fidelity_file(arm))
        if full:
            row["artifact"] = str(shown_dir / fidelity_file(arm))
            tf = full.get("teacher_forced") or {}
            row.update(positions=tf.get("positions"), kl_k=full.get("kl_k"),
                       exact_str=(full.get("greedy") or {}).get("exact_matches_str"))
        rows.append(row)
    return rows


def write_doc(out_dir: str | os.PathLike, doc: str | os.PathLike = DEFAULT_DOC,
              synthetic_1b: bool = False, title: str | None = None) -> dict:
    """Splice the rendered section of ``out_dir`` into ``doc``, a page with one compare section
    (a user model's own, or one given with --doc); ``title`` names a new page's model."""
    from vllm_edge.bench import render as bench_render
    from vllm_edge.common import atomic
    from vllm_edge.common.errors import EdgeError

    out_dir, doc_path = Path(out_dir), Path(doc)
    body, written = render(out_dir, doc_path, str(out_dir))
    old = doc_path.read_text() if doc_path.exists() else user_doc(title or out_dir.name)
    if BEGIN not in old:
        raise EdgeError(f"{doc_path}: has no {BEGIN} ... {END} section to write into; "
                        "pass --doc with a new file name")
    atomic.write_text(doc_path, bench_render.splice(old, body, BEGIN, END))
    return {"doc": str(doc_path), "plots": [str(p) for p in written]}


def page(results_dir: str | os.PathLike, doc: str | os.PathLike = DEFAULT_DOC) -> tuple[str, list[Path]]:
    """docs/results/comparisons.md whole, from every host's run of the default model and the 1B
    under ``results_dir`` (named as given, so the page names no machine path)."""
    results_dir, doc_path = Path(results_dir), Path(doc)
    parts, written = [PAGE_HEAD], []
    for base, _, title in MODEL_SECTIONS:
        for out in host_dirs(results_dir / Path(base).name):
            body, plots = render(out, doc_path, str(out))
            body = body.replace("; edit outside the markers._", "._", 1)  # this page is generated whole
            parts += [f"## {title}: {recorded_host(out) or 'host not recorded'}", "", body]
            written += plots
    return "\n".join(parts).rstrip() + "\n", written


def write_page(results_dir: str | os.PathLike, doc: str | os.PathLike = DEFAULT_DOC) -> dict:
    from vllm_edge.common import atomic

    text, written = page(results_dir, doc)
    atomic.write_text(Path(doc), text)
    return {"doc": str(doc), "plots": [str(p) for p in written]}


def is_shared_page(out_dir: Path, doc: Path) -> bool:
    """A run in a host directory under the default bases, drawn on the shared page."""
    return (Path(doc) == Path(DEFAULT_DOC)
            and any(Path(out_dir).parent == Path(base) for base, _, _ in MODEL_SECTIONS))


def draw(out_dir: Path, doc: Path, synthetic_1b: bool = False, title: str | None = None) -> dict:
    """Redraw the page a run belongs on: the shared page whole, or its own section."""
    if is_shared_page(out_dir, doc):
        return write_page(Path(out_dir).parent.parent, doc)
    return write_doc(out_dir, doc, synthetic_1b=synthetic_1b, title=title)


# --- the run ---------------------------------------------------------------------

def run(paths: dict[str, Path], *, out_dir: Path, doc: Path, passes: int = DEFAULT_PASSES,
        reps: int = DEFAULT_REPS, threads: int, cores: list[int], batch: int = DEFAULT_BATCH,
        prompt_len: int = 512, tg_tokens: int = 128, fidelity: bool = True, enforce_eager: bool = False,
        greedy_tokens: int = FIDELITY_GREEDY_TOKENS, chunks: int = FIDELITY_CHUNKS,
        allow_busy: bool = False, wait_lock: bool = False, lock_path: str | None = None,
        command: str = "vllm-edge compare", smoke: bool = False, synthetic_1b: bool = False,
        title: str | None = None, log: Callable[[str], None] | None = None) -> dict:
    from tqdm import tqdm

    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.common import atomic

    t_start, started = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    refuse_other_host(out_dir, this_host(cores))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = grid.default_work_dir("compare")
    spec = build_spec(paths, threads=threads, cores=cores, prompt_len=prompt_len, tg_tokens=tg_tokens,
                      batch=batch, reps=reps, enforce_eager=enforce_eager)
    fspec = fidelity_spec(paths, ref_dir=work / "fidelity-ref", out_dir=out_dir / "fidelity",
                          threads=threads, greedy_tokens=greedy_tokens, chunks=chunks) if fidelity else None
    if fspec and not fspec["arms"]:  # the selected arms make no scored pair
        fspec = None
    atomic.write_json(out_dir / "speed_spec.json", spec)
    if fspec:
        atomic.write_json(out_dir / "fidelity_spec.json", fspec)
    n_runs = len(spec["arms"]) * (1 + passes) + (len(fspec["arms"]) if fspec else 0)
    bar = tqdm(total=n_runs, desc="compare", unit="run", file=sys.stderr)
    say = log or bar.write

    def tick(rec: dict) -> None:
        bar.set_postfix_str(f"{rec['arm']} {'ok' if rec['ok'] else 'FAILED'} {rec['wall_s']:.0f}s")
        bar.update(1)

    phases: dict[str, float] = {}
    lock = grid.HostLock(lock_path or grid.DEFAULT_LOCK, wait=wait_lock)
    with lock:
        t0 = time.perf_counter()
        parsed = grid.load_spec(spec)
        pre = grid.contention(cores, grid.DEFAULT_BUSY_PCT)
        if pre["busy"] and not allow_busy:
            bar.close()
            raise grid.HostBusy(pre)
        atomic.write_text(out_dir / "prime.jsonl", "")
        for arm in parsed["arms"]:  # warm each arm's compile cache and the page cache; not measured
            bar.set_description(f"compare: warm-up {arm.name}")
            rec = grid.run_arm(arm, work / "cache" / grid.slugify(arm.name), cores, spec["timeout_s"])
            atomic.append_jsonl(out_dir / "prime.jsonl", [rec])
            tick(rec)
        phases["warmup_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        bar.set_description("compare: speed passes")
        summary = grid.run_grid(spec, passes, out_dir / "speed", work_dir=work, allow_busy=allow_busy,
                                lock_path=None, cores=cores, log=say, on_record=tick)
        phases["speed_s"] = round(time.perf_counter() - t0, 1)
        fsum = None
        if fspec:
            t0 = time.perf_counter()
            bar.set_description("compare: fidelity")
            fsum = grid.run_grid(fspec, 1, out_dir / "fidelity", work_dir=work, allow_busy=True,
                                 lock_path=None, cores=cores, log=say, on_record=tick)
            phases["fidelity_s"] = round(time.perf_counter() - t0, 1)
    bar.close()
    meta = {"command": command, "smoke": smoke, "started": started,
            "wall_s": round(time.perf_counter() - t_start, 1), "phases": phases, "work_dir": str(work),
            "builds": {k: str(v) for k, v in paths.items()}}
    atomic.write_json(out_dir / "compare.json", meta)
    written = draw(out_dir, doc, synthetic_1b=synthetic_1b, title=title)
    return {"speed": summary, "fidelity": fsum, "meta": meta, **written}
