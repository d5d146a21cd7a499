"""`amptool diff` options: tolerances, references, inputs, iterations, report files.

Parsers and loaders are tested directly (fast); the CLI is tested end to end on tiny zoo
models, mostly against artifacts converted once per module so each diff skips the compile.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from amptool.app.convert import ConvertConfig
from amptool.app.diff import DiffConfig
from amptool.compare.stats import COUNT_KEYS, STAT_KEYS
from amptool.compare.tolerance import (
    DEFAULT_TOLERANCES,
    ToleranceOverride,
    TolerancePolicy,
    parse_tolerance_flags,
)
from amptool.errors import UserError
from amptool.frontend.signature import TensorSpec, graph_inputs
from amptool.runtime.inputs import (
    check_val_ranges,
    generate_inputs,
    load_inputs,
    load_reference_outputs,
    parse_val_ranges,
    save_arrays,
    save_outputs,
)
from amptool.testing import model_zoo
from tests.conftest import read_json, single_error

# --------------------------------------------------------------------------- tolerance flags


def test_tolerance_flags_global_and_per_output():
    policy = parse_tolerance_flags(atol=["1e-2", "logits:0.5"], rtol=["Identity:0:0"], min_cosine=["0.9"],
                                   check_stat=["logits:p99"], max_scale_error=["logits:0.02"])
    assert policy.default == ToleranceOverride(atol=1e-2, min_cosine=0.9)
    per = dict(policy.per_output)
    assert per["logits"] == ToleranceOverride(atol=0.5, check_stat="p99", max_scale_error=0.02)
    assert per["Identity:0"] == ToleranceOverride(rtol=0.0)  # the value is after the last colon
    base = DEFAULT_TOLERANCES["float16"]
    assert policy.resolve("float16", "logits") == replace(base, atol=0.5, min_cosine=0.9, check_stat="p99",
                                                          max_scale_error=0.02)
    assert policy.resolve("float16", "other") == replace(base, atol=1e-2, min_cosine=0.9)
    assert policy.resolve("bfloat16") == replace(DEFAULT_TOLERANCES["bfloat16"], atol=1e-2, min_cosine=0.9)


def test_later_tolerance_flag_wins():
    assert parse_tolerance_flags(atol=["1", "2"]).default.atol == 2.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"atol": ["abc"]}, "--atol 'abc': 'abc' is not a finite number ≥ 0"),
        ({"atol": ["y:"]}, "--atol 'y:': '' is not a finite number ≥ 0"),
        ({"rtol": ["-1"]}, "--rtol '-1': '-1' is not a finite number ≥ 0"),
        ({"rtol": ["nan"]}, "is not a finite number"),
        ({"atol": ["inf"]}, "is not a finite number"),
        ({"min_cosine": ["1.5"]}, "--min-cosine '1.5': '1.5' is not a number in [-1, 1]"),
        ({"check_stat": ["p95"]}, "--check-error-stat 'p95': 'p95' is not a statistic"),
        ({"max_scale_error": ["y:-0.1"]}, "--max-scale-error 'y:-0.1': '-0.1' is not a finite number ≥ 0"),
    ],
)
def test_bad_tolerance_flags_are_user_errors(flags, message):
    with pytest.raises(UserError) as info:
        parse_tolerance_flags(**flags)
    assert message in str(info.value)
    assert info.value.hint


def test_per_output_tolerance_must_name_an_output():
    policy = parse_tolerance_flags(atol=["y:1"], rtol=["nope:1"])
    with pytest.raises(UserError, match="--rtol nope:1 names unknown output 'nope'"):
        policy.check_names(["y", "z"])
    TolerancePolicy(per_output=(("y", ToleranceOverride(atol=1.0)),)).check_names(["y"])


# --------------------------------------------------------------------------- value ranges and inputs

SPECS = [
    TensorSpec("x", "float32", (64, 8)),
    TensorSpec("ids", "int64", (64,)),
    TensorSpec("small", "uint8", (16,)),
    TensorSpec("mask", "bool", (4,)),
]


def _gather_model() -> onnx.ModelProto:
    """ids index a 7-row table; x, small and mask are plain inputs."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="g")], "g",
        [helper.make_tensor_value_info(s.name, helper.np_dtype_to_tensor_dtype(np.dtype(s.dtype)), s.shape)
         for s in SPECS],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 3])],
        [helper.make_tensor("table", TensorProto.FLOAT, [7, 3], [0.0] * 21)],
    )
    return helper.make_model(graph)


def test_parse_val_ranges():
    assert parse_val_ranges(["x:-1,1", "[0,2]", "a:b:3,4"]) == {"x": (-1.0, 1.0), "*": (0.0, 2.0), "a:b": (3.0, 4.0)}


@pytest.mark.parametrize("raw", ["x:1", "x:1,2,3", "x:a,b", "x:2,1", "x:0,inf", ""])
def test_malformed_val_range_is_a_user_error(raw):
    with pytest.raises(UserError, match="is not a range LO,HI"):
        parse_val_ranges([raw])


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ({"nope": (0, 1)}, "--val-range names unknown input 'nope'"),
        ({"mask": (0, 1)}, "input 'mask' is bool"),
        ({"ids": (0.5, 3)}, "does not suit int64 input 'ids'"),
        ({"ids": (3, 3)}, "does not suit int64 input 'ids'"),
        ({"small": (0, 300)}, "does not suit uint8 input 'small'"),
    ],
)
def test_val_range_must_suit_the_input(ranges, message):
    with pytest.raises(UserError, match=message):
        check_val_ranges(ranges, SPECS)


def test_generated_inputs_respect_val_range():
    ranges = {"x": (2.0, 3.0), "small": (250.0, 256.0)}
    check_val_ranges(ranges, SPECS)
    arrays = generate_inputs(SPECS, _gather_model(), seed=1, ranges=ranges)
    assert arrays["x"].dtype == np.float32 and arrays["x"].min() >= 2.0 and arrays["x"].max() < 3.0
    assert arrays["small"].min() >= 250 and arrays["small"].max() <= 255
    assert arrays["ids"].min() >= 0 and arrays["ids"].max() < 7, "Gather indices keep [0, rows)"
    assert arrays["mask"].dtype == np.bool_


def test_blanket_val_range_touches_floats_only():
    arrays = generate_inputs(SPECS, _gather_model(), seed=2, ranges={"*": (-5.0, -4.0)})
    assert arrays["x"].min() >= -5.0 and arrays["x"].max() < -4.0
    assert arrays["ids"].min() >= 0 and arrays["ids"].max() < 7
    default = generate_inputs(SPECS, _gather_model(), seed=2)
    np.testing.assert_array_equal(arrays["small"], default["small"])


def test_generated_inputs_are_seeded():
    a, b, c = (generate_inputs(SPECS, _gather_model(), seed=s) for s in (3, 3, 4))
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], c["x"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--inputs: file not found"),
        (b"not a zip", "is not a readable .npz file"),
        ({"x": np.zeros((64, 8), np.float32)}, "no array for input(s) 'ids', 'small', 'mask'"),
        ({**{s.name: np.zeros(s.shape, s.dtype) for s in SPECS}, "extra": np.zeros(1)}, "unknown input(s) 'extra'"),
        ({**{s.name: np.zeros(s.shape, s.dtype) for s in SPECS}, "x": np.zeros((64, 8))}, "'x' is float64"),
    ],
)
def test_bad_inputs_file_is_a_user_error(content, message, tmp_path):
    path = tmp_path / "in.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        save_arrays(str(path), content)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_inputs(str(path), SPECS)


def test_reference_file_ignores_converted_outputs_and_checks_names(tmp_path):
    path = str(tmp_path / "ref.npz")
    save_outputs(path, {"y": np.ones(3)}, {"y": np.zeros(3)})
    with np.load(path) as data:
        assert sorted(data.files) == ["converted/y", "y"]
    np.testing.assert_array_equal(load_reference_outputs(path, ["y"])["y"], np.ones(3))
    with pytest.raises(UserError, match=r"no array for output\(s\) 'z'; unknown output\(s\) 'y'"):
        load_reference_outputs(path, ["z"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"iterations": 0}, "need at least 1"),
        ({"iterations": 2, "inputs_path": "x.npz"}, "but --inputs work with one set"),
        ({"iterations": 3, "reference_outputs": "r.npz", "save_outputs": "o.npz"},
         "--reference-outputs, --save-outputs work"),
        ({"val_ranges": {"x": (0.0, 1.0)}, "inputs_path": "x.npz"}, "--val-range shapes generated inputs"),
    ],
)
def test_conflicting_diff_options_are_user_errors(fields, message):
    with pytest.raises(UserError, match=message):
        DiffConfig(convert=ConvertConfig(model="m.onnx"), **fields)


# --------------------------------------------------------------------------- CLI end to end


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """tiny_cnn and transformer_encoder saved, and converted once to float16 artifacts."""
    from click.testing import CliRunner

    from amptool.cli.main import cli

    root = tmp_path_factory.mktemp("built")
    paths = {}
    for name in ("tiny_cnn", "transformer_encoder"):
        model = root / f"{name}.onnx"
        onnx.save(model_zoo.ALL_BUILDERS[name](), model)
        result = CliRunner().invoke(cli, ["convert", str(model), "-o", str(root / name)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        paths[name] = (str(model), str(root / name))
    return paths


def _last(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_json_carries_every_statistic_for_every_output(built, run_cli, tmp_path):
    model, artifact = built["transformer_encoder"]
    path = tmp_path / "r.json"
    result = run_cli("diff", model, "--artifact", artifact, "--json", str(path))
    assert result.exit_code == 0, result.output
    report = read_json(path)
    assert [o["name"] for o in report["outputs"]] == ["last_hidden_state", "pooled"]
    for output in report["outputs"]:
        missing = [k for k in (*STAT_KEYS, *COUNT_KEYS, "passed", "failure", "failed_check", "tolerance",
                               "worst_iteration") if k not in output]
        assert missing == []
        for key in ("max_abs", "mean_abs", "median_abs", "p90_abs", "p99_abs", "std_abs", "max_rel", "mean_rel",
                    "cosine", "snr_db", "psnr_db", "scale_error", "min_tolerance", "tolerance_ratio"):
            assert isinstance(output[key], float) and math.isfinite(output[key]), key
        assert output["topk_agree"]["top1"] == 1.0  # rank 2–3 float outputs get top-k, read or not
    assert report["reference"] == {"source": "onnxruntime", "path": None}
    assert report["inputs"]["source"] == "generated"
    assert report["iterations"]["count"] == 1 and len(report["iterations"]["runs"]) == 1
    assert set(report["tolerance"]) >= {"atol", "rtol", "min_cosine", "check_error_stat", "max_scale_error",
                                        "per_output"}
    last = _last(result)
    assert last.startswith("PASSED | float16 on llvm | 2 outputs | worst output '")
    assert "× tolerance" in last


def test_reference_scaled_by_1_01_fails_naming_output_and_statistic(built, run_cli, tmp_path):
    """The issue's done-when: a 1 % drift of a stored reference fails, and the last line says where."""
    model, artifact = built["tiny_cnn"]
    saved, inputs, first = tmp_path / "ref.npz", tmp_path / "in.npz", tmp_path / "a.json"
    result = run_cli("diff", model, "--artifact", artifact, "--save-outputs", str(saved),
                     "--save-inputs", str(inputs), "--json", str(first))
    assert result.exit_code == 0, result.output
    with np.load(saved) as data:
        assert sorted(data.files) == ["converted/probs", "probs"]
        reference, converted = data["probs"], data["converted/probs"]
    max_abs = float(np.max(np.abs(converted.astype(np.float64) - reference.astype(np.float64))))
    np.testing.assert_allclose(read_json(first)["outputs"][0]["max_abs"], max_abs, rtol=1e-12)

    # the saved file is itself a valid reference: same statistics as onnxruntime gave
    again = tmp_path / "b.json"
    same = run_cli("diff", model, "--artifact", artifact, "--inputs", str(inputs), "--reference-outputs",
                   str(saved), "--json", str(again))
    assert same.exit_code == 0, same.output
    assert read_json(again)["outputs"][0]["max_abs"] == read_json(first)["outputs"][0]["max_abs"]
    assert read_json(again)["reference"] == {"source": "file", "path": str(saved)}

    scaled = tmp_path / "scaled.npz"
    save_arrays(str(scaled), {"probs": reference * np.float32(1.01)})
    report = tmp_path / "c.json"
    failed = run_cli("diff", model, "--artifact", artifact, "--inputs", str(inputs), "--reference-outputs",
                     str(scaled), "--json", str(report))
    assert failed.exit_code == 1, failed.output
    last = _last(failed)
    assert last.startswith("FAILED | float16 on llvm vs ")
    max_scale_error = DEFAULT_TOLERANCES["float16"].max_scale_error
    found = re.search(rf"output 'probs': scale_error ([0-9.e-]+) > max_scale_error {max_scale_error:g} "
                      r"\(converted ≈ (0\.99[0-9]*) × reference", last)
    assert found, last
    np.testing.assert_allclose(float(found.group(1)), 1 - 1 / 1.01, atol=5e-4)  # what rounding adds is small
    output = read_json(report)["outputs"][0]
    assert output["passed"] is False and output["failed_check"] == "scale_error"
    assert output["cosine"] > 0.9999, "a scale is invisible to cosine"
    assert output["tolerance_ratio"] < 1.0, "and within rtol, which must leave room for trained models' rounding"
    assert read_json(again)["outputs"][0]["scale_error"] < max_scale_error / 10, "the conversion has no scale"


def test_reference_with_wrong_shape_fails_naming_the_output(built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    ref = tmp_path / "ref.npz"
    save_arrays(str(ref), {"probs": np.zeros((2, 10), np.float32)})
    result = run_cli("diff", model, "--artifact", artifact, "--reference-outputs", str(ref))
    assert result.exit_code == 1, result.output
    assert _last(result).endswith("output 'probs': shape [1, 10] != reference [2, 10]")


def test_iterations_report_worst_case_and_mean(built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    path = tmp_path / "r.json"
    result = run_cli("diff", model, "--artifact", artifact, "--iterations", "3", "--seed", "5",
                     "--json", str(path))
    assert result.exit_code == 0, result.output
    assert "mean over 3 input sets (seeds 5…7)" in result.output
    report = read_json(path)
    section = report["iterations"]
    assert section["count"] == 3 and section["seeds"] == [5, 6, 7] and section["failed"] == []
    per_run = [run["outputs"][0] for run in section["runs"]]
    assert len({r["max_abs"] for r in per_run}) == 3, "each input set differs"
    top = report["outputs"][0]
    assert top["max_abs"] == max(r["max_abs"] for r in per_run)
    assert top["cosine"] == min(r["cosine"] for r in per_run)
    np.testing.assert_allclose(section["mean"][0]["max_abs"], np.mean([r["max_abs"] for r in per_run]), rtol=1e-12)
    assert "× 3 input sets" in _last(result)


def test_iteration_one_matches_a_single_run_with_that_seed(built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    many, one = tmp_path / "many.json", tmp_path / "one.json"
    assert run_cli("diff", model, "--artifact", artifact, "--iterations", "2", "--seed", "3", "--json",
                   str(many)).exit_code == 0
    assert run_cli("diff", model, "--artifact", artifact, "--seed", "4", "--json", str(one)).exit_code == 0
    single = {k: v for k, v in read_json(one)["outputs"][0].items() if k != "worst_iteration"}
    assert read_json(many)["iterations"]["runs"][1]["outputs"] == [single]


def test_val_range_shapes_generated_inputs(built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    saved = tmp_path / "in.npz"
    result = run_cli("diff", model, "--artifact", artifact, "--val-range", "input:0,0.5", "--save-inputs", str(saved))
    assert result.exit_code == 0, result.output
    with np.load(saved) as data:
        assert data["input"].min() >= 0.0 and data["input"].max() < 0.5


def test_per_output_tolerance_fails_only_that_output(built, run_cli, tmp_path):
    model, artifact = built["transformer_encoder"]
    path = tmp_path / "r.json"
    result = run_cli("diff", model, "--artifact", artifact, "--atol", "pooled:1e-7", "--rtol", "pooled:0",
                     "--json", str(path))
    assert result.exit_code == 1, result.output
    report = read_json(path)
    verdicts = {o["name"]: o["passed"] for o in report["outputs"]}
    assert verdicts == {"last_hidden_state": True, "pooled": False}
    assert report["tolerance"]["per_output"]["pooled"]["atol"] == 1e-7
    assert "output 'pooled': max_abs" in _last(result)


def test_check_error_stat_and_min_cosine_flags(built, run_cli):
    model, artifact = built["tiny_cnn"]
    # tiny_cnn's errors (~5e-5) are all within atol, where direction is not judged; atol 0 judges it
    within_atol = run_cli("diff", model, "--artifact", artifact, "--min-cosine", "1")
    assert within_atol.exit_code == 0 and "(…) not judged" in within_atol.output
    strict = run_cli("diff", model, "--artifact", artifact, "--min-cosine", "1", "--atol", "0")
    assert strict.exit_code == 1 and "output 'probs': cosine " in _last(strict)
    median = run_cli("diff", model, "--artifact", artifact, "--check-error-stat", "median")
    assert median.exit_code == 0 and "median_abs" in _last(median)
    no_scale = run_cli("diff", model, "--artifact", artifact, "--max-scale-error", "probs:0", "--atol", "0")
    assert no_scale.exit_code == 1 and "output 'probs': scale_error " in _last(no_scale)


def test_plot_draws_an_image(built, run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    model, artifact = built["transformer_encoder"]
    path = tmp_path / "plots" / "p.png"
    result = run_cli("diff", model, "--artifact", artifact, "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["p.png"]


def test_plot_without_matplotlib_is_a_one_line_error(built, run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    model, artifact = built["tiny_cnn"]
    result = run_cli("diff", model, "--artifact", artifact, "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2
    assert "--plot needs matplotlib" in result.output and "pip install 'amptool[plot]'" in result.output
    assert single_error(result.output)


def test_error_text_is_printed_as_text_not_rich_markup(capsys):
    from amptool.cli.console import abort

    with pytest.raises(SystemExit) as info:
        abort(UserError("--inputs runs/a[1].npz: file not found [bold]", "pip install 'amptool[plot]' [/]"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --inputs runs/a[1].npz: file not found [bold]" in err
    assert "hint: pip install 'amptool[plot]' [/]" in err


def _bad_args(case: str, tmp_path: Path, artifact: str) -> list[str]:
    good = {"input": np.zeros((1, 3, 32, 32), np.float32)}
    if case in ("inputs_garbage", "reference_garbage"):
        (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated")
        return ["--inputs" if case == "inputs_garbage" else "--reference-outputs", str(tmp_path / "bad.npz")]
    if case == "inputs_extra":
        save_arrays(str(tmp_path / "x.npz"), {**good, "other": np.zeros(1)})
        return ["--inputs", str(tmp_path / "x.npz")]
    if case == "inputs_shape":
        save_arrays(str(tmp_path / "x.npz"), {"input": np.zeros((2, 3, 32, 32), np.float32)})
        return ["--artifact", artifact, "--inputs", str(tmp_path / "x.npz")]
    if case == "reference_missing":
        save_arrays(str(tmp_path / "r.npz"), {"logits": np.zeros((1, 10), np.float32)})
        return ["--reference-outputs", str(tmp_path / "r.npz")]
    return {
        "atol_text": ["--atol", "abc"],
        "atol_name": ["--atol", "nope:1e-3"],
        "rtol_negative": ["--rtol=-1"],
        "stat": ["--check-error-stat", "probs:p95"],
        "scale_name": ["--max-scale-error", "nope:0.01"],
        "cosine": ["--min-cosine", "2"],
        "val_range_form": ["--val-range", "input:1"],
        "val_range_name": ["--val-range", "nope:0,1"],
        "iterations_zero": ["--iterations", "0"],
        "iterations_save": ["--iterations", "2", "--save-inputs", str(tmp_path / "in.npz")],
        "plot_type": ["--plot", str(tmp_path / "p.bmp")],
        "inputs_missing_file": ["--inputs", str(tmp_path / "none.npz")],
    }[case]


BAD = {
    "atol_text": "--atol 'abc': 'abc' is not a finite number",
    "atol_name": "--atol nope:1e-3 names unknown output 'nope'",
    "rtol_negative": "--rtol '-1'",
    "stat": "'p95' is not a statistic",
    "scale_name": "--max-scale-error nope:0.01 names unknown output 'nope'",
    "cosine": "is not a number in [-1, 1]",
    "val_range_form": "--val-range 'input:1'",
    "val_range_name": "--val-range names unknown input 'nope'",
    "iterations_zero": "Invalid value for '--iterations'",
    "iterations_save": "2 input sets, but --save-inputs, --save-outputs work with one set",
    "plot_type": "unknown image type '.bmp'",
    "inputs_missing_file": "--inputs: file not found",
    "inputs_garbage": "is not a readable .npz file",
    "inputs_extra": "unknown input(s) 'other'",
    "inputs_shape": "array 'input' has shape [2, 3, 32, 32], the compiled model takes [1, 3, 32, 32]",
    "reference_garbage": "is not a readable .npz file",
    "reference_missing": "no array for output(s) 'probs'; unknown output(s) 'logits'",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    out = tmp_path / "out"
    out.mkdir()
    written = [str(out / "r.json"), str(out / "o.npz"), str(out / "i.npz")]
    args = ["--json", written[0], "--save-outputs", written[1]]
    if case != "iterations_save":
        args += ["--save-inputs", written[2]]
    result = run_cli("diff", model, *_bad_args(case, tmp_path, artifact), *args)
    assert result.exit_code == 2, result.output
    assert BAD[case] in result.output
    assert single_error(result.output)
    if not case.startswith("iterations_"):
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.output
    assert list(out.iterdir()) == [], "no output file, not even a temporary one"


def test_json_written_is_valid_json_with_nulls_not_nan(built, run_cli, tmp_path):
    model, artifact = built["tiny_cnn"]
    inputs = tmp_path / "in.npz"
    assert run_cli("diff", model, "--artifact", artifact, "--save-inputs", str(inputs)).exit_code == 0
    ref = tmp_path / "ref.npz"
    save_arrays(str(ref), {"probs": np.full((1, 10), np.nan, np.float32)})
    path = tmp_path / "r.json"
    result = run_cli("diff", model, "--artifact", artifact, "--inputs", str(inputs), "--reference-outputs",
                     str(ref), "--json", str(path))
    assert result.exit_code == 1
    output = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))["outputs"][0]
    assert output["nan_reference"] == 10 and output["nan"] == 0
    assert output["failed_check"] == "nonfinite" and output["max_abs"] is None
    assert "10 finite where the reference has 10 NaN / 0 Inf" in _last(result)


def test_scalar_bool_input_is_generated_as_an_array_and_diff_runs(run_cli, tmp_path):
    """An If on a scalar bool input: the generated condition must be a 0-d array (a numpy
    scalar is not a valid onnxruntime feed), and diff compares both runs."""
    from onnx import TensorProto, helper

    then_graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    else_graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)], "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "if_bool.onnx"
    onnx.save(model, path)
    feeds = generate_inputs(graph_inputs(model), model, seed=0)
    assert isinstance(feeds["cond"], np.ndarray) and feeds["cond"].shape == ()
    result = run_cli("diff", str(path), "--dtype", "float16", "--json", str(tmp_path / "d.json"))
    assert result.exit_code == 0, result.output


def test_an_output_within_atol_of_zero_gets_a_note(run_cli, tmp_path):
    """A PASSED verdict on logits of ~1e-7 (random weights) says nothing: the report says so."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(np.array(1e-7, np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    result = run_cli("diff", str(path), "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert "note: y: every reference value is within atol 0.001 of zero" in result.output


def test_diff_reads_the_model_once(monkeypatch, run_cli, tmp_path):
    """diff loads the model for its reference and hands the same LoadedModel to the build (BERT-base:
    ~1 s of reading, parsing and checking 440 MB a second time); the build leaves it as it was."""
    from amptool.app import convert, diff
    from amptool.frontend import load

    model = tmp_path / "m.onnx"
    onnx.save(model_zoo.ALL_BUILDERS["tiny_cnn"](), model)
    loads: list[onnx.ModelProto] = []

    def counted(path):
        loaded = load.load_model(path)
        loads.append(onnx.ModelProto.FromString(loaded.model.SerializeToString()))
        loads.append(loaded.model)
        return loaded

    monkeypatch.setattr(diff, "load_model", counted)
    monkeypatch.setattr(convert, "load_model", counted)
    result = run_cli("diff", str(model))
    assert result.exit_code == 0, result.output
    assert len(loads) == 2  # one load: a copy as read, and the model the build and the reference shared
    assert loads[1].SerializeToString() == loads[0].SerializeToString()
