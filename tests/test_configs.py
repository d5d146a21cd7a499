"""configs/: family colour lists, the JSON Schema of the colour YAML, ``extends:`` a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from amptool.colors import load_policy
from amptool.colors.policy import Color

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
FAMILIES = sorted((CONFIGS / "colors").glob("*.yaml"))
PRESETS = sorted((ROOT / "amptool" / "colors" / "presets").glob("*.yaml"))


def test_at_least_three_family_lists_ship():
    assert len(FAMILIES) >= 3


@pytest.mark.parametrize("path", FAMILIES, ids=lambda p: p.stem)
def test_each_family_list_loads_in_inspect(path, run_cli, zoo_model):
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--colors", str(path))
    assert result.exit_code == 0, result.output
    assert "error" not in result.output.lower()


@pytest.mark.parametrize("path", FAMILIES, ids=lambda p: p.stem)
def test_each_family_list_extends_the_default_and_says_when_to_use_it(path):
    text = path.read_text()
    assert yaml.safe_load(text)["extends"] == "builtin:default"
    assert text.startswith("# Colour list for ") and "Use it" in text


@pytest.mark.parametrize("path", FAMILIES + PRESETS, ids=lambda p: p.stem)
def test_colour_lists_validate_against_the_schema(path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CONFIGS / "colors.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_the_schema_rejects_what_the_loader_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CONFIGS / "colors.schema.json").read_text())
    for bad in ({"version": 2}, {"version": 1, "alwyas": []}, {"version": 1, "nodes": [{"match": "x"}]},
                {"version": 1, "unknown_ops": "loud"}, {"version": 1, "accumulation": {"Conv": "int8"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_extends_takes_a_file_relative_to_the_extending_one(tmp_path):
    (tmp_path / "family").mkdir()
    (tmp_path / "family" / "base.yaml").write_text("version: 1\nextends: builtin:default\nnever: {add: [Relu]}\n")
    (tmp_path / "mine.yaml").write_text("version: 1\nextends: family/base.yaml\nfollow: {add: [relax.exp]}\n")
    policy = load_policy(str(tmp_path / "mine.yaml"))
    assert policy.onnx_colors["Relu"] is Color.NEVER
    assert policy.relax_colors["relax.exp"] is Color.FOLLOW
    assert policy.relax_colors["relax.nn.conv2d"] is Color.ALWAYS  # from builtin:default, two levels up
    assert policy.sources[0] == "builtin:default" and len(policy.sources) == 3


def test_extends_a_family_list_from_configs(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"version: 1\nextends: {CONFIGS / 'colors' / 'transformer.yaml'}\n")
    assert load_policy(str(mine)).onnx_colors["ReduceMean"] is Color.NEVER


def test_a_cycle_of_files_is_one_line(tmp_path, run_cli, zoo_model):
    (tmp_path / "a.yaml").write_text("version: 1\nextends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("version: 1\nextends: ./a.yaml\n")
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--colors", str(tmp_path / "a.yaml"))
    assert result.exit_code == 2 and "forms a cycle" in result.output


def test_extending_a_missing_file_names_it(tmp_path, run_cli, zoo_model):
    (tmp_path / "a.yaml").write_text("version: 1\nextends: nothere.yaml\n")
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--colors", str(tmp_path / "a.yaml"))
    assert result.exit_code == 2 and "nothere.yaml" in result.output


# ---- make check-models ----------------------------------------------------------------------

def _check_models(tmp_path, entry: str):
    import subprocess
    import sys

    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(f"version: 1\nmatrix:\n{entry}")
    return subprocess.run([sys.executable, str(CONFIGS / "check_models.py"), "--matrix", str(matrix),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)


def test_check_models_passes_a_passing_matrix_and_skips_an_absent_target(tmp_path):
    done = _check_models(tmp_path, "  - {model: examples/tiny_cnn.onnx, dtypes: [float16], targets: [llvm, vulkan]}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| tiny_cnn.onnx | float16 | llvm | PASSED |" in done.stdout
    assert "| tiny_cnn.onnx | float16 | vulkan | SKIPPED |" in done.stdout
    assert json.loads((tmp_path / "out" / "tiny_cnn-float16-llvm.json").read_text())["passed"] is True


def test_check_models_fails_the_make_on_a_failed_verdict(tmp_path):
    done = _check_models(tmp_path, "  - {model: examples/tiny_cnn.onnx, dtypes: [float16], "
                                   "flags: [--atol, '0', --rtol, '0', --min-cosine, '1']}\n")
    assert done.returncode == 1
    assert "| FAILED |" in done.stdout and "CHECK_MODELS | 0/1 passed or skipped | 1 failed" in done.stdout


def test_the_shipped_matrix_names_models_that_exist():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_models", CONFIGS / "check_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    combos = module.combinations(CONFIGS / "models.yaml")
    assert len(combos) >= 4 and all(path.is_file() for path, *_ in combos)


# ---- tolerance profiles ---------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((CONFIGS / "tolerances").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_tolerance_profiles_load(path):
    from amptool.compare.tolerance_profile import load_tolerance_profile

    policy = load_tolerance_profile(str(path))
    assert policy.default.atol is not None


def test_a_profile_sets_tolerances_and_flags_win_over_it(tmp_path, run_cli, zoo_model):
    model = zoo_model("tiny_cnn")
    strict = tmp_path / "strict.yaml"
    strict.write_text("version: 1\ndefault: {atol: 0, rtol: 0}\noutputs:\n  probs: {min_cosine: 1}\n")
    failed = run_cli("diff", model, "--tolerances", str(strict), "--json", str(tmp_path / "f.json"))
    assert failed.exit_code == 1
    assert json.loads((tmp_path / "f.json").read_text())["outputs"][0]["tolerance"]["atol"] == 0.0
    relaxed = run_cli("diff", model, "--tolerances", str(strict), "--atol", "1e-3", "--rtol", "1e-2",
                      "--min-cosine", "probs:0.999")
    assert relaxed.exit_code == 0, relaxed.output


@pytest.mark.parametrize(("body", "message"), [
    ("version: 2\n", "version: 1"),
    ("version: 1\ndefualt: {}\n", "unknown key(s) defualt"),
    ("version: 1\ndefault: {atoll: 1}\n", "unknown tolerance key(s) atoll"),
    ("version: 1\ndefault: {atol: -1}\n", "is not a finite number"),
    ("version: 1\noutputs: {probs: {check_error_stat: p42}}\n", "is not a statistic"),
])
def test_a_malformed_profile_is_one_line(tmp_path, run_cli, zoo_model, body, message):
    profile = tmp_path / "p.yaml"
    profile.write_text(body)
    result = run_cli("diff", zoo_model("tiny_cnn"), "--tolerances", str(profile))
    assert result.exit_code == 2 and message in result.output
