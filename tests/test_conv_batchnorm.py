"""prepare's own Conv → BatchNorm fold, and when it lets prepare skip onnxruntime's folding session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.frontend.conv_batchnorm import fold_conv_batchnorm
from amptool.frontend.ort_folding import folding_needed
from amptool.runtime.onnxruntime_runner import run_session, session


def _conv_bn(*, dims: int = 2, group: int = 1, bias: bool = True, epsilon: float | None = None,
             as_constants: bool = False, extra_reader: bool = False, shared_weight: bool = False,
             variance: float = 1.0) -> onnx.ModelProto:
    """x → Conv → BatchNorm → y (a second Conv → BatchNorm on the same input when ``shared_weight``;
    the first Conv's output also a graph output when ``extra_reader``)."""
    rng = np.random.default_rng(7)
    channels, out = 4, 8
    kernel = (3,) * dims
    values = {
        "w": rng.standard_normal((out, channels // group, *kernel)).astype(np.float32),
        "b": rng.standard_normal(out).astype(np.float32),
        "scale": rng.uniform(0.5, 2, out).astype(np.float32),
        "shift": rng.standard_normal(out).astype(np.float32),
        "mean": rng.standard_normal(out).astype(np.float32),
        "var": (rng.uniform(0.5, 2, out) * variance).astype(np.float32),
    }
    nodes, inits = [], []
    for name, value in values.items():
        if as_constants:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        else:
            inits.append(numpy_helper.from_array(value, name))
    bn_attrs = {} if epsilon is None else {"epsilon": epsilon}
    outputs = []
    for tag in ["a", "b"] if shared_weight else ["a"]:
        nodes.append(helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], [f"conv_{tag}"],
                                      name=f"conv_{tag}", group=group, pads=[1] * (2 * dims)))
        nodes.append(helper.make_node("BatchNormalization", [f"conv_{tag}", "scale", "shift", "mean", "var"],
                                      [f"y_{tag}"], name=f"bn_{tag}", **bn_attrs))
        outputs.append(helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [1, out, *(6,) * dims]))
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("conv_a", TensorProto.FLOAT, [1, out, *(6,) * dims]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *(6,) * dims])
    graph = helper.make_graph(nodes, "conv_bn", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _outputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    return run_session(session(model, optimize="disable"), {model.graph.input[0].name: x})


@pytest.mark.parametrize("variant", [
    {}, {"dims": 1}, {"dims": 3}, {"group": 4}, {"bias": False}, {"epsilon": 1e-3}, {"as_constants": True},
    {"shared_weight": True}, {"variance": 1e8},
])
def test_folded_conv_computes_what_conv_and_batchnorm_did(variant):
    model = _conv_bn(**variant)
    folded, count = fold_conv_batchnorm(model)
    assert count == (2 if variant.get("shared_weight") else 1)
    ops = [n.op_type for n in folded.graph.node]
    assert "BatchNormalization" not in ops and "Constant" not in ops
    onnx.checker.check_model(folded)
    want, got = _outputs(model), _outputs(folded)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * np.abs(want[name]).max())
    # the original is untouched, and only the folded weights are held
    assert [n.op_type for n in model.graph.node].count("BatchNormalization") == count
    assert {i.name for i in folded.graph.initializer} == {i.name for i in folded.graph.initializer
                                                          if any(i.name in n.input for n in folded.graph.node)}


def test_a_conv_read_elsewhere_too_is_not_folded():
    model = _conv_bn(extra_reader=True)
    folded, count = fold_conv_batchnorm(model)
    assert count == 0 and folded is model


def test_training_mode_batchnorm_is_not_folded():
    model = _conv_bn()
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    assert fold_conv_batchnorm(model) == (model, 0)


def _with_node(model: onnx.ModelProto, node: onnx.NodeProto, *inits: onnx.TensorProto) -> onnx.ModelProto:
    """``model`` with ``node`` reading output ``y_a`` and writing output ``z`` in its place."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.node.append(node)
    changed.graph.initializer.extend(inits)
    del changed.graph.output[:]
    changed.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 6, 6]))
    return changed


def test_plain_graphs_need_no_onnxruntime_folding_and_others_do():
    folded, _ = fold_conv_batchnorm(_conv_bn())
    assert folding_needed(folded) is None
    assert folding_needed(_conv_bn(extra_reader=True)) is None  # onnxruntime would not fold a read Conv either
    assert folding_needed(_conv_bn()).startswith("BatchNormalization node bn_a")  # but this one it would
    shape = helper.make_node("Shape", ["y_a"], ["z"], name="shape")
    assert folding_needed(_with_node(folded, shape)).startswith("Shape node shape")
    custom = helper.make_node("Relu", ["y_a"], ["z"], name="custom", domain="com.example")
    assert folding_needed(_with_node(folded, custom)).startswith("Relu node custom")
    two = numpy_helper.from_array(np.float32(2), "two")
    scaled = helper.make_node("Mul", ["y_a", "two"], ["z"], name="scale")
    assert "merges into the weights" in folding_needed(_with_node(folded, scaled, two))  # Conv → Mul(constant)
    doubled = helper.make_node("Add", ["y_a", "y_a"], ["z"], name="double")
    assert folding_needed(_with_node(folded, doubled)) is None  # no constant: nothing to merge
    unfolded = helper.make_node("Transpose", ["two"], ["z"], name="left")
    assert "constant inputs" in folding_needed(_with_node(folded, unfolded, two))


def test_prepare_skips_onnxruntime_on_a_plain_cnn_and_keeps_its_numerics():
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs
    from amptool.testing import model_zoo

    for model in (model_zoo.resnet_like(), model_zoo.batchnorm_huge_variance()):
        prepared = prepare.prepare_model(model, graph_inputs(model))
        assert prepared.steps[2:4] == ["fold-batchnorm", "onnxruntime-fold-unneeded"], prepared.steps
        assert "check-numerics" not in prepared.steps and not prepared.notes
        assert "BatchNormalization" not in {n.op_type for n in prepared.model.graph.node}
        want, got = _outputs(model), _outputs(prepared.model)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * np.abs(want[name]).max())


def test_prepare_still_folds_through_onnxruntime_when_a_graph_needs_it():
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs

    model = _with_node(_conv_bn(), helper.make_node("Mul", ["y_a", "two"], ["z"]),
                       numpy_helper.from_array(np.float32(2), "two"))
    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "onnxruntime-fold" in prepared.steps and "check-numerics" in prepared.steps
    assert "fold-batchnorm" not in prepared.steps


def test_plain_path_turns_constant_nodes_into_initializers():
    """TVM's importer reads a Constant's ``value`` only; onnxruntime's saved model had every Constant as
    an initializer, and so does the plain path (``value_ints`` feeding a Reshape, as in exporters)."""
    from amptool.frontend import prepare
    from amptool.frontend.ort_folding import constants_as_initializers
    from amptool.frontend.signature import graph_inputs

    nodes = [helper.make_node("Constant", [], ["shape"], value_ints=[1, -1]),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert folding_needed(model) is None
    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "onnxruntime-fold-unneeded" in prepared.steps
    assert [n.op_type for n in prepared.model.graph.node] == ["Reshape"]
    np.testing.assert_array_equal(numpy_helper.to_array(prepared.model.graph.initializer[0]), [1, -1])
    assert [n.op_type for n in model.graph.node] == ["Constant", "Reshape"]  # the original is untouched
    plain, _ = fold_conv_batchnorm(_conv_bn())
    assert constants_as_initializers(plain) is plain  # nothing to convert: no copy
    sparse = helper.make_node("Constant", [], ["s"], sparse_value=onnx.SparseTensorProto())
    assert "sparse or string" in folding_needed(_with_node(plain, sparse))


def test_plain_path_still_checks_what_the_constant_folder_changed():
    """Skipping onnxruntime skips check-numerics only for the BatchNorm fold: a graph amptool's own
    constant folder changed (here two initializers added) is still checked before and after."""
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs

    a, b = (numpy_helper.from_array(np.full(4, v, np.float32), n) for v, n in ((1.5, "a"), (2.0, "b")))
    nodes = [helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Mul", ["x", "ab"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [a, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "onnxruntime-fold-unneeded" in prepared.steps and "check-numerics" in prepared.steps
    assert [n.op_type for n in prepared.model.graph.node] == ["Mul"]
