"""The CLI contract: exit codes, JSON keys, manifest keys, no half-written outputs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import read_json, single_error

MANIFEST_KEYS = {
    "dtype", "target", "inputs", "outputs", "ops_by_dtype", "casts_inserted",
    "weight_bytes", "timings_s", "versions", "prepare", "colors", "guarded", "unknown_ops",
}
STAGES = {"load", "prepare", "import", "mixed_precision", "fold", "compile", "export"}
DIFF_OUTPUT_KEYS = {"name", "max_abs", "mean_abs", "max_rel", "cosine", "nan", "inf", "passed"}


def test_convert_writes_library_and_manifest(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    model = zoo_model("resnet_like")
    result = run_cli("convert", model, "--dtype", "float16", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.so"]
    manifest = read_json(out / "manifest.json")
    assert set(manifest) >= MANIFEST_KEYS
    assert manifest["model"]["sha256"] == hashlib.sha256(Path(model).read_bytes()).hexdigest()
    assert set(manifest["timings_s"]) >= STAGES
    assert manifest["dtype"] == "float16" and manifest["target"] == "llvm"
    assert manifest["inputs"] == [{"name": "input", "dtype": "float32", "shape": [1, 3, 32, 32]}]
    assert manifest["ops_by_dtype"]["relax.nn.conv2d"] == {"float16": 10}
    # real initializers: weights stored in fp16 take about half the bytes
    weights = manifest["weight_bytes"]
    assert weights["after"] / weights["before"] <= 0.55
    assert "ops by compute dtype" in result.output and "time per stage" in result.output


def test_convert_float32_is_an_unchanged_baseline(zoo_model, run_cli, tmp_path):
    out = tmp_path / "fp32"
    assert run_cli("convert", zoo_model("tiny_cnn"), "--dtype", "float32", "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    dtypes = {d for counts in manifest["ops_by_dtype"].values() for d in counts}
    assert dtypes == {"float32"}
    assert manifest["casts_inserted"] == 0


def test_diff_json_contract_and_verdict_line(zoo_model, run_cli, tmp_path):
    report_path = tmp_path / "diff.json"
    result = run_cli("diff", zoo_model("transformer_encoder"), "--json", str(report_path))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED | float16 on llvm")
    report = read_json(report_path)
    assert report["passed"] is True and report["dtype"] == "float16" and report["target"] == "llvm"
    assert [o["name"] for o in report["outputs"]] == ["last_hidden_state", "pooled"]
    for output in report["outputs"]:
        assert set(output) >= DIFF_OUTPUT_KEYS
        assert output["cosine"] >= 0.999 and output["nan"] == 0 and output["inf"] == 0


def test_diff_with_artifact_matches_fresh_build(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    out = tmp_path / "art"
    assert run_cli("convert", model, "-o", str(out)).exit_code == 0
    fresh, stored = tmp_path / "fresh.json", tmp_path / "stored.json"
    assert run_cli("diff", model, "--json", str(fresh)).exit_code == 0
    assert run_cli("diff", model, "--artifact", str(out), "--json", str(stored)).exit_code == 0
    assert read_json(fresh)["outputs"][0]["max_abs"] == read_json(stored)["outputs"][0]["max_abs"]


def test_diff_inputs_roundtrip(zoo_model, run_cli, tmp_path):
    model = zoo_model("mlp_with_bool_mask")
    saved = tmp_path / "inputs.npz"
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    assert run_cli("diff", model, "--save-inputs", str(saved), "--seed", "7", "--json", str(first)).exit_code == 0
    assert run_cli("diff", model, "--inputs", str(saved), "--json", str(second)).exit_code == 0
    assert read_json(first)["outputs"] == read_json(second)["outputs"]


def test_range_guard_keeps_overflowing_constant_in_fp32(zoo_model, run_cli, tmp_path):
    model = zoo_model("scale_beyond_fp16")
    guarded = run_cli("diff", model, "--json", str(tmp_path / "g.json"))
    assert guarded.exit_code == 0, guarded.output
    assert read_json(tmp_path / "g.json")["guarded"], "the 1e5 multiply must be reported as guarded"
    broken = run_cli("diff", model, "--no-range-guards")
    assert broken.exit_code == 1
    last = broken.output.strip().splitlines()[-1]
    assert last.startswith("FAILED |") and "output 'y'" in last


def test_batchnorm_with_huge_variance_passes(zoo_model, run_cli):
    result = run_cli("diff", zoo_model("batchnorm_huge_variance"), "--min-cosine", "0.999")
    assert result.exit_code == 0, result.output


def test_bfloat16_resnet(zoo_model, run_cli, tmp_path):
    result = run_cli("diff", zoo_model("resnet_like"), "--dtype", "bfloat16", "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    assert read_json(tmp_path / "b.json")["outputs"][0]["cosine"] >= 0.99


def test_dynamic_batch_defaults_to_one_other_dynamic_dims_need_pinning(zoo_model, run_cli, tmp_path, caplog):
    model = zoo_model("dynamic_batch_cnn")
    with caplog.at_level("WARNING"):
        result = run_cli("convert", model, "-o", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert read_json(tmp_path / "o" / "manifest.json")["inputs"][0]["shape"] == [1, 3, 32, 32]
    assert "dynamic batch dim pinned to 1 (choose with --input-shape input:" in caplog.text
    pinned = run_cli("diff", model, "--input-shape", "input:3x3x32x32")
    assert pinned.exit_code == 0, pinned.output

    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "length"])])
    seq = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), seq)
    result = run_cli("convert", str(seq), "-o", str(tmp_path / "s"))
    assert result.exit_code == 2
    assert "Input 'x' has unknown dims [batch, length]" in result.output
    assert "--input-shape x:1xN (each N the size you run)" in result.output  # not x:1x1, a one-step sequence
    assert "--dim batch=N --dim length=N" in result.output  # by name: pins every input that declares it
    assert not (tmp_path / "s").exists()
    assert run_cli("convert", str(seq), "--dim", "length=5", "-o", str(tmp_path / "s2")).exit_code == 0


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _custom_op_model(path: Path) -> str:
    nodes = [
        helper.make_node("FooBar", ["x"], ["y"], domain="custom.x", name="foo1"),
        helper.make_node("FooBar", ["y"], ["z"], domain="custom.x", name="foo2"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.x", 1)])
    onnx.save(model, path)
    return str(path)


def _quantized_model(path: Path) -> str:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="quant")]
    inits = [
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("zp", TensorProto.UINT8, [], [0]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, [4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _mismatched_conv_model(path: Path) -> str:
    """A Conv whose weight has 5 input channels for a 3-channel image: every shape known, and wrong."""
    weight = numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _invalid_model(path: Path) -> str:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["q"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("missing", 2, "Model file not found"),
        ("not_onnx", 2, "is not a readable ONNX model"),
        ("invalid", 2, "is not a valid ONNX model"),
        ("mismatched", 2, "hint: Its inputs' shapes are all known and disagree with what Conv requires"),
        ("custom_op", 2, "custom.x::FooBar ×2 ('foo1', 'foo2')"),
        ("quantized", 2, "already quantized (QuantizeLinear ×1)"),
        ("bad_dtype", 2, "Invalid value for '--dtype'"),
        ("unknown_target", 2, "Unknown target 'cuda11'. Available here: llvm, cuda."),
        ("vulkan", 3, "Target 'vulkan' is not available here"),
        ("misspelt_op", 2, "did you mean 'Softmax'"),
        ("two_colours", 2, "is in both 'always' and 'never'"),
        ("bad_yaml", 2, "is not valid YAML"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(case, code, message, zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    extra: list[str] = []
    if case == "missing":
        model = str(tmp_path / "nope.onnx")
    elif case == "not_onnx":
        model = _write(tmp_path / "bad.onnx", "garbage")
    elif case == "invalid":
        model = _invalid_model(tmp_path / "invalid.onnx")
    elif case == "mismatched":
        model = _mismatched_conv_model(tmp_path / "mismatched.onnx")
    elif case == "custom_op":
        model = _custom_op_model(tmp_path / "custom.onnx")
    elif case == "quantized":
        model = _quantized_model(tmp_path / "q.onnx")
    elif case == "bad_dtype":
        extra = ["--dtype", "float8"]
    elif case == "unknown_target":
        extra = ["--target", "cuda11"]
    elif case == "vulkan":
        extra = ["--target", "vulkan"]
    elif case == "misspelt_op":
        extra = ["--colors", _write(tmp_path / "c.yaml", "version: 1\nalways: [Sofmax]\n")]
    elif case == "two_colours":
        extra = ["--colors", _write(tmp_path / "c.yaml", "version: 1\nalways: [Conv]\nnever: [Conv]\n")]
    elif case == "bad_yaml":
        extra = ["--colors", _write(tmp_path / "c.yaml", "version: [1\n")]
    out = tmp_path / "out"
    result = run_cli("convert", model, *extra, "-o", str(out))
    assert result.exit_code == code, result.output
    assert message in result.output
    assert single_error(result.output)
    assert not out.exists(), "no partial output directory"


def test_failed_convert_keeps_previous_output(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    assert run_cli("convert", zoo_model("tiny_cnn"), "-o", str(out)).exit_code == 0
    before = (out / "manifest.json").read_text()
    assert run_cli("convert", str(tmp_path / "missing.onnx"), "-o", str(out)).exit_code == 2
    assert (out / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_help_and_version(run_cli):
    assert run_cli("--help").exit_code == 0
    assert "0.1.0" in run_cli("--version").output


def _nms_model(gather: bool) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    consts = [numpy_helper.from_array(np.array([10], np.int64), "max_out"),
              numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
              numpy_helper.from_array(np.array([0.1], np.float32), "thr"),
              numpy_helper.from_array(np.array([2], np.int64), "two")]
    nodes = [helper.make_node("Relu", ["scores"], ["s"]),
             helper.make_node("NonMaxSuppression", ["boxes", "s", "max_out", "iou", "thr"], ["sel"], name="nms")]
    outputs = [helper.make_tensor_value_info("sel", TensorProto.INT64, ["n", 3])]
    if gather:
        nodes.append(helper.make_node("Gather", ["sel", "two"], ["col"], axis=1, name="pick"))
        outputs.append(helper.make_tensor_value_info("col", TensorProto.INT64, ["n", 1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 50, 4]),
                                           helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 50])],
                              outputs, consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nms_as_a_model_output_and_feeding_other_ops_both_match(run_cli, tmp_path):
    """NonMaxSuppression's output has a run-time row count: as a model output and read by a Gather."""
    for gather in (False, True):
        path = tmp_path / f"nms_{gather}.onnx"
        onnx.save(_nms_model(gather), path)
        result = run_cli("diff", str(path), "--dtype", "float32")
        assert result.exit_code == 0, result.output
        assert "PASSED" in result.output




def test_diff_of_a_model_whose_every_output_is_empty_passes_in_one_line(run_cli, tmp_path):
    """Nothing to compare (a detector that kept no box): a verdict, not a crash in the verdict line."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "zero", "zero"], ["y"], name="none")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0])],
        [helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = run_cli("diff", str(path), "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output and "internal error" not in result.output
