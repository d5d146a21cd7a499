"""Inputs whose values decide output shapes (Reduce axes, Pad pads, …): pinned from diff's --inputs,
named in convert's refusal, and checked by ``amptool run`` against the artifact's fixed value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from amptool.app.convert import ConvertConfig
from amptool.app.diff import DiffConfig, diff_model
from amptool.frontend.load import load_model
from amptool.frontend.shape_inputs import pins_from_arrays, shape_uses
from amptool.frontend.signature import graph_inputs
from tests.conftest import read_json, single_error


def _reduce_sum_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=1)], "reduce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _pad_model() -> onnx.ModelProto:
    """pads reaches Pad through a Cast (int32 → int64): the walk follows value-preserving ops."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["pads"], ["pads64"], name="cast", to=TensorProto.INT64),
         helper.make_node("Pad", ["x", "pads64"], ["y"], name="pad", mode="constant")], "pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("pads", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _save(tmp_path, model, arrays):
    path, npz = tmp_path / "model.onnx", tmp_path / "x.npz"
    onnx.save(model, path)
    np.savez(npz, **arrays)
    return str(path), str(npz)


X3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7


def test_diff_pins_reduce_axes_from_inputs(tmp_path, run_cli):
    path, npz = _save(tmp_path, _reduce_sum_model(), {"x": X3, "axes": np.array([1], dtype=np.int64)})
    result = run_cli("diff", path, "--dtype", "float32", "--inputs", npz)
    assert result.exit_code == 0, result.output
    report = diff_model(DiffConfig(convert=ConvertConfig(model=path, dtype="float32"), inputs_path=npz))
    assert report.passed
    assert report.manifest["fixed_inputs"] == {"axes": [1]}
    assert [i["name"] for i in report.manifest["inputs"]] == ["x"]


def test_diff_pin_is_logged(tmp_path, caplog):
    path, npz = _save(tmp_path, _reduce_sum_model(), {"x": X3, "axes": np.array([1], dtype=np.int64)})
    with caplog.at_level("WARNING", logger="amptool.app.diff"):
        diff_model(DiffConfig(convert=ConvertConfig(model=path, dtype="float32"), inputs_path=npz))
    assert "input 'axes' decides output shapes (ReduceSum axes); pinned to its --inputs value [1]" in caplog.text


def test_diff_pins_pad_pads_and_the_reference_sees_them(tmp_path, run_cli):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    path, npz = _save(tmp_path, _pad_model(), {"x": x, "pads": np.array([0, 1, 1, 2], dtype=np.int32)})
    result = run_cli("diff", path, "--dtype", "float32", "--inputs", npz, "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    assert read_json(tmp_path / "r.json")["passed"] is True
    assert "input 'pads' decides output shapes (Pad pads)" in result.output


def test_convert_without_values_names_the_fixed_input(tmp_path, run_cli):
    path, _npz = _save(tmp_path, _pad_model(), {"x": np.zeros((2, 3), np.float32)})
    result = run_cli("convert", path, "--dtype", "float32", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert single_error(result.output)
    assert "--fixed-input pads=" in result.output


def test_run_refuses_a_feed_that_differs_from_the_fixed_value(tmp_path, run_cli):
    path, _npz = _save(tmp_path, _pad_model(), {"x": np.zeros((2, 3), np.float32)})
    out = tmp_path / "out"
    result = run_cli("convert", path, "--dtype", "float32", "--fixed-input", "pads=0,1,1,2", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out / "manifest.json")["fixed_inputs"] == {"pads": [0, 1, 1, 2]}
    x = np.ones((2, 3), np.float32)
    same, other = tmp_path / "same.npz", tmp_path / "other.npz"
    np.savez(same, x=x, pads=np.array([0, 1, 1, 2], dtype=np.int32))
    np.savez(other, x=x, pads=np.array([0, 0, 0, 0], dtype=np.int32))
    result = run_cli("run", str(out), "--inputs", str(same), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "y.npz")["y"].shape == (3, 6)
    result = run_cli("run", str(out), "--inputs", str(other), "-o", str(tmp_path / "y2.npz"))
    assert result.exit_code == 2, result.output
    assert single_error(result.output) and "fixed to [0, 1, 1, 2]" in result.output


def test_float_inputs_are_pinned_only_when_they_feed_shapes_alone(tmp_path):
    """scales → Resize only: pinned; a float that also feeds arithmetic is data, never pinned."""
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["r"], name="resize", mode="nearest"),
         helper.make_node("Concat", ["s1", "s1"], ["s2"], name="cat", axis=0),
         helper.make_node("Resize", ["x", "", "s2"], ["q"], name="resize2", mode="nearest"),
         helper.make_node("Mul", ["s1", "s1"], ["m"], name="mul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
         helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("s1", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("r", "q", "m")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    model = load_model(str(path)).model
    uses = shape_uses(model)
    assert uses["scales"].labels == ["Resize scales"] and not uses["scales"].other_uses
    assert uses["s1"].other_uses and "x" not in uses
    arrays = {"x": np.zeros((1, 1, 2, 2), np.float32), "scales": np.ones(4, np.float32), "s1": np.ones(2, np.float32)}
    pins = pins_from_arrays(model, graph_inputs(model), arrays)
    assert list(pins) == ["scales"]
    assert not pins_from_arrays(model, graph_inputs(model), arrays, already=["scales"])


def test_an_input_behind_integer_arithmetic_and_a_loop_trip_count_is_pinned(tmp_path, run_cli):
    """``crop`` reaches Pad's pads through Sub/Div/Concat (an expanded CenterCropPad) and a Loop's
    trip count through Relu: both pinned from --inputs, so the Pad imports and the Loop unrolls."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    nodes = [
        helper.make_node("Sub", ["crop", "two"], ["less"]), helper.make_node("Div", ["less", "two"], ["half"]),
        helper.make_node("Concat", ["zeros", "half", "zeros", "half"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad"),
        helper.make_node("Relu", ["crop"], ["trips_vec"]), helper.make_node("Squeeze", ["trips_vec"], ["trips"]),
        helper.make_node("Loop", ["trips", "", "start"], ["total"], name="loop", body=body),
    ]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("crop", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("start", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.INT64, [1], [2]),
         helper.make_tensor("zeros", TensorProto.INT64, [1], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert set(shape_uses(model)) == {"crop"}
    arrays = {"x": X3[0, :2, :3].copy(), "crop": np.array([6], np.int64), "start": np.zeros(2, np.float32)}
    path, npz = _save(tmp_path, model, arrays)
    result = run_cli("diff", path, "--dtype", "float32", "--inputs", npz, "--json", str(tmp_path / "d.json"))
    assert result.exit_code == 0, result.output
    assert "input 'crop' decides output shapes" in result.output


def _if_split_model() -> onnx.ModelProto:
    """``size`` split into two dims inside both branches of an If (AffineGrid's expanded function),
    the If's outputs then a ConstantOfShape's shape: the input decides shapes through the If."""
    def branch(tag: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Split", ["size"], [f"h_{tag}", f"w_{tag}"], num_outputs=2, axis=0)], tag, [],
            [helper.make_tensor_value_info(f"h_{tag}", TensorProto.INT64, [1]),
             helper.make_tensor_value_info(f"w_{tag}", TensorProto.INT64, [1])])
    graph = helper.make_graph(
        [helper.make_node("Size", ["size"], ["n"], name="n"),
         helper.make_node("Equal", ["n", "two"], ["is_2d"], name="is_2d"),
         helper.make_node("If", ["is_2d"], ["h", "w"], name="dims", then_branch=branch("then"),
                          else_branch=branch("else")),
         helper.make_node("Concat", ["h", "w"], ["hw"], name="hw", axis=0),
         helper.make_node("ConstantOfShape", ["hw"], ["zeros"], name="zeros"),
         helper.make_node("Add", ["zeros", "x"], ["y"], name="add")], "if_split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("size", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(2, np.int64), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_an_input_split_inside_if_branches_decides_shapes_through_the_if(tmp_path, run_cli):
    """Split passes a shape vector's pieces on, and an If's branch results are the If's outputs:
    ``size`` is found deciding the ConstantOfShape, pinned from --inputs, and the model converts
    (AffineGrid's expanded conformance cases were refused: 'Unsqueeze requires a statically known
    input rank')."""
    model = _if_split_model()
    assert shape_uses(model)["size"].nodes == ["zeros"]
    path, npz = _save(tmp_path, model, {"x": np.array([0.5], np.float32), "size": np.array([3, 4], np.int64)})
    result = run_cli("diff", path, "--dtype", "float32", "--inputs", npz)
    assert result.exit_code == 0, result.output
