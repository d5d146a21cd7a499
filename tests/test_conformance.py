"""The conformance harness (conformance/): classification, worker isolation, the per-op table."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conformance.cases import Case
from conformance.report import reason_key, render
from conformance.run import Worker, run_all
from conformance.worker import compare


def _case(tmp_path, name, op, node, inputs, outputs, feeds, expected, opset=18):
    path = tmp_path / name
    path.mkdir()
    graph = helper.make_graph([node], name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.save(model, path / "model.onnx")
    with open(path / "data.pkl", "wb") as f:
        pickle.dump({"inputs": feeds, "outputs": expected}, f)
    return Case(name, op, str(path), True)


@pytest.fixture
def cases(tmp_path):
    f = TensorProto.FLOAT
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    add = _case(tmp_path, "test_add", "Add", helper.make_node("Add", ["a", "b"], ["c"]),
                [helper.make_tensor_value_info(n, f, [2, 3]) for n in "ab"],
                [helper.make_tensor_value_info("c", f, [2, 3])], [x, x], [x + x])
    bad = _case(tmp_path, "test_add_bad_reference", "Add", helper.make_node("Add", ["a", "b"], ["c"]),
                [helper.make_tensor_value_info(n, f, [2, 3]) for n in "ab"],
                [helper.make_tensor_value_info("c", f, [2, 3])], [x, x], [x])
    # Run-time axes: Relax needs them at import; the harness fixes them to the case's value (as diff --inputs).
    reduce = _case(tmp_path, "test_reduce_sum_axes_input", "ReduceSum",
                   helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
                   [helper.make_tensor_value_info("x", f, [2, 3]),
                    helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                   [helper.make_tensor_value_info("y", f, [2])], [x, np.array([1], np.int64)], [x.sum(1)])
    # String tensors: onnxruntime runs it, amptool refuses.
    words = np.array(["a", "bc"], dtype=object)
    strings = _case(tmp_path, "test_identity_strings", "Identity", helper.make_node("Identity", ["x"], ["y"]),
                    [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                    [helper.make_tensor_value_info("y", TensorProto.STRING, [2])], [words], [words])
    # Stored as a TensorProto (as the generator keeps Cast's float8 data); onnxruntime cannot take the
    # float8 array, so amptool is judged against the stored outputs alone.
    eights = np.array([0.5, -2.0, 448.0, 3.0], np.float32)
    float8 = _case(tmp_path, "test_cast_float8_to_float", "Cast",
                   helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT),
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [4])],
                   [helper.make_tensor_value_info("y", f, [4])],
                   [helper.make_tensor("x", TensorProto.FLOAT8E4M3FN, [4], eights)],
                   [helper.make_tensor("y", f, [4], eights)], opset=21)
    return [add, bad, reduce, strings, float8]


def test_compare_checks_shapes_and_values():
    a = np.ones((2, 3), np.float32)
    assert compare(a, a) is None
    assert "shape" in compare(a, a.reshape(3, 2))
    assert "values differ" in compare(a, a + 1e-2)
    assert compare(np.array([np.nan]), np.array([np.nan])) is None
    assert compare(np.array([1, 2]), np.array([1, 3])) == "integer values differ"


def test_run_classifies_and_renders_the_table(cases, tmp_path):
    outcomes = run_all(cases, jobs=2, timeout=120, float16=True, bfloat16=True, log_dir=str(tmp_path / "logs"))
    verdicts = {o.name: (o.ort, o.f32, o.f16, o.bf16) for o in outcomes}
    assert verdicts["test_add"] == ("pass", "pass", "pass", "pass")
    assert verdicts["test_add_bad_reference"][0] == "wrong"  # onnxruntime disagrees: out of the denominator
    assert verdicts["test_add_bad_reference"][1] == ""  # and amptool is not run
    assert verdicts["test_reduce_sum_axes_input"][:2] == ("pass", "pass")
    assert verdicts["test_identity_strings"][:2] == ("pass", "refused")
    assert verdicts["test_cast_float8_to_float"][:3] == ("fails", "pass", "")  # judged apart, no low-dtype runs
    text, summary = render(outcomes, minutes=0.1, jobs=2, full=False)
    assert "onnxruntime passes 3 · amptool float32 passes 2 (66.7%)" in summary
    assert "of 1 cases onnxruntime cannot run, amptool passes 1 (crash 0)" in summary
    assert "| Add | 2 | 1 | 1 |  |  |  |  | 1 / 1 | 1 / 1 |  |" in text
    assert "| ReduceSum | 1 | 1 | 1 |  |  |  |  | 1 / 1 | 1 / 1 |  |" in text
    assert "| Identity | 1 | 1 |  |  | 1 |  |  | 0 / 1 | 0 / 1 |  |" in text
    assert "| Cast | 1 | 0 |  |  |  |  |  | – | – | 1 / 1 |" in text
    assert "## Refusals" in text and "STRING" in text


def test_a_hung_case_is_a_timeout_and_the_worker_is_replaced(cases, tmp_path):
    worker = Worker(0, str(tmp_path), timeout=0.01)
    try:
        assert worker.request({"kind": "amptool", "path": cases[0].path, "dtype": "float32"})["verdict"] == "timeout"
        assert worker.proc is None  # killed; the next request starts a fresh one
        worker.timeout = 120
        assert worker.request({"kind": "ort", "path": cases[0].path})["verdict"] == "pass"
    finally:
        worker.stop()


def test_low_dtype_builds_that_fail_where_float32_passed_are_listed():
    """A float16/bfloat16 build that crashes or is refused where float32 passed is a bug, not a
    precision limit: the page lists it by first line."""
    from conformance.run import Outcome

    crash = "InternalError: Check failed: value->ty == var->ty"
    ok = Outcome("test_argmax_x", "ArgMax", True, ort="pass", f32="pass", f16="pass", bf16="crash", bf16_detail=crash)
    text, summary = render([ok], minutes=0.1, jobs=1, full=False)
    assert "float16 passes 1 and bfloat16 0 of 1 float cases" in summary
    assert "## Low-dtype builds that failed where float32 passed" in text
    assert f"| 1 | bfloat16 crash: {crash} | argmax_x |" in text


def test_reason_key_masks_names_and_shapes():
    key = reason_key("Cannot import node 'n_7' (op Resize): bad [1, 2]")
    assert key == "Cannot import node '…' (op Resize): bad […]"
