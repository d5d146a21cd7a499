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
