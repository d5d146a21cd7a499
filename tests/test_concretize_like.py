"""ConcretizeLike: one structural test per rule (Before → Expected TVMScript), the cases that
must not fire, parameter removal, the pipeline stage, and the ONNX model of issue 6 end to end."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from amptool import _tvm
from amptool.app.convert import ConvertConfig, build_model
from amptool.colors import load_policy
from amptool.frontend.importer import import_model
from amptool.frontend.signature import graph_inputs, pin_input_specs
from amptool.passes.concretize_like import concretize_like, rules
from amptool.passes.pipeline import PASS_ORDER, run_passes
from amptool.runtime.inputs import generate_inputs
from tests.conftest import read_json, single_error

# --------------------------------------------------------------------------- one test per rule


@I.ir_module
class ZerosOnesFullBefore:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        z = R.zeros_like(x)
        o = R.ones_like(x, dtype="float16")
        f = R.full_like(x, R.const(2.5, "float32"))
        return (z, o, f)


@I.ir_module
class ZerosOnesFullExpected:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        z = R.zeros(R.shape([2, 3]), "float32")
        o = R.ones(R.shape([2, 3]), "float16")
        f = R.full(R.shape([2, 3]), R.const(2.5, "float32"), "float32")
        return (z, o, f)


@I.ir_module
class EyeCollapseBefore:
    @R.function
    def main(x: R.Tensor((3, 4), "float32"), g: R.Tensor((5, 3, 4), "float32")):
        e = R.eye_like(x, 1)
        c = R.collapse_sum_like(g, x)
        return (e, c)


@I.ir_module
class EyeCollapseExpected:
    @R.function
    def main(x: R.Tensor((3, 4), "float32"), g: R.Tensor((5, 3, 4), "float32")):
        e = R.eye(3, 4, 1, "float32")
        c = R.collapse_sum_to(g, R.shape([3, 4]))
        return (e, c)


@I.ir_module
class ShapeOfBefore:
    """ONNX's Expand(v, Shape(y)), ConstantOfShape(Shape(y)) and Reshape(w, Shape(y)) when
    Shape is not resolved at import: broadcast_to / reshape of a ``shape_of``."""

    @R.function
    def main(v: R.Tensor((1, 3), "float32"), w: R.Tensor((6,), "float32"), y: R.Tensor((2, 3), "float32")):
        s = R.shape_of(y)
        e = R.broadcast_to(v, s)
        c = R.broadcast_to(R.const(1.5, "float32"), s)
        r = R.reshape(w, s)
        return (e, c, r)


@I.ir_module
class ShapeOfExpected:
    @R.function
    def main(v: R.Tensor((1, 3), "float32"), w: R.Tensor((6,), "float32"), y: R.Tensor((2, 3), "float32")):
        e = R.broadcast_to(v, R.shape([2, 3]))
        c = R.broadcast_to(R.const(1.5, "float32"), R.shape([2, 3]))
        r = R.reshape(w, R.shape([2, 3]))
        return (e, c, r)


@pytest.mark.parametrize(
    ("before", "expected", "counts"),
    [
        (ZerosOnesFullBefore, ZerosOnesFullExpected, {"zeros_like": 1, "ones_like": 1, "full_like": 1}),
        (EyeCollapseBefore, EyeCollapseExpected, {"eye_like": 1, "collapse_sum_like": 1}),
        (ShapeOfBefore, ShapeOfExpected, {"broadcast_to(shape_of)": 2, "reshape(shape_of)": 1}),
    ],
    ids=["zeros-ones-full", "eye-collapse_sum", "shape_of"],
)
def test_each_rule_rewrites_to_a_static_shape_op(before, expected, counts):
    after, report = concretize_like(before)
    tvm.ir.assert_structural_equal(after, expected)
    _tvm.assert_well_formed(after, "test")
    assert dict(report.concretized) == counts and not report.skipped


def test_one_table_holds_every_rule():
    assert set(rules()) == {"relax.zeros_like", "relax.ones_like", "relax.full_like", "relax.eye_like",
                            "relax.collapse_sum_like", "relax.broadcast_to", "relax.reshape"}


def test_a_shape_of_used_elsewhere_survives():
    @I.ir_module
    class Kept:
        @R.function
        def main(v: R.Tensor((1, 3), "float32"), y: R.Tensor((2, 3), "float32")):
            s = R.shape_of(y)
            e = R.broadcast_to(v, s)
            t = R.shape_to_tensor(s)
            return (e, t)

    after, report = concretize_like(Kept)
    script = _tvm.module_script(after)
    assert "R.broadcast_to(v, R.shape([2, 3]))" in script and script.count("R.shape_of(y)") == 1
    assert dict(report.concretized) == {"broadcast_to(shape_of)": 1}


def test_values_used_only_for_their_shape_are_dropped():
    @I.ir_module
    class ShapeOnly:
        @R.function
        def main(x: R.Tensor((2, 3), "float32"), v: R.Tensor((3,), "float32")):
            with R.dataflow():
                big = R.exp(x)  # read only for its shape
                z = R.ones_like(big)
                y = R.add(x, z)
                R.output(y)
            s = R.shape_of(y)
            b = R.broadcast_to(v, s)
            return (y, b)

    after, report = concretize_like(ShapeOnly)
    script = _tvm.module_script(after)
    assert "R.exp" not in script and "shape_of" not in script and "R.ones(R.shape([2, 3])" in script
    assert dict(report.concretized) == {"ones_like": 1, "broadcast_to(shape_of)": 1}


# --------------------------------------------------------------------------- when it must not fire


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 3), "float32"), v: R.Tensor((1, 3), "float32"), u: R.Tensor("float32", ndim=2)):
        z = R.zeros_like(x)
        s = R.shape_of(x)
        e = R.broadcast_to(v, s)
        su = R.shape_of(u)
        r = R.reshape(v, su)
        b = R.broadcast_to(v, R.shape([4, 3]))  # already static: no like-pattern, not counted
        return (z, e, r, b)


def test_symbolic_and_unknown_shapes_are_left_alone_with_a_reason(caplog):
    with caplog.at_level(logging.DEBUG, logger="amptool.passes.concretize_like"):
        after, report = concretize_like(Symbolic)
    assert after.same_as(Symbolic)  # nothing fired: the module itself, no DCE
    assert not report.concretized
    skipped = {(op, reason) for (op, reason) in report.skipped}
    assert skipped == {
        ("zeros_like", "shape of 'x' is symbolic (n, 3)"),
        ("broadcast_to(shape_of)", "shape of 'x' is symbolic (n, 3)"),
        ("reshape(shape_of)", "shape of 'u' is unknown (rank 2)"),
    }
    assert "zeros_like at 'z' left alone: shape of 'x' is symbolic (n, 3)" in caplog.text
    assert report.as_json()["skipped"][0] == {"op": "broadcast_to(shape_of)",
                                              "reason": "shape of 'x' is symbolic (n, 3)", "count": 1}


def test_onnx_shrink_of_a_data_dependent_shape_does_not_fire():
    """NonZero's output has a symbolic dim: Shrink's zeros_like stays."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Cast", ["nz"], ["f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Shrink", ["f"], ["y"], name="shrink", lambd=0.5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    imported = import_model(model, pin_input_specs(graph_inputs(model)))
    after, report = concretize_like(imported.mod)
    assert after.same_as(imported.mod)
    assert [(op, reason) for op, reason in report.skipped] == [
        ("zeros_like", "shape of 'cast' is symbolic (2, nonzero_numbers)")]


def test_large_creations_fire_in_low_precision_builds_too():
    """A zeros larger than FoldConstant folds (1,024 elements in TVM 0.27) stays a run-time op;
    the mixed-precision pass treats it as a castable constant, so it may fire at any size."""
    n = 1025

    @I.ir_module
    class Large:
        @R.function
        def main(x: R.Tensor((1, n), "float32"), f: R.Tensor((1, n), "float32")):
            z = R.zeros_like(x)
            g = R.full_like(f, R.const(1.0, "float32"))
            return (z, g)

    for dtype in ("float16", "float32"):
        out, report = concretize_like(Large, dtype)
        assert "_like" not in _tvm.module_script(out) and not report.skipped
        assert dict(report.concretized) == {"zeros_like": 1, "full_like": 1}


# --------------------------------------------------------------------------- parameters


@I.ir_module
class WithHelper:
    @R.function(private=True)
    def helper(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        z = R.zeros_like(b)
        return R.add(a, z)

    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32"), sq: R.Tensor((3, 3), "float32")):
        h = WithHelper.helper(x, y)
        e = R.eye_like(sq)
        return (h, e)


def test_unused_parameters_leave_internal_functions_but_not_the_entry():
    after, report = concretize_like(WithHelper)
    _tvm.assert_well_formed(after, "test")
    params = {gv.name_hint: [_tvm.var_name(p) for p in f.params] for gv, f in _tvm.relax_functions(after)}
    assert params == {"helper": ["a"], "main": ["x", "y", "sq"]}  # sq now unused, still there
    assert report.params_removed == {"helper": ["b"]}
    assert "cls.helper(x)" in _tvm.module_script(after)  # the call site lost the argument too


def test_numerics_are_bit_identical_on_relax_modules():
    """The rewritten module computes exactly what the original does."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)] + [
        rng.standard_normal((3, 3)).astype(np.float32)]
    outputs = []
    for mod in (WithHelper, concretize_like(WithHelper)[0]):
        exe = tvm.compile(mod, target="llvm")
        vm = relax.VirtualMachine(exe, tvm.cpu())
        outputs.append([o.numpy() for o in vm["main"](*[tvm.runtime.tensor(a) for a in arrays])])
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- the pipeline


def test_concretize_runs_before_prefold_and_can_be_turned_off():
    assert PASS_ORDER.index("concretize") == PASS_ORDER.index("prefold") - 1
    seen: list[str] = []
    result = run_passes(WithHelper, load_policy(), "float16", {}, on_stage=seen.append)
    assert seen[0] == "concretize" and "concretize" in result.timings_s
    assert result.concretize is not None and dict(result.concretize.concretized) == {"zeros_like": 1, "eye_like": 1}
    seen.clear()
    result = run_passes(WithHelper, load_policy(), "float16", {}, concretize=False, on_stage=seen.append)
    assert "concretize" not in seen and "concretize" not in result.timings_s and result.concretize is None


# --------------------------------------------------------------------------- issue 6, end to end


def _issue_model() -> onnx.ModelProto:
    """ConstantOfShape(Shape(x)), Expand(v, Shape(y)), Reshape(w, Shape(y)), EyeLike and Shrink."""
    f = TensorProto.FLOAT
    v = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 2, 3), "v")
    w = numpy_helper.from_array(np.linspace(-2, 2, 24, dtype=np.float32), "w")
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"], name="shape_x"),
        helper.make_node("ConstantOfShape", ["sx"], ["cs"], name="const_of_shape",
                         value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("Add", ["cs", "x"], ["c"], name="add_c"),
        helper.make_node("Shape", ["y"], ["sy"], name="shape_y"),
        helper.make_node("Expand", ["v", "sy"], ["ex"], name="expand"),
        helper.make_node("Mul", ["ex", "y"], ["e"], name="mul_e"),
        helper.make_node("Reshape", ["w", "sy"], ["rs"], name="reshape"),
        helper.make_node("Sub", ["rs", "y"], ["r"], name="sub_r"),
        helper.make_node("EyeLike", ["sq"], ["el"], name="eye_like", k=1),
        helper.make_node("Add", ["el", "sq"], ["eye"], name="add_eye"),
        helper.make_node("Shrink", ["x"], ["shr"], name="shrink", lambd=0.3, bias=0.1),
    ]
    inputs = [helper.make_tensor_value_info("x", f, [2, 3]), helper.make_tensor_value_info("y", f, [4, 2, 3]),
              helper.make_tensor_value_info("sq", f, [3, 3])]
    shapes = {"c": [2, 3], "e": [4, 2, 3], "r": [4, 2, 3], "eye": [3, 3], "shr": [2, 3]}
    outputs = [helper.make_tensor_value_info(n, f, shape) for n, shape in shapes.items()]
    model = helper.make_model(helper.make_graph(nodes, "likes", inputs, outputs, [v, w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def issue_model(tmp_path) -> str:
    path = tmp_path / "likes.onnx"
    onnx.save(_issue_model(), path)
    return str(path)


@pytest.mark.parametrize("prepare", [[], ["--no-prepare"]], ids=["prepared", "no-prepare"])
def test_emitted_ir_holds_no_like_op_and_outputs_match_onnxruntime(issue_model, run_cli, tmp_path, prepare):
    ir = tmp_path / "final.py"
    out = tmp_path / "art"
    result = run_cli("convert", issue_model, *prepare, "--emit-ir", str(ir), "-o", str(out))
    assert result.exit_code == 0, result.output
    text = ir.read_text()
    assert "def main(" in text and "_like" not in text and "shape_of" not in text
    manifest = read_json(out / "manifest.json")
    assert manifest["concretize_like"]["concretized"] == {"eye_like": 1, "zeros_like": 1}
    assert manifest["concretize_like"]["skipped"] == []
    assert list(manifest["timings_s"]).index("concretize") < list(manifest["timings_s"]).index("prefold")
    assert "like-ops concretized" in result.output
    diff = run_cli("diff", issue_model, *prepare)
    assert diff.exit_code == 0, diff.output


def _if_model() -> onnx.ModelProto:
    """Shrink and EyeLike in a graph with an If: its bindings are outside dataflow blocks, where
    FoldConstant does not fold like-ops (inside them it folds them itself)."""
    f = TensorProto.FLOAT
    then = helper.make_graph([helper.make_node("EyeLike", ["sq"], ["t"], name="eye_then", k=-1)], "then", [],
                             [helper.make_tensor_value_info("t", f, [3, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["sq"], ["n"], name="neg_else")], "else", [],
                              [helper.make_tensor_value_info("n", f, [3, 3])])
    nodes = [helper.make_node("Shrink", ["x"], ["s"], name="shrink", lambd=0.3, bias=0.2),
             helper.make_node("If", ["c"], ["o"], name="if", then_branch=then, else_branch=other)]
    inputs = [helper.make_tensor_value_info("x", f, [2, 3]), helper.make_tensor_value_info("sq", f, [3, 3]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    outputs = [helper.make_tensor_value_info("s", f, [2, 3]), helper.make_tensor_value_info("o", f, [3, 3])]
    model = helper.make_model(helper.make_graph(nodes, "if_likes", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_outside_dataflow_only_the_pass_removes_like_ops(run_cli, tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    texts = {}
    for flags in ((), ("--no-concretize",)):
        ir = tmp_path / "final.py"
        result = run_cli("convert", str(path), *flags, "--emit-ir", str(ir), "-o", str(tmp_path / "a"))
        assert result.exit_code == 0, result.output
        texts[flags] = ir.read_text()
    assert "_like" not in texts[()] and "R.eye(3, 3, -1" in texts[()] and "R.zeros(R.shape([2, 3])" in texts[()]
    assert "R.eye_like(" in texts[("--no-concretize",)] and "R.zeros_like(" in texts[("--no-concretize",)]
    assert read_json(tmp_path / "a" / "manifest.json")["concretize_like"] is None


def test_if_model_outputs_match_onnxruntime_bit_for_bit_with_and_without_the_pass(tmp_path):
    import onnxruntime as ort

    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    rng = np.random.default_rng(1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    builds = [build_model(ConvertConfig(model=str(path), dtype="float32", concretize=flag)).compiled()
              for flag in (True, False)]
    for cond in (True, False):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32),
                 "sq": rng.standard_normal((3, 3)).astype(np.float32), "c": np.array(cond)}
        expected = dict(zip(["s", "o"], session.run(None, feeds)))
        for build in builds:
            got = build.run(feeds)
            for name in expected:
                np.testing.assert_array_equal(got[name], expected[name])


def test_float32_outputs_are_bit_identical_with_and_without_the_pass(issue_model):
    model = onnx.load(issue_model)
    feeds = generate_inputs(graph_inputs(model), model, seed=3)
    runs = [build_model(ConvertConfig(model=issue_model, dtype="float32", prepare=False, concretize=flag))
            .compiled().run(feeds) for flag in (True, False)]
    assert runs[0].keys() == runs[1].keys()
    for name in runs[0]:
        np.testing.assert_array_equal(runs[0][name], runs[1][name])


def test_inspect_reports_concretized_and_left_alone(issue_model, run_cli, tmp_path):
    path = tmp_path / "inspect.json"
    result = run_cli("inspect", issue_model, "--json", str(path))
    assert result.exit_code == 0, result.output
    section = read_json(path)["concretize_like"]
    assert section["concretized"] == {"eye_like": 1, "zeros_like": 1} and section["skipped"] == []
    assert "2 (eye_like ×1, zeros_like ×1)" in result.output


def test_emit_ir_to_a_bad_path_is_one_line(issue_model, run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad in (str(tmp_path), str(blocker / "ir.py")):
        result = run_cli("convert", issue_model, "--emit-ir", bad, "-o", str(tmp_path / "out"))
        assert result.exit_code == 2, result.output
        assert "--emit-ir" in result.output and single_error(result.output)
        assert not (tmp_path / "out").exists()  # refused before anything was built


def test_shrink_concretizes_and_colours_stay(run_cli, tmp_path):
    """A Shrink on 4×40×40 float16 activations: zeros(S) is too large for FoldConstant and
    stays a float32 op, yet its consumers stay float16 as under --no-concretize (the
    mixed-precision pass reads it as a castable constant)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Shrink", ["c"], ["y"], name="shrink", lambd=0.3)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 40, 40])], [w])
    path = tmp_path / "shrink.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    reports, printed = [], []
    for flags in ((), ("--no-concretize",)):
        result = run_cli("inspect", str(path), *flags, "--json", str(tmp_path / "i.json"))
        assert result.exit_code == 0, result.output
        reports.append(read_json(tmp_path / "i.json"))
        printed.append(result.output)
    assert "like-ops not concretized" not in printed[0] and "off (--no-concretize)" in printed[1]
    assert reports[0]["concretize_like"]["concretized"] == {"zeros_like": 1}
    assert reports[0]["concretize_like"]["skipped"] == []
    for report in reports:
        assert report["ops_by_dtype"]["relax.where"] == {"float16": 2}
        assert report["ops_by_dtype"]["relax.add"] == {"float16": 2}


def test_full_like_with_a_run_time_fill_fires_only_in_float32():
    @I.ir_module
    class RunTimeFill:
        @R.function
        def main(x: R.Tensor((2, 3), "float32"), f: R.Tensor((), "float32")):
            g = R.full_like(x, f)
            return g

    low, report = concretize_like(RunTimeFill, "bfloat16")
    assert low.same_as(RunTimeFill)
    assert [reason for _, reason in report.skipped] == [
        "fill value is not a constant: full would not fold, would pull its consumers out of bfloat16"]
    fp32, report = concretize_like(RunTimeFill, "float32")
    assert "R.full(R.shape([2, 3]), f" in _tvm.module_script(fp32) and dict(report.concretized) == {"full_like": 1}
