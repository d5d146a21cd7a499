"""Regression tests for amptool/frontend/small_ops.py (Celu, EyeLike, Pow, Mod, ReduceMax/Min, Split,
Trilu, OneHot, Det, ai.onnx.ml Binarizer / ArrayFeatureExtractor).

Each builds a one-node model with onnx.helper and compares amptool float32 with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import amptool

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def _save(tmp_path, node, inputs, outputs, *, opset=23, ml=0, initializers=()):
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml)] if ml else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def _check(tmp_path, node, inputs, outputs, feeds, *, opset=23, ml=0, initializers=(), fixed=None, rtol=1e-5,
           atol=1e-6):
    """amptool float32 against onnxruntime (``ml``: the ai.onnx.ml opset, 0 for none); returns amptool's outputs."""
    import onnxruntime as ort

    path = _save(tmp_path, node, inputs, outputs, opset=opset, ml=ml, initializers=initializers)
    names = [o.name for o in outputs]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    actual = amptool.convert(path, dtype="float32", fixed_inputs=fixed or {}).run(feeds)
    for name, want in zip(names, expected, strict=True):
        got = np.asarray(actual[name])
        assert got.shape == want.shape, name
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    return actual


def _info(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def test_celu(tmp_path):
    x = np.linspace(-6, 4, 24, dtype=np.float32).reshape(2, 3, 4)
    _check(tmp_path, helper.make_node("Celu", ["x"], ["y"], alpha=2.0), [_info("x", [2, 3, 4])],
           [_info("y", [2, 3, 4])], {"x": x})


def test_eye_like_with_another_dtype_and_k(tmp_path):
    x = np.zeros((4, 5), dtype=np.int32)
    _check(tmp_path, helper.make_node("EyeLike", ["x"], ["y"], dtype=F, k=1), [_info("x", [4, 5], I32)],
           [_info("y", [4, 5])], {"x": x})


@pytest.mark.parametrize(("base", "exponent", "x", "y"), [
    (F, I64, [1.5, -2.0, 3.0, 0.5], [2, 3, -1, 0]),
    (I32, F, [1, 2, 3, 7], [4.0, 5.0, 0.5, 2.0]),
    (I64, I64, [1, 2, 3, -3], [4, 5, 6, 3]),
    (I32, I32, [2, 1, -1, 5], [-1, -3, -3, 0]),
])
def test_pow_takes_the_base_type(tmp_path, base, exponent, x, y):
    np_of = helper.tensor_dtype_to_np_dtype
    feeds = {"x": np.array(x, dtype=np_of(base)), "y": np.array(y, dtype=np_of(exponent))}
    _check(tmp_path, helper.make_node("Pow", ["x", "y"], ["z"]), [_info("x", [4], base), _info("y", [4], exponent)],
           [_info("z", [4], base)], feeds)


def test_mod_float_follows_numpy_with_infinite_divisors(tmp_path):
    x = np.array([0.0, -0.0, -3.0, 3.0, -1.0, 1.0, np.inf, 5.5, -5.5, 7.0], dtype=np.float32)
    y = np.array([-2.0, 2.0, np.inf, np.inf, -np.inf, -np.inf, 2.0, -2.0, 2.0, 0.0], dtype=np.float32)
    actual = _check(tmp_path, helper.make_node("Mod", ["x", "y"], ["z"], fmod=0), [_info("x", [10]), _info("y", [10])],
                    [_info("z", [10])], {"x": x, "y": y}, opset=28)  # float fmod=0: opset 28
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.signbit(actual["z"][:2]), np.signbit(np.mod(x, y)[:2]))  # signed zeros


@pytest.mark.parametrize(("op", "want"), [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_reduce_extreme_of_an_empty_set_is_its_identity(tmp_path, op, want):
    axes = helper.make_tensor("axes", I64, [1], [1])
    actual = _check(tmp_path, helper.make_node(op, ["x", "axes"], ["y"], keepdims=1), [_info("x", [2, 0, 4])],
                    [_info("y", [2, 1, 4])], {"x": np.zeros((2, 0, 4), np.float32)}, opset=20, initializers=[axes])
    assert np.all(actual["y"] == want)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_extreme_of_bools(tmp_path, op):
    x = np.array([[True, True], [True, False], [False, True], [False, False]])
    axes = helper.make_tensor("axes", I64, [1], [1])
    _check(tmp_path, helper.make_node(op, ["x", "axes"], ["y"], keepdims=0), [_info("x", [4, 2], TensorProto.BOOL)],
           [_info("y", [4], TensorProto.BOOL)], {"x": x}, opset=20, initializers=[axes])


@pytest.mark.parametrize(("shape", "sizes", "axis"), [
    ([0], [0, 0, 0], 0), ([2, 5], [2, 0, 3], 1), ([2, 3], [0, 3, 0], 1),
    ([5], [2, 0, 3], 0), ([3, 2], [0, 3], 0),  # loops that fuse to extent 0: the CPU schedule must skip them
])
def test_split_with_zero_size_pieces(tmp_path, shape, sizes, axis):
    outs = [f"y{i}" for i in range(len(sizes))]
    split = helper.make_tensor("split", I64, [len(sizes)], sizes)
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    _check(tmp_path, helper.make_node("Split", ["x", "split"], outs, axis=axis), [_info("x", shape)],
           [_info(o, None) for o in outs], {"x": x}, opset=18, initializers=[split])


@pytest.mark.parametrize(("upper", "k"), [(1, 2), (0, -1), (1, 9)])
def test_trilu_run_time_k(tmp_path, upper, k):
    x = np.arange(2 * 4 * 5, dtype=np.int64).reshape(2, 4, 5) + 1
    _check(tmp_path, helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper),
           [_info("x", [2, 4, 5], I64), _info("k", [], I64)], [_info("y", [2, 4, 5], I64)],
           {"x": x, "k": np.array(k, dtype=np.int64)}, opset=14)


def test_trilu_of_an_empty_tensor(tmp_path):
    _check(tmp_path, helper.make_node("Trilu", ["x", "k"], ["y"], upper=0),
           [_info("x", [3, 0, 5], I64), _info("k", [], I64)], [_info("y", [3, 0, 5], I64)],
           {"x": np.zeros((3, 0, 5), np.int64), "k": np.array(6, dtype=np.int64)}, opset=14)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_run_time_values_and_negative_indices(tmp_path, axis):
    indices = np.array([[1.0, -3.0, 9.0], [0.0, -1.0, 4.0]], dtype=np.float32)  # 9 is out of range
    depth, values = np.array(5.0, np.float32), np.array([-1.0, 3.0], np.float32)
    out = [2, 3, 5] if axis == -1 else ([5, 2, 3] if axis == 0 else [2, 5, 3])
    _check(tmp_path, helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis),
           [_info("i", [2, 3]), _info("d", []), _info("v", [2])], [_info("y", out)],
           {"i": indices, "d": depth, "v": values}, opset=11, fixed={"d": depth})


@pytest.mark.parametrize("shape", [(2, 2), (3, 4, 4), (2, 3, 5, 5)])
def test_det(tmp_path, shape):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    _check(tmp_path, helper.make_node("Det", ["x"], ["y"]), [_info("x", list(shape))], [_info("y", list(shape[:-2]))],
           {"x": x}, rtol=1e-4, atol=1e-5)


def test_det_needs_pivoting_and_singular(tmp_path):
    x = np.array([[[0, 1, 0], [0, 0, 1], [1, 0, 0]],  # a permutation: zero leading pivot
                  [[1, 2, 3], [2, 4, 6], [0, 1, 1]],  # singular
                  [[0, 0, 2], [0, 3, 1], [4, 1, 1]]], dtype=np.float32)
    actual = _check(tmp_path, helper.make_node("Det", ["x"], ["y"]), [_info("x", [3, 3, 3])], [_info("y", [3])],
                    {"x": x}, atol=1e-5)
    np.testing.assert_allclose(actual["y"], [1.0, 0.0, -24.0], atol=1e-5)


def test_binarizer(tmp_path):
    x = np.array([[-1.0, 0.5, 1.0, 1.5]], dtype=np.float32)
    actual = _check(tmp_path, helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.75),
                    [_info("x", [1, 4])], [_info("y", [1, 4])], {"x": x}, ml=1)
    np.testing.assert_array_equal(actual["y"], [[0.0, 0.0, 1.0, 1.0]])


@pytest.mark.parametrize("shape", [[3, 4], [4], [2, 3, 4]])
def test_array_feature_extractor(tmp_path, shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    out = [1, 3] if len(shape) == 1 else [*shape[:-1], 3]
    _check(tmp_path, helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml"),
           [_info("x", shape), _info("i", [3], I64)], [_info("y", out)], {"x": x, "i": np.array([3, 0, 3])}, ml=1)


def _forest(**extra):
    """Three trees over 3 features: a depth-2 tree, a set-membership tree with NaN tracking, a lone leaf."""
    return helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=3, tree_roots=[0, 3, 5],
        nodes_featureids=[0, 1, 2, 2, 1, 0], nodes_splits=helper.make_tensor("s", TensorProto.DOUBLE, [6],
                                                                             [0.5, -0.2, 1.0, np.nan, 0.0, 0.0]),
        nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [6], [0, 3, 1, 6, 2, 0]),
        nodes_truenodeids=[1, 0, 2, 4, 5, 7], nodes_trueleafs=[0, 1, 1, 0, 1, 1],
        nodes_falsenodeids=[2, 1, 3, 6, 6, 7], nodes_falseleafs=[0, 1, 1, 1, 1, 1],
        nodes_missing_value_tracks_true=[0, 0, 1, 1, 0, 0],
        membership_values=helper.make_tensor("mv", TensorProto.DOUBLE, [4], [1.0, 2.0, 3.0, np.nan]),
        leaf_targetids=[0, 1, 2, 0, 1, 2, 0, 1], leaf_weights=helper.make_tensor(
            "w", TensorProto.DOUBLE, [8], [1.5, -2.0, 0.25, 4.0, 3.0, -1.0, 0.5, 2.5]), **extra)


def _forest_input():
    x = np.random.default_rng(3).standard_normal((8, 3))
    x[:, 2] = [1.0, 2.0, 3.0, 0.5, np.nan, 1.0, 7.0, np.nan]
    x[5, 0] = np.nan
    return x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble(tmp_path, aggregate):
    _check(tmp_path, _forest(aggregate_function=aggregate), [_info("x", [8, 3], TensorProto.DOUBLE)],
           [_info("y", [8, 3], TensorProto.DOUBLE)], {"x": _forest_input()}, ml=5)


@pytest.mark.parametrize("post", [1, 2])
def test_tree_ensemble_post_transform_follows_the_spec(tmp_path, post):
    """SOFTMAX (1) / LOGISTIC (2) of the raw scores, as the spec numbers them. onnxruntime applies LOGISTIC for 1
    and SOFTMAX for 2 (its internal numbering; see microsoft/onnxruntime#26596), so the reference is its raw
    output transformed here."""
    x = _forest_input()
    raw = _check(tmp_path, _forest(), [_info("x", [8, 3], TensorProto.DOUBLE)],
                 [_info("y", [8, 3], TensorProto.DOUBLE)], {"x": x}, ml=5)["y"]
    path = _save(tmp_path, _forest(post_transform=post), [_info("x", [8, 3], TensorProto.DOUBLE)],
                 [_info("y", [8, 3], TensorProto.DOUBLE)], ml=5)
    got = amptool.convert(path, dtype="float32").run({"x": x})["y"]
    exp = np.exp(raw - raw.max(axis=1, keepdims=True))
    want = exp / exp.sum(axis=1, keepdims=True) if post == 1 else 1 / (1 + np.exp(-raw))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_wide_types_keep_their_range(tmp_path):
    """An empty int64 reduction gives int64's minimum; float64 Det keeps float64 precision."""
    axes = helper.make_tensor("axes", I64, [1], [0])
    actual = _check(tmp_path, helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0),
                    [_info("x", [0, 3], I64)], [_info("y", [3], I64)], {"x": np.zeros((0, 3), np.int64)}, opset=20,
                    initializers=[axes])
    assert np.all(actual["y"] == np.iinfo(np.int64).min)
    x = np.array([[1.0, 1e-9], [1.0, 2e-9]])  # det 1e-9: float32 arithmetic loses it (onnxruntime has no such Det)
    path = _save(tmp_path, helper.make_node("Det", ["x"], ["y"]), [_info("x", [2, 2], TensorProto.DOUBLE)],
                 [_info("y", [], TensorProto.DOUBLE)])
    got = amptool.convert(path, dtype="float32").run({"x": x})["y"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-9)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_extreme_of_a_row_of_infinities_is_infinite(tmp_path, op):
    """A fully masked row (all -inf) reduces to -inf, not TVM's init value -3.4e38: the expanded
    Attention's Equal(ReduceMax(bias), -inf) guard depends on it."""
    sign = -1.0 if op == "ReduceMax" else 1.0
    x = np.array([[1.0, 5.0, -2.0], [sign * np.inf] * 3, [sign * np.inf, 0.5, sign * np.inf]], np.float32)
    axes = helper.make_tensor("axes", I64, [1], [1])
    got = _check(tmp_path, helper.make_node(op, ["x", "axes"], ["y"], keepdims=0), [_info("x", [3, 3])],
                 [_info("y", [3])], {"x": x}, opset=18, initializers=[axes])
    assert got["y"][1] == sign * np.inf
