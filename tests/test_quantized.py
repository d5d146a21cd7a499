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


def _qlinear_conv_reference(x, w, bias, x_scale, x_zp, w_scale, y_scale, y_zp):
    """QLinearConv as the ONNX spec defines it (int32 sums, round-half-even), for the test's
    geometry only: 2 groups, stride 2, 3x3 taps, one padding row and column each side."""
    data = np.pad(x.astype(np.int64) - x_zp, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out_channels, group_in = w.shape[:2]
    size = (x.shape[2] + 1) // 2
    acc = np.zeros((1, out_channels, size, size), np.int64)
    for o in range(out_channels):
        first = (o // (out_channels // 2)) * group_in
        for i in range(group_in):
            for ky in range(3):
                for kx in range(3):
                    acc[0, o] += int(w[o, i, ky, kx]) * data[0, first + i, ky:ky + 2 * size:2, kx:kx + 2 * size:2]
    real = (acc + bias[None, :, None, None]).astype(np.float32) * (np.float32(x_scale) * w_scale)[None, :, None, None]
    return np.clip(np.round(real / np.float32(y_scale)) + y_zp, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("weight_bits", [7, 8])
def test_qlinear_conv_per_channel_scales_and_bias(tmp_path, weight_bits):
    """Against the spec's arithmetic for full-range int8 weights, and against onnxruntime for
    7-bit ones: without AVX-512 VNNI onnxruntime multiplies u8 × s8 pairs into saturating int16
    (vpmaddubsw), so 255 × 127 × 2 clips there (seen on an AVX2 EPYC: 33 of 150 values off by up to
    30), while amptool sums exactly in int32 as the spec says."""
    rng = np.random.default_rng(1)
    limit = 2 ** (weight_bits - 1) - 1
    w = rng.integers(-limit, limit + 1, (6, 2, 3, 3), dtype=np.int8)
    w_scale = rng.uniform(0.001, 0.01, 6).astype(np.float32)
    bias = rng.integers(-500, 500, 6, dtype=np.int32)
    weights = [
        nh.from_array(np.array(0.02, np.float32), "x_scale"), nh.from_array(np.array(128, np.uint8), "x_zp"),
        nh.from_array(w, "w"), nh.from_array(w_scale, "w_scale"), nh.from_array(np.zeros(6, np.int8), "w_zp"),
        nh.from_array(np.array(0.05, np.float32), "y_scale"), nh.from_array(np.array(120, np.uint8), "y_zp"),
        nh.from_array(bias, "bias"),
    ]
    node = h.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "bias"],
                       ["y"], group=2, strides=[2, 2], auto_pad="SAME_UPPER")
    path = _model(tmp_path, [node], [h.make_tensor_value_info("x", T.UINT8, [1, 4, 9, 9])],
                  [h.make_tensor_value_info("y", T.UINT8, None)], weights, opset=10)
    x = rng.integers(0, 256, (1, 4, 9, 9), dtype=np.uint8)
    if weight_bits == 7:
        _against_onnxruntime(path, {"x": x})
    else:
        got = amptool.convert(path, dtype="float32").run({"x": x})["y"]
        np.testing.assert_array_equal(got, _qlinear_conv_reference(x, w, bias, 0.02, 128, w_scale, 0.05, 120))


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
