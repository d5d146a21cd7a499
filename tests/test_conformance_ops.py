"""Regression tests for the converters added after the ONNX node conformance run (docs/conformance.md).

Each builds a one-node model with onnx.helper and compares amptool float32 with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import amptool
from tests.onnx_checks import assert_outputs_match, info

F = TensorProto.FLOAT


def _check(tmp_path, nodes, inputs, outputs, feeds, opset=23, atol=1e-5):
    import onnxruntime as ort

    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    names = [o.name for o in outputs]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    actual = amptool.convert(path, dtype="float32").run(feeds)
    assert_outputs_match(actual, names, expected, atol=atol)


def test_attention_3d_gqa_causal_with_presents(tmp_path):
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((2, 4, 16), dtype=np.float32),
             "k": rng.standard_normal((2, 5, 8), dtype=np.float32),
             "v": rng.standard_normal((2, 5, 8), dtype=np.float32),
             "pk": rng.standard_normal((2, 2, 3, 4), dtype=np.float32),
             "pv": rng.standard_normal((2, 2, 3, 4), dtype=np.float32)}
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "present_k", "present_v"],
                            q_num_heads=4, kv_num_heads=2, is_causal=1)
    _check(tmp_path, [node], [info("q", [2, 4, 16]), info("k", [2, 5, 8]), info("v", [2, 5, 8]),
                              info("pk", [2, 2, 3, 4]), info("pv", [2, 2, 3, 4])],
           [info("y", [2, 4, 16]), info("present_k", [2, 2, 8, 4]), info("present_v", [2, 2, 8, 4])], feeds)


def test_attention_fully_masked_row_is_zero_not_nan(tmp_path):
    rng = np.random.default_rng(1)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False  # query row 1 sees no key
    feeds = {"q": rng.standard_normal((1, 2, 3, 8), dtype=np.float32),
             "k": rng.standard_normal((1, 2, 4, 8), dtype=np.float32),
             "v": rng.standard_normal((1, 2, 4, 8), dtype=np.float32), "m": mask}
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], softcap=2.0)
    _check(tmp_path, [node], [info("q", [1, 2, 3, 8]), info("k", [1, 2, 4, 8]), info("v", [1, 2, 4, 8]),
                              info("m", [3, 4], TensorProto.BOOL)], [info("y", [1, 2, 3, 8])], feeds)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_with_position_ids(tmp_path, interleaved):
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 3, 5, 8), dtype=np.float32),
             "cos": rng.standard_normal((10, 2), dtype=np.float32),
             "sin": rng.standard_normal((10, 2), dtype=np.float32),
             "pos": rng.integers(0, 10, (2, 5)).astype(np.int64)}
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], interleaved=interleaved,
                            rotary_embedding_dim=4)
    _check(tmp_path, [node], [info("x", [2, 3, 5, 8]), info("cos", [10, 2]), info("sin", [10, 2]),
                              info("pos", [2, 5], TensorProto.INT64)], [info("y", [2, 3, 5, 8])], feeds)


def test_layer_norm_mean_and_inv_std_dev_shapes(tmp_path):
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 4), dtype=np.float32), "s": rng.standard_normal(4, dtype=np.float32),
             "b": rng.standard_normal(4, dtype=np.float32)}
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=-1)
    _check(tmp_path, [node], [info("x", [2, 3, 4]), info("s", [4]), info("b", [4])],
           [info("y", [2, 3, 4]), info("mean", [2, 3, 1]), info("inv", [2, 3, 1])], feeds, opset=17)


def test_lp_normalization_l1_with_a_zero_row(tmp_path):
    x = np.array([[1.0, -3.0, 4.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=1, axis=1)
    _check(tmp_path, [node], [info("x", [2, 3])], [info("y", [2, 3])], {"x": x}, opset=17)


def test_cumsum_run_time_axis_reverse_exclusive(tmp_path):
    rng = np.random.default_rng(4)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], reverse=1, exclusive=1)
    for axis in (0, -1):
        _check(tmp_path, [node], [info("x", [3, 4]), info("axis", [], TensorProto.INT64)], [info("y", [3, 4])],
               {"x": rng.standard_normal((3, 4), dtype=np.float32), "axis": np.array(axis, dtype=np.int64)},
               opset=14)


def test_cumsum_over_a_dim_the_data_decides(tmp_path):
    """A scan over the values NonZero picked (a detector's running count of kept boxes): the dim is
    symbolic, the rank known — enough for the scan, which needed a static shape."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"]),
             helper.make_node("Cast", ["where"], ["picked"], to=F),
             helper.make_node("CumSum", ["picked", "axis"], ["y"], exclusive=1),
             helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("a", TensorProto.INT64, [], [1]))]
    nodes = [nodes[3], *nodes[:3]]
    x = np.array([0, 3, 0, 1, 2, 0], dtype=np.float32)
    _check(tmp_path, nodes, [info("x", [6])], [helper.make_tensor_value_info("y", F, None)], {"x": x}, opset=14)


@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_of_infinite_and_nan_rows(tmp_path, last):
    """A row of only -inf (a fully masked row) gave ArgMax -1 — the last element to a Gather after
    it — and NaNs were read otherwise than onnxruntime does (a NaN first element wins; later ones
    are skipped)."""
    nodes = [helper.make_node("ArgMax", ["x"], ["best"], axis=1, keepdims=0, select_last_index=last),
             helper.make_node("ArgMin", ["x"], ["worst"], axis=-1, keepdims=1, select_last_index=last)]
    x = np.array([[-np.inf] * 3, [np.nan, 1, 2], [1, np.nan, 2], [-np.inf, -np.inf, 5], [np.inf] * 3, [2, 7, 7]],
                 np.float32)
    _check(tmp_path, nodes, [info("x", [6, 3])],
           [info("best", [6], TensorProto.INT64), info("worst", [6, 1], TensorProto.INT64)], {"x": x}, opset=13)


def test_compress_with_a_mask_of_the_input_shape_and_no_axis(tmp_path):
    """paddle2onnx's masked_select: Compress, no axis, a condition of the input's shape (refused as
    not 1-D)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    nodes = [helper.make_node("Greater", ["x", "limit"], ["mask"]),
             helper.make_node("Compress", ["x", "mask"], ["y"])]
    limit = helper.make_node("Constant", [], ["limit"], value=helper.make_tensor("l", F, [], [4.5]))
    _check(tmp_path, [limit, *nodes], [info("x", [3, 4])], [helper.make_tensor_value_info("y", F, None)], {"x": x},
           opset=13)


def test_reduce_with_an_empty_axes_input_reduces_everything(tmp_path):
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    _check(tmp_path, [node], [info("x", [3, 4]), info("axes", [0], TensorProto.INT64)], [info("y", [1, 1])],
           {"x": x, "axes": np.zeros(0, dtype=np.int64)}, opset=18)


@pytest.mark.parametrize(("positive", "negative"), [(1, 0), (0, 1)])
def test_isinf_detects_only_the_sign_asked(tmp_path, positive, negative):
    x = np.array([np.inf, -np.inf, 1.0, np.nan], dtype=np.float32)
    node = helper.make_node("IsInf", ["x"], ["y"], detect_positive=positive, detect_negative=negative)
    _check(tmp_path, [node], [info("x", [4])], [info("y", [4], TensorProto.BOOL)], {"x": x}, opset=20)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_by_the_width_or_more_or_a_negative_amount(tmp_path, direction):
    """Signed int8 (opset 28): past the width, or negative, a left shift gives 0 and a right shift
    the sign fill (an AVX2 build had given ``x >> (s mod 8)``); amounts inside shift as usual."""
    x = np.array([-8, 4, -1, 100, -128, 37, -37, 1], dtype=np.int8)
    amount = np.array([8, 9, 127, -1, -8, 0, 3, 7], dtype=np.int8)
    node = helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
    _check(tmp_path, [node], [info("x", [8], TensorProto.INT8), info("s", [8], TensorProto.INT8)],
           [info("y", [8], TensorProto.INT8)], {"x": x, "s": amount}, opset=28)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_unsigned_bitshift_past_the_width_is_zero(tmp_path, direction):
    x = np.array([1, 200, 255, 7], dtype=np.uint8)
    amount = np.array([1, 7, 8, 200], dtype=np.uint8)
    graph = helper.make_graph([helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)], "g",
                              [info("x", [4], TensorProto.UINT8), info("s", [4], TensorProto.UINT8)],
                              [info("y", [4], TensorProto.UINT8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    path = tmp_path / "shift.onnx"
    onnx.save(model, path)
    shifted = [(int(v) << int(s)) & 0xFF if direction == "LEFT" else int(v) >> int(s) for v, s in zip(x, amount)]
    want = np.array([v if s < 8 else 0 for v, s in zip(shifted, amount)], dtype=np.uint8)
    got = amptool.convert(path, dtype="float32").run({"x": x, "s": amount})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_swiglu_and_swish_of_an_llm_mlp(tmp_path, dtype):
    """SwiGLU (opset 28) and Swish (opset 24) had no converter: an MLP exported with them was refused.
    onnxruntime has no SwiGLU kernel: the onnx reference judges, float16 at amptool's tolerance."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(1)
    weights = [helper.make_tensor(n, F, [16, 32], (rng.standard_normal((16, 32)) * 0.3).ravel())
               for n in ("w_gate", "w_up")]
    nodes = [helper.make_node("MatMul", ["x", "w_gate"], ["gate"]), helper.make_node("MatMul", ["x", "w_up"], ["up"]),
             helper.make_node("SwiGLU", ["gate", "up"], ["mlp"], alpha=1.702),
             helper.make_node("Swish", ["mlp"], ["y"], alpha=0.5)]
    graph = helper.make_graph(nodes, "g", [info("x", [4, 16])], [info("y", [4, 32])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    model.ir_version = 11
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    feeds = {"x": rng.standard_normal((4, 16), dtype=np.float32)}
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    actual = np.asarray(amptool.convert(path, dtype=dtype).run(feeds)["y"])
    tolerance = 1e-5 if dtype == "float32" else 1e-2 * float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, atol=tolerance, rtol=0)
