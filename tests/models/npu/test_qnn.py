"""The QDQ graphs compile for the QNN HTP with CPU fallback disabled (every node on the HTP),
leave a context binary beside the EPContext model, and run on the HTP's x86 emulation close
to the same graph on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime_qnn")

from vllm_edge.common import manifest  # noqa: E402
from vllm_edge.models.npu import qnn, runner  # noqa: E402


def test_compile_strict_and_run_on_htp_emulation(tiny_export, tmp_path):
    import onnxruntime as ort

    res = qnn.compile_graph(tiny_export / "decode.onnx", tmp_path / "decode_ctx.onnx")
    assert res["compiled"] and res["strict"], res
    assert res["nodes_on_htp_fraction"] == 1.0 and res["ep_context_nodes"] == 1
    assert res["context_binaries"] and (tmp_path / res["context_binaries"][0]).stat().st_size > 0
    s = manifest.read(tiny_export)["shapes"]
    shape = runner.CacheShape(s["n_layer"], s["n_kv_heads"], s["head_dim"], s["context"])
    feed = runner.inputs(runner.empty_cache(shape), 0, [1], 1, shape)
    htp = qnn.session(tmp_path / "decode_ctx.onnx", strict=True)
    cpu = ort.InferenceSession(str(tiny_export / "decode.onnx"), providers=["CPUExecutionProvider"])
    got = runner.ort_graph(htp)(feed)[0]
    want = runner.ort_graph(cpu)(feed)[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_placement_counts_nodes_left_off_the_htp(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    def model(nodes):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        return helper.make_model(g, ir_version=9)

    onnx.save(model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                     helper.make_node("Relu", ["b"], ["c"]), helper.make_node("Neg", ["c"], ["y"])]),
              tmp_path / "q.onnx")
    onnx.save(model([helper.make_node("EPContext", ["x"], ["c"], domain="com.microsoft"),
                     helper.make_node("Neg", ["c"], ["y"])]), tmp_path / "ctx.onnx")
    p = qnn.placement(tmp_path / "q.onnx", tmp_path / "ctx.onnx")
    assert p["nodes_off_htp"] == 1 and p["ops_off_htp"] == {"Neg": 1} and p["nodes_on_htp_fraction"] == 0.75
