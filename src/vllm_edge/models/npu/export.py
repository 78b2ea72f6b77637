"""bf16 Llama folder -> fixed-shape ONNX decoder graphs, quantized QDQ for Qualcomm's QNN.

OUT holds ``prefill.onnx`` (a chunk of ``prefill`` tokens) and ``decode.onnx`` (one token),
both with the KV cache as inputs and outputs at one fixed ``context`` (see
:mod:`vllm_edge.models.npu.llama` for the interface), the attention sink's cache entries
(``sink_kv.npy``, :mod:`vllm_edge.models.npu.sink`) when the model starts every sequence with
the same token, the tokenizer files, and a manifest with the shapes, the sink, the
calibration, the bits and the tool versions.

The graphs are exported from a functional torch forward with the legacy exporter
(``dynamo=False``) in float32, then quantized by onnxruntime's quantizer with its QNN
configuration (``get_qnn_qdq_config``): uint8 weights, uint16 activations (``w8a16``, what
the QNN HTP backend runs) or uint8 activations (``w8a8``); ``float`` keeps the float32 graph
(the fidelity bound). Activation ranges come from MinMax calibration on a shipped prompt set
(``data/npu_calibration.json``) run through the same runner a phone app uses.

Nothing partial is left: OUT appears complete or not at all (``common/atomic``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vllm_edge.common import atomic
from vllm_edge.common import manifest as manifest_file
from vllm_edge.models.npu import sink as sinks
from vllm_edge.models.npu.errors import NpuExportError

logger = logging.getLogger("vllm_edge.models")

KIND = "npu-export"
CONVERTER_VERSION = f"{KIND}/1"
PRECISIONS = ("w8a16", "w8a8", "float")
WEIGHT_SCHEMES = ("per-channel", "per-tensor")
DEFAULT_CONTEXT = 256
DEFAULT_PREFILL = 32
CALIBRATION = Path(__file__).resolve().parents[2] / "data" / "npu_calibration.json"
# the decode graph is calibrated on every position of each prompt's second half (the prefill
# graph sees every token): the prompts' last few tokens are the chat template's closing ones,
# the same in every prompt, and ranges taken from them alone clip ordinary tokens in decode
DECODE_FROM = 0.5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json", "config.json")
OPSET = 17
QDQ_OPSET = 21
GRAPHS = ("prefill", "decode")


def graph_file(name: str) -> str:
    return f"{name}.onnx"


def check_shapes(context: Any, prefill: Any, max_positions: int | None = None) -> tuple[int, int]:
    """``context`` and ``prefill`` as the fixed ints a graph needs; refuses dynamic or
    impossible shapes by name."""
    for name, v in (("context", context), ("prefill", prefill)):
        if v is None or (isinstance(v, str) and not v.isdigit()):
            raise NpuExportError(f"--{name} {v!r}: dynamic shapes are not supported; NPU graphs are "
                                 f"fixed-shape, give --{name} a number")
    context, prefill = int(context), int(prefill)
    if prefill < 1:
        raise NpuExportError(f"--prefill {prefill}: the prefill chunk needs at least one token")
    if context < 2 * prefill or context < 8:
        raise NpuExportError(f"--context {context}: needs at least 8 and twice the prefill chunk ({prefill})")
    if max_positions is not None and context > max_positions:
        raise NpuExportError(f"--context {context}: the model has {max_positions} positions")
    return context, prefill


def _versions() -> dict[str, str | None]:
    from vllm_edge.common.provenance import version

    return {d: version(d) for d in ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-qnn")}


def _import_onnx():
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config  # noqa: F401
    except ImportError as exc:
        raise NpuExportError(f"export-npu needs the [npu] extra (onnx, onnxruntime, onnxruntime-qnn): "
                             f"{exc}; pip install 'vllm-edge[npu]'") from None


def calibration_prompts(path: Path = CALIBRATION) -> tuple[str, list[str]]:
    data = json.loads(path.read_text())
    return data["name"], list(data["prompts"])


def encode_chat(tokenizer, text: str, limit: int) -> list[int]:
    """A user turn in the model's chat template (plain text when it has none), cut to ``limit``."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    return list(ids)[:limit]


def export_float(model, path: Path, chunk: int) -> Path:
    """The torch module's float32 graph at chunk ``chunk`` (legacy exporter, fixed shapes)."""
    import torch

    from vllm_edge.models.npu.llama import MASK_VALUE, io_names

    s, c = model.shape, model.context
    args = [torch.zeros(1, chunk, dtype=torch.int32), torch.arange(chunk, dtype=torch.int32)[None],
            torch.full((1, 1, chunk, c), MASK_VALUE)]
    for _ in range(s.n_layer):
        args += [torch.zeros(1, s.n_kv, c - chunk, s.head_dim)] * 2
    ins, outs = io_names(s.n_layer)
    with torch.no_grad():
        torch.onnx.export(model, tuple(args), str(path), input_names=ins, output_names=outs,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    _raise_opset(path, [1, chunk, s.hidden])
    return path


def _raise_opset(path: Path, norm_shape: list[int]) -> None:
    """Declare opset 21 (16-bit QuantizeLinear) on the exported graph. The quantizer's own
    upgrade runs onnx's version converter, which stops at onnxruntime's RMSNorm node; every
    op the graph uses means the same from opset 17 to 21."""
    import onnx

    m = onnx.load(str(path))
    for op in m.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = QDQ_OPSET
    # onnx's shape inference does not know the RMSNorm node; without its output type every
    # tensor after it is untyped and the calibrator would skip it
    for node in m.graph.node:
        if node.op_type == "SimplifiedLayerNormalization":
            m.graph.value_info.append(onnx.helper.make_tensor_value_info(
                node.output[0], onnx.TensorProto.FLOAT, norm_shape))
    m = onnx.shape_inference.infer_shapes(m)
    onnx.save(m, str(path))


class _Feeds:
    """A CalibrationDataReader over recorded input dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # never called by MinMax; present for the reader protocol
        pass


def calibration_feeds(model, tokenizer, prompts: list[str], prefill: int,
                      sink: sinks.Sink | None = None) -> dict[str, list[dict]]:
    """The inputs each graph sees when the prompts run through the torch model the way the
    app runs them (after the sink, when there is one): every prefill chunk, and a decode step
    at every position of each prompt's second half (``DECODE_FROM``)."""
    from vllm_edge.models.npu import runner

    s, c = model.shape, model.context
    shape = runner.CacheShape(s.n_layer, s.n_kv, s.head_dim, c)
    graph = runner.torch_graph(model)
    feeds: dict[str, list[dict]] = {"prefill": [], "decode": []}

    def keep(name):
        return lambda feed: feeds[name].append({k: np.array(v) for k, v in feed.items()})

    for text in prompts:
        ids = encode_chat(tokenizer, text, c - 1)
        n_pre = max(1, int(len(ids) * DECODE_FROM))
        # prefill: the whole prompt in chunks; decode: its second half one token at a time
        runner.run(ids, shape, _recording(graph, keep("prefill")), prefill, sink=sink)
        runner.run(ids, shape, graph, prefill, _recording(graph, keep("decode")), n_prefill=n_pre, sink=sink)
    return feeds


def _recording(graph, record):
    def call(feed):
        record(feed)
        return graph(feed)
    return call


def matmul_weights(model_path: Path) -> list[str]:
    """The constant right-hand sides of the graph's MatMuls (the linear layers and the head)."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return sorted({n.input[1] for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in inits})


def quantize_graph(float_path: Path, out_path: Path, feeds: list[dict], precision: str,
                   weights: str = "per-channel") -> dict:
    """``float_path`` quantized QDQ for QNN at ``precision``; returns what was done.

    ``weights``: ``per-channel`` (8-bit symmetric, one scale per output channel, the form the
    HTP takes for per-channel weights) or ``per-tensor`` (uint8, one scale per matrix: what
    ``get_qnn_qdq_config`` gives by default; on the default model it alone costs about a
    quarter of the top-1 agreement)."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if precision == "float":
        shutil.copyfile(float_path, out_path)
        return {"weights": "float32", "activations": "float32"}
    if weights not in WEIGHT_SCHEMES:
        raise NpuExportError(f"--weights {weights!r}: choose one of {', '.join(WEIGHT_SCHEMES)}")
    act = QuantType.QUInt16 if precision == "w8a16" else QuantType.QUInt8
    overrides = None
    if weights == "per-channel":
        overrides = {name: [{"quant_type": QuantType.QInt8, "symmetric": True, "axis": 1}]
                     for name in matmul_weights(float_path)}
    cfg = get_qnn_qdq_config(str(float_path), _Feeds(feeds), activation_type=act,
                             weight_type=QuantType.QUInt8, init_overrides=overrides)
    quantize(str(float_path), str(out_path), cfg)
    return {"weights": ("int8 per-output-channel, symmetric" if weights == "per-channel"
                        else "uint8 per-tensor, asymmetric") + " (linear layers and head); "
                        "embedding and norms 16-bit per-tensor",
            "activations": f"{act.name.lower()[1:]} per-tensor",
            "calibration_method": "MinMax", "quantizer": "onnxruntime.quantization get_qnn_qdq_config"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve_source(src: str | os.PathLike) -> Path:
    """``default`` (the default embedded model, prepared in bf16) or a bf16 Llama folder."""
    if str(src) == "default":
        from vllm_edge.models.store import prepare

        return prepare("default", progress=False)
    path = Path(src).expanduser().resolve()
    if not path.is_dir():
        raise NpuExportError(f"{src}: not a folder; give a bf16 Llama folder or 'default'")
    return path


def export_npu(src: str | os.PathLike, out: str | os.PathLike, *, context: Any = DEFAULT_CONTEXT,
               prefill: Any = DEFAULT_PREFILL, precision: str = "w8a16", weights: str = "per-channel",
               sink: str = "auto", force: bool = False,
               calibration: Path = CALIBRATION, calibration_limit: int | None = None,
               progress: bool = True) -> Path:
    """Write the NPU build of ``src`` to ``out`` (see the module docstring); returns ``out``."""
    if precision not in PRECISIONS:
        raise NpuExportError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if weights not in WEIGHT_SCHEMES:
        raise NpuExportError(f"--weights {weights!r}: choose one of {', '.join(WEIGHT_SCHEMES)}")
    if sink not in sinks.MODES:
        raise NpuExportError(f"--sink {sink!r}: choose one of {', '.join(sinks.MODES)}")
    from vllm_edge.models.npu.llama import read_shape

    src_path = resolve_source(src)
    shape = read_shape(src_path)
    context, prefill = check_shapes(context, prefill, shape.max_positions)
    out = atomic.check_destination(out, kind=KIND, inputs=[src_path], force=force)
    _import_onnx()
    import torch
    from transformers import AutoTokenizer

    from vllm_edge.models.npu.llama import MASK_VALUE, NpuLlama, io_names, load_weights

    started = time.time()
    torch.manual_seed(0)
    model = NpuLlama(shape, load_weights(src_path, shape), context).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(src_path))
    cal_name, prompts = calibration_prompts(calibration)
    prompts = prompts[:calibration_limit] if calibration_limit else prompts
    chunks = {"prefill": prefill, "decode": 1}
    sink_token, sink_why = sinks.first_token(tokenizer) if sink == "auto" else (None, "--sink off")
    the_sink = sinks.compute(model, sink_token) if sink_token is not None else None
    feeds = calibration_feeds(model, tokenizer, prompts, prefill, the_sink) if precision != "float" else {}
    graphs: dict[str, Any] = {}
    with atomic.directory(out, kind=KIND, inputs=[src_path], force=force) as tmp, \
            tempfile.TemporaryDirectory(prefix=".npu-float.", dir=out.parent) as work:
        for name in GRAPHS:
            t0 = time.time()
            fp = export_float(model, Path(work) / graph_file(name), chunks[name])
            quant = quantize_graph(fp, tmp / graph_file(name), feeds.get(name, []), precision, weights)
            fp.unlink()
            graphs[name] = {"file": graph_file(name), "chunk": chunks[name], "past": context - chunks[name],
                            "calibration_samples": len(feeds.get(name, [])),
                            "bytes": (tmp / graph_file(name)).stat().st_size,
                            "seconds": round(time.time() - t0, 1), **quant}
            if progress:
                logger.info("npu export: %s graph written (%.0f s)", name, time.time() - t0)
        for f in TOKENIZER_FILES:
            if (src_path / f).is_file():
                shutil.copyfile(src_path / f, tmp / f)
        if the_sink is not None:
            the_sink.save(tmp)
        ins, outs = io_names(shape.n_layer)
        manifest_file.write(tmp, {
            "converter": CONVERTER_VERSION, "source": str(src) if str(src) == "default" else str(src_path),
            "precision": precision, "weights": weights,
            "bits": {"w8a16": {"weights": 8, "activations": 16}, "w8a8": {"weights": 8, "activations": 8},
                     "float": {"weights": 32, "activations": 32}}[precision],
            "target": "Qualcomm QNN HTP (QDQ ONNX; onnxruntime QNN execution provider)",
            "shapes": {"context": context, "prefill": prefill, "decode": 1, "n_layer": shape.n_layer,
                       "n_kv_heads": shape.n_kv, "head_dim": shape.head_dim, "vocab": shape.vocab},
            "interface": {"inputs": ins[:3] + ["past_key.{i}", "past_value.{i}"],
                          "outputs": outs[:1] + ["present_key.{i}", "present_value.{i}"],
                          "input_ids": "int32 [1, chunk]", "position_ids": "int32 [1, chunk]",
                          "attention_mask": f"float32 [1, 1, chunk, context]: 0 or {MASK_VALUE}; columns "
                                            "0..past-1 are cache slots, the last chunk columns the chunk",
                          "past": "float32 [1, n_kv_heads, context - chunk, head_dim], keys after RoPE",
                          "present": "float32 [1, n_kv_heads, chunk, head_dim]: the chunk's own K/V"},
            "sink": ({"token": the_sink.token, "text": tokenizer.convert_ids_to_tokens(the_sink.token),
                      "file": sinks.FILE, "position": 0, "source": sink_why,
                      "shape": "[2 * n_layer, 1, n_kv_heads, 1, head_dim] float32: layer i's key at 2i "
                               "(after RoPE), value at 2i+1; write into cache slot 0, then run the "
                               "prompt from its second token at position 1"}
                     if the_sink is not None else None),
            "sink_off_reason": None if the_sink is not None else sink_why,
            "graphs": graphs,
            "calibration": {"prompts": cal_name, "count": len(prompts), "sha256": _sha(calibration),
                            "decode_positions": f"each prompt's positions from {DECODE_FROM:g} of its length on",
                            "prefill_padding": "a short chunk repeats its last token"}
            if precision != "float" else None,
            "tools": _versions(),
            "seconds": round(time.time() - started, 1),
        })
    return out
