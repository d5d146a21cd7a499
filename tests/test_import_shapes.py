"""Regression tests for shape arithmetic the importer could not take (docs/conformance.md).

Function ops onnxruntime expands in prepare (GroupNormalization, CausalConvWithState,
LinearAttention …) leave Shape arithmetic and Scans behind; TVM's frontend turns Shape into a
ShapeExpr that Sub/Div/Max refuse, and has no Scan converter. Each test builds a one-node model
with onnx.helper and compares amptool float32 with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import amptool
from tests.onnx_checks import assert_outputs_match, info

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset < 25 else 11
    return model


def _check(tmp_path, model, feeds, atol=1e-5):
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    names = [o.name for o in model.graph.output]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    result = amptool.convert(path, dtype="float32")
    actual = result.run(feeds)
    assert_outputs_match(actual, names, expected, atol=atol)
    return result


def test_expanded_group_normalization_folds_its_shape_arithmetic(tmp_path):
    """Was: "Node Div_5 cannot handle ShapeExpr inputs" (the expansion divides Shape(x)[1] by groups)."""
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 6, 3, 3), dtype=np.float32),
             "s": rng.standard_normal(6, dtype=np.float32), "b": rng.standard_normal(6, dtype=np.float32)}
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-3)
    model = _model([node], [info("x", [2, 6, 3, 3]), info("s", [6]), info("b", [6])], [info("y", None)], 21)
    result = _check(tmp_path, model, feeds)
    assert "fold-expanded" in result.build.prepare_steps


def test_causal_conv_with_state_present_state_is_sliced_statically(tmp_path):
    """Was: "Node Sub_3 cannot handle ShapeExpr inputs" (kernel size − 1 from Shape(weight))."""
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 4, 7), dtype=np.float32),
             "w": rng.standard_normal((4, 1, 3), dtype=np.float32),
             "past": rng.standard_normal((2, 4, 2), dtype=np.float32)}
    node = helper.make_node("CausalConvWithState", ["x", "w", "", "past"], ["y", "present"], activation="silu")
    model = _model([node], [info("x", [2, 4, 7]), info("w", [4, 1, 3]), info("past", [2, 4, 2])],
                   [info("y", None), info("present", None)], 27)
    _check(tmp_path, model, feeds)


def test_linear_attention_scan_is_unrolled_after_expansion(tmp_path):
    """Was: "Scan … could be unrolled, but prepare's folding was skipped": the Scan only appears
    once onnxruntime expands the op, after amptool's first folding round."""
    rng = np.random.default_rng(2)
    feeds = {name: rng.standard_normal((1, 3, 16), dtype=np.float32) for name in ("q", "k", "v")}
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=2, kv_num_heads=2,
                            update_rule="linear")
    model = _model([node], [info(n, [1, 3, 16]) for n in ("q", "k", "v")],
                   [info("y", None), info("state", None)], 27)
    result = _check(tmp_path, model, feeds, atol=1e-4)
    assert "fold-expanded" in result.build.prepare_steps


@pytest.mark.parametrize(("shape", "axis"), [((3, 4), 0), ((2, 3, 4), -3)])
def test_rms_normalization_over_every_axis(tmp_path, shape, axis):
    """Was: TVM's FoldConstant failing in topi's rms_norm ("Tensor dimension mismatch in read ndim = 1")."""
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal(shape, dtype=np.float32), "s": rng.standard_normal(shape, dtype=np.float32)}
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-4)
    model = _model([node], [info("x", list(shape)), info("s", list(shape))], [info("y", list(shape))], 23)
    _check(tmp_path, model, feeds)


def test_opset8_scan_with_batch_axis_is_unrolled(tmp_path):
    """Opset-8 Scan: a batch axis in front, time on axis 1, one scan input read in reverse."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "fwd"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "bwd"], ["elem"])],
        "body", [info("acc_in", [3]), info("fwd", [3]), info("bwd", [3])],
        [info("acc_out", [3]), info("elem", [3])])
    node = helper.make_node("Scan", ["", "init", "a", "b"], ["final", "seq"], num_scan_inputs=2,
                            directions=[0, 1], body=body)
    model = _model([node], [info("init", [2, 3]), info("a", [2, 4, 3]), info("b", [2, 4, 3])],
                   [info("final", [2, 3]), info("seq", [2, 4, 3])], 8)
    model.ir_version = 3
    rng = np.random.default_rng(4)
    feeds = {"init": rng.standard_normal((2, 3), dtype=np.float32),
             "a": rng.standard_normal((2, 4, 3), dtype=np.float32),
             "b": rng.standard_normal((2, 4, 3), dtype=np.float32)}
    _check(tmp_path, model, feeds)
