"""Loops decided at run time (frontend/loop_function.py): a recursive Relax function per Loop, judged
against onnxruntime on the original model in float32, float16 and bfloat16."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.frontend import loop_function
from tests.conftest import read_json, single_error
from tests.test_unroll import data_dependent_loop

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name: str, dtype: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(tmp_path: Path, name: str, nodes: list, inputs: list, outputs: list, inits: list = ()) -> str:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = str(tmp_path / name)
    onnx.save(model, path)
    return path


def _weights(name: str, shape: tuple[int, ...], seed: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).normal(0, scale, shape).astype(np.float32), name)


def refinement_loop(tmp_path: Path) -> str:
    """A while loop over low-precision values: v ← v + 0.3·(tanh(v·W) + c) until sum(v²) ≥ limit or 40 steps
    (M an input value), c and v₀ made by MatMuls outside the loop (float16 there: the call takes
    them back in float32), each step's v·i stacked as a scan output."""
    body = helper.make_graph([
        helper.make_node("MatMul", ["v_in", "W"], ["t"]),
        helper.make_node("Tanh", ["t"], ["t2"]),
        helper.make_node("Add", ["t2", "c"], ["pull"]),
        helper.make_node("Mul", ["pull", "rate"], ["move"]),
        helper.make_node("Add", ["v_in", "move"], ["v_out"]),
        helper.make_node("Mul", ["v_out", "v_out"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["energy"], keepdims=0),
        helper.make_node("Less", ["energy", "limit"], ["cond_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["v_out", "fi"], ["scan"]),
    ], "body", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F, [2, 8])],
        [_vi("cond_out", BOOL, []), _vi("v_out", F, [2, 8]), _vi("scan", F, [2, 8])],
        [numpy_helper.from_array(np.array(0.3, np.float32), "rate")])
    nodes = [
        helper.make_node("MatMul", ["x", "W2"], ["v0"]),
        helper.make_node("MatMul", ["x", "W"], ["c0"]),
        helper.make_node("Sigmoid", ["c0"], ["c"]),
        helper.make_node("ReduceMax", ["steps"], ["m"], keepdims=0),
        helper.make_node("Loop", ["m", "", "v0"], ["v_final", "trace"], body=body, name="refine"),
        helper.make_node("MatMul", ["v_final", "W2"], ["y"]),
    ]
    return _save(tmp_path, "refine.onnx", nodes,
                 [_vi("x", F, [2, 8]), _vi("steps", I64, [3]), _vi("limit", F, [])],
                 [_vi("y", F, [2, 8]), _vi("trace", F, ["n", 2, 8])],
                 [_weights("W", (8, 8), 0), _weights("W2", (8, 8), 1)])


def counter_loop(tmp_path: Path, shape: tuple[int, ...] = (1, 4)) -> str:
    """v ← v + 1 (``shape`` values) for M = ReduceMax(n) iterations, M an input value."""
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])],
                             "body", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F, list(shape))],
                             [_vi("cond_out", BOOL, []), _vi("v_out", F, list(shape))],
                             [numpy_helper.from_array(np.ones([1] * len(shape), np.float32), "one")])
    nodes = [helper.make_node("ReduceMax", ["n"], ["m"], keepdims=0),
             helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="count")]
    return _save(tmp_path, "count.onnx", nodes, [_vi("x", F, list(shape)), _vi("n", I64, [1])],
                 [_vi("y", F, list(shape))])


def growing_loop(tmp_path: Path) -> str:
    """A loop-carried value that grows a row per iteration (Concat), while its mean stays below a limit."""
    body = helper.make_graph([
        helper.make_node("Concat", ["rows_in", "x"], ["rows_out"], axis=0),
        helper.make_node("ReduceMean", ["rows_out"], ["mean"], keepdims=0),
        helper.make_node("Less", ["mean", "limit"], ["cond_out"]),
    ], "body", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("rows_in", F, ["r", 4])],
        [_vi("cond_out", BOOL, []), _vi("rows_out", F, ["r2", 4])])
    nodes = [helper.make_node("Loop", ["max_trips", "", "x"], ["rows"], body=body, name="grow"),
             helper.make_node("ReduceSum", ["rows"], ["total"], axes=None, keepdims=1)]
    return _save(tmp_path, "grow.onnx", nodes, [_vi("x", F, [1, 4]), _vi("limit", F, [])],
                 [_vi("rows", F, ["n", 4])], [numpy_helper.from_array(np.array(50, np.int64), "max_trips")])


def _feeds(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = str(tmp_path / "feeds.npz")
    np.savez(path, **arrays)
    return path


def _passed(result: Any) -> str:
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("PASSED"), result.output
    return last


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_while_loop_with_a_data_dependent_exit_matches_onnxruntime(run_cli, tmp_path, dtype):
    model = refinement_loop(tmp_path)
    feeds = _feeds(tmp_path, x=np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32),
                   steps=np.array([5, 40, 12], np.int64), limit=np.array(60.0, np.float32))
    report = tmp_path / "diff.json"
    _passed(run_cli("diff", model, "--dtype", dtype, "--inputs", feeds, "--json", str(report)))
    outputs = {o["name"]: o for o in read_json(report)["outputs"]}
    trips = outputs["trace"]["shape"][0]
    assert 1 < trips < 40, "the exit is the data's, not the trip count's"
    assert read_json(report)["build"]["run_time_loops"] == 1 if "build" in read_json(report) else True


def test_the_manifest_counts_run_time_loops_and_static_loops_still_unroll(run_cli, tmp_path):
    from tests.test_unroll import counting_loop

    out = tmp_path / "out"
    result = run_cli("convert", refinement_loop(tmp_path), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out / "manifest.json")["run_time_loops"] == 1
    static = tmp_path / "static.onnx"
    onnx.save(counting_loop(), static)
    result = run_cli("convert", str(static), "-o", str(tmp_path / "static_out"))
    assert result.exit_code == 0, result.output
    assert read_json(tmp_path / "static_out" / "manifest.json")["run_time_loops"] == 0


@pytest.mark.parametrize("trip_count_input", [False, True], ids=["condition", "trip-count"])
def test_loops_prepare_cannot_unroll_now_run(run_cli, tmp_path, trip_count_input):
    """The loops that were a "No converter … not unrolled" refusal."""
    path = tmp_path / "while.onnx"
    onnx.save(data_dependent_loop(trip_count_input), path)
    arrays = {"x": np.array([0.5, 1.0, 1.5], np.float32), "limit": np.array(100.0, np.float32)}
    if trip_count_input:
        arrays["n"] = np.array(4, np.int64)
    _passed(run_cli("diff", str(path), "--dtype", "float16", "--inputs", _feeds(tmp_path, **arrays)))


def test_thousands_of_iterations_run_on_a_deep_stack(run_cli, tmp_path):
    """6,000 iterations: on the main thread's 8 MB stack the VM's recursion segfaulted near 2,500."""
    feeds = _feeds(tmp_path, x=np.zeros((1, 4), np.float32), n=np.array([6000], np.int64))
    _passed(run_cli("diff", counter_loop(tmp_path), "--dtype", "float32", "--inputs", feeds))


def test_a_loop_past_the_run_time_bound_is_a_one_line_refusal(run_cli, tmp_path, monkeypatch):
    monkeypatch.setattr(loop_function, "MAX_ITERATIONS", 50)
    feeds = _feeds(tmp_path, x=np.zeros((1, 4), np.float32), n=np.array([80], np.int64))
    result = run_cli("diff", counter_loop(tmp_path), "--inputs", feeds)
    assert result.exit_code == 2, result.output
    assert single_error(result.output) and "Traceback" not in result.output
    assert "a Loop ran past amptool's bound" in result.output


def test_a_loop_carried_value_that_grows_gets_a_symbolic_dim(run_cli, tmp_path):
    feeds = _feeds(tmp_path, x=np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), limit=np.array(3.0, np.float32))
    report = tmp_path / "diff.json"
    _passed(run_cli("diff", growing_loop(tmp_path), "--dtype", "float16", "--inputs", feeds, "--json", str(report)))
    assert read_json(report)["outputs"][0]["shape"] == [1 + 50, 4]  # the mean never reaches 3: all 50 trips


def scripted_while(tmp_path: Path) -> str:
    """torch.jit.script's ``while mean(h²) < tol and i < 50`` as its exporter writes it: the
    condition's second half in an If inside the body (whose branches the importer caches)."""
    fifty = numpy_helper.from_array(np.array(50, np.int64), "fifty")
    then_branch = helper.make_graph([helper.make_node("Less", ["i_out", "fifty"], ["go_on"])], "then", [],
                                    [_vi("go_on", BOOL, [])], [fifty])
    else_branch = helper.make_graph([helper.make_node("Identity", ["false"], ["stop"])], "else", [],
                                    [_vi("stop", BOOL, [])])
    body = helper.make_graph([
        helper.make_node("Gemm", ["h", "W", "b"], ["pre"], transB=1),
        helper.make_node("Tanh", ["pre"], ["act"]),
        helper.make_node("Mul", ["act", "rate"], ["move"]),
        helper.make_node("Add", ["h", "move"], ["h_out"]),
        helper.make_node("Add", ["i_in", "one"], ["i_out"]),
        helper.make_node("Mul", ["h_out", "h_out"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["energy"], keepdims=0),
        helper.make_node("Less", ["energy", "tol"], ["low"]),
        helper.make_node("If", ["low"], ["cond_out"], then_branch=then_branch, else_branch=else_branch, name="and"),
    ], "body", [_vi("iter", I64, []), _vi("cond", BOOL, []), _vi("h", F, [1, 16]), _vi("i_in", I64, [])],
        [_vi("cond_out", BOOL, []), _vi("h_out", F, [1, 16]), _vi("i_out", I64, [])],
        [numpy_helper.from_array(np.array(0.2, np.float32), "rate"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["x2"]),
        helper.make_node("ReduceMean", ["x2"], ["e0"], keepdims=0),
        helper.make_node("Less", ["e0", "tol"], ["c0"]),
        helper.make_node("Loop", ["big", "c0", "x", "zero"], ["h_final", "steps"], body=body, name="while"),
        helper.make_node("Gemm", ["h_final", "W2", "b2"], ["y"], transB=1),
    ]
    inits = [_weights("W", (16, 16), 2), _weights("b", (16,), 3), _weights("W2", (4, 16), 4), _weights("b2", (4,), 5),
             numpy_helper.from_array(np.array(np.iinfo(np.int64).max, np.int64), "big"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(False), "false")]
    return _save(tmp_path, "scripted.onnx", nodes, [_vi("x", F, [1, 16]), _vi("tol", F, [])],
                 [_vi("y", F, [1, 4]), _vi("steps", I64, [])], inits)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_scripted_while_with_an_if_in_its_body(run_cli, tmp_path, dtype):
    """The If's branches were cached from the first (trial) import of the body and reused in the
    loop's own function: "Var … is not defined" (exit 70)."""
    feeds = _feeds(tmp_path, x=np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32) * 0.3,
                   tol=np.array(3.0, np.float32))
    report = tmp_path / "diff.json"
    _passed(run_cli("diff", scripted_while(tmp_path), "--dtype", dtype, "--inputs", feeds, "--json", str(report)))
    steps = next(o for o in read_json(report)["outputs"] if o["name"] == "steps")
    assert steps["max_abs"] == 0


def test_nested_loops_both_decided_at_run_time(run_cli, tmp_path):
    """An outer loop of M (an input's value) trips, each running an inner loop i + 1 times."""
    inner = helper.make_graph(
        [helper.make_node("Add", ["inner_acc", "x"], ["inner_new"])],
        "inner", [_vi("j", I64, []), _vi("inner_cond", BOOL, []), _vi("inner_acc", F, [2])],
        [_vi("inner_cond", BOOL, []), _vi("inner_new", F, [2])])
    outer = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["count"]),
         helper.make_node("Loop", ["count", "", "acc"], ["acc_new"], name="inner_loop", body=inner)],
        "outer", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("acc", F, [2])],
        [_vi("cond_in", BOOL, []), _vi("acc_new", F, [2])], [numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = _save(tmp_path, "nested.onnx",
                 [helper.make_node("ReduceMax", ["n"], ["m"], keepdims=0),
                  helper.make_node("Loop", ["m", "", "x"], ["y"], name="outer_loop", body=outer)],
                 [_vi("x", F, [2]), _vi("n", I64, [1])], [_vi("y", F, [2])])
    feeds = _feeds(tmp_path, x=np.array([0.25, -1.0], np.float32), n=np.array([5], np.int64))
    out = tmp_path / "out"
    assert run_cli("convert", path, "-o", str(out)).exit_code == 0
    assert read_json(out / "manifest.json")["run_time_loops"] == 2
    report = tmp_path / "diff.json"
    _passed(run_cli("diff", path, "--inputs", feeds, "--json", str(report)))
    assert read_json(report)["outputs"][0]["max_abs"] == 0  # x · (1 + 1 + 2 + 3 + 4 + 5) in float16: exact


def appending_loop(tmp_path: Path, axis: int, new_axis: int, read_inside: bool = False) -> str:
    """torch.jit.script's ``outs.append(v)`` in a while loop, then ``torch.stack``/``torch.cat``:
    a carried sequence (SequenceEmpty → SequenceInsert → ConcatFromSequence)."""
    nodes = [helper.make_node("MatMul", ["v_in", "W"], ["t"]), helper.make_node("Tanh", ["t"], ["v_out"]),
             helper.make_node("SequenceInsert", ["seq_in", "v_out"], ["seq_out"]),
             helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "limit"], ["cond_out"])]
    if read_inside:  # the list read in the body: not a plain append any more
        nodes.append(helper.make_node("SequenceLength", ["seq_out"], ["length"]))
    body = helper.make_graph(
        nodes, "body",
        [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F, [2, 3]),
         helper.make_tensor_sequence_value_info("seq_in", F, None)],
        [_vi("cond_out", BOOL, []), _vi("v_out", F, [2, 3]),
         helper.make_tensor_sequence_value_info("seq_out", F, None)])
    main = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
            helper.make_node("Loop", ["max_trips", "", "x", "empty"], ["v_final", "seq"], body=body, name="loop"),
            helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=axis, new_axis=new_axis)]
    weights = numpy_helper.from_array(np.eye(3, dtype=np.float32) * 1.3, "W")
    return _save(tmp_path, "append.onnx", main, [_vi("x", F, [2, 3]), _vi("limit", F, [])],
                 [_vi("v_final", F, [2, 3]), _vi("stacked", F, ["a", "b", "c"][:3 - (new_axis == 0)])],
                 [weights, numpy_helper.from_array(np.array(30, np.int64), "max_trips")])


@pytest.mark.parametrize(("axis", "new_axis", "shape"), [
    (0, 1, [5, 2, 3]), (2, 1, [2, 3, 5]), (-1, 1, [2, 3, 5]), (0, 0, [10, 3]), (1, 0, [2, 15])])
def test_a_list_appended_in_a_while_loop_becomes_its_scan_output(run_cli, tmp_path, axis, new_axis, shape):
    feeds = _feeds(tmp_path, x=np.full((2, 3), 0.5, np.float32), limit=np.array(4.3, np.float32))  # 5 trips
    report = tmp_path / "diff.json"
    result = run_cli("diff", appending_loop(tmp_path, axis, new_axis), "--dtype", "float16", "--inputs", feeds,
                     "--json", str(report))
    _passed(result)
    assert next(o for o in read_json(report)["outputs"] if o["name"] == "stacked")["shape"] == shape


def test_a_list_read_inside_the_loop_is_still_refused_by_name(run_cli, tmp_path):
    result = run_cli("convert", appending_loop(tmp_path, 0, 1, read_inside=True), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert single_error(result.output) and "Loop 'loop' carries 'seq_in', which is not a tensor" in result.output


def test_a_run_time_loop_lowers_for_cuda(run_cli, tmp_path):
    """No GPU needed: --lower-only schedules every kernel for the target. A hand-written scalar
    kernel for the loop's decision had no root block, which the CUDA schedules require."""
    out = tmp_path / "cuda"
    result = run_cli("convert", refinement_loop(tmp_path), "--target", "cuda", "--cuda-arch", "sm_90", "--lower-only",
                     "-o", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out / "manifest.json")["run_time_loops"] == 1


def test_an_if_branch_that_does_not_type_inside_a_run_time_loop(run_cli, tmp_path):
    """The branch raises at run time (control_flow.py's assert_op) inside the loop's function, which
    main calls from a dataflow block: the loop function is marked pure for it."""
    shapes = {"good": [2, 8], "bad": [3, 5]}  # 16 values: the bad shape cannot hold them
    branches = {name: helper.make_graph(
        [helper.make_node("Reshape", ["v_in", f"{name}_shape"], [f"{name}_out"])], name, [],
        [_vi(f"{name}_out", F, shape)], [numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape")])
        for name, shape in shapes.items()}
    body = helper.make_graph([
        helper.make_node("Less", ["i", "big"], ["early"]),
        helper.make_node("If", ["early"], ["picked"], then_branch=branches["good"], else_branch=branches["bad"],
                         name="pick"),
        helper.make_node("Tanh", ["picked"], ["v_out"]),
        helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "limit"], ["cond_out"]),  # v ← tanh(v) shrinks: ~230 trips
    ], "body", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F, [2, 8])],
        [_vi("cond_out", BOOL, []), _vi("v_out", F, [2, 8])],
        [numpy_helper.from_array(np.array(1000, np.int64), "big")])
    path = _save(tmp_path, "if_in_loop.onnx",
                 [helper.make_node("Loop", ["", "", "x"], ["y"], body=body, name="loop")],
                 [_vi("x", F, [2, 8]), _vi("limit", F, [])], [_vi("y", F, [2, 8])])
    feeds = _feeds(tmp_path, x=np.full((2, 8), 0.1, np.float32), limit=np.array(1.0, np.float32))
    result = run_cli("diff", path, "--inputs", feeds)
    _passed(result)
    assert result.output.count("If 'pick': its else branch does not type") == 1, "warned once, not per import"


def test_a_loop_of_large_values_is_bounded_by_what_its_frames_hold(run_cli, tmp_path, monkeypatch):
    """Each iteration's frame holds the 1 MB state it passes on until the loop ends (1,000 iterations
    held 1 GB): the bound comes down to what the budget allows, named in the one-line error."""
    monkeypatch.setattr(loop_function, "MEMORY_BUDGET_BYTES", 64 << 20)
    monkeypatch.setattr(loop_function, "MIN_ITERATIONS", 16)
    path = counter_loop(tmp_path, (256, 1024))
    out = tmp_path / "out"
    assert run_cli("convert", path, "-o", str(out)).exit_code == 0
    for trips, bounded in ((60, False), (70, True)):  # 64 MB / 1 MB: 64 iterations
        arrays = _feeds(tmp_path, x=np.zeros((256, 1024), np.float32), n=np.array([trips], np.int64))
        result = run_cli("run", str(out), "--inputs", arrays, "-o", str(tmp_path / "y.npz"))
        assert result.exit_code == (2 if bounded else 0), result.output
        assert ("a Loop ran past amptool's bound of 64 iterations" in result.output) is bounded


def test_a_scan_past_the_unroll_limit_runs_as_a_run_time_loop(run_cli, tmp_path):
    """1,500 steps, inputs read forward and backward along axes 0 and 1, outputs stacked on both
    axes, one reversed: the Scan was refused ("exceeds the unroll limit"); now a Loop."""
    from tests.test_unroll import scan_model

    path = tmp_path / "scan.onnx"
    onnx.save(scan_model(1500), path)
    out = tmp_path / "out"
    assert run_cli("convert", str(path), "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    assert manifest["run_time_loops"] == 1
    assert any("1 Scan(s) made run-time Loops" in note for note in manifest["prepare_notes"])
    _passed(run_cli("diff", str(path), "--dtype", "float16"))
