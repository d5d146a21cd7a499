"""amptool: ONNX → mixed-precision (float16 / bfloat16) TVM Relax models, proven against onnxruntime."""

__version__ = "0.1.0"
