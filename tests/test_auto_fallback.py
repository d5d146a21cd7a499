"""``convert --auto-fallback``: the nodes to keep float32, found from per-layer errors, written as colours."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
import yaml

from amptool.colors import load_policy
from amptool.colors.policy import Color
from amptool.convert import ConvertConfig
from amptool.errors import UserError
from amptool.fallback import FallbackConfig, literal_pattern, with_fp32_nodes
from amptool.testing import model_zoo
from tests.conftest import read_json


def _last(result) -> str:
    return result.output.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def fell_back(tmp_path_factory):
    """scale_beyond_fp16 converted with --no-range-guards --auto-fallback (the failing conversion)."""
    from click.testing import CliRunner

    from amptool.cli.main import cli

    root = tmp_path_factory.mktemp("fallback")
    model = root / "scale.onnx"
    onnx.save(model_zoo.scale_beyond_fp16(), model)
    out = root / "out"
    result = CliRunner().invoke(cli, ["convert", str(model), "--no-range-guards", "--auto-fallback", "-o", str(out)],
                                catch_exceptions=False)
    return model, out, result


def test_auto_fallback_turns_the_failing_conversion_into_a_passing_one(fell_back):
    """The issue's done-when: x1e5 overflows float16; keeping that Mul float32 passes."""
    _model, out, result = fell_back
    assert result.exit_code == 0, result.output
    assert _last(result).startswith("PASSED | auto-fallback | 3 compiles | 1 node(s) kept float32 (/scale_up/Mul) | ")
    assert "of compute in float16 (was 100.0%)" in _last(result)
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert section["passed"] is True and section["compiles"] == 3
    assert section["nodes_kept_fp32"] == ["/scale_up/Mul"]
    assert 0.5 < section["fraction_low_precision"] < 1.0 and section["fraction_low_precision_before"] == 1.0
    assert section["final"]["name"] == "y" and section["final"]["passed"] is True
    assert section["final"]["tolerance_ratio"] < 1.0
    assert [a["passed"] for a in section["attempts"]] == [False, True]
    assert section["attempts"][0]["first_jump"] == "/scale_up/Mul"
    assert (out / "model.so").is_file()


def test_fallback_yaml_loads_and_reproduces_a_passing_build(fell_back, run_cli):
    model, out, _result = fell_back
    text = (out / "fallback.yaml").read_text()
    assert "--no-range-guards --colors fallback.yaml" in text  # how to reproduce, in a comment
    data = yaml.safe_load(text)
    assert data == {"version": 1, "extends": "builtin:default",
                    "nodes": [{"match": "/scale_up/Mul", "color": "never"}]}
    policy = load_policy(str(out / "fallback.yaml"))
    assert policy.color_of("relax.multiply", "/scale_up/Mul", "Mul") is Color.NEVER
    assert policy.color_of("relax.multiply", "/scale_down/Mul", "Mul") is not Color.NEVER

    result = run_cli("diff", str(model), "--no-range-guards", "--colors", str(out / "fallback.yaml"))
    assert result.exit_code == 0, result.output
    assert _last(result).startswith("PASSED | float16 on llvm")


def test_a_user_colour_file_is_extended_in_place(tmp_path, run_cli):
    """extends: takes only built-in presets, so a user's file is copied with the rules added first."""
    colors = tmp_path / "mine.yaml"
    colors.write_text("version: 1\nextends: builtin:default\nnever: {add: [Relu]}\n"
                      "nodes:\n  - {match: '/relu/*', color: never}\n")
    model = tmp_path / "scale.onnx"
    onnx.save(model_zoo.scale_beyond_fp16(), model)
    out = tmp_path / "out"
    result = run_cli("convert", str(model), "--no-range-guards", "--colors", str(colors), "--auto-fallback",
                     "--max-compiles", "4", "--iterations", "2", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "on seeded inputs (seeds 0…1)" in (out / "fallback.yaml").read_text()
    data = yaml.safe_load((out / "fallback.yaml").read_text())
    assert data["never"] == {"add": ["Relu"]}
    assert data["nodes"] == [{"match": "/scale_up/Mul", "color": "never"}, {"match": "/relu/*", "color": "never"}]
    assert load_policy(str(out / "fallback.yaml")).node_rules[1].match == "/relu/*"


@pytest.mark.parametrize("name", ["/a/Conv", "x*y", "a?b", "w[0]", "/looks/like/regex/", "plain"])
def test_literal_patterns_match_only_their_node(name):
    policy = with_fp32_nodes(load_policy(None), [name])
    assert policy.node_rules[0].matches(name)
    for other in ("", name + "x", "x" + name, name.replace("/", "_") + "_"):
        if other != name:
            assert not policy.node_rules[0].matches(other)


def test_a_search_that_cannot_pass_exits_1_and_still_writes_everything(zoo_model, run_cli, tmp_path):
    """atol = rtol = 0: not even float32 matches onnxruntime bit for bit (reassociation)."""
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--auto-fallback", "--atol", "0", "--rtol", "0",
                     "--max-compiles", "3", "-o", str(out))
    assert result.exit_code == 1, result.output
    assert _last(result).startswith("FAILED | auto-fallback | 3 compiles | ")
    assert "0.0% of compute in float16" in _last(result) and "max_abs" in _last(result)
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert section["passed"] is False and section["final"]["passed"] is False
    assert "still FAILS" in (out / "fallback.yaml").read_text()


def test_bad_combinations_are_one_line_errors(tmp_path, run_cli):
    model = tmp_path / "scale.onnx"
    onnx.save(model_zoo.scale_beyond_fp16(), model)
    result = run_cli("convert", str(model), "--atol", "1e-2", "--iterations", "2", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "error: --atol, --iterations: only used by --auto-fallback" in result.output
    result = run_cli("convert", str(model), "--dtype", "float32", "--auto-fallback", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "--auto-fallback needs a low-precision --dtype" in result.output
    result = run_cli("convert", str(model), "--auto-fallback", "--atol", "nope:1e-2", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "names unknown output 'nope'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_search_budget_is_checked():
    with pytest.raises(UserError, match="needs at least 3"):
        FallbackConfig(convert=ConvertConfig(model="m.onnx"), max_compiles=2)
    config = FallbackConfig(convert=ConvertConfig(model="m.onnx"))
    assert dataclasses.replace(config, max_compiles=3).max_compiles == 3


def test_literal_pattern_escapes_glob_characters():
    assert literal_pattern("a*b?c[d]") == "a[*]b[?]c[[]d]"
    assert literal_pattern("/x/") == "/x[/]"
