"""Loop/Scan unrolling in prepare: structure of the unrolled graph, numerics equal to
onnxruntime on the original, the one-line refusal, and a tf2onnx-style RNN loop end to end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.frontend.fold import fold_model
from amptool.frontend.graph import iter_nodes
from amptool.frontend.prepare import pin_shapes
from amptool.frontend.signature import TensorSpec
from amptool.frontend.unroll import MAX_TRIP_COUNT, refusals, unroll_loops

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _const(name: str, value: Any) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(np.asarray(value), name))


def _vi(name: str, dtype: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "loops", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _loop_io(carried: list[tuple[str, list[int]]]) -> list[onnx.ValueInfoProto]:
    return [_vi("i", I64, []), _vi("cond_in", BOOL, []), *(_vi(n, F, s) for n, s in carried)]


def counting_loop(trips: int = 5) -> onnx.ModelProto:
    """acc += x·i over M iterations; scan output 2·acc; cond passes through an Identity."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], name="cast", to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"], name="mul"),
            helper.make_node("Add", ["acc", "xi"], ["acc_new"], name="add"),
            _const("two", np.float32(2)),
            helper.make_node("Mul", ["acc_new", "two"], ["scan"], name="scale"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
        ],
        "body", _loop_io([("acc", [2, 3])]),
        [_vi("cond_out", BOOL, []), _vi("acc_new", F, [2, 3]), _vi("scan", F, [2, 3])],
    )
    nodes = [
        _const("M", np.int64(trips)),
        _const("zeros", np.zeros((2, 3), np.float32)),
        helper.make_node("Loop", ["M", "", "zeros"], ["acc_final", "scans"], name="loop", body=body),
    ]
    return _model(nodes, [_vi("x", F, [2, 3])], [_vi("acc_final", F, [2, 3]), _vi("scans", F, [trips, 2, 3])])


def gather_loop() -> onnx.ModelProto:
    """Row i of a constant table, picked with iteration_num; cond_out is a constant true."""
    table = numpy_helper.from_array(np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32), "table")
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "i"], ["row"], name="pick", axis=0),
            helper.make_node("Mul", ["row", "x"], ["prod"], name="mul"),
            helper.make_node("Add", ["acc", "prod"], ["acc_new"], name="add"),
            _const("true", np.array(True)),
        ],
        "body", _loop_io([("acc", [3, 4])]),
        [_vi("true", BOOL, []), _vi("acc_new", F, [3, 4]), _vi("row", F, [4])],
    )
    nodes = [
        _const("M", np.int64(6)),
        _const("start", np.ones((3, 4), np.float32)),
        helper.make_node("Loop", ["M", "", "start"], ["acc_final", "rows"], name="loop", body=body),
    ]
    return _model(nodes, [_vi("x", F, [3, 4])], [_vi("acc_final", F, [3, 4]), _vi("rows", F, [6, 4])], [table])


def nested_if_loop() -> onnx.ModelProto:
    """acc = 2·acc for i < 2, acc + x after; the body's cond_out is cond_in itself."""
    then_branch = helper.make_graph(
        [_const("two", np.float32(2)), helper.make_node("Mul", ["acc", "two"], ["doubled"], name="double")],
        "then", [], [_vi("doubled", F, [2, 3])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Add", ["acc", "x"], ["summed"], name="sum")], "else", [], [_vi("summed", F, [2, 3])]
    )
    body = helper.make_graph(
        [
            _const("limit", np.int64(2)),
            helper.make_node("Less", ["i", "limit"], ["early"], name="less"),
            helper.make_node("If", ["early"], ["acc_new"], name="branch", then_branch=then_branch,
                             else_branch=else_branch),
        ],
        "body", _loop_io([("acc", [2, 3])]),
        [_vi("cond_in", BOOL, []), _vi("acc_new", F, [2, 3])],
    )
    nodes = [_const("M", np.int64(4)), _const("true", np.array(True)),
             helper.make_node("Loop", ["M", "true", "x"], ["acc_final"], name="loop", body=body)]
    return _model(nodes, [_vi("x", F, [2, 3])], [_vi("acc_final", F, [2, 3])])


def nested_loops() -> onnx.ModelProto:
    """An inner Loop running i + 1 times inside an outer one: acc = x·(1 + 2 + 3)."""
    inner = helper.make_graph(
        [helper.make_node("Add", ["inner_acc", "x"], ["inner_new"], name="inner_add")],
        "inner", [_vi("j", I64, []), _vi("inner_cond", BOOL, []), _vi("inner_acc", F, [2])],
        [_vi("inner_cond", BOOL, []), _vi("inner_new", F, [2])],
    )
    outer = helper.make_graph(
        [
            _const("one", np.int64(1)),
            helper.make_node("Add", ["i", "one"], ["count"], name="count"),
            helper.make_node("Loop", ["count", "", "acc"], ["acc_new"], name="inner_loop", body=inner),
        ],
        "outer", _loop_io([("acc", [2])]), [_vi("cond_in", BOOL, []), _vi("acc_new", F, [2])],
    )
    nodes = [_const("M", np.int64(3)), _const("zeros", np.zeros(2, np.float32)),
             helper.make_node("Loop", ["M", "", "zeros"], ["acc_final"], name="outer_loop", body=outer)]
    return _model(nodes, [_vi("x", F, [2])], [_vi("acc_final", F, [2])])


def data_dependent_loop(trip_count_input: bool = False) -> onnx.ModelProto:
    """Doubles acc while sum(acc) < limit (an input), or a trip count that is an input."""
    body = helper.make_graph(
        [
            _const("two", np.float32(2)),
            helper.make_node("Mul", ["acc", "two"], ["acc_new"], name="double"),
            helper.make_node("ReduceSum", ["acc_new"], ["total"], name="total", keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"], name="less"),
        ],
        "body", _loop_io([("acc", [3])]), [_vi("cond_out", BOOL, []), _vi("acc_new", F, [3])],
    )
    m = ["n", ""] if trip_count_input else ["big", ""]
    nodes = [_const("big", np.int64(100)), helper.make_node("Loop", [*m, "x"], ["acc_final"], name="loop", body=body)]
    inputs = [_vi("x", F, [3]), _vi("limit", F, [])] + ([_vi("n", I64, [])] if trip_count_input else [])
    return _model(nodes, inputs, [_vi("acc_final", F, [3])])


def tf2onnx_rnn_loop(features: int = 8, hidden: int = 16, batch: int = 2) -> onnx.ModelProto:
    """An RNN the way tf2onnx writes a Keras while-loop: trip count INT64_MAX, a loop-carried
    ``time`` counter, ``cond = time < T`` with T from Shape(x), x_t = Gather(x, time)."""
    rng = np.random.default_rng(7)
    scale = 1 / np.sqrt(hidden)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name)

    inits = [weight("W", (features, hidden)), weight("R", (hidden, hidden)), weight("b", (hidden,)),
             weight("fc.weight", (5, hidden))]
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["x", "time"], ["x_t"], name="read", axis=0),
            helper.make_node("MatMul", ["x_t", "W"], ["xw"], name="xw"),
            helper.make_node("MatMul", ["h", "R"], ["hr"], name="hr"),
            helper.make_node("Add", ["xw", "hr"], ["pre"], name="sum"),
            helper.make_node("Add", ["pre", "b"], ["pre_b"], name="bias"),
            helper.make_node("Tanh", ["pre_b"], ["h_new"], name="tanh"),
            _const("one", np.int64(1)),
            helper.make_node("Add", ["time", "one"], ["time_next"], name="tick"),
            helper.make_node("Less", ["time_next", "T"], ["cond_out"], name="more"),
            helper.make_node("Identity", ["h_new"], ["y_t"], name="write"),
        ],
        "body", [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("time", I64, []), _vi("h", F, [batch, hidden])],
        [_vi("cond_out", BOOL, []), _vi("time_next", I64, []), _vi("h_new", F, [batch, hidden]),
         _vi("y_t", F, [batch, hidden])],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        _const("zero", np.int64(0)),
        helper.make_node("Gather", ["x_shape", "zero"], ["T"], name="steps", axis=0),
        helper.make_node("Less", ["zero", "T"], ["cond"], name="any_steps"),
        _const("max_trips", np.int64(np.iinfo(np.int64).max)),
        _const("h0", np.zeros((batch, hidden), np.float32)),
        helper.make_node("Loop", ["max_trips", "cond", "zero", "h0"], ["time_final", "h_final", "ys"],
                         name="while", body=body),
        helper.make_node("Gemm", ["h_final", "fc.weight"], ["logits"], name="fc", transB=1),
    ]
    return _model(nodes, [_vi("x", F, ["T", batch, features])],
                  [_vi("ys", F, ["T", batch, hidden]), _vi("logits", F, [batch, 5])], inits)


def scan_model(steps: int | str = 5) -> onnx.ModelProto:
    """Scan with two inputs (axis 0 forward, axis 1 reverse) and two outputs (axis 0, axis 1 reversed)."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["a_t", "b_t"], ["ab"], name="mul"),
            helper.make_node("Add", ["s", "ab"], ["s_new"], name="add"),
            _const("three", np.float32(3)),
            helper.make_node("Mul", ["a_t", "three"], ["a3"], name="triple"),
            helper.make_node("Identity", ["s_new"], ["s_out"], name="copy"),
        ],
        "body", [_vi("s", F, [2, 4]), _vi("a_t", F, [2, 4]), _vi("b_t", F, [4])],
        [_vi("s_new", F, [2, 4]), _vi("s_out", F, [2, 4]), _vi("a3", F, [2, 4])],
    )
    nodes = [_const("s0", np.ones((2, 4), np.float32)),
             helper.make_node("Scan", ["s0", "a", "b"], ["s_final", "states", "tripled"], name="scan", body=body,
                              num_scan_inputs=2, scan_input_axes=[0, 1], scan_input_directions=[0, 1],
                              scan_output_axes=[0, 1], scan_output_directions=[0, 1])]
    return _model(nodes, [_vi("a", F, [steps, 2, 4]), _vi("b", F, [4, steps])],
                  [_vi("s_final", F, [2, 4]), _vi("states", F, [steps, 2, 4]), _vi("tripled", F, [2, steps, 4])])


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in wanted})


def _feeds(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = shapes.get(value.name) or tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in iter_nodes(model.graph)]


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, tuple[int, ...]]]] = {
    "counting": (counting_loop, {}),
    "counting-once": (lambda: counting_loop(1), {}),
    "counting-zero-trips": (lambda: counting_loop(0), {}),
    "gather-iteration-num": (gather_loop, {}),
    "nested-if": (nested_if_loop, {}),
    "nested-loops": (nested_loops, {}),
    "tf2onnx-rnn": (tf2onnx_rnn_loop, {"x": (6, 2, 8)}),
    "scan": (scan_model, {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unrolled_model_equals_onnxruntime_on_the_original(name: str) -> None:
    build, shapes = CASES[name]
    original = build()
    pinned = pin_shapes(original, [TensorSpec(n, "float32", s) for n, s in shapes.items()])
    unrolled, stats = fold_model(pinned)
    assert stats.loops_unrolled >= 1
    assert not {"Loop", "Scan"} & set(_ops(unrolled)), _ops(unrolled)
    onnx.checker.check_model(unroll_loops(original)[0], full_check=True)  # valid, types and shapes
    feeds = _feeds(original, shapes)
    for got, want in zip(_ort(unrolled, feeds), _ort(original, feeds), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_counting_loop_becomes_copies_threaded_and_stacked() -> None:
    unrolled, count = unroll_loops(counting_loop(5))
    assert count == 1
    ops = _ops(unrolled)
    assert "Loop" not in ops and ops.count("Add") == 5 and ops.count("Unsqueeze") == 5 and ops.count("Concat") == 1
    adds = [n for n in unrolled.graph.node if n.op_type == "Add"]
    assert adds[0].input[0] == "zeros"  # copy 0 reads the initial value ...
    assert [a.input[0] for a in adds[1:]] == [a.output[0] for a in adds[:-1]]  # ... then the previous copy's
    iterations = [n for n in unrolled.graph.node if n.output[0].startswith("loop/iteration_")]
    assert [int(numpy_helper.to_array(n.attribute[0].t)) for n in iterations] == [0, 1, 2, 3, 4]
    assert sum(1 for n in unrolled.graph.node if n.output[0].startswith("loop/two")) == 1  # hoisted once
    assert [n.op_type for n in unrolled.graph.node if "keep" in n.name] == []  # cond_out's chain is dead


def test_zero_trips_give_initial_values_and_empty_scans() -> None:
    unrolled, count = unroll_loops(counting_loop(0))
    assert count == 1 and _ops(unrolled).count("Add") == 0
    acc, scans = _ort(unrolled, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(acc, np.zeros((2, 3), np.float32))
    assert scans.shape == (0, 2, 3)


def test_iteration_num_folds_the_gather_of_a_constant() -> None:
    folded, stats = fold_model(gather_loop())
    assert stats.loops_unrolled == 1
    assert "Gather" not in _ops(folded)  # Gather(table, Constant i) became the row itself


def test_nested_if_is_copied_with_renamed_names_then_inlined() -> None:
    unrolled, _ = unroll_loops(nested_if_loop())
    ifs = [n for n in unrolled.graph.node if n.op_type == "If"]
    assert len(ifs) == 4
    inner = [n.output[0] for node in ifs for a in node.attribute for n in a.g.node]
    assert len(inner) == len(set(inner)) == 12  # every copy's branch names are its own
    folded, stats = fold_model(nested_if_loop())
    assert stats.ifs_inlined == 4 and "If" not in _ops(folded)


def test_nested_loops_unroll_over_rounds() -> None:
    folded, stats = fold_model(nested_loops())
    assert stats.loops_unrolled == 4  # the outer loop, then its three inner copies
    assert _ops(folded).count("Add") >= 6


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (data_dependent_loop(), "its continuation condition depends on input values"),
        (data_dependent_loop(trip_count_input=True), "its trip count depends on input values"),
        (counting_loop(MAX_TRIP_COUNT + 1), f"unroll limit of {MAX_TRIP_COUNT}"),
        (tf2onnx_rnn_loop(), "its initial condition depends on input values"),  # T unknown until pinned
        (scan_model("L"), "its trip count depends on input values"),  # made a Loop (scan_loops.py), run at run time
    ],
    ids=["condition", "trip-count", "too-long", "unpinned-shape", "scan-unpinned"],
)
def test_loops_that_cannot_be_unrolled_stay_and_say_why(model: onnx.ModelProto, reason: str) -> None:
    folded, stats = fold_model(model)
    loops = [n.name for n in folded.graph.node if n.op_type in ("Loop", "Scan")]
    assert stats.loops_unrolled == 0 and len(loops) == 1
    assert reason in refusals(folded)[loops[0]]


def test_an_unrollable_loop_left_in_place_says_prepare_did_not_run() -> None:
    assert "prepare's folding was skipped (--no-prepare)" in refusals(counting_loop())["loop"]


def test_tf2onnx_style_rnn_loop_passes_float16_diff(tmp_path: Path, run_cli: Any) -> None:
    from tests.conftest import read_json

    path = tmp_path / "rnn_loop.onnx"
    onnx.save(tf2onnx_rnn_loop(), path)
    report = tmp_path / "diff.json"
    result = run_cli("diff", str(path), "--input-shape", "x:6x2x8", "--dtype", "float16", "--json", str(report))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED |")
    for output in read_json(report)["outputs"]:
        assert output["cosine"] >= 0.999 and output["nan"] == 0 and output["inf"] == 0, output
