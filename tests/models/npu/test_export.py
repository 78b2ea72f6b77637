"""export-npu on a tiny Llama: the QDQ graphs carry 8-bit weights and 16-bit activations (read
from the graph), the KV cache is an input and an output at fixed shapes, and bad input is refused
by name with nothing written. The real default model is exported in test_export_engine."""

from __future__ import annotations

import json

import pytest

from vllm_edge.common import manifest
from vllm_edge.common.errors import EdgeError
from vllm_edge.models.npu import sink
from vllm_edge.models.npu.errors import NpuExportError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")

from vllm_edge.models.npu.export import export_npu  # noqa: E402


def _dq_types(path):
    """The integer types of the graph's dequantized weights (initializers) and activations."""
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    matmul_w = {n.input[1] for n in m.graph.node if n.op_type == "MatMul"}
    weights, acts = set(), set()
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            t = onnx.TensorProto.DataType.Name(inits[n.input[0]].data_type)
            if any(o in matmul_w for o in n.output):
                weights.add(t)
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            acts.add(onnx.TensorProto.DataType.Name(inits[n.input[2]].data_type))
    return weights, acts, m


def test_w8a16_graph_types_and_io(tiny_export):
    data = manifest.read(tiny_export)
    assert data["precision"] == "w8a16" and data["bits"] == {"weights": 8, "activations": 16}
    assert data["shapes"]["context"] == 16 and data["shapes"]["prefill"] == 4
    assert data["calibration"]["count"] == 2 and data["tools"]["onnxruntime"]
    assert (tiny_export / "tokenizer.json").is_file()
    # the chat template starts every prompt with <|im_start|>: its position-0 cache entries ship
    # beside the graphs, as the manifest says
    assert data["sink"]["text"] == "<|im_start|>" and data["sink"]["position"] == 0
    assert sink.load(tiny_export, data).kv.shape == (2 * 2, 1, 2, 1, 16)
    for name, chunk in (("prefill", 4), ("decode", 1)):
        weights, acts, m = _dq_types(tiny_export / f"{name}.onnx")
        assert weights == {"INT8"}          # per-channel symmetric 8-bit on every linear layer
        assert acts == {"UINT16"}           # every activation quantized to uint16
        dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.input}
        assert dims["input_ids"] == [1, chunk] and dims["attention_mask"] == [1, 1, chunk, 16]
        assert dims["past_key.1"] == [1, 2, 16 - chunk, 16]
        outs = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.output}
        assert outs["present_value.0"] == [1, 2, chunk, 16] and outs["logits"][:2] == [1, chunk]
        assert all(d > 0 for dims_ in (*dims.values(), *outs.values()) for d in dims_)  # all static


def test_per_tensor_weights_are_uint8(tiny_llama, tmp_path):
    out = export_npu(tiny_llama, tmp_path / "pt", context=16, prefill=4, weights="per-tensor",
                     calibration_limit=1, sink="off", progress=False)
    weights, acts, _ = _dq_types(out / "decode.onnx")
    assert weights == {"UINT8"} and acts == {"UINT16"}
    data = manifest.read(out)
    assert data["sink"] is None and data["sink_off_reason"] == "--sink off"
    assert not (out / sink.FILE).exists()


def test_w8a8_activations_are_uint8(tiny_llama, tmp_path):
    out = export_npu(tiny_llama, tmp_path / "a8", context=16, prefill=4, precision="w8a8",
                     calibration_limit=1, progress=False)
    assert _dq_types(out / "prefill.onnx")[1] == {"UINT8"}


@pytest.mark.parametrize("kwargs, words", [
    ({"context": "dynamic"}, "dynamic shapes are not supported"),
    ({"prefill": None}, "dynamic shapes are not supported"),
    ({"context": 16, "prefill": 12}, "twice the prefill"),
    ({"context": 100000}, "positions"),
    ({"precision": "w4a16"}, "--precision"),
    ({"weights": "per-group"}, "--weights"),
    ({"sink": "always"}, "--sink"),
])
def test_refuses_shapes_by_name(tiny_llama, tmp_path, kwargs, words):
    with pytest.raises(NpuExportError, match=words):
        export_npu(tiny_llama, tmp_path / "out", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_llama_and_unwritable(tiny_llama, tmp_path):
    other = tmp_path / "gemma"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gemma3",
                                                   "architectures": ["Gemma3ForCausalLM"]}))
    with pytest.raises(NpuExportError, match="Llama family only"):
        export_npu(other, tmp_path / "out")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("not yours")
    with pytest.raises(EdgeError, match="not a vllm-edge"):
        export_npu(tiny_llama, taken)
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    with pytest.raises(EdgeError, match="inside the input"):
        export_npu(tiny_llama, tiny_llama / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma", "taken"]


def test_failed_export_leaves_nothing(tiny_llama, tmp_path, monkeypatch):
    from vllm_edge.models.npu import export

    def boom(*a, **k):
        raise RuntimeError("quantizer died")

    monkeypatch.setattr(export, "quantize_graph", boom)
    with pytest.raises(RuntimeError, match="quantizer died"):
        export_npu(tiny_llama, tmp_path / "out", context=16, prefill=4, calibration_limit=1, progress=False)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
