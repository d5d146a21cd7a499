"""Helpers shared by the tests that build ONNX models in code: a typed value info, a one-input
model, the activation-range "amplifier", and outputs compared by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

