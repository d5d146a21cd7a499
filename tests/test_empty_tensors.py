"""Convs and matmuls over empty tensors (a zero-size dim): an empty result is a kernel that writes
nothing, and a sum over nothing (zero input channels, a zero-length inner dim) is zeros — in
every dtype. Each was an internal error ('TVM failed to compile') or uninitialised memory (NaN)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import amptool
from tests.onnx_checks import info, onnxruntime_and_amptool

pytest.importorskip("tvm")

DTYPES = ["float32", "float16", "bfloat16"]


def _conv(path: Path, x_shape: list[int], w_shape: list[int], pads: list[int]) -> str:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal(w_shape).astype(np.float32), "w")
    b = numpy_helper.from_array(np.arange(w_shape[0], dtype=np.float32), "b")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads)], "conv",
                              [info("x", x_shape)], [info("y", None)], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("x_shape", "w_shape", "pads"), [
    ([1, 0, 4, 4], [16, 0, 1, 1], [0, 0, 0, 0]),  # zero input channels: each output is its bias
    ([1, 8, 4, 0], [16, 8, 1, 1], [1, 1, 1, 1]),  # a zero-width map padded to 2 columns: bias
])
def test_a_conv_summing_over_nothing_gives_its_bias(tmp_path: Path, dtype: str, x_shape: list[int],
                                                     w_shape: list[int], pads: list[int]) -> None:
    path = _conv(tmp_path / "conv.onnx", x_shape, w_shape, pads)
    want, got = onnxruntime_and_amptool(path, {"x": np.zeros(x_shape, np.float32)}, dtype)
    assert np.asarray(got).shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_conv_with_an_empty_result_runs(tmp_path: Path, dtype: str) -> None:
    """A 3×3 conv over a zero-width map, padded by 1, has zero output columns (onnxruntime refuses
    to run it; amptool builds it and returns the empty result)."""
    path = _conv(tmp_path / "conv.onnx", [1, 8, 4, 0], [16, 8, 3, 3], [1, 1, 1, 1])
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": np.zeros((1, 8, 4, 0), np.float32)})["y"]
    assert np.asarray(got).shape == (1, 16, 4, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("constant_right", [True, False])
def test_a_matmul_over_a_zero_length_inner_dim_is_zeros(tmp_path: Path, dtype: str, constant_right: bool) -> None:
    inits = [numpy_helper.from_array(np.ones((0, 8), np.float32), "b")] if constant_right else []
    inputs = [info("a", [2, 4, 0])] + ([] if constant_right else [info("b", [2, 0, 8])])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "matmul", inputs,
                              [info("y", None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / "matmul.onnx")
    onnx.save(model, path)
    feeds = {"a": np.zeros((2, 4, 0), np.float32)}
    if not constant_right:
        feeds["b"] = np.zeros((2, 0, 8), np.float32)
    want, got = onnxruntime_and_amptool(path, feeds, dtype)
    assert np.asarray(got).shape == want.shape == (2, 4, 8)
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
