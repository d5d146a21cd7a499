"""CumSum's CPU kernel (amptool.compiler.cpu_scan) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import amptool
from tests.conftest import scheduled_kernels

_SHAPE = [3, 37, 48]


def _model(axis: int, exclusive: int, reverse: int, dtype: int) -> onnx.ModelProto:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    graph = helper.make_graph([node], "scan", [helper.make_tensor_value_info("x", dtype, _SHAPE)],
                              [helper.make_tensor_value_info("y", dtype, _SHAPE)],
                              [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT64])
def test_cumsum_matches_onnxruntime(tmp_path, axis, exclusive, reverse, dtype):
    """Every axis (the last one through TOPI's walk), exclusive and reverse, float32 and int64
    (position ids), give onnxruntime's values; the float sums to float32 rounding."""
    model = _model(axis, exclusive, reverse, dtype)
    path = tmp_path / "scan.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(axis + 3 + 3 * exclusive + 5 * reverse)
    if dtype == TensorProto.FLOAT:
        x = rng.standard_normal(_SHAPE).astype(np.float32)
    else:
        x = rng.integers(-50, 50, _SHAPE).astype(np.int64)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_scan_over_rows_adds_whole_vectors(tmp_path):
    """A scan with elements after its axis walks its rows adding vectors (``cumsum_rows``), not
    one scalar walk per column (TOPI's ``cumsum_generic``: [1, 4096, 64] 0.67 → 0.11 ms)."""
    path = tmp_path / "scan.onnx"
    onnx.save(_model(1, 0, 0, TensorProto.FLOAT), str(path))
    (kernel,) = [k for k in scheduled_kernels(str(path), "float32") if "cumsum" in k]
    assert "cumsum_rows" in kernel and "T.vectorized" in kernel, kernel


def test_an_empty_scan_builds_and_returns_its_empty_result(tmp_path):
    """A scan of an empty tensor (an axis of length 0) is its empty result: TOPI's kernel failed to
    build ("Divide by zero") and the row scan, which stores its first row unconditionally, would
    write past it."""
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    graph = helper.make_graph([node], "scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 0, 48])],
                              [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path = tmp_path / "scan.onnx"
    onnx.save(model, str(path))
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": np.zeros((2, 0, 48), np.float32)})["y"]
    assert got.shape == (2, 0, 48)
