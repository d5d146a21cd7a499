"""ONNX Gradient (ai.onnx.preview.training) through the whole convert pipeline.

onnxruntime cannot run these models, so the references are the onnx wheel's stored outputs,
float64 central finite differences (amptool.app.gradient_reference) and, for the model built
here, the closed-form derivative computed in numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.app.artifact import load_artifact
from amptool.app.gradient_reference import GradientReference, finite_difference_gradients
from amptool.errors import UserError
from amptool.frontend.gradient import check_gradients, forward_only
from tests.conftest import ONNX_DATA, read_json, single_error

TRAINING = "ai.onnx.preview.training"
WHEEL_MODELS = ["test_gradient_of_add", "test_gradient_of_add_and_mul"]
RNG = np.random.default_rng(7)
X = RNG.normal(size=(4, 8)).astype(np.float32)
W = (RNG.normal(size=(8, 16)) * 0.3).astype(np.float32)


def _read_tensors(folder: Path, prefix: str) -> dict[str, np.ndarray]:
    arrays = {}
    for path in sorted(folder.glob(f"{prefix}_*.pb")):
        tensor = onnx.TensorProto()
        tensor.ParseFromString(path.read_bytes())
        arrays[tensor.name] = numpy_helper.to_array(tensor)
    return arrays


def _convert_and_run(run_cli, model: str, out: Path, dtype: str, feeds: dict[str, np.ndarray]) -> tuple:
    result = run_cli("convert", model, "--dtype", dtype, "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest, compiled = load_artifact(str(out))
    return manifest, compiled.run(feeds)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", WHEEL_MODELS)
def test_wheel_gradient_models_match_stored_outputs_and_finite_differences(run_cli, tmp_path, name, dtype):
    folder = ONNX_DATA / "simple" / name
    model_path = str(folder / "model.onnx")
    inputs = _read_tensors(folder / "test_data_set_0", "input")
    expected = _read_tensors(folder / "test_data_set_0", "output")
    manifest, got = _convert_and_run(run_cli, model_path, tmp_path / "out", dtype, inputs)
    assert {"fold-subgraphs", "onnxruntime-fold-skipped", "check-numerics-skipped"} <= set(manifest["prepare"])
    assert set(got) == set(expected)
    for output, want in expected.items():
        np.testing.assert_allclose(got[output], want, atol=1e-4, rtol=0, err_msg=output)
    model = onnx.load(model_path)
    (spec,) = check_gradients(model).values()
    finite = finite_difference_gradients(model, spec, {k: v.astype(np.float64) for k, v in inputs.items()})
    for output, fd in zip(spec.outputs, finite, strict=True):
        np.testing.assert_allclose(got[output], fd, atol=1e-4, rtol=0, err_msg=output)
        np.testing.assert_allclose(expected[output], fd, atol=1e-6, rtol=0, err_msg=output)  # FD itself


def _mlp_model(xs: list[str], y: str = "L", zs: tuple[str, ...] = (), grad_inputs: list[str] | None = None,
               extra_inputs: tuple[tuple[str, int, list[int]], ...] = (), extra_nodes: tuple = ()) -> onnx.ModelProto:
    """X @ W → Tanh → ReduceSum, with Gradient(xs, zs, y); W is an initializer."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
        helper.make_node("Tanh", ["H"], ["T"], name="tanh"),
        helper.make_node("ReduceSum", ["T"], ["L"], name="sum", keepdims=0),
        *extra_nodes,
    ]
    grads = [f"d{x}" for x in xs]
    attrs = {"xs": xs, "y": y, **({"zs": list(zs)} if zs else {})}
    nodes.append(helper.make_node("Gradient", grad_inputs or [*xs, *zs], grads, name="grad", domain=TRAINING, **attrs))
    shapes = {"X": [4, 8], "W": [8, 16], "W_T": [16, 8], "H": [4, 16], "T": [4, 16],
              **{n: s for n, _t, s in extra_inputs}}
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
         *(helper.make_tensor_value_info(n, t, s) for n, t, s in extra_inputs)],
        [helper.make_tensor_value_info("L", TensorProto.FLOAT, []),
         *(helper.make_tensor_value_info(g, TensorProto.FLOAT, shapes.get(x)) for g, x in zip(grads, xs))],
        initializer=[numpy_helper.from_array(W, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model


def _save(model: onnx.ModelProto, tmp_path: Path, name: str = "mlp.onnx") -> str:
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


def _analytic(x: np.ndarray) -> dict[str, np.ndarray]:
    """d sum(tanh(X W)) / dX and / dW, in float64."""
    x64, w64 = x.astype(np.float64), W.astype(np.float64)
    dh = 1.0 - np.tanh(x64 @ w64) ** 2
    return {"dX": dh @ w64.T, "dW": x64.T @ dh, "dH": dh}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_own_mlp_gradient_through_convert(run_cli, tmp_path, dtype):
    path = _save(_mlp_model(["X", "W"]), tmp_path)
    manifest, got = _convert_and_run(run_cli, path, tmp_path / "out", dtype, {"X": X})
    reference = GradientReference(onnx.load(path)).run({"X": X})
    exact = _analytic(X)
    for name in ("dX", "dW"):
        np.testing.assert_allclose(reference[name], exact[name], atol=1e-8, rtol=0, err_msg=name)  # FD itself
        scale = float(np.abs(exact[name]).max())
        atol = 1e-4 if dtype == "float32" else 1e-3 + 1e-2 * scale
        np.testing.assert_allclose(got[name], reference[name], atol=atol, rtol=0, err_msg=name)
    # The backward graph's matmuls (dX = dH Wᵀ, dW = Xᵀ dH) are rewritten too, and it reuses the
    # forward values main computed (the node is fed X and W themselves): 1 forward + 2 backward.
    matmuls = manifest["ops_by_dtype"]["relax.matmul"]
    assert matmuls == ({"float32": 3} if dtype == "float32" else {"float16": 3})
    assert manifest["ops_by_dtype"]["relax.tanh"] == {dtype: 1}


def test_a_node_rule_on_the_gradient_keeps_the_backward_graph_float32(tmp_path):
    from amptool.app.convert import ConvertConfig, build_model

    colors = tmp_path / "colors.yaml"
    colors.write_text('version: 1\nextends: builtin:default\nnodes:\n  - {match: "grad", color: never}\n')
    built = build_model(ConvertConfig(model=_save(_mlp_model(["X", "W"]), tmp_path), colors=str(colors)))
    ops = built.manifest()["ops_by_dtype"]
    assert ops["relax.matmul"] == {"float16": 1, "float32": 2}  # forward X·W low, dX and dW float32
    assert ops["relax.tanh"] == {"float16": 1}


def test_non_scalar_y_is_the_gradient_of_its_sum_and_xs_may_be_intermediate(tmp_path):
    from amptool.app.convert import ConvertConfig, build_model

    model = _mlp_model(["H"], y="T", grad_inputs=["H"])
    built = build_model(ConvertConfig(model=_save(model, tmp_path), dtype="float32"))
    got = built.compiled().run({"X": X})
    np.testing.assert_allclose(got["dH"], _analytic(X)["dH"], atol=1e-5, rtol=0)


def test_zs_are_held_constant(tmp_path):
    from amptool.app.convert import ConvertConfig, build_model

    model = _mlp_model(["W"], zs=("X",))
    built = build_model(ConvertConfig(model=_save(model, tmp_path), dtype="float32"))
    got = built.compiled().run({"X": X})
    np.testing.assert_allclose(got["dW"], _analytic(X)["dW"], atol=1e-4, rtol=0)
    # backward bindings belong to the Gradient node; recomputed forward ones to their own nodes
    origins = {o.node for o in built.provenance.values()}
    assert {"grad", "mm", "tanh"} <= origins


def test_prepare_folds_around_a_constant_x_without_cutting_it(tmp_path):
    """xs = [a weight read only through Transpose]: a plain constant folder would fold the
    Transpose into a constant, leaving the weight unreachable from y."""
    from amptool.app.convert import ConvertConfig, build_model

    transpose = helper.make_node("Transpose", ["W_T"], ["W"], name="untranspose", perm=[1, 0])
    model = _mlp_model(["W_T"], zs=("X",))
    grad = model.graph.node.pop()
    del model.graph.initializer[:]
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(W.T), "W_T"))
    model.graph.node.insert(0, transpose)
    model.graph.node.append(grad)
    built = build_model(ConvertConfig(model=_save(model, tmp_path), dtype="float32"))
    assert "fold-subgraphs" in built.prepare_steps
    got = built.compiled().run({"X": X})
    np.testing.assert_allclose(got["dW_T"], _analytic(X)["dW"].T, atol=1e-4, rtol=0)


def test_gradient_is_taken_at_the_values_fed_to_the_node(tmp_path):
    """Gradient(xs=[X, W]) fed (2·X, W): the derivative at 2·X, not at X."""
    from amptool.app.convert import ConvertConfig, build_model

    double = helper.make_node("Mul", ["X", "two"], ["X2"], name="double")
    model = _mlp_model(["X", "W"], grad_inputs=["X2", "W"], extra_nodes=(double,))
    model.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    built = build_model(ConvertConfig(model=_save(model, tmp_path), dtype="float32"))
    got = built.compiled().run({"X": X})
    reference = GradientReference(model).run({"X": X})
    exact = _analytic(2 * X)
    for name in ("dX", "dW"):
        np.testing.assert_allclose(reference[name], exact[name], atol=1e-8, rtol=0, err_msg=name)
        np.testing.assert_allclose(got[name], exact[name], atol=1e-4, rtol=0, err_msg=name)
    assert not np.allclose(exact["dW"], _analytic(X)["dW"], atol=1e-2)  # the two points differ
    # fed another value, the forward graph is recomputed at it: main's own forward is not reused
    assert built.manifest()["ops_by_dtype"]["relax.tanh"] == {"float32": 2}


def test_diff_compares_against_finite_differences(run_cli, tmp_path):
    path = _save(_mlp_model(["X", "W"]), tmp_path)
    report_path = tmp_path / "r.json"
    result = run_cli("diff", path, "--dtype", "float16", "--json", str(report_path))
    assert result.exit_code == 0, result.output
    report = read_json(report_path)
    assert report["reference"]["source"] == "onnxruntime+finite-differences"
    assert [o["name"] for o in report["outputs"]] == ["L", "dX", "dW"]
    assert all(o["cosine"] > 0.999 for o in report["outputs"][1:])
    per_layer = run_cli("diff", path, "--per-layer")
    assert per_layer.exit_code == 2 and "Gradient" in per_layer.output


def _cross_entropy_model() -> onnx.ModelProto:
    """A training step's loss: Gemm → Relu → Softmax → −mean(Σ labels·log p); d/dW, d/dB."""
    weights = [numpy_helper.from_array((RNG.normal(size=(10, 16)) * 0.3).astype(np.float32), "W"),
               numpy_helper.from_array((RNG.normal(size=(10,)) * 0.1).astype(np.float32), "B"),
               numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [
        helper.make_node("Gemm", ["X", "W", "B"], ["logits"], name="fc", transB=1),
        helper.make_node("Relu", ["logits"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["p"], name="softmax", axis=1),
        helper.make_node("Log", ["p"], ["log_p"], name="log"),
        helper.make_node("Mul", ["labels", "log_p"], ["m"], name="mul"),
        helper.make_node("ReduceSum", ["m", "axis1"], ["s"], name="row_sum", keepdims=0),
        helper.make_node("ReduceMean", ["s"], ["mean"], name="mean", keepdims=0),
        helper.make_node("Neg", ["mean"], ["loss"], name="neg"),
        helper.make_node("Gradient", ["W", "B", "X", "labels"], ["dW", "dB"], name="grad", domain=TRAINING,
                         xs=["W", "B"], zs=["X", "labels"], y="loss"),
    ]
    graph = helper.make_graph(
        nodes, "cross_entropy",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 16]),
         helper.make_tensor_value_info("labels", TensorProto.FLOAT, [8, 10])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("dW", TensorProto.FLOAT, [10, 16]),
         helper.make_tensor_value_info("dB", TensorProto.FLOAT, [10])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cross_entropy_gradients_pass_diff(run_cli, tmp_path, dtype):
    report_path = tmp_path / "r.json"
    result = run_cli("diff", _save(_cross_entropy_model(), tmp_path), "--dtype", dtype, "--json", str(report_path))
    assert result.exit_code == 0, result.output
    outputs = {o["name"]: o for o in read_json(report_path)["outputs"]}
    bound = 1e-4 if dtype == "float32" else 2e-3
    assert outputs["dW"]["max_abs"] < bound and outputs["dB"]["max_abs"] < bound


def test_erf_has_a_gradient_rule(tmp_path):
    """TVM 0.27 has none; amptool registers d erf(x) = 2/√π·exp(−x²) (GELU in PyTorch exports)."""
    from amptool.app.convert import ConvertConfig, build_model

    erf = helper.make_node("Erf", ["T"], ["E"], name="erf")
    model = _mlp_model(["X"], y="E", extra_nodes=(erf,))
    built = build_model(ConvertConfig(model=_save(model, tmp_path), dtype="float32"))
    got = built.compiled().run({"X": X})["dX"]
    x64, w64 = X.astype(np.float64), W.astype(np.float64)
    t = np.tanh(x64 @ w64)
    exact = (2 / np.sqrt(np.pi) * np.exp(-t * t) * (1 - t * t)) @ w64.T
    np.testing.assert_allclose(got, exact, atol=1e-5, rtol=0)
    np.testing.assert_allclose(GradientReference(model).run({"X": X})["dX"], exact, atol=1e-8, rtol=0)


def _if_model() -> onnx.ModelProto:
    """y = If(c, tanh(X), sigmoid(X)); Gradient(xs=[X], zs=[c])."""
    then = helper.make_graph([helper.make_node("Tanh", ["X"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Sigmoid", ["X"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("If", ["c"], ["Y"], name="if", then_branch=then, else_branch=other),
             helper.make_node("Gradient", ["X", "c"], ["dX"], name="grad", domain=TRAINING, xs=["X"], zs=["c"], y="Y")]
    graph = helper.make_graph(nodes, "branch",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("dX", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model


def test_control_flow_in_the_forward_graph_needs_a_fixed_condition(run_cli, tmp_path):
    path = _save(_if_model(), tmp_path)
    refused = run_cli("convert", path, "-o", str(tmp_path / "no"))
    assert refused.exit_code == 2
    assert "the graph from xs to y contains If 'if'" in refused.output and "--fixed-input" in refused.output
    x = np.array([0.1, -0.5, 2.0], np.float32)
    result = run_cli("convert", path, "--fixed-input", "c=1", "--dtype", "float32", "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    _manifest, compiled = load_artifact(str(tmp_path / "out"))
    np.testing.assert_allclose(compiled.run({"X": x})["dX"], 1 - np.tanh(x) ** 2, atol=1e-6, rtol=0)


def test_higher_order_gradients_are_refused(run_cli, tmp_path):
    nodes = [helper.make_node("Mul", ["X", "X"], ["Y"], name="square"),
             helper.make_node("Gradient", ["X"], ["dX"], name="g1", domain=TRAINING, xs=["X"], y="Y"),
             helper.make_node("Gradient", ["X"], ["ddX"], name="g2", domain=TRAINING, xs=["X"], y="dX")]
    graph = helper.make_graph(nodes, "second", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("ddX", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    result = run_cli("convert", _save(model, tmp_path), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "y 'dX' depends on Gradient 'g1'; higher-order gradients are not supported" in result.output


def test_forward_only_drops_gradients_and_their_consumers():
    update = helper.make_node("Sub", ["X", "dX"], ["X_next"], name="step")
    model = _mlp_model(["X"], extra_nodes=())
    model.graph.node.append(update)
    model.graph.output.append(helper.make_tensor_value_info("X_next", TensorProto.FLOAT, [4, 8]))
    forward = forward_only(model)
    assert [n.name for n in forward.graph.node] == ["mm", "tanh", "sum"]
    assert [o.name for o in forward.graph.output] == ["L"]
    with pytest.raises(UserError, match="'X_next' is computed from a Gradient output"):
        GradientReference(model)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (lambda: _mlp_model(["X", "Z"], extra_inputs=(("Z", TensorProto.FLOAT, [3]),)),
         "x 'Z' does not reach y 'L'"),
        (lambda: _mlp_model(["X", "K"], y="LK", extra_inputs=(("K", TensorProto.INT64, [4, 16]),),
                            extra_nodes=(helper.make_node("Cast", ["K"], ["Kf"], to=TensorProto.FLOAT),
                                         helper.make_node("Add", ["L", "Kf"], ["LK"], name="add_k"))),
         "x 'K' is int64"),
        (lambda: _mlp_model(["W"]), "depends on graph input 'X', which is in neither xs nor zs"),
        (lambda: _mlp_model(["X"], y="nowhere"), "y 'nowhere' is not a tensor of the graph"),
        (lambda: _mlp_model(["X"], y="M", extra_nodes=(helper.make_node("ReduceMax", ["T"], ["M"], name="max",
                                                                          keepdims=0),)),
         "(ONNX node 'max', ReduceMax)"),
    ],
    ids=["x-not-reaching-y", "integer-x", "free-input", "unknown-y", "no-gradient-rule"],
)
def test_unsupported_gradients_are_one_line_user_errors(run_cli, tmp_path, model, message):
    out = tmp_path / "out"
    result = run_cli("convert", _save(model(), tmp_path), "--dtype", "float32", "-o", str(out))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert single_error(result.output) and not out.exists()
