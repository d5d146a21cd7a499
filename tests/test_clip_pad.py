"""Clip and Pad import as colourable Relax ops (not call_tir) and match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.app.convert import ConvertConfig, build_model, rewrite_model


def _model(nodes, inits, x_shape, opset, extra_inputs=()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _scalar(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def _conv_clip_conv(clip_inputs, inits, opset=13, **clip_attrs):
    """Conv → Clip → Conv: the ReLU6 sandwich of mobile CNNs."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="/conv1/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", *clip_inputs], ["r"], name="/act/Clip", **clip_attrs),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="/conv2/Conv"),
    ]
    return _model(nodes, [w, w2, *inits], [1, 3, 8, 8], opset)


CLIPS = {
    "relu6": (["lo", "hi"], [_scalar("lo", 0.0), _scalar("hi", 6.0)], 13, {}),
    "min_only": (["lo"], [_scalar("lo", 0.0)], 13, {}),
    "max_only": (["", "hi"], [_scalar("hi", 1.0)], 13, {}),
    "nan_bound": (["lo", "hi"], [_scalar("lo", float("nan")), _scalar("hi", 2.0)], 13, {}),
    "huge_bound": (["lo", "hi"], [_scalar("lo", -1e6), _scalar("hi", 1.0)], 13, {}),
    "opset6_attrs": ([], [], 6, {"min": -0.5, "max": 0.5}),
}


def _run(model, feeds, dtype, workdir):
    """Build and run ``model``; its file lives in pytest's ``tmp_path`` (the manifest hashes it later)."""
    path = str(workdir / f"model-{dtype}.onnx")
    onnx.save(model, path)
    build = build_model(ConvertConfig(model=path, dtype=dtype))
    return build, build.compiled().run(feeds)["y"]


@pytest.mark.parametrize("case", list(CLIPS))
def test_clip_matches_onnxruntime(case, tmp_path):
    inputs, inits, opset, attrs = CLIPS[case]
    model = _conv_clip_conv(inputs, inits, opset, **attrs)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32) * 3
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    _, got32 = _run(model, {"x": x}, "float32", tmp_path)
    np.testing.assert_allclose(got32, want, atol=1e-5, rtol=1e-5)
    _, got16 = _run(model, {"x": x}, "float16", tmp_path)
    np.testing.assert_allclose(got16, want, atol=2e-2, rtol=2e-2)


def test_relu6_computes_in_float16_between_convs(tmp_path):
    inputs, inits, opset, attrs = CLIPS["relu6"]
    path = tmp_path / "m.onnx"
    onnx.save(_conv_clip_conv(inputs, inits, opset, **attrs), path)
    rewritten = rewrite_model(ConvertConfig(model=str(path)))
    clip = [d for d in rewritten.passes.report.decisions if d.onnx_op == "Clip"]
    assert clip and all(d.relax_op == "relax.clip" and d.dtype == "float16" for d in clip)


def test_clip_with_runtime_bounds(tmp_path):
    bounds = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("lo", "hi")]
    model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="Clip")], [], [2, 5], 13, bounds)
    x = np.linspace(-3, 3, 10, dtype=np.float32).reshape(2, 5)
    feeds = {"x": x, "lo": np.array(-1, np.float32), "hi": np.array(np.nan, np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    _, got = _run(model, feeds, "float32", tmp_path)
    np.testing.assert_array_equal(got, want)


PADS = [
    ("constant", [0, 0, 1, 2, 0, 0, 3, 0], None, 1.5),
    ("reflect", [0, 0, 2, 1, 0, 0, 1, 2], None, None),
    ("edge", [0, 0, 1, 1, 0, 0, 1, 1], None, None),
    ("wrap", [0, 0, 2, 0, 0, 0, 0, 2], None, None),
    ("constant", [1, 3, 2, 0], [1, 3], 0.0),  # opset 18 axes
]


@pytest.mark.parametrize(("mode", "pads", "axes", "value"), PADS)
def test_pad_matches_onnxruntime(mode, pads, axes, value, tmp_path):
    inits = [numpy_helper.from_array(np.array(pads, dtype=np.int64), "pads")]
    names = ["x", "pads"]
    if value is not None:
        inits.append(_scalar("value", value))
        names.append("value")
    if axes is not None:
        if value is None:
            names.append("")
        inits.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), "axes"))
        names.append("axes")
    model = _model([helper.make_node("Pad", names, ["y"], name="Pad", mode=mode)], inits, [1, 2, 4, 5], 18)
    x = np.random.default_rng(2).standard_normal((1, 2, 4, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    build, got = _run(model, {"x": x}, "float32", tmp_path)
    np.testing.assert_array_equal(got, want)
    ops = build.manifest()["ops_by_dtype"]
    assert "relax.nn.pad" in ops  # a colourable op, not an opaque call_tir


def test_negative_pads_fall_back_to_tvm(tmp_path):
    inits = [numpy_helper.from_array(np.array([0, 0, -1, 0, 0, 0, 0, -1], dtype=np.int64), "pads")]
    model = _model([helper.make_node("Pad", ["x", "pads"], ["y"], name="Pad")], inits, [1, 2, 4, 5], 13)
    x = np.random.default_rng(3).standard_normal((1, 2, 4, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    _, got = _run(model, {"x": x}, "float32", tmp_path)
    np.testing.assert_array_equal(got, want)
