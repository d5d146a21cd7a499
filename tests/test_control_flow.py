"""If nodes on an input's value whose untaken branch does not type at the pinned shapes (issue 14, point 4).

The model is of the voice-activity-detector class: ``If(sr == 16000)``, an LSTM in each branch, the
8 kHz branch framing 256 samples while 512 are pinned. onnxruntime runs it with sr = 16000 and fails
at run time with sr = 8000; amptool must do the same, with a warning naming the If and 'sr'.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.conftest import single_error

HIDDEN = 16


def _lstm_branch(name: str, frame: int, samples: int, seed: int) -> onnx.GraphProto:
    """Frame the samples, run an LSTM over the frames, a sigmoid of the last state: prob, hn, cn."""
    rng = np.random.default_rng(seed)
    weights = [
        nh.from_array(np.array([samples // frame, 1, frame], np.int64), f"{name}_frames"),
        nh.from_array((rng.standard_normal((1, 4 * HIDDEN, frame)) * 0.1).astype(np.float32), f"{name}_W"),
        nh.from_array((rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.1).astype(np.float32), f"{name}_R"),
        nh.from_array((rng.standard_normal((1, 8 * HIDDEN)) * 0.1).astype(np.float32), f"{name}_B"),
        nh.from_array((rng.standard_normal((HIDDEN, 1)) * 0.3).astype(np.float32), f"{name}_head"),
        nh.from_array(np.array([1, 1], np.int64), f"{name}_one_one"),
    ]
    nodes = [
        h.make_node("Reshape", ["x", f"{name}_frames"], [f"{name}_seq"]),
        h.make_node("LSTM", [f"{name}_seq", f"{name}_W", f"{name}_R", f"{name}_B", "", "h0", "c0"],
                    [f"{name}_Y", f"{name}_hn", f"{name}_cn"], hidden_size=HIDDEN),
        h.make_node("MatMul", [f"{name}_hn", f"{name}_head"], [f"{name}_logit"]),
        h.make_node("Sigmoid", [f"{name}_logit"], [f"{name}_p"]),
        h.make_node("Reshape", [f"{name}_p", f"{name}_one_one"], [f"{name}_prob"]),
    ]
    outputs = [h.make_tensor_value_info(f"{name}_prob", T.FLOAT, [1, 1]),
               h.make_tensor_value_info(f"{name}_hn", T.FLOAT, [1, 1, HIDDEN]),
               h.make_tensor_value_info(f"{name}_cn", T.FLOAT, [1, 1, HIDDEN])]
    return h.make_graph(nodes, name, [], outputs, weights)


def vad_class_model(else_samples: int = 256) -> onnx.ModelProto:
    """512 samples pinned; the 16 kHz branch frames them by 128, the 8 kHz one expects ``else_samples``."""
    nodes = [
        h.make_node("Constant", [], ["sr16k"], value=nh.from_array(np.array(16000, np.int64))),
        h.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        h.make_node("If", ["is16k"], ["prob", "hn", "cn"], name="If_sr",
                    then_branch=_lstm_branch("k16", 128, 512, seed=1),
                    else_branch=_lstm_branch("k8", 64, else_samples, seed=2)),
    ]
    graph = h.make_graph(nodes, "vad", [
        h.make_tensor_value_info("x", T.FLOAT, [1, 512]),
        h.make_tensor_value_info("sr", T.INT64, []),
        h.make_tensor_value_info("h0", T.FLOAT, [1, 1, HIDDEN]),
        h.make_tensor_value_info("c0", T.FLOAT, [1, 1, HIDDEN]),
    ], [h.make_tensor_value_info("prob", T.FLOAT, [1, 1]), h.make_tensor_value_info("hn", T.FLOAT, [1, 1, HIDDEN]),
        h.make_tensor_value_info("cn", T.FLOAT, [1, 1, HIDDEN])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _inputs(path, sr: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.standard_normal((1, 512)).astype(np.float32), sr=np.array(sr, np.int64),
             h0=(rng.standard_normal((1, 1, HIDDEN)) * 0.1).astype(np.float32),
             c0=(rng.standard_normal((1, 1, HIDDEN)) * 0.1).astype(np.float32))
    return str(path)


@pytest.fixture
def vad(tmp_path):
    path = tmp_path / "vad.onnx"
    onnx.save(vad_class_model(), path)
    return str(path)


def test_float16_diff_passes_with_the_controlling_input_among_inputs(run_cli, vad, tmp_path, caplog):
    inputs = _inputs(tmp_path / "in16k.npz", 16000)
    result = run_cli("diff", vad, "--dtype", "float16", "--inputs", inputs, "--json", str(tmp_path / "d.json"))
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output
    warned = [r.getMessage() for r in caplog.records if "If 'If_sr'" in r.getMessage()]
    assert warned and "else branch does not type" in warned[0] and "'sr'" in warned[0]


def test_the_untaken_branch_raises_at_run_time_in_one_line(run_cli, vad, tmp_path):
    out = tmp_path / "vad16"
    assert run_cli("convert", vad, "--dtype", "float16", "-o", str(out)).exit_code == 0
    taken = run_cli("run", str(out), "--inputs", _inputs(tmp_path / "in16k.npz", 16000), "-o", str(tmp_path / "a.npz"))
    assert taken.exit_code == 0, taken.output
    raised = run_cli("run", str(out), "--inputs", _inputs(tmp_path / "in8k.npz", 8000), "-o", str(tmp_path / "b.npz"))
    assert raised.exit_code == 2, raised.output
    assert single_error(raised.output) and "failed at run time" in raised.output and "If 'If_sr'" in raised.output
    assert "Traceback" not in raised.output and not (tmp_path / "b.npz").exists()


def test_values_match_onnxruntime_in_float32(vad, tmp_path):
    import onnxruntime as ort

    import amptool

    feeds = dict(np.load(_inputs(tmp_path / "in.npz", 16000, seed=3)))
    want = ort.InferenceSession(vad, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = amptool.convert(vad, dtype="float32").run(feeds)
    for name, expected in zip(("prob", "hn", "cn"), want, strict=True):
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5)


def test_neither_branch_typing_is_refused_naming_the_fixed_input(run_cli, tmp_path):
    path = tmp_path / "bad.onnx"
    model = vad_class_model()
    then_branch = next(a for a in model.graph.node[2].attribute if a.name == "then_branch")
    then_branch.g.initializer[0].CopyFrom(nh.from_array(np.array([3, 1, 100], np.int64), "k16_frames"))
    onnx.save(model, path)
    result = run_cli("convert", str(path), "--dtype", "float16", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and single_error(result.output), result.output
    assert "neither branch types" in result.output and "--fixed-input sr=VALUE" in result.output
    assert not (tmp_path / "out").exists()
