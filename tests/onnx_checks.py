"""Helpers shared by the tests that build ONNX models in code: a typed value info, a one-input
model, a one-node model saved for onnxruntime and amptool alike, the activation-range
"amplifier", and outputs compared by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def info(name: str, dims, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def assert_outputs_match(actual: Mapping[str, np.ndarray], names: Sequence[str], expected: Sequence[np.ndarray],
                         *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Every named output has the expected shape and values (a reference's outputs, in ``names`` order)."""
    for name, want in zip(names, expected, strict=True):
        assert actual[name].shape == want.shape, name
        np.testing.assert_allclose(actual[name], want, rtol=rtol, atol=atol, err_msg=name)


def save_node_model(path: str | Path, node: onnx.NodeProto, inputs: Mapping[str, np.ndarray],
                    initializers: Mapping[str, np.ndarray] | None = None, opset: int = 17) -> str:
    """``node`` alone as a model (float32 inputs shaped like ``inputs``, one output ``y`` whose shape
    onnx infers), saved at ``path``; returns the path."""
    graph = helper.make_graph([node], "g", [info(name, list(value.shape)) for name, value in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, n) for n, v in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return str(path)


def onnxruntime_and_amptool(path: str, feeds: Mapping[str, np.ndarray],
                            dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """Output ``y`` of the model at ``path`` on ``feeds``: onnxruntime's, then amptool's ``dtype`` build's."""
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], dict(feeds))[0]
    got = build_model(ConvertConfig(model=path, dtype=dtype)).compiled().run(dict(feeds))["y"]
    return want, got


def assert_close_to_onnxruntime(path: str, feeds: Mapping[str, np.ndarray], dtype: str = "float32") -> None:
    """amptool's ``dtype`` build of ``path`` gives onnxruntime's ``y``: in float32 to 1e-5 of the
    output's scale, in a low dtype to 5% and 3% of that scale (operands rounded to 8–11 bits)."""
    want, got = onnxruntime_and_amptool(path, feeds, dtype)
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    if dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    else:
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=0.05, atol=0.03 * scale)


def x_to_y_model(nodes: Sequence[onnx.NodeProto], name: str, shape: Sequence[int],
                 inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """float ``x`` → ``nodes`` → float ``y`` of the same ``shape``; opset 17, IR 8."""
    graph = helper.make_graph(list(nodes), name, [info("x", list(shape))], [info("y", list(shape))], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def amplifier_model() -> onnx.ModelProto:
    """x@(200·I) → @(200·I) (|x| ≈ 1e5: beyond fp16) → ·1e-4 → Relu: every constant fits fp16."""
    inits = [numpy_helper.from_array(np.eye(64, dtype=np.float32) * 200, "gain"),
             numpy_helper.from_array(np.array(1e-4, dtype=np.float32), "shrink")]
    nodes = [
        helper.make_node("MatMul", ["x", "gain"], ["a"], name="/amp1/MatMul"),
        helper.make_node("MatMul", ["a", "gain"], ["b"], name="/amp2/MatMul"),
        helper.make_node("Mul", ["b", "shrink"], ["c"], name="/shrink/Mul"),
        helper.make_node("Relu", ["c"], ["y"], name="/out/Relu"),
    ]
    return x_to_y_model(nodes, "amplifier", [2, 64], inits)

