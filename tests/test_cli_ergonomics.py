"""CLI ergonomics (issue 16): progress lines in CI logs, -v/-q anywhere, --version, exclusions,
unmatched node rules, aliases, --dim."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import read_json, single_error

STAGE_LINE = re.compile(r"^\[\s*\d+\.\d+s\] \S+", re.MULTILINE)


def _stage_lines(text: str) -> list[str]:
    return STAGE_LINE.findall(text)


def _seq2seq_model(path: Path) -> str:
    """Four inputs sharing the symbolic dims batch, src_len and tgt_len (a seq2seq attention step)."""
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], rng.normal(0, 0.3, (8, 8)).astype(np.float32).ravel())
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    nodes = [
        helper.make_node("Unsqueeze", ["src_mask", "axes"], ["src_mask3"], name="unsqueeze_src"),
        helper.make_node("Unsqueeze", ["tgt_mask", "axes"], ["tgt_mask3"], name="unsqueeze_tgt"),
        helper.make_node("Mul", ["src", "src_mask3"], ["src_masked"], name="mask_src"),
        helper.make_node("Mul", ["tgt", "tgt_mask3"], ["tgt_masked"], name="mask_tgt"),
        helper.make_node("MatMul", ["tgt_masked", "w"], ["query"], name="project"),
        helper.make_node("Transpose", ["src_masked"], ["keys"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["query", "keys"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["attention"], name="softmax", axis=-1),
    ]
    inputs = [
        helper.make_tensor_value_info("src", TensorProto.FLOAT, ["batch", "src_len", 8]),
        helper.make_tensor_value_info("src_mask", TensorProto.FLOAT, ["batch", "src_len"]),
        helper.make_tensor_value_info("tgt", TensorProto.FLOAT, ["batch", "tgt_len", 8]),
        helper.make_tensor_value_info("tgt_mask", TensorProto.FLOAT, ["batch", "tgt_len"]),
    ]
    outputs = [helper.make_tensor_value_info("attention", TensorProto.FLOAT, ["batch", "tgt_len", "src_len"])]
    graph = helper.make_graph(nodes, "seq2seq", inputs, outputs, initializer=[weight, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return str(path)


# ---------------------------------------------------------------- 1. progress in CI logs


def test_convert_outside_a_terminal_prints_a_line_per_stage(zoo_model, run_cli, tmp_path):
    result = run_cli("convert", zoo_model("tiny_cnn"), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    lines = _stage_lines(result.stderr)
    assert len(lines) >= 5, result.stderr
    names = [line.split("] ", 1)[1] for line in lines]
    assert {"load", "compile", "export"} <= set(names)
    assert _stage_lines(result.stdout) == []  # progress never mixes into the report


def test_quiet_silences_progress_before_or_after_the_verb(zoo_model, run_cli):
    model = zoo_model("tiny_cnn")
    loud = run_cli("inspect", model)
    assert loud.exit_code == 0 and len(_stage_lines(loud.stderr)) >= 4, loud.stderr
    for args in (("-q", "inspect", model), ("inspect", model, "-q"), ("inspect", model, "--quiet")):
        result = run_cli(*args)
        assert result.exit_code == 0, result.output
        assert _stage_lines(result.stderr) == [], (args, result.stderr)
        assert logging.getLogger().level == logging.ERROR


# ---------------------------------------------------------------- 2. -v anywhere


def test_verbose_after_the_verb_sets_the_log_level(zoo_model, run_cli):
    from amptool.cli import console

    model = zoo_model("tiny_cnn")
    for args, level in ((("inspect", model, "-v"), logging.INFO), (("inspect", model, "-vv"), logging.DEBUG),
                        (("-v", "inspect", model), logging.INFO), (("-v", "inspect", model, "-v"), logging.DEBUG)):
        result = run_cli(*args)
        assert result.exit_code == 0, result.output
        assert logging.getLogger().level == level, args
        assert console._verbosity == (2 if level == logging.DEBUG else 1)
    assert run_cli("inspect", model).exit_code == 0
    assert logging.getLogger().level == logging.WARNING and console._verbosity == 0


def test_run_takes_verbose_and_quiet(run_cli):
    result = run_cli("run", "--help")
    assert "--verbose" in result.output and "--quiet" in result.output


# ---------------------------------------------------------------- 3. --version


def test_version_lists_the_engines_without_importing_tvm():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom amptool.cli.main import cli\n"
            "result = CliRunner().invoke(cli, ['--version'])\nprint(result.output)\n"
            "print('TVM-IMPORTED' if 'tvm' in sys.modules else 'NO-TVM')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    names = {line.split()[0] for line in lines if line.strip()}
    assert {"amptool", "apache-tvm", "apache-tvm-ffi", "onnxruntime", "onnx"} <= names, done.stdout
    assert any(re.fullmatch(r"apache-tvm 0\.\d+\S*", line) for line in lines), done.stdout
    assert lines[-1] == "NO-TVM"


# ---------------------------------------------------------------- 4. exclusions


def test_exclude_op_keeps_every_node_of_that_type_float32(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    path = tmp_path / "inspect.json"
    assert run_cli("inspect", model, "--json", str(path)).exit_code == 0
    before = [n for n in read_json(path)["nodes"] if n["op_type"] == "Conv"]
    assert before and all(n["dtype"] == "float16" for n in before)  # the flag, not the preset, decides

    result = run_cli("inspect", model, "--exclude-op", "Conv", "--json", str(path))
    assert result.exit_code == 0, result.output
    data = read_json(path)
    convs = [n for n in data["nodes"] if n["op_type"] == "Conv"]
    assert len(convs) == len(before) and all(n["dtype"] == "float32" and n["color"] == "never" for n in convs)
    assert "Conv" in data["colors"]["onnx_ops"]["never"]
    assert "--exclude-op Conv" in data["colors"]["sources"]
    assert any(n["dtype"] == "float16" for n in data["nodes"] if n["op_type"] != "Conv")


def test_exclude_node_keeps_that_node_float32(zoo_model, run_cli, tmp_path):
    path = tmp_path / "inspect.json"
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--exclude-node", "/features/4/Conv", "--json", str(path))
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in read_json(path)["nodes"]}
    assert nodes["/features/4/Conv"]["dtype"] == "float32"
    assert nodes["/features/0/Conv"]["dtype"] == "float16"
    assert read_json(path)["unmatched_node_rules"] == []


def test_exclude_op_unknown_is_one_line_with_did_you_mean(zoo_model, run_cli):
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--exclude-op", "Cnv")
    assert result.exit_code == 2 and single_error(result.output)
    assert "--exclude-op names unknown op 'Cnv'" in result.output and "'Conv'" in result.output


def test_python_api_takes_the_exclusions(zoo_model):
    import amptool

    report = amptool.inspect(zoo_model("tiny_cnn"), exclude_ops=("Conv",), exclude_nodes=("/Flatten",))
    nodes = {n.name: n for n in report.nodes}
    assert {n.dtype for n in report.nodes if n.op_type == "Conv"} == {"float32"}
    assert report.as_json()["colors"]["nodes"][0] == {"match": "/Flatten", "color": "never"}
    assert nodes["/features/0/Conv"].color == "never"


# ---------------------------------------------------------------- 5. unmatched node rules


def test_node_rules_that_match_nothing_warn_and_are_listed(zoo_model, run_cli, tmp_path):
    colors = tmp_path / "colors.yaml"
    colors.write_text('version: 1\nextends: builtin:default\nnodes:\n  - {match: "/decoder/*", color: never}\n')
    path = tmp_path / "inspect.json"
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--colors", str(colors), "--exclude-node", "/feature/4/Conv",
                     "--exclude-node", "/features/0/*", "--json", str(path))
    assert result.exit_code == 0, result.output
    assert read_json(path)["unmatched_node_rules"] == ["/feature/4/Conv", "/decoder/*"]
    assert "'/feature/4/Conv'" in result.stderr and "'/decoder/*'" in result.stderr
    assert "'/features/0/*'" not in result.stderr

    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--exclude-node", "nothing_here", "-o", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert read_json(out / "manifest.json")["unmatched_node_rules"] == ["nothing_here"]
    assert "nothing_here" not in result.stderr  # -q: warnings are off


# ---------------------------------------------------------------- 6. aliases


def test_dtype_aliases_become_the_canonical_name(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    path = tmp_path / "inspect.json"
    for alias, canonical in (("bf16", "bfloat16"), ("half", "float16"), ("FP32", "float32")):
        result = run_cli("inspect", model, "--dtype", alias, "--json", str(path))
        assert result.exit_code == 0, result.output
        assert read_json(path)["dtype"] == canonical
    bad = run_cli("inspect", model, "--dtype", "fp8")
    assert bad.exit_code == 2 and "fp8" in bad.output
    assert "--dtype" in run_cli("bench", "--help").output


def test_polygraphy_aliases_for_shapes_inputs_and_outputs(zoo_model, run_cli, tmp_path):
    import onnxruntime as ort

    model = zoo_model("dynamic_batch_cnn")
    inputs = tmp_path / "x.npz"
    first = run_cli("diff", model, "--input-shapes", "input:[2,3,32,32]", "--save-inputs", str(inputs))
    assert first.exit_code == 0, first.output
    with np.load(inputs) as saved:
        assert saved["input"].shape == (2, 3, 32, 32)
        feeds = {"input": saved["input"]}
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    outputs = tmp_path / "y.npz"
    np.savez(outputs, probs=session.run(["probs"], feeds)[0])
    second = run_cli("diff", model, "--load-inputs", str(inputs), "--load-outputs", str(outputs))
    assert second.exit_code == 0, second.output
    assert second.stdout.strip().splitlines()[-1].startswith("PASSED")


# ---------------------------------------------------------------- 7. --dim


def test_dim_sets_shared_symbolic_dims_across_inputs(run_cli, tmp_path):
    model = _seq2seq_model(tmp_path / "seq2seq.onnx")
    inputs = tmp_path / "x.npz"
    result = run_cli("diff", model, "--dim", "batch=2", "--dim", "src_len=16", "--dim", "tgt_len=5",
                     "--save-inputs", str(inputs))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("PASSED")
    with np.load(inputs) as saved:
        shapes = {name: saved[name].shape for name in saved.files}
    assert shapes == {"src": (2, 16, 8), "src_mask": (2, 16), "tgt": (2, 5, 8), "tgt_mask": (2, 5)}


def test_dim_unknown_name_lists_the_models_dims(run_cli, tmp_path):
    model = _seq2seq_model(tmp_path / "seq2seq.onnx")
    result = run_cli("inspect", model, "--dim", "batch=2", "--dim", "seq=4")
    assert result.exit_code == 2 and single_error(result.output)
    assert "'seq'" in result.output and "batch, src_len, tgt_len" in result.output
    bad = run_cli("inspect", model, "--dim", "batch=zero")
    assert bad.exit_code == 2 and "--dim 'batch=zero'" in bad.output


# ---------------------------------------------------------------- 8. examples in --help


def test_every_verb_help_has_examples(run_cli):
    for verb in ("convert", "diff", "inspect", "bench", "run"):
        text = run_cli(verb, "--help").output
        examples = [line for line in text.splitlines() if line.strip().startswith(f"amptool {verb} ")]
        assert len(examples) >= 2, (verb, text)


@pytest.mark.parametrize("verb", ["convert", "diff", "inspect", "bench", "run"])
def test_help_groups_every_option_under_a_heading(run_cli, verb):
    """--help lists options under Model/Precision/Target/Inputs/Tolerances/Output; only -v, -q and
    -h are left under Other, so a new option without a group shows up here."""
    text = run_cli(verb, "--help").output
    assert "Output options:" in text
    other = text.split("Other options:", 1)[1] if "Other options:" in text else ""
    flags = re.findall(r"^\s+(-[-\w, ]+?)\s{2,}", other, re.M)
    assert all(any(f in entry for f in ("--verbose", "--quiet", "--help")) for entry in flags), flags


def test_bench_outside_a_terminal_prints_stage_and_timing_lines(zoo_model, run_cli):
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float32", "--rounds", "1", "--runs", "1")
    assert result.exit_code == 0, result.output
    lines = re.findall(r"^\[\s*[\d.]+s\] (.+)$", result.output, re.M)
    assert any(line.endswith(": compile") for line in lines) and any(line.startswith("timing ") for line in lines)
    quiet = run_cli("-q", "bench", zoo_model("tiny_cnn"), "--dtype", "float32", "--rounds", "1", "--runs", "1")
    assert not re.search(r"^\[\s*[\d.]+s\]", quiet.output, re.M)
