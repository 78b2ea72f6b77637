"""The phone-NPU path: a fixed-shape Llama decoder in ONNX with the KV cache as inputs and
outputs (``llama``), quantized to QDQ w8a16 for Qualcomm's QNN (``export``), compiled and run
through onnxruntime's QNN execution provider (``qnn``), and run from numpy (``runner``)."""
