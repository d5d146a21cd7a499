"""The ONNX node conformance harness (``make conformance``): amptool against the onnx wheel's node cases."""
