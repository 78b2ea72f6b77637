"""Compile and run the QDQ graphs through onnxruntime's QNN execution provider.

``onnxruntime-qnn`` is a plugin EP for the stock ``onnxruntime`` wheel (module
``onnxruntime_qnn``): it ships Qualcomm's ``libQnnHtp.so`` and ``libHtpPrepare.so`` for Linux
x86_64, where the HTP backend compiles a graph for the Hexagon NPU and runs it on its x86
emulation. Compiling with ``ep.context_enable`` writes an EPContext model: a small ONNX file
whose ``EPContext`` nodes point at the QNN context binary (``*_qnn.bin``), the file a phone
loads without compiling again. Nodes the HTP cannot take stay as ordinary ONNX nodes in that
model (they would run on the CPU); counting them gives the placement.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from vllm_edge.models.npu.errors import NpuExportError

EP = "QNNExecutionProvider"
_registered = False
_lock = threading.Lock()


def _qnn():
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as exc:
        raise NpuExportError(f"the QNN path needs onnxruntime-qnn (the [npu] extra): {exc}") from None
    return ort, onnxruntime_qnn


def devices() -> list:
    """The QNN EP's devices (registers the plugin library once)."""
    global _registered
    ort, q = _qnn()
    with _lock:
        if not _registered:
            ort.register_execution_provider_library(EP, q.get_library_path())
            _registered = True
    return [d for d in ort.get_ep_devices() if d.ep_name == EP]


def htp_options() -> dict[str, str]:
    _, q = _qnn()
    return {"backend_path": q.get_qnn_htp_path()}


def session(model: str | Path, *, context_file: Path | None = None, strict: bool = False):
    """An HTP session on ``model`` (a QDQ graph or an EPContext model). ``context_file``
    compiles and writes the EPContext model there; ``strict`` refuses any CPU fallback."""
    ort, _ = _qnn()
    devs = devices()
    if not devs:
        raise NpuExportError("onnxruntime-qnn registered no QNN device on this host")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if context_file is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(context_file))
        so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_provider_for_devices(devs, htp_options())
    return ort.InferenceSession(str(model), so)


def placement(qdq: Path, ctx: Path) -> dict[str, Any]:
    """Which nodes of ``qdq`` the compiled ``ctx`` model runs on the HTP: every node not
    left behind as an ordinary node beside the EPContext nodes."""
    import onnx

    total = len(onnx.load(str(qdq), load_external_data=False).graph.node)
    nodes = onnx.load(str(ctx), load_external_data=False).graph.node
    left = [n.op_type for n in nodes if n.op_type != "EPContext"]
    ops: dict[str, int] = {}
    for op in left:
        ops[op] = ops.get(op, 0) + 1
    return {"nodes": total, "ep_context_nodes": len(nodes) - len(left), "nodes_off_htp": len(left),
            "ops_off_htp": ops, "nodes_on_htp_fraction": round(1 - len(left) / total, 4) if total else None}


def compile_graph(qdq: Path, ctx: Path) -> dict[str, Any]:
    """Compile ``qdq`` for the HTP into the EPContext model ``ctx`` (and its ``*_qnn.bin``);
    first strictly (every node on the HTP), then, if that is refused, with CPU fallback so
    the placement can be counted. Returns the placement, the binaries and the time, or the
    exact error."""
    out: dict[str, Any] = {"strict": True}
    t0 = time.time()
    try:
        session(qdq, context_file=ctx, strict=True)
    except Exception as exc:  # the EP's refusal is the finding; keep it verbatim
        out.update(strict=False, strict_error=str(exc).strip()[:2000])
        t0 = time.time()
        try:
            session(qdq, context_file=ctx, strict=False)
        except Exception as exc2:
            return {**out, "compiled": False, "error": str(exc2).strip()[:2000]}
    out["compile_seconds"] = round(time.time() - t0, 1)
    if not ctx.is_file():
        return {**out, "compiled": False, "error": "the QNN EP wrote no EPContext model"}
    bins = sorted(p.name for p in ctx.parent.glob(ctx.stem + "*.bin"))
    return {**out, "compiled": True, "context_model": ctx.name, "context_binaries": bins,
            "context_bytes": sum((ctx.parent / b).stat().st_size for b in bins), **placement(qdq, ctx)}
