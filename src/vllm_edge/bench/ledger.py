"""Memory ledger: attribute resident anonymous memory, do not subtract.

Runs inside the process that holds the weights (a vLLM worker, through the
worker extension). Every tensor storage is counted once (by ``data_ptr``) and
given a role; residency comes from ``mincore(2)``, because allocated is not
resident. What RssAnon holds beyond the attributed bytes is reported as
``unattributed_mb``: a finding to explain, not noise.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Iterable

from vllm_edge.common.errors import UsageError

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_bytes(addr: int, nbytes: int) -> int:
    """Bytes of [addr, addr+nbytes) whose pages are in RAM, by mincore(2)."""
    if nbytes <= 0:
        return 0
    start = addr - addr % PAGE
    length = addr + nbytes - start
    pages = (length + PAGE - 1) // PAGE
    vec = ctypes.create_string_buffer(pages)
    if _libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
        return -1  # not a mapped range (should not happen for live tensors)
    resident = sum(b & 1 for b in vec.raw)
    return min(nbytes, resident * PAGE)


def _workspaces() -> list[tuple[str, Any, bool]]:
    """Process-wide scratch tensors that are not module state: cpu_int4's dequantization
    workspace (quant/native.py), if that module was ever loaded here."""
    import sys

    native = sys.modules.get("vllm_edge.quant.native")
    ws = getattr(native, "_workspace", None)
    return [] if ws is None else [("cpu_int4.dequant_workspace", ws, True)]


def _role(name: str, tensor: Any, is_buffer: bool) -> str:
    if name == "cpu_int4.dequant_workspace":
        return "workspace"
    low = name.lower()
    if "embed_tokens" in low or "lm_head" in low or "wte" in low:
        return "embedding/head"
    if ".cpu_linear[" in name:
        return "packed weights"
    if is_buffer:
        return "buffers"
    if not tensor.dtype.is_floating_point:
        return "quantized weights"
    return "other weights"


def _storages(named: Iterable[tuple[str, Any, bool]]) -> dict[int, dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for name, t, is_buffer in named:
        if t is None or t.device.type != "cpu":
            continue
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if ptr == 0 or nbytes == 0:
            continue
        entry = seen.get(ptr)
        if entry is None:
            seen[ptr] = {"names": [name], "bytes": nbytes, "role": _role(name, t, is_buffer),
                         "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "ptr": ptr}
        else:
            entry["names"].append(name)
    return seen


def _packed_closures(model: Any) -> tuple[list[tuple[str, Any, bool]], dict[str, Any]]:
    """vLLM's CPU linear dispatch drops ``layer.weight`` and keeps a packed copy inside the
    ``cpu_linear`` closure: a tensor (sgl kernel) or an opaque oneDNN handle."""
    import torch

    tensors: list[tuple[str, Any, bool]] = []
    opaque = {"handles": 0, "estimated_mb": 0.0}
    for mod_name, mod in model.named_modules():
        fn = getattr(mod, "cpu_linear", None)
        if fn is None or fn is torch.nn.functional.linear:
            continue
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
        cells += list(getattr(fn, "__defaults__", None) or ())
        found_tensor = False
        for i, obj in enumerate(cells):
            if isinstance(obj, torch.Tensor):
                tensors.append((f"{mod_name}.cpu_linear[{i}]", obj, False))
                found_tensor = True
        if not found_tensor:
            n = getattr(mod, "output_size_per_partition", None) or getattr(mod, "output_size", 0)
            k = getattr(mod, "input_size_per_partition", None) or getattr(mod, "input_size", 0)
            elem = getattr(getattr(mod, "weight", None), "element_size", lambda: 2)()
            opaque["handles"] += 1
            opaque["estimated_mb"] += n * k * elem / 2**20
    opaque["estimated_mb"] = round(opaque["estimated_mb"], 1)
    return tensors, opaque


def anon_mappings(pid: int | None = None, top: int = 10) -> dict[str, Any]:
    """Anonymous memory per mapping from /proc/<pid>/smaps."""
    pid = os.getpid() if pid is None else pid
    maps, current = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split()
                current = {"range": parts[0], "path": parts[5] if len(parts) > 5 else "[anon]", "anon_kb": 0}
                maps.append(current)
            elif first == "Anonymous:" and current is not None:
                current["anon_kb"] = int(line.split()[1])
    maps.sort(key=lambda m: m["anon_kb"], reverse=True)
    return {"total_anon_mb": round(sum(m["anon_kb"] for m in maps) / 1024, 1), "mappings": len(maps),
            "largest": [{**m, "anon_mb": round(m.pop("anon_kb") / 1024, 1)} for m in maps[:top]]}


def ledger(model: Any, kv_caches: Iterable[Any] = (), top: int = 10) -> dict[str, Any]:
    from vllm_edge.common.procmem import rss_anon_kb

    named = [(n, p, False) for n, p in model.named_parameters(remove_duplicate=False)]
    named += [(n, b, True) for n, b in model.named_buffers(remove_duplicate=False)]
    packed, opaque = _packed_closures(model)
    named += packed
    named += _workspaces()
    storages = _storages(named)
    roles: dict[str, dict[str, float]] = {}
    tied_bytes = 0
    for s in storages.values():
        s["resident"] = resident_bytes(s["ptr"], s["bytes"])
        r = roles.setdefault(s["role"], {"allocated_mb": 0.0, "resident_mb": 0.0, "storages": 0})
        r["allocated_mb"] += s["bytes"] / 2**20
        r["resident_mb"] += max(s["resident"], 0) / 2**20
        r["storages"] += 1
        if len(s["names"]) > 1:
            tied_bytes += s["bytes"]
    kv = _storages((f"kv_cache.{i}", t, True) for i, t in enumerate(_flatten(kv_caches)))
    kv_alloc = sum(s["bytes"] for s in kv.values())
    kv_res = sum(max(resident_bytes(s["ptr"], s["bytes"]), 0) for s in kv.values())
    weights_res = sum(max(s["resident"], 0) for s in storages.values())
    rss = (rss_anon_kb(os.getpid()) or 0) * 1024
    largest = sorted(storages.values(), key=lambda s: s["bytes"], reverse=True)[:top]
    return {
        "pid": os.getpid(),
        "rss_anon_mb": round(rss / 2**20, 1),
        "roles": {k: {kk: round(vv, 1) if isinstance(vv, float) else vv for kk, vv in v.items()}
                  for k, v in roles.items()},
        "tied_mb": round(tied_bytes / 2**20, 1),
        "kv_cache": {"allocated_mb": round(kv_alloc / 2**20, 1), "resident_mb": round(kv_res / 2**20, 1),
                     "tensors": len(kv)},
        "largest_tensors": [{"names": s["names"], "dtype": s["dtype"], "shape": s["shape"],
                             "mb": round(s["bytes"] / 2**20, 2),
                             "resident_mb": round(max(s["resident"], 0) / 2**20, 2)} for s in largest],
        "anon_mappings": anon_mappings(top=top),
        # Opaque oneDNN handles hold a packed copy we cannot address; counted from shapes.
        "opaque_packed_handles": opaque,
        "attributed_mb": round((weights_res + kv_res) / 2**20 + opaque["estimated_mb"], 1),
        "unattributed_mb": round((rss - weights_res - kv_res) / 2**20 - opaque["estimated_mb"], 1),
    }


def _flatten(items: Iterable[Any]) -> list[Any]:
    out = []
    for it in items:
        if isinstance(it, (list, tuple)):
            out.extend(_flatten(it))
        elif hasattr(it, "untyped_storage"):
            out.append(it)
    return out


def bench(model: str = "default", context_len: int = 1024, max_model_len: int = 2048,
          multiprocess: bool = False, enforce_eager: bool = False, out: str | None = None) -> dict:
    """`vllm-edge bench ledger`: load, fill the KV cache with ``context_len`` tokens, attribute."""
    if context_len > max_model_len:
        raise UsageError(f"--context-len {context_len} is larger than --max-model-len {max_model_len}")
    from vllm_edge.bench import WORKER_EXTENSION
    from vllm_edge.common import atomic, provenance
    from vllm_edge.models.resolver import ensure_model
    from vllm_edge.runtime.engine import edge_engine

    path = ensure_model(model)
    edge = edge_engine(path, max_model_len=max_model_len, enforce_eager=enforce_eager,
                       one_process=not multiprocess, max_num_seqs=1, enable_prefix_caching=False,
                       worker_extension=WORKER_EXTENSION)
    edge.apply_env()
    from vllm import LLM, SamplingParams

    llm = LLM(**edge.kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(1000, 1000 + context_len - 8))}], params, use_tqdm=False)
    result = {"benchmark": "ledger", "context_len": context_len,
              "ledgers": llm.collective_rpc("vllm_edge_ledger"), "engine": edge.describe(),
              "provenance": provenance.collect(model=path)}
    del llm
    if out:
        atomic.write_json(out, result)
    return result
