"""Regression tests for the spatial/layout converters (amptool/frontend/layout_ops.py, resize.py, clip_pad.py).

Each builds a one-node model with onnx.helper and compares amptool float32 with onnxruntime (or onnx's
reference evaluator where onnxruntime lacks the op or mode)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import amptool
from amptool.frontend.shape_inputs import pins_from_arrays
from amptool.frontend.signature import graph_inputs
from tests.onnx_checks import assert_outputs_match, info

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _check(tmp_path, node, inputs, outputs, feeds, *, opset=19, constants=(), oracle="ort", atol=1e-5, fixed=(),
           prepare=True):
    """``fixed``: the graph inputs that decide shapes, pinned to their feed as ``amptool diff --inputs`` (and the
    conformance run) pin them; ``prepare=False``: the node reaches the importer as it is (onnxruntime's folding
    expands function ops such as CenterCropPad)."""
    graph = helper.make_graph([node], "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in constants])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    names = [o.name for o in outputs]
    if oracle == "ort":
        import onnxruntime as ort

        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    else:
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(names, feeds)
    pins = {name: value for name, (value, _use) in pins_from_arrays(model, graph_inputs(model), feeds).items()}
    assert sorted(pins) == sorted(fixed)
    actual = amptool.convert(path, dtype="float32", fixed_inputs=pins, prepare=prepare).run(feeds)
    assert_outputs_match(actual, names, expected, atol=atol)
    return actual


def _image(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(("attrs", "scales", "sizes", "out"), [
    # a scale that does not divide the size: ONNX maps coordinates with the scale, not out/in
    ({"mode": "linear"}, [1, 1, 0.6, 0.6], None, [1, 2, 3, 3]),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 1, 0.8, 0.8], None, [1, 2, 4, 4]),
    ({"mode": "cubic", "antialias": 1}, None, [1, 2, 3, 2], [1, 2, 3, 2]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.75], None, [1, 2, 2, 3]),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 1.7, 0.6], None,
     [1, 2, 8, 3]),
    ({"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger",
      "nearest_mode": "round_prefer_ceil"}, None, [7, 9], [1, 2, 9, 9]),
])
def test_resize_modes_tvm_got_wrong(tmp_path, attrs, scales, sizes, out):
    x = _image(1, 2, 5, 5)
    constants = [("scales", np.array(scales, np.float32))] if scales else [("sizes", np.array(sizes, np.int64))]
    operands = ["x", "", "scales"] if scales else ["x", "", "", "sizes"]
    node = helper.make_node("Resize", operands, ["y"], **attrs)
    _check(tmp_path, node, [info("x", [1, 2, 5, 5])], [info("y", out)], {"x": x}, constants=constants)


def test_resize_tf_crop_and_resize_extrapolates_outside_the_roi(tmp_path):
    x = _image(1, 1, 4, 4)
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0)
    actual = _check(tmp_path, node, [info("x", [1, 1, 4, 4])], [info("y", [1, 1, 3, 5])], {"x": x},
                    constants=[("roi", np.array([0.4, -0.2, 1.2, 0.9], np.float32)),
                               ("sizes", np.array([3, 5], np.int64))])
    assert (actual["y"] == 7.0).any()  # the case reaches past the input


@pytest.mark.parametrize(("scales", "out"), [([1, 1, 2.0, 1.5], [1, 1, 8, 6]), ([1, 1, 0.75, 0.5], [1, 1, 3, 2])])
def test_resize_tf_half_pixel_for_nn_of_opset_11(tmp_path, scales, out):
    """tf2onnx's nearest resize at opsets 11-12 (TensorFlow's half-pixel centres, no -0.5 shift)."""
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    _check(tmp_path, node, [info("x", [1, 1, 4, 4])], [info("y", out)], {"x": _image(1, 1, 4, 4)}, opset=11,
           constants=[("roi", np.zeros(0, np.float32)), ("scales", np.array(scales, np.float32))])


def test_resize_float16_build_stays_close(tmp_path):
    x = _image(1, 3, 8, 8)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic")
    graph = helper.make_graph([node], "g", [info("x", [1, 3, 8, 8])], [info("y", [1, 3, 12, 12])],
                              [numpy_helper.from_array(np.array([1, 1, 1.5, 1.5], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    full = amptool.convert(path, dtype="float32").run({"x": x})["y"]
    half = amptool.convert(path, dtype="float16").run({"x": x})["y"]
    np.testing.assert_allclose(half.astype(np.float32), full, rtol=1e-2, atol=1e-2)


def test_upsample_opset9_scales_input(tmp_path):
    x = _image(1, 1, 2, 3)
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    _check(tmp_path, node, [info("x", [1, 1, 2, 3])], [info("y", [1, 1, 6, 6])], {"x": x}, opset=9,
           constants=[("scales", np.array([1, 1, 3, 2], np.float32))])


def test_space_to_depth_crd(tmp_path):
    x = _image(2, 3, 4, 6)
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode="CRD")
    actual = _check(tmp_path, node, [info("x", [2, 3, 4, 6])], [info("y", [2, 12, 2, 3])], {"x": x}, opset=28,
                    oracle="reference")
    want = x.reshape(2, 3, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(2, 12, 2, 3)
    np.testing.assert_array_equal(actual["y"], want)


@pytest.mark.parametrize("attrs", [
    {"strides": [3, 2], "output_shape": [10, 8]},  # larger than the natural 9x7: a zero row and column
    {"strides": [2, 2], "output_shape": [6, 5], "auto_pad": "SAME_UPPER", "group": 2},
    {"strides": [2, 3], "output_shape": [7, 9], "dilations": [2, 1]},
])
def test_conv_transpose_output_shape(tmp_path, attrs):
    rng = np.random.default_rng(5)
    group = attrs.get("group", 1)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((2, 4 // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    _check(tmp_path, node, [info("x", [1, 2, 3, 3])], [info("y", [1, 4, *attrs["output_shape"]])], {"x": x},
           constants=[("w", w), ("b", b)], atol=1e-4)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [2, 3], "storage_order": 1, "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},  # (onnxruntime mis-sizes SAME + dilations)
])
def test_max_pool_with_indices(tmp_path, attrs):
    x = _image(2, 3, 5, 6, seed=6)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 9.0  # a tie: the first in row-major order wins
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    graph = helper.make_graph([node], "g", [info("x", [2, 3, 5, 6])], [info("y", None), info("i", None, I64)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    import onnxruntime as ort

    want_y, want_i = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    actual = amptool.convert(path, dtype="float32").run({"x": x})
    np.testing.assert_array_equal(actual["y"], want_y)
    np.testing.assert_array_equal(actual["i"], want_i)


def test_batch_norm_training_mode_running_statistics(tmp_path):
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}
    constants = [("s", rng.standard_normal(3).astype(np.float32)), ("b", rng.standard_normal(3).astype(np.float32)),
                 ("m", rng.standard_normal(3).astype(np.float32)), ("v", rng.random(3).astype(np.float32))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                            momentum=0.8, epsilon=1e-2)
    _check(tmp_path, node, [info("x", [2, 3, 4, 5])], [info("y", [2, 3, 4, 5]), info("rm", [3]), info("rv", [3])],
           feeds, opset=15, constants=constants, oracle="reference", atol=1e-4)


@pytest.mark.parametrize("runtime_stats", [False, True])
def test_batch_norm_inference_as_multiply_add(tmp_path, runtime_stats):
    """Running statistics as one multiply-add (TVM's batch_norm kernel was 12x onnxruntime's time);
    statistics fed at run time take the same path, computed per call."""
    rng = np.random.default_rng(3)
    stats = {"s": rng.standard_normal(6), "b": rng.standard_normal(6), "m": rng.standard_normal(6) * 5,
             "v": rng.random(6) + 0.1}
    stats = {n: v.astype(np.float32) for n, v in stats.items()}
    feeds = {"x": rng.standard_normal((2, 6, 7)).astype(np.float32), **(stats if runtime_stats else {})}
    inputs = [info("x", [2, 6, 7]), *([info(n, [6]) for n in stats] if runtime_stats else [])]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    _check(tmp_path, node, inputs, [info("y", [2, 6, 7])], feeds, opset=15,
           constants=[] if runtime_stats else list(stats.items()), atol=1e-5, prepare=False)
    from amptool.app.convert import ConvertConfig, rewrite_model

    script = rewrite_model(ConvertConfig(model=str(tmp_path / "m.onnx"), dtype="float32")).passes.mod.script()
    assert "batch_norm" not in script


def test_pad_with_a_run_time_constant_value(tmp_path):
    x = _image(2, 3, 4)
    node = helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"])
    _check(tmp_path, node, [info("x", [2, 3, 4]), info("value", [])], [info("y", [2, 4, 7])],
           {"x": x, "value": np.array(-2.5, np.float32)}, opset=18,
           constants=[("pads", np.array([1, 2, 0, 1], np.int64)), ("axes", np.array([-2, 2], np.int64))])


def test_center_crop_pad_crops_one_axis_and_pads_another(tmp_path):
    x = _image(5, 4, 3)
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], axes=[0, -2])
    _check(tmp_path, node, [info("x", [5, 4, 3]), info("shape", [2], I64)], [info("y", [2, 7, 3])],
           {"x": x, "shape": np.array([2, 7], np.int64)}, opset=18, fixed=["shape"], prepare=False)


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [1, 2]}])
def test_col2im(tmp_path, attrs):
    image, block = [5, 6], [2, 3]
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    blocks = [(image[i] + pads[i] + pads[i + 2] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(2)]
    shape = [2, 2 * 6, blocks[0] * blocks[1]]
    x = _image(*shape, seed=8)
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    _check(tmp_path, node, [info("x", shape)], [info("y", [2, 2, *image])], {"x": x}, opset=18,
           constants=[("image", np.array(image, np.int64)), ("block", np.array(block, np.int64))])


@pytest.mark.parametrize(("size", "align"), [([2, 1, 3, 4], 0), ([1, 1, 2, 3, 4], 1)])
def test_affine_grid_with_a_pinned_size_input(tmp_path, size, align):
    dims = len(size) - 2
    theta = _image(size[0], dims, dims + 1, seed=9)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    _check(tmp_path, node, [info("theta", list(theta.shape)), info("size", [len(size)], I64)],
           [info("grid", [size[0], *size[2:], dims])], {"theta": theta, "size": np.array(size, np.int64)}, opset=20,
           fixed=["size"])
