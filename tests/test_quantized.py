"""Already-quantized models: built as they are with --dtype float32, refused for float16/bfloat16.

The integer ops (ConvInteger, QLinearConv, QLinearMatMul) must match onnxruntime exactly: int32
accumulation, round-half-even requantization, per-channel scales and zero points."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import amptool
from tests.conftest import single_error


def _model(tmp_path, nodes, inputs, outputs, weights, opset=21):
    graph = h.make_graph(nodes, "q", inputs, outputs, weights)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / "q.onnx"
    onnx.save(model, path)
    return str(path)


def _against_onnxruntime(path, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    got = amptool.convert(path, dtype="float32").run(feeds)
    for name, expected in want.items():
        assert got[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(got[name], expected, err_msg=name)


def test_conv_integer_accumulates_exactly_in_int32(tmp_path):
    """3x3x256 int8 products sum past 2^24, where float32 accumulation would round."""
    rng = np.random.default_rng(0)
    w = rng.integers(100, 128, (8, 256, 3, 3), dtype=np.int8)
    node = h.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 1, 1, 1])
    path = _model(tmp_path, [node], [h.make_tensor_value_info("x", T.UINT8, [1, 256, 6, 6])],
                  [h.make_tensor_value_info("y", T.INT32, [1, 8, 6, 6])],
                  [nh.from_array(w, "w"), nh.from_array(np.array(3, np.uint8), "x_zp"),
                   nh.from_array(np.array(-2, np.int8), "w_zp")], opset=10)
    _against_onnxruntime(path, {"x": rng.integers(200, 256, (1, 256, 6, 6), dtype=np.uint8)})


def test_qlinear_conv_per_channel_scales_and_bias(tmp_path):
    rng = np.random.default_rng(1)
    weights = [
        nh.from_array(np.array(0.02, np.float32), "x_scale"), nh.from_array(np.array(128, np.uint8), "x_zp"),
        nh.from_array(rng.integers(-127, 128, (6, 2, 3, 3), dtype=np.int8), "w"),
        nh.from_array(rng.uniform(0.001, 0.01, 6).astype(np.float32), "w_scale"),
        nh.from_array(np.zeros(6, np.int8), "w_zp"),
        nh.from_array(np.array(0.05, np.float32), "y_scale"), nh.from_array(np.array(120, np.uint8), "y_zp"),
        nh.from_array(rng.integers(-500, 500, 6, dtype=np.int32), "bias"),
    ]
    node = h.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "bias"],
                       ["y"], group=2, strides=[2, 2], auto_pad="SAME_UPPER")
    path = _model(tmp_path, [node], [h.make_tensor_value_info("x", T.UINT8, [1, 4, 9, 9])],
                  [h.make_tensor_value_info("y", T.UINT8, None)], weights, opset=10)
    _against_onnxruntime(path, {"x": rng.integers(0, 256, (1, 4, 9, 9), dtype=np.uint8)})


@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(tmp_path, per_column):
    """b's scale and zero point per output column (onnxruntime takes a's only per tensor)."""
    rng = np.random.default_rng(2)
    m, n = 5, 7
    b_scale = rng.uniform(0.01, 0.03, n if per_column else ()).astype(np.float32)
    b_zp = rng.integers(-3, 3, n if per_column else (), dtype=np.int8)
    weights = [nh.from_array(np.array(0.02, np.float32), "a_scale"), nh.from_array(np.array(3, np.int8), "a_zp"),
               nh.from_array(rng.integers(-128, 128, (16, n), dtype=np.int8), "b"),
               nh.from_array(np.asarray(b_scale), "b_scale"), nh.from_array(np.asarray(b_zp), "b_zp"),
               nh.from_array(np.array(0.4, np.float32), "y_scale"), nh.from_array(np.array(5, np.int8), "y_zp")]
    node = h.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], ["y"])
    path = _model(tmp_path, [node], [h.make_tensor_value_info("a", T.INT8, [m, 16])],
                  [h.make_tensor_value_info("y", T.INT8, [m, n])], weights)
    _against_onnxruntime(path, {"a": rng.integers(-128, 128, (m, 16), dtype=np.int8)})


def test_quantized_model_builds_in_float32_and_is_refused_in_float16(run_cli, tmp_path):
    node = h.make_node("MatMulInteger", ["a", "b"], ["y"])
    path = _model(tmp_path, [node], [h.make_tensor_value_info("a", T.UINT8, [2, 4])],
                  [h.make_tensor_value_info("y", T.INT32, [2, 3])],
                  [nh.from_array(np.arange(12, dtype=np.uint8).reshape(4, 3), "b")], opset=10)
    refused = run_cli("convert", path, "--dtype", "float16", "-o", str(tmp_path / "f16"))
    assert refused.exit_code == 2 and single_error(refused.output)
    assert "already quantized (MatMulInteger ×1)" in refused.output and "--dtype float32" in refused.output
    built = run_cli("convert", path, "--dtype", "float32", "-o", str(tmp_path / "f32"))
    assert built.exit_code == 0, built.output
