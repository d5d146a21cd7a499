"""ONNX loading, preparation and import into Relax."""
