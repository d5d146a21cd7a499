"""amptool's LSTM / GRU / RNN and ReverseSequence converters against onnxruntime, and end to end
in float16.

Each case builds a one-node model in code with seeded weights, imports it with amptool's
importer, compiles it for llvm in float32 (no amptool passes: this tests the converter) and
compares every output with onnxruntime within 1e-4. onnxruntime rejects ``layout=1``
("Batchwise recurrent operations are not supported"), so those cases are checked against
the ``layout=0`` twin of the same model with inputs and outputs transposed.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool import _tvm, compiler
from amptool.compiler.targets import get_target
from amptool.errors import UserError
from amptool.frontend.importer import import_model
from amptool.frontend.signature import TensorSpec, graph_inputs, graph_outputs
from amptool.runtime.tvm_runner import CompiledModel

ATOL = RTOL = 1e-4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


@dataclass(frozen=True)
class Case:
    """One RNN node and how it is fed."""

    op: str
    direction: str = "forward"
    seq: int = 4
    batch: int = 3
    input_size: int = 5
    hidden: int = 6
    layout: int = 0
    bias: bool = True
    initial: bool = False  # initial_h (and initial_c for LSTM)
    peepholes: bool = False
    lens: tuple[int, ...] | None = None
    lens_as_input: bool = False
    omit_y: bool = False
    weights_as_inputs: bool = False  # W, R, B, P, initial states fed at run time, not constants
    attrs: tuple[tuple[str, Any], ...] = ()

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def outputs(self) -> list[str]:
        return ["Y", "Y_h", "Y_c"][: 3 if self.op == "LSTM" else 2]


def rnn_model(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node LSTM/GRU/RNN model and seeded feeds; weights are drawn in ``layout=0`` order."""
    rng = np.random.default_rng(0)
    nd, hid, gates = case.dirs, case.hidden, GATES[case.op]
    inits: list[onnx.TensorProto] = []
    graph_in: list[onnx.ValueInfoProto] = []
    feeds: dict[str, np.ndarray] = {}

    def add(name: str, value: np.ndarray) -> str:
        if case.weights_as_inputs:
            graph_in.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape))
            feeds[name] = value
        else:
            inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(name: str, shape: tuple[int, ...], scale: float = 0.5) -> str:
        return add(name, rng.uniform(-scale, scale, shape).astype(np.float32))

    def state(name: str) -> str:
        value = rng.standard_normal((nd, case.batch, hid)).astype(np.float32)
        return add(name, np.ascontiguousarray(value.transpose(1, 0, 2)) if case.layout else value)

    x_shape = [case.batch, case.seq, case.input_size] if case.layout else [case.seq, case.batch, case.input_size]
    graph_in.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape))
    feeds["X"] = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    names = ["X", weight("W", (nd, gates * hid, case.input_size)), weight("R", (nd, gates * hid, hid))]
    names.append(weight("B", (nd, 2 * gates * hid)) if case.bias else "")
    if case.lens is None:
        names.append("")
    elif case.lens_as_input:
        graph_in.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [case.batch]))
        feeds["lens"] = np.array(case.lens, np.int32)
        names.append("lens")
    else:
        inits.append(numpy_helper.from_array(np.array(case.lens, np.int32), "lens"))
        names.append("lens")
    names.append(state("initial_h") if case.initial else "")
    if case.op == "LSTM":
        names.append(state("initial_c") if case.initial else "")
        names.append(weight("P", (nd, 3 * hid)) if case.peepholes else "")
    while names[-1] == "":
        names.pop()

    y_shape = [case.batch, case.seq, nd, hid] if case.layout else [case.seq, nd, case.batch, hid]
    state_shape = [case.batch, nd, hid] if case.layout else [nd, case.batch, hid]
    shapes = dict(zip(case.outputs, [y_shape, state_shape, state_shape]))
    node_outputs = [("" if (name == "Y" and case.omit_y) else name) for name in case.outputs]
    attrs: dict[str, Any] = {"direction": case.direction, "hidden_size": hid, **dict(case.attrs)}
    if case.layout:
        attrs["layout"] = case.layout
    node = helper.make_node(case.op, names, node_outputs, name=f"/rnn/{case.op}", **attrs)
    graph = helper.make_graph(
        [node],
        "rnn",
        graph_in,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in node_outputs if n],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, feeds


def reference(case: Case) -> dict[str, np.ndarray]:
    """onnxruntime's outputs, in ``case.layout``."""
    if case.layout == 0:
        model, feeds = rnn_model(case)
        return _run_ort(model, feeds)
    twin, feeds = rnn_model(dataclasses.replace(case, layout=0))
    feeds["X"] = np.ascontiguousarray(rnn_model(case)[1]["X"].transpose(1, 0, 2))
    out = _run_ort(twin, feeds)
    return {k: v.transpose(2, 0, 1, 3) if k == "Y" else v.transpose(1, 0, 2) for k, v in out.items()}


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def amptool_fp32(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """amptool's import, shapes pinned from ``feeds``, compiled as is for llvm (float32)."""
    specs = [TensorSpec(s.name, str(feeds[s.name].dtype), feeds[s.name].shape) for s in graph_inputs(model)]
    executable = compiler.compile_module(import_model(model, specs).mod, get_target("llvm").build_spec())
    compiled = CompiledModel(
        vm=_tvm.vm_from_executable(executable),
        input_names=[s.name for s in specs],
        output_names=[s.name for s in graph_outputs(model)],
    )
    return compiled.run(feeds)


LSTM_CASES = {
    "seq1_batch1_bare": Case("LSTM", seq=1, batch=1, bias=False),
    "forward_lens": Case("LSTM", seq=5, initial=True, lens=(5, 2, 3)),
    "reverse_lens_with_zero": Case("LSTM", direction="reverse", seq=5, initial=True, lens=(4, 1, 0)),
    "bidirectional_peepholes_lens": Case(
        "LSTM", direction="bidirectional", initial=True, peepholes=True, lens=(2, 4, 3)
    ),
    "bidirectional_seq1": Case("LSTM", direction="bidirectional", seq=1, input_size=7, hidden=3),
    "layout1_bidirectional_lens": Case("LSTM", direction="bidirectional", layout=1, initial=True, lens=(3, 4, 1)),
    "input_forget_clip": Case("LSTM", peepholes=True, attrs=(("input_forget", 1), ("clip", 0.3))),
    "activations": Case(
        "LSTM",
        direction="bidirectional",
        attrs=(("activations", ["Relu", "Tanh", "Sigmoid", "Sigmoid", "Softsign", "Softplus"]),),
    ),
    "y_omitted": Case("LSTM", omit_y=True, batch=1, hidden=8),
    "lens_as_input_reverse": Case("LSTM", direction="reverse", lens=(2, 4, 3), lens_as_input=True),
    "weights_as_inputs_layout1": Case(
        "LSTM", direction="bidirectional", layout=1, initial=True, peepholes=True, weights_as_inputs=True
    ),
}

GRU_CASES = {
    "seq1_batch1_bare": Case("GRU", seq=1, batch=1, bias=False),
    "forward_lens": Case("GRU", seq=5, initial=True, lens=(5, 2, 3)),
    "reverse_linear_before_reset_lens": Case(
        "GRU", direction="reverse", seq=5, lens=(4, 1, 0), attrs=(("linear_before_reset", 1),)
    ),
    "bidirectional_lens": Case("GRU", direction="bidirectional", initial=True, lens=(2, 4, 3), input_size=2, hidden=9),
    "bidirectional_linear_before_reset": Case(
        "GRU", direction="bidirectional", initial=True, attrs=(("linear_before_reset", 1),)
    ),
    "layout1_linear_before_reset_lens": Case(
        "GRU", direction="bidirectional", layout=1, initial=True, lens=(3, 4, 1), attrs=(("linear_before_reset", 1),)
    ),
    "linear_before_reset_no_bias": Case("GRU", bias=False, attrs=(("linear_before_reset", 1),)),
    "clip_activations": Case(
        "GRU",
        direction="bidirectional",
        attrs=(("clip", 0.3), ("activations", ["Softsign", "Relu", "Sigmoid", "Softplus"])),
    ),
    "lens_as_input_y_omitted": Case("GRU", lens=(1, 3, 4), lens_as_input=True, omit_y=True),
    "weights_as_inputs": Case("GRU", direction="bidirectional", initial=True, weights_as_inputs=True),
    "weights_as_inputs_linear_before_reset": Case(
        "GRU", direction="reverse", weights_as_inputs=True, lens=(2, 4, 3), attrs=(("linear_before_reset", 1),)
    ),
}

RNN_CASES = {
    "seq1_batch1_bare": Case("RNN", seq=1, batch=1, bias=False),
    "forward_initial_lens": Case("RNN", seq=5, initial=True, lens=(5, 2, 3)),
    "reverse_lens_with_zero": Case("RNN", direction="reverse", seq=5, initial=True, lens=(4, 1, 0)),
    "bidirectional_relu_sigmoid": Case(
        "RNN", direction="bidirectional", input_size=2, hidden=9, attrs=(("activations", ["Relu", "Sigmoid"]),)
    ),
    "layout1_bidirectional_lens": Case("RNN", direction="bidirectional", layout=1, initial=True, lens=(3, 4, 1)),
    "clip": Case("RNN", direction="bidirectional", seq=6, attrs=(("clip", 0.3),)),
    "lens_as_input_y_omitted": Case("RNN", lens=(1, 3, 4), lens_as_input=True, omit_y=True),
    "weights_as_inputs": Case("RNN", direction="bidirectional", initial=True, weights_as_inputs=True),
}
#: Covered by the other RNN cases' features (the unroller is shared): run in `make test-all` only.
RNN_SLOW = {"seq1_batch1_bare", "forward_initial_lens", "weights_as_inputs"}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=f"lstm-{k}") for k, c in LSTM_CASES.items()]
    + [pytest.param(c, id=f"gru-{k}") for k, c in GRU_CASES.items()]
    + [
        pytest.param(c, id=f"rnn-{k}", marks=[pytest.mark.slow] if k in RNN_SLOW else [])
        for k, c in RNN_CASES.items()
    ],
)
def test_matches_onnxruntime_fp32(case: Case) -> None:
    _assert_matches_reference(case)


def _assert_matches_reference(case: Case) -> None:
    """amptool's float32 build of ``case``'s node gives every output of the reference, shapes included."""
    model, feeds = rnn_model(case)
    expected = reference(case)
    got = amptool_fp32(model, feeds)
    assert list(got) == [n for n in case.outputs if not (n == "Y" and case.omit_y)]
    for name, value in got.items():
        assert value.shape == expected[name].shape, name
        np.testing.assert_allclose(value, expected[name], atol=ATOL, rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("op, per_step", [("LSTM", 1), ("GRU", 2)])
def test_input_projection_is_one_matmul_per_direction(op: str, per_step: int) -> None:
    """X·Wᵀ for all timesteps is one matmul per direction; each step adds only its recurrent
    matmul(s), both directions in one (a batched matmul, one weight per direction) — but the
    first, whose H·Rᵀ from the zero initial state is a constant (GRU's (r ⊙ H)·Rhᵀ still runs)."""
    case = Case(op, direction="bidirectional", seq=6)
    model, _ = rnn_model(case)
    calls = [
        _tvm.op_name(b.value)
        for _gv, func in _tvm.relax_functions(import_model(model, graph_inputs(model)).mod)
        for block in func.body.blocks
        for b in block.bindings
    ]
    assert calls.count("relax.matmul") == case.dirs + per_step * case.seq - 1


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_unrolled_steps_leave_tvm_nothing_to_fold(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step reads its slice of the projection (no ``split`` into every timestep: a kernel with
    ``seq`` outputs), and nothing is left that only TVM's FoldConstant could fold: one matmul of the
    zero initial state by Rᵀ made it legalize every call of the sequence (23 s at 300 steps)."""
    from amptool.passes import fold_constants

    model, _ = rnn_model(Case(op, direction="bidirectional", seq=6))
    mod = import_model(model, graph_inputs(model)).mod
    names = [_tvm.op_name(call) for _gv, func in _tvm.relax_functions(mod) for call in _tvm.bound_calls(func)]
    assert "relax.split" not in names
    monkeypatch.setattr(_tvm, "fold_constant", lambda _mod: pytest.fail("TVM's FoldConstant ran"))
    fold_constants.fold_constants(mod)


@pytest.mark.parametrize(
    "case, message",
    [
        (
            Case("LSTM", attrs=(("activations", ["HardSigmoid", "Tanh", "Tanh"]),)),
            "LSTM node '/rnn/LSTM': activation 'HardSigmoid'",
        ),
        (Case("GRU", direction="bidirectional", attrs=(("activations", ["Sigmoid", "Tanh"]),)), "needs 4 activations"),
    ],
    ids=["unsupported-activation", "activation-count"],
)
def test_unsupported_attributes_are_one_line_user_errors(case: Case, message: str) -> None:
    model, _ = rnn_model(case)
    with pytest.raises(UserError, match=message) as info:
        import_model(model, graph_inputs(model))
    assert "\n" not in str(info.value) and info.value.hint


@pytest.mark.parametrize(("op", "name", "shape", "message"), [
    ("LSTM", "R", (2, 10, 6), r"input R has shape \[2, 10, 6\]; X and R make it \[2, 24, 6\]"),
    ("LSTM", "R", (24, 6), "input R must be 3-D"),
    ("GRU", "W", (2, 18, 4), r"input W has shape \[2, 18, 4\]; X and R make it \[2, 18, 5\]"),
    ("GRU", "B", (2, 18), r"input B has shape \[2, 18\]; X and R make it \[2, 36\]"),
    ("LSTM", "P", (2, 6), r"input P has shape \[2, 6\]; X and R make it \[2, 18\]"),
    ("RNN", "initial_h", (1, 3, 6), r"input initial_h has shape \[1, 3, 6\]; X and R make it \[2, 3, 6\]"),
])
def test_inputs_of_the_wrong_shape_are_one_line_user_errors(op: str, name: str, shape: tuple[int, ...],
                                                             message: str) -> None:
    """A node whose W, R, B, P or initial state disagrees with X and R (onnxruntime refuses it)
    is named with what it should be, not failed deep in the import with TVM's words."""
    model, _ = rnn_model(Case(op, direction="bidirectional", peepholes=op == "LSTM", initial=True))
    (init,) = [i for i in model.graph.initializer if i.name == name]
    init.CopyFrom(numpy_helper.from_array(np.zeros(shape, np.float32), name))
    with pytest.raises(UserError, match=message) as info:
        import_model(model, graph_inputs(model))
    assert "\n" not in str(info.value) and "onnx.checker" in info.value.hint


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_a_zero_length_sequence_gives_an_empty_y_and_zero_states(op: str, layout: int) -> None:
    """X with no timesteps: Y is empty and every final state zeros, initial states or not
    (onnxruntime's LSTM returns zeros — or, for Y_c, uninitialised memory — and its GRU and RNN
    abort the process). It failed to import: a stack of no steps."""
    model, feeds = rnn_model(Case(op, direction="bidirectional", seq=0, batch=3, layout=layout, initial=True))
    got = amptool_fp32(model, feeds)
    assert got["Y"].shape == ((0, 2, 3, 6) if layout == 0 else (3, 0, 2, 6))
    for name in ["Y_h", "Y_c"] if op == "LSTM" else ["Y_h"]:
        np.testing.assert_array_equal(got[name], np.zeros((2, 3, 6) if layout == 0 else (3, 2, 6), np.float32))


def test_symbolic_sequence_length_is_a_user_error() -> None:
    from tvm import relax, tirx

    from amptool.frontend.rnn import convert_gru

    x = relax.Var("X", relax.TensorType([tirx.Var("seq", "int64"), 1, 2], "float32"))
    w = relax.const(np.zeros((1, 9, 2), np.float32))
    r = relax.const(np.zeros((1, 9, 3), np.float32))
    with pytest.raises(UserError, match="static input X shape") as info:
        convert_gru(relax.BlockBuilder(), [x, w, r], {"hidden_size": 3})
    assert "--input-shape" in (info.value.hint or "")


ONNX_NODE_CASES = [
    *(
        f"test_lstm_{k}"
        for k in ("defaults", "with_initial_bias", "with_peepholes", "batchwise", "reverse", "bidirectional")
    ),
    *(
        f"test_gru_{k}"
        for k in ("defaults", "with_initial_bias", "seq_length", "batchwise", "reverse", "bidirectional")
    ),
    *(f"test_simple_rnn_{k}" for k in ("defaults", "with_initial_bias", "batchwise")),
    "test_rnn_seq_length",
    *(f"test_reversesequence_{k}" for k in ("time", "batch")),
]


@pytest.fixture(scope="module")
def onnx_node_cases() -> dict[str, Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # other ops' generators overflow on purpose
        warnings.simplefilter("ignore")
        return {c.name: c for c in collect_testcases() if c.name in ONNX_NODE_CASES}


@pytest.mark.slow
@pytest.mark.parametrize("name", ONNX_NODE_CASES)
def test_matches_onnx_backend_reference(name: str, onnx_node_cases: dict[str, Any]) -> None:
    """The onnx wheel's own node tests (numpy reference outputs; ``batchwise`` is layout=1)."""
    case = onnx_node_cases[name]
    names = [i.name for i in case.model.graph.input]
    for inputs, expected in case.data_sets:
        got = amptool_fp32(case.model, dict(zip(names, inputs)))
        for (out, value), want in zip(got.items(), expected):
            np.testing.assert_allclose(value, want, atol=ATOL, rtol=RTOL, err_msg=f"{name}/{out}")


# --------------------------------------------------------------------------- ReverseSequence
def reverse_sequence_model(
    shape: tuple[int, ...], lens: tuple[int, ...], time_axis: int, batch_axis: int, lens_as_input: bool
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    graph_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    inits = []
    if lens_as_input:
        graph_in.append(helper.make_tensor_value_info("lens", TensorProto.INT64, [len(lens)]))
        feeds["lens"] = np.array(lens, np.int64)
    else:
        inits.append(numpy_helper.from_array(np.array(lens, np.int64), "lens"))
    node = helper.make_node(
        "ReverseSequence", ["x", "lens"], ["y"], name="/rev", time_axis=time_axis, batch_axis=batch_axis
    )
    graph = helper.make_graph(
        [node], "rev", graph_in, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, feeds


@pytest.mark.parametrize(
    "shape, lens, time_axis, batch_axis, lens_as_input",
    [
        ((5, 3, 4), (5, 2, 0), 0, 1, False),
        ((3, 5, 4), (1, 5, 3), 1, 0, False),
        ((4, 6), (6, 3, 1, 2), 1, 0, True),
        ((6, 2, 3, 2), (4, 6), 0, 1, True),
    ],
    ids=["time0-const", "batch0-const", "batch0-2d-run-time", "time0-4d-run-time"],
)
def test_reverse_sequence_matches_onnxruntime(
    shape: tuple[int, ...], lens: tuple[int, ...], time_axis: int, batch_axis: int, lens_as_input: bool
) -> None:
    model, feeds = reverse_sequence_model(shape, lens, time_axis, batch_axis, lens_as_input)
    got = amptool_fp32(model, feeds)["y"]
    np.testing.assert_array_equal(got, _run_ort(model, feeds)["y"])  # a permutation: exact


# --------------------------------------------------------------------------- end to end
def _classifier(op: str, seq: int = 6, batch: int = 2, features: int = 8, hidden: int = 16) -> onnx.ModelProto:
    """Bidirectional ``op`` over a sequence, final states flattened, Gemm head → 5 logits."""
    rng = np.random.default_rng(3)
    gates = GATES[op]

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name)

    scale = 1 / np.sqrt(hidden)
    inits = [
        init("rnn.W", (2, gates * hidden, features), scale),
        init("rnn.R", (2, gates * hidden, hidden), scale),
        init("rnn.B", (2, 2 * gates * hidden), scale),
        init("fc.weight", (5, 2 * hidden), scale),
        init("fc.bias", (5,), scale),
        numpy_helper.from_array(np.array([batch, 2 * hidden], np.int64), "flat_shape"),
    ]
    outputs = ["rnn_y", "rnn_h"] + (["rnn_c"] if op == "LSTM" else [])
    nodes = [
        helper.make_node(
            op,
            ["x", "rnn.W", "rnn.R", "rnn.B"],
            outputs,
            name=f"/rnn/{op}",
            direction="bidirectional",
            hidden_size=hidden,
        ),
        helper.make_node("Transpose", ["rnn_h"], ["h_bdh"], name="/Transpose", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["h_bdh", "flat_shape"], ["h_flat"], name="/Reshape"),
        helper.make_node("Gemm", ["h_flat", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        f"{op.lower()}_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_bidirectional_classifier_float16_diff_passes(op: str, run_cli: Any, tmp_path: Path) -> None:
    from tests.conftest import read_json

    path = tmp_path / f"{op.lower()}_classifier.onnx"
    onnx.save(_classifier(op), path)
    result = run_cli("diff", str(path), "--dtype", "float16", "--json", str(tmp_path / "diff.json"))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED |")
    (logits,) = read_json(tmp_path / "diff.json")["outputs"]
    assert logits["cosine"] >= 0.999 and logits["nan"] == 0 and logits["inf"] == 0


def _tf2onnx_bidirectional_rnn(seq: int = 6, batch: int = 2, features: int = 8, hidden: int = 16) -> onnx.ModelProto:
    """tf2onnx's shape of a bidirectional Keras SimpleRNN: a forward RNN on x, another on
    ReverseSequence(x) whose output is reversed back, concatenated, mean over time → logits."""
    rng = np.random.default_rng(4)
    scale = 1 / np.sqrt(hidden)

    def init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name)

    lens = np.array([seq, seq - 2])
    inits = [numpy_helper.from_array(lens.astype(np.int64), "lens"),  # ReverseSequence reads int64
             numpy_helper.from_array(lens.astype(np.int32), "lens32")]  # RNN reads int32
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axis1"), init("fc.weight", (5, 2 * hidden))]
    nodes = [helper.make_node("ReverseSequence", ["x", "lens"], ["x_rev"], name="/bw/ReverseSequence")]
    for tag, source in (("fw", "x"), ("bw", "x_rev")):
        inits += [init(f"{tag}.W", (1, hidden, features)), init(f"{tag}.R", (1, hidden, hidden)),
                  init(f"{tag}.B", (1, 2 * hidden))]
        nodes += [
            helper.make_node("RNN", [source, f"{tag}.W", f"{tag}.R", f"{tag}.B", "lens32"], [f"{tag}_y4"],
                             name=f"/{tag}/RNN", hidden_size=hidden),
            helper.make_node("Squeeze", [f"{tag}_y4", "axis1"], [f"{tag}_y"], name=f"/{tag}/Squeeze"),
        ]
    nodes += [
        helper.make_node("ReverseSequence", ["bw_y", "lens"], ["bw_y_fwd"], name="/bw/ReverseSequence_out"),
        helper.make_node("Concat", ["fw_y", "bw_y_fwd"], ["y"], name="/Concat", axis=2),
        helper.make_node("ReduceMean", ["y"], ["pooled"], name="/ReduceMean", axes=[0], keepdims=0),
        helper.make_node("Gemm", ["pooled", "fc.weight"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tf2onnx_birnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, batch, 2 * hidden]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_tf2onnx_style_bidirectional_rnn_float16_diff_passes(run_cli: Any, tmp_path: Path) -> None:
    from tests.conftest import read_json

    path = tmp_path / "birnn.onnx"
    onnx.save(_tf2onnx_bidirectional_rnn(), path)
    result = run_cli("diff", str(path), "--dtype", "float16", "--json", str(tmp_path / "diff.json"))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED |")
    for output in read_json(tmp_path / "diff.json")["outputs"]:
        assert output["cosine"] >= 0.999 and output["nan"] == 0 and output["inf"] == 0, output


BIDIRECTIONAL_CASES = {f"{c.op.lower()}-{k}": c for cases in (LSTM_CASES, GRU_CASES, RNN_CASES)
                       for k, c in cases.items() if c.direction == "bidirectional"}


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in BIDIRECTIONAL_CASES.items()])
def test_directions_apart_match_onnxruntime(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bidirectional node whose recurrent weights pass ``APART_BYTES`` (here every one) runs as
    two single-direction recurrences joined along the directions axis: the same outputs in either
    layout, with initial states, peepholes, sequence lengths, per-direction activations and weights
    fed at run time."""
    from amptool.frontend import rnn_directions

    monkeypatch.setattr(rnn_directions, "APART_BYTES", 0)
    _assert_matches_reference(case)


@pytest.mark.parametrize(("hidden", "apart"), [(16, False), (512, True)])
def test_large_recurrent_weights_run_the_directions_one_after_the_other(hidden: int, apart: bool) -> None:
    """A 512-unit bidirectional LSTM (8 MB of recurrent weights: more than two cores' L2) steps
    each direction on its own weight — ``[1, H]·[H, 4H]`` matmuls, twice as many — where a small
    one steps both directions in one batched matmul (``[2, 1, H]·[2, H, 4H]``)."""
    case = Case("LSTM", direction="bidirectional", seq=3, batch=1, input_size=4, hidden=hidden)
    model, _ = rnn_model(case)
    shapes = [
        [int(d) for d in b.value.args[1].ty.shape]
        for _gv, func in _tvm.relax_functions(import_model(model, graph_inputs(model)).mod)
        for block in func.body.blocks
        for b in block.bindings
        if _tvm.op_name(b.value) == "relax.matmul"
    ]
    recurrent = [s for s in shapes if s[-2:] == [hidden, 4 * hidden]]
    assert len(recurrent) == (2 * (case.seq - 1) if apart else case.seq - 1), shapes
    assert all(len(s) == (2 if apart else 3) for s in recurrent), shapes
