"""Prepare stage: folding inside subgraphs, inlining decided Ifs, fixed inputs."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.app import convert as convert_module
from amptool.app.convert import ConvertConfig, build_model
from amptool.errors import UserError
from amptool.frontend.fold import fold_model
from amptool.frontend.input_values import fixed_input_arrays, parse_fixed_input
from amptool.frontend.signature import TensorSpec
from tests.conftest import read_json


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))


def _padded_branch(tag: str, scale: float) -> onnx.GraphProto:
    """x → Pad(x, pads computed by a constant chain) * scale: the STFT-padding pattern."""
    nodes = [
        _const(f"{tag}_zeros_shape", np.array([2], dtype=np.int64)),
        helper.make_node("ConstantOfShape", [f"{tag}_zeros_shape"], [f"{tag}_zeros"], name=f"{tag}/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([0], dtype=np.int64))),
        _const(f"{tag}_lr", np.array([0, 3], dtype=np.int64)),
        helper.make_node("Concat", [f"{tag}_zeros", f"{tag}_lr"], [f"{tag}_pads4"], name=f"{tag}/Concat", axis=0),
        helper.make_node("Identity", [f"{tag}_pads4"], [f"{tag}_pads"], name=f"{tag}/Identity"),
        helper.make_node("Pad", ["x", f"{tag}_pads"], [f"{tag}_padded"], name=f"{tag}/Pad", mode="reflect"),
        _const(f"{tag}_scale", np.array(scale, dtype=np.float32)),
        helper.make_node("Mul", [f"{tag}_padded", f"{tag}_scale"], [f"{tag}_out"], name=f"{tag}/Mul"),
    ]
    output = helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, ["batch", 11])
    return helper.make_graph(nodes, tag, [], [output])


def _branchy_model() -> onnx.ModelProto:
    """If(mode == 1) over two branches whose Pad amounts come from constant chains."""
    nodes = [
        _const("one", np.array(1, dtype=np.int64)),
        helper.make_node("Equal", ["mode", "one"], ["is_one"], name="Equal"),
        helper.make_node("If", ["is_one"], ["y"], name="If",
                         then_branch=_padded_branch("then", 2.0), else_branch=_padded_branch("else", -1.0)),
    ]
    graph = helper.make_graph(
        nodes, "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 11])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _shape_if_model() -> onnx.ModelProto:
    """If(Shape(x)[0] == 1) — decided once the batch dim is pinned; the else branch is dead."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="Shape"),
        _const("zero", np.array(0, dtype=np.int64)),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="Gather", axis=0),
        _const("one", np.array(1, dtype=np.int64)),
        helper.make_node("Equal", ["batch", "one"], ["single"], name="Equal"),
        helper.make_node("If", ["single"], ["y"], name="If",
                         then_branch=helper.make_graph(
                             [helper.make_node("Relu", ["x"], ["t"], name="then/Relu")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)]),
                         else_branch=helper.make_graph(
                             [helper.make_node("Neg", ["x"], ["e"], name="else/Neg")], "else", [],
                             [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])),
    ]
    graph = helper.make_graph(nodes, "shape_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _pinned(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    from amptool.frontend.prepare import pin_shapes

    return pin_shapes(model, [TensorSpec(n, "float32", s) for n, s in shapes.items()])


def test_fold_reaches_inside_if_branches_and_keeps_numerics():
    model = _branchy_model()
    folded, stats = fold_model(model)
    assert stats.folded >= 4 and stats.ifs_inlined == 0  # the condition depends on an input's value
    pads = [n for g in (a.g for a in folded.graph.node[-1].attribute) for n in g.node if n.op_type == "Pad"]
    assert len(pads) == 2
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    for mode in (0, 1):
        feeds = {"x": x, "mode": np.array(mode, dtype=np.int64)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        got = ort.InferenceSession(folded.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)


def test_fold_leaves_a_model_with_nothing_to_fold_uncopied():
    """No Shape, no decided If, no node of constants only (a Conv/BN export): the folder returns the
    model itself instead of a copy of its weights; one constant-only node anywhere makes it fold."""
    weight = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [weight])
    plain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded, stats = fold_model(plain)
    assert folded is plain and not stats.changed
    plain.graph.node.insert(0, helper.make_node("Neg", ["w"], ["w_neg"], name="neg"))
    plain.graph.node[1].input[1] = "w_neg"
    folded, stats = fold_model(plain)
    assert folded is not plain and stats.folded == 1 and plain.graph.node[0].op_type == "Neg"


def test_if_on_a_pinned_shape_is_inlined():
    folded, stats = fold_model(_pinned(_shape_if_model(), {"x": (1, 4)}))
    assert stats.ifs_inlined == 1 and stats.shapes == 1
    ops = [n.op_type for n in folded.graph.node]
    assert "If" not in ops and "Relu" in ops and "Neg" not in ops
    x = np.array([[-1, 2, -3, 4]], dtype=np.float32)
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_branch_with_constant_pad_chain_converts_and_matches(tmp_path):
    path = tmp_path / "branchy.onnx"
    onnx.save(_branchy_model(), path)
    build = build_model(ConvertConfig(model=str(path), dtype="float16", input_shapes={"x": (2, 8)}))
    assert "fold-subgraphs" in build.prepare_steps
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    for mode in (0, 1):
        feeds = {"x": x, "mode": np.array(mode, dtype=np.int64)}
        want = ort.InferenceSession(str(path)).run(None, feeds)[0]
        got = build.compiled().run(feeds)["y"]
        np.testing.assert_allclose(got, want, atol=1e-2, rtol=1e-2)


def test_fixed_input_bakes_value_and_drops_the_input(tmp_path, run_cli):
    path = tmp_path / "branchy.onnx"
    onnx.save(_branchy_model(), path)
    out = tmp_path / "art"
    result = run_cli("convert", str(path), "--input-shape", "x:1x8", "--fixed-input", "mode=1", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    assert manifest["fixed_inputs"] == {"mode": 1}
    assert [i["name"] for i in manifest["inputs"]] == ["x"]
    assert "fix-inputs" in manifest["prepare"]
    assert manifest["ops_by_dtype"].get("relax.nn.pad") or manifest["ops_by_dtype"]  # imported one branch


def _fixed(texts, specs):
    """--fixed-input as the CLI reads it: parsed at the edge, resolved against the model."""
    return fixed_input_arrays(dict(parse_fixed_input(t) for t in texts), specs)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("mode", "is not NAME=VALUE"), ("nope=1", "unknown input 'nope'"), ("mode=abc", "is not a number"),
     ("mode=1.5", "is not a int64 value"),
     ("mode=1,2", "gives 2 value(s) but 'mode' has shape []: needs 1 value"),
     ("grid=1,2,3", "but 'grid' has shape [2, 2]: needs 1 or 4 values"),
     ("ragged=1,2", "but 'ragged' has shape [2, n]: needs a static shape")],
)
def test_fixed_input_errors_are_one_line(text, fragment):
    specs = [TensorSpec("x", "float32", (1, 8)), TensorSpec("mode", "int64", ()),
             TensorSpec("grid", "float32", (2, 2)), TensorSpec("ragged", "float32", (2, "n"))]
    with pytest.raises(UserError) as info:
        _fixed([text], specs)
    assert fragment in str(info.value)


def test_fixed_input_fills_an_n_d_input():
    """One value fills a static N-D input; as many values as elements fill it row-major."""
    specs = [TensorSpec("mask", "bool", (2, 3)), TensorSpec("grid", "float32", (2, 2))]
    fixed = _fixed(["mask=1", "grid=1,2,3,4"], specs)
    assert fixed["mask"].dtype == np.bool_ and fixed["mask"].shape == (2, 3) and fixed["mask"].all()
    assert fixed["grid"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_fixed_input_parses_floats_and_bools():
    specs = [TensorSpec("t", "float32", ()), TensorSpec("flag", "bool", (1,))]
    fixed = _fixed(["t=0.5", "flag=true"], specs)
    assert fixed["t"].dtype == np.float32 and float(fixed["t"]) == 0.5
    assert fixed["flag"].dtype == np.bool_ and fixed["flag"].tolist() == [True]


def test_diff_with_fixed_input_feeds_the_value_to_the_reference(tmp_path, run_cli):
    path = tmp_path / "branchy.onnx"
    onnx.save(_branchy_model(), path)
    for mode in ("0", "1"):
        result = run_cli("diff", str(path), "--input-shape", "x:1x8", "--fixed-input", f"mode={mode}")
        assert result.exit_code == 0, result.output


def test_folding_that_changes_numerics_is_reverted(monkeypatch, onnxruntime_folding):
    from amptool.frontend import prepare
    from amptool.testing import model_zoo

    def corrupting_fold(model: onnx.ModelProto, _workdir: str) -> onnx.ModelProto:
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        first = broken.graph.initializer[0]
        first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 1.5, first.name))
        return broken

    monkeypatch.setattr(prepare, "_onnxruntime_basic_optimize", corrupting_fold)
    model = model_zoo.tiny_cnn()
    from amptool.frontend.signature import graph_inputs

    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "folding-reverted" in prepared.steps
    assert any("check-numerics" in note for note in prepared.notes)
    weights = {i.name: numpy_helper.to_array(i) for i in prepared.model.graph.initializer}
    for init in model.graph.initializer:
        np.testing.assert_array_equal(weights[init.name], numpy_helper.to_array(init))


@pytest.mark.parametrize("corrupt", [False, True])
def test_deferred_numerics_check_settles_before_anything_is_built(monkeypatch, tmp_path, corrupt, onnxruntime_folding):
    """rewrite_model runs check-numerics beside import and the passes: a folding it rejects is
    undone and everything after prepare redone from the unfolded model; its files are removed."""
    from amptool.app.convert import rewrite_model
    from amptool.frontend import prepare
    from amptool.testing import model_zoo

    real_fold = prepare._onnxruntime_basic_optimize

    def fold(model: onnx.ModelProto, workdir: str) -> onnx.ModelProto:
        folded = real_fold(model, workdir)
        if corrupt:
            first = folded.graph.initializer[0]
            first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 1.5, first.name))
            prepare._FOLDING.path = None  # onnxruntime's file no longer holds the model returned
        workdirs.append(workdir)
        return folded

    workdirs: list[str] = []
    imports: list[onnx.ModelProto] = []
    real_import = convert_module.import_model
    monkeypatch.setattr(prepare, "_onnxruntime_basic_optimize", fold)
    monkeypatch.setattr(convert_module, "import_model", lambda m, specs: imports.append(m) or real_import(m, specs))
    path = tmp_path / "cnn.onnx"
    onnx.save(model_zoo.resnet_like(), path)
    rewritten = rewrite_model(ConvertConfig(model=str(path), dtype="float16"))
    assert ("folding-reverted" in rewritten.prepare_steps) == corrupt
    assert ("shape-inference-unfolded" in rewritten.prepare_steps) == corrupt
    assert ("check-numerics" in rewritten.prepare_steps) != corrupt
    assert not any(step.endswith("-pending") for step in rewritten.prepare_steps)
    assert len(imports) == (2 if corrupt else 1)  # the rejected folding's import is redone
    assert rewritten.prepared is imports[-1]
    ops = {n.op_type for n in rewritten.prepared.graph.node}
    assert ("BatchNormalization" in ops) == corrupt  # the unfolded model, BatchNorm and all
    assert workdirs and not any(os.path.exists(w) for w in workdirs)


def test_honest_folding_passes_the_numerics_check(onnxruntime_folding):
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs
    from amptool.testing import model_zoo

    model = model_zoo.resnet_like()
    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "onnxruntime-fold" in prepared.steps and "check-numerics" in prepared.steps


def test_numerics_check_compares_sequence_outputs_element_by_element():
    """Sequence outputs whose elements differ in shape cannot become one array (a crash, once)."""
    from amptool.frontend.prepare import _first_mismatch

    seq = [np.zeros((2, 3), np.float32), np.ones((1, 3), np.float32)]
    assert _first_mismatch({"s": seq}, {"s": [a.copy() for a in seq]}) is None
    assert _first_mismatch({"s": seq}, {"s": seq[:1]}) == "'s' (sequence lengths differ)"
    changed = [seq[0], seq[1] * 2]
    assert _first_mismatch({"s": seq}, {"s": changed}).startswith("'s[1]'")


def test_calibration_reads_the_numerics_checks_run_when_it_ran_on_the_same_inputs(monkeypatch, onnxruntime_folding):
    """prepare's check-numerics runs the folded model on the seed-0 inputs calibration uses: with
    ``expose_tensors`` it keeps every tensor, and calibration built from them equals calibration's
    own run (no session of its own is opened). Other inputs get nothing: calibration runs itself."""
    from amptool.app import calibrate
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs
    from amptool.runtime.inputs import generate_inputs
    from amptool.testing import model_zoo

    model = model_zoo.resnet_like()
    specs = graph_inputs(model)
    prepared = prepare.prepare_model(model, specs, defer_check=True, expose_tensors=True)
    feeds = generate_inputs(specs, prepared.model, seed=0)
    shared = prepared.checked_tensors(feeds)
    assert shared is not None and len(shared) > len(prepared.model.graph.output)
    assert prepared.checked_tensors({k: v + 1 for k, v in feeds.items()}) is None
    own = calibrate.activation_peaks(prepared.model, feeds, source="own")
    runs: list[object] = []
    monkeypatch.setattr(calibrate, "every_tensor", lambda *args: runs.append(args))
    reused = calibrate.activation_peaks(prepared.model, feeds, source="own", values=shared)
    assert not runs and reused.skipped is None and reused == own and reused.peaks
    assert not prepared.settle() and "check-numerics" in prepared.steps
    assert prepared.checked_tensors(feeds) is None  # settled: the tensors are dropped


def test_exposed_check_run_falls_back_when_the_weights_are_in_an_external_file(tmp_path):
    """A folded model over 1.5 GB is written with its weights in a file beside it, which a session
    opened from bytes cannot find: check-numerics then runs as it did without exposing tensors."""
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs
    from amptool.runtime.onnxruntime_runner import exposable_tensors
    from amptool.testing import model_zoo

    model = model_zoo.resnet_like()
    specs = graph_inputs(model)
    feeds = {s.name: np.random.default_rng(0).standard_normal(s.shape).astype(np.float32) for s in specs}
    expose = exposable_tensors(model)
    inline = prepare._run_exposed(model.SerializeToString(), feeds, expose)
    assert inline is not None and set(expose) <= set(inline)
    path = tmp_path / "external.onnx"
    external = onnx.ModelProto()
    external.CopyFrom(model)  # saving with external data rewrites the proto it is given
    onnx.save(external, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.data",
              size_threshold=0)
    assert prepare._run_exposed(str(path), feeds, expose) is None
    outcome = prepare._numerics_outcome(model, model, specs, {}, None, str(path), expose)
    assert outcome.step == "check-numerics" and outcome.tensors is None


def _bert_like_model() -> onnx.ModelProto:
    """What a transformers BERT export leaves after folding: token types gathered from a 512-long
    constant buffer (GatherElements), and a padding mask made with Equal / Where / IsNaN / Expand."""
    buffer = np.zeros((1, 512), np.int64)
    buffer[0, 3::7] = 1
    nodes = [
        _const("buffer", buffer), _const("positions", np.arange(128, dtype=np.int64)[None]),
        helper.make_node("GatherElements", ["buffer", "positions"], ["types"], name="gather", axis=1),
        helper.make_node("Cast", ["types"], ["types_f"], name="cast", to=TensorProto.FLOAT),
        _const("zero", np.array(0, np.int64)), _const("big", np.array(-3.4e38, np.float32)),
        _const("none", np.array(0.0, np.float32)), _const("shape", np.array([1, 4, 128], np.int64)),
        helper.make_node("Equal", ["mask", "zero"], ["padded"], name="equal"),
        helper.make_node("Where", ["padded", "big", "none"], ["bias"], name="where"),
        helper.make_node("IsNaN", ["bias"], ["nan"], name="isnan"),
        helper.make_node("Where", ["nan", "none", "bias"], ["clean"], name="where2"),
        helper.make_node("Unsqueeze", ["clean", "one_axis"], ["bias3"], name="unsqueeze"),
        _const("one_axis", np.array([1], np.int64)),
        helper.make_node("Expand", ["bias3", "shape"], ["bias4"], name="expand"),
        helper.make_node("Add", ["types_f", "bias4"], ["y"], name="add"),
    ]
    nodes.insert(-3, nodes.pop(-3))  # the axis constant before its Unsqueeze
    graph = helper.make_graph(nodes, "bert_like", [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 128])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_gather_elements_along_a_long_axis_folds():
    """onnx's reference GatherElements takes at most 64 values along the axis (np.choose) and then
    fails: the folder computes it itself, as onnxruntime would."""
    folded, stats = fold_model(_bert_like_model())
    assert "GatherElements" not in [n.op_type for n in folded.graph.node] and stats.folded >= 2
    feeds = {"mask": np.array([[1] * 100 + [0] * 28], np.int64)}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (_bert_like_model(), folded)]
    np.testing.assert_array_equal(run[0], run[1])


def test_a_transformer_mask_chain_does_not_need_onnxruntime_folding():
    """Comparisons, Where, IsNaN, Expand and GatherElements are ops onnxruntime's basic level leaves
    alone: once amptool's folder has run, the model skips the folding session (for BERT-base a 440 MB
    model written and parsed again, ~9 s of a 22 s convert) and its numerics are still checked."""
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs

    model = _bert_like_model()
    prepared = prepare.prepare_model(model, graph_inputs(model))
    assert "onnxruntime-fold-unneeded" in prepared.steps and "check-numerics" in prepared.steps, prepared.steps


def test_the_deferred_check_takes_the_folded_model_with_its_weights_apart(monkeypatch):
    """The folded model goes to the check's thread as ``Apart`` (weights copied out as arrays, not the
    model serialised and parsed again), and calibration still reads the check's tensors."""
    from amptool.frontend import prepare
    from amptool.frontend.signature import graph_inputs
    from amptool.runtime import onnxruntime_runner as runner
    from amptool.runtime.inputs import generate_inputs

    monkeypatch.setattr(runner, "APART_MODEL_BYTES", 1)
    monkeypatch.setattr(runner, "APART_TENSOR_BYTES", 100)
    opened: list[object] = []
    real_session = runner.session
    monkeypatch.setattr(runner, "session", lambda model, **kw: opened.append(model) or real_session(model, **kw))
    model = _bert_like_model()
    weight = numpy_helper.from_array(np.linspace(-1, 1, 128 * 64, dtype=np.float32).reshape(128, 64), "w")
    model.graph.initializer.append(weight)
    model.graph.node.append(helper.make_node("MatMul", ["y", "w"], ["z"], name="project"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 64]))
    specs = graph_inputs(model)
    prepared = prepare.prepare_model(model, specs, defer_check=True, expose_tensors=True)
    tensors = prepared.checked_tensors(generate_inputs(specs, prepared.model, seed=0))
    assert tensors is not None and "y" in tensors
    assert not prepared.settle() and "check-numerics" in prepared.steps, prepared.steps
    assert any(isinstance(m, runner.Apart) and "w" in m.names for m in opened)


def test_folding_caps_growth_not_size():
    """A result no larger than the constants it reads is folded however big (wav2vec2's weight norm of
    4.7 M values sent the model through onnxruntime's folding session); one that grows past them and
    past 1 M values (a ConstantOfShape, a Tile) stays for the runtime to make."""
    weight = np.linspace(-1, 1, 2_000_000, dtype=np.float32).reshape(1000, 2000)
    nodes = [_const("w", weight), _const("norm", np.array(4.0, np.float32)),
             helper.make_node("Div", ["w", "norm"], ["w_n"], name="normalise"),
             _const("shape", np.array([1500, 1000], np.int64)),
             helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros"),
             _const("reps", np.array([2, 1], np.int64)),
             helper.make_node("Tile", ["w", "reps"], ["tiled"], name="tile"),
             helper.make_node("MatMul", ["x", "w_n"], ["y"], name="project"),
             helper.make_node("ReduceSum", ["zeros"], ["z"], name="zsum", keepdims=0),
             helper.make_node("ReduceSum", ["tiled"], ["t"], name="tsum", keepdims=0)]
    graph = helper.make_graph(nodes, "caps", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1000])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                               for n, s in (("y", [2, 2000]), ("z", []), ("t", []))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded, _ = fold_model(model)
    ops = {n.name: n.op_type for n in folded.graph.node}
    assert ops["normalise"] == "Constant" and ops["zeros"] == "ConstantOfShape" and ops["tile"] == "Tile", ops
