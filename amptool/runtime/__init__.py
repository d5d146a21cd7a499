"""Runners (onnxruntime, compiled TVM module) and input generation; no comparison here."""
