"""amptool's onnxruntime sessions: large initializers passed apart from the model give the same results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.runtime import onnxruntime_runner as runner


def _model() -> onnx.ModelProto:
    """x @ W (float32, large), then Reshape by a small int64 shape (which shape inference must read),
    plus a float16 bias added after a Cast."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(96).astype(np.float16), "b16")
    shape = numpy_helper.from_array(np.array([4, 2, 48], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
             helper.make_node("Cast", ["b16"], ["b"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["y", "b"], ["z"], name="bias"),
             helper.make_node("Reshape", ["z", "shape"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 2, 48])],
                              [weight, bias, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("optimize", ["disable", "all"])
def test_initializers_passed_apart_give_the_same_outputs(monkeypatch, optimize):
    model = _model()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    whole = runner.session(model, optimize=optimize)
    assert not hasattr(whole, "amptool_initializers")  # small: serialised as it is
    monkeypatch.setattr(runner, "APART_MODEL_BYTES", 1)
    monkeypatch.setattr(runner, "APART_TENSOR_BYTES", 100)
    apart = runner.session(model, optimize=optimize)
    assert len(apart.amptool_initializers) == 2  # the weight and the float16 bias, not the int64 shape
    want, got = runner.run_session(whole, feeds), runner.run_session(apart, feeds)
    np.testing.assert_array_equal(got["out"], want["out"])
    assert [init.data_location for init in model.graph.initializer] == [TensorProto.DEFAULT] * 3  # untouched


def test_every_tensor_exposes_the_same_tensors_either_way(monkeypatch):
    model = _model()
    feeds = {"x": np.ones((4, 64), np.float32)}
    want = runner.every_tensor(model, feeds)
    monkeypatch.setattr(runner, "APART_MODEL_BYTES", 1)
    monkeypatch.setattr(runner, "APART_TENSOR_BYTES", 100)
    got = runner.every_tensor(model, feeds)
    assert set(got) == set(want) == {"y", "b", "z", "out"}
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    with_y = runner.session(model.SerializeToString(), outputs=["y"])  # bytes take outputs too
    np.testing.assert_array_equal(runner.run_session(with_y, feeds)["y"], want["y"])


def test_a_split_model_and_a_one_shot_session_compute_what_the_plain_session_does(monkeypatch, tmp_path):
    """``Apart`` (weights as arrays, the model serialised without them) and ``one_shot`` (no weight
    prepacking) change how onnxruntime holds the weights, not what it computes."""
    model = _model()
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    want = runner.run_session(runner.session(model), feeds)
    monkeypatch.setattr(runner, "APART_MODEL_BYTES", 1)
    monkeypatch.setattr(runner, "APART_TENSOR_BYTES", 100)
    apart = runner.split_apart(model)
    assert apart is not None and apart.names == ["w", "b16"]
    model.graph.initializer[0].raw_data = b"\0" * len(model.graph.initializer[0].raw_data)  # the model changes after
    for handle in (runner.session(apart, one_shot=True), runner.session(apart, outputs=["y"], optimize="disable")):
        np.testing.assert_array_equal(runner.run_session(handle, feeds)["out"], want["out"])
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    with pytest.raises(ValueError, match="given by path"):
        runner.session(str(path), outputs=["y"])


def test_an_initializer_nothing_reads_does_not_stop_a_split_session(monkeypatch):
    """onnxruntime drops an unread initializer before it takes the arrays passed apart, then failed to
    find it ("ReplaceInitializedTensorImpl"): every session on such a model over 16 MB failed — the
    diff reference among them (exit 2 on a model onnxruntime runs)."""
    model = _model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "left_over"))
    feeds = {"x": np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)}
    want = runner.run_session(runner.session(model), feeds)
    monkeypatch.setattr(runner, "APART_MODEL_BYTES", 1)
    monkeypatch.setattr(runner, "APART_TENSOR_BYTES", 100)
    apart = runner.split_apart(model)
    assert apart is not None and "left_over" not in apart.names
    assert "left_over" not in [init.name for init in onnx.ModelProto.FromString(apart.light).graph.initializer]
    for optimize in ("disable", "all"):
        np.testing.assert_array_equal(runner.run_session(runner.session(model, optimize=optimize), feeds)["out"],
                                      want["out"])
