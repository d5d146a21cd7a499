"""``convert --auto-fallback``: the nodes to keep float32, found from per-layer errors, written as colours."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from amptool.app.convert import ConvertConfig
from amptool.app.fallback import FallbackConfig, literal_pattern, with_fp32_nodes
from amptool.colors import load_policy
from amptool.colors.policy import Color
from amptool.errors import UserError
from amptool.testing import model_zoo
from tests.conftest import read_json, single_error


def _last(result) -> str:
    return result.output.strip().splitlines()[-1]


def _seed_dependent(path: Path) -> str:
    """x @ I, ×2^15, ×2^-15: exact in float32; in float16 the ×2^15 overflows when |x| > 2, which
    diff's seeded inputs reach on seeds 1, 5, 6 and 7 (max |x| 2.67, 2.36, 2.14, 2.14) but not
    on seed 0 (1.44). Powers of two, so float16 adds no error but the input's rounding."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc/MatMul"),
             helper.make_node("Mul", ["h", "up"], ["u"], name="/up/Mul"),
             helper.make_node("Mul", ["u", "down"], ["y"], name="/down/Mul")]
    weights = [numpy_helper.from_array(np.eye(16, dtype=np.float32), "w"),
               numpy_helper.from_array(np.array(2.0**15, np.float32), "up"),
               numpy_helper.from_array(np.array(2.0**-15, np.float32), "down")]
    graph = helper.make_graph(nodes, "seed_dependent", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return str(path)


@pytest.fixture(scope="module")
def seed_dependent(tmp_path_factory):
    """_seed_dependent converted with --no-range-guards --auto-fallback and the default input sets."""
    from click.testing import CliRunner

    from amptool.cli.main import cli

    root = tmp_path_factory.mktemp("seed_dependent")
    model = _seed_dependent(root / "seedy.onnx")
    out = root / "out"
    result = CliRunner().invoke(cli, ["convert", model, "--no-range-guards", "--auto-fallback", "-o", str(out)],
                                catch_exceptions=False)
    return model, out, result


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
    assert "# Search (seeds 0-1): output 'y' passes" in (out / "fallback.yaml").read_text()
    assert "# Held-out (seeds 2-5): output 'y' passes" in (out / "fallback.yaml").read_text()
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
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((1, 16), np.float32))
    result = run_cli("convert", str(model), "--validation", str(inputs), "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "error: --validation: only used by --auto-fallback" in result.output
    result = run_cli("convert", str(model), "--auto-fallback", "--calibration", str(inputs), "--iterations", "4",
                     "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and f"--iterations 4 generates the search's input sets, but --calibration {inputs}" \
        in result.output
    result = run_cli("convert", str(model), "--auto-fallback", "--validation", str(tmp_path / "none.npz"),
                     "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "none.npz' does not exist" in result.output
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, z=np.ones((1, 16), np.float32))
    result = run_cli("convert", str(model), "--auto-fallback", "--validation", str(wrong), "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and f"error: --validation {wrong}: no array for input(s) 'x'" in result.output
    assert single_error(result.output) and not (tmp_path / "o").exists()


def test_search_budget_is_checked():
    with pytest.raises(UserError, match="needs at least 3"):
        FallbackConfig(convert=ConvertConfig(model="m.onnx"), max_compiles=2)
    config = FallbackConfig(convert=ConvertConfig(model="m.onnx"))
    assert dataclasses.replace(config, max_compiles=3).max_compiles == 3


def test_literal_pattern_escapes_glob_characters():
    assert literal_pattern("a*b?c[d]") == "a[*]b[?]c[[]d]"
    assert literal_pattern("/x/") == "/x[/]"


# --------------------------------------------------------------------------- search vs held-out input sets


def test_the_search_judges_on_four_seeds_and_holds_out_four_more(seed_dependent):
    """Seed 0 alone passes all-float16; seed 1 overflows. Four search seeds see it, so /up/Mul is kept."""
    _model, out, result = seed_dependent
    assert result.exit_code == 0, result.output
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert section["nodes_kept_fp32"] == ["/up/Mul"] and section["passed"] is True
    assert section["search"]["seeds"] == [0, 1, 2, 3] and section["search"]["sets"] == 4
    assert section["search"]["source"] == "seeds 0-3" and section["search"]["passed"] is True
    assert section["attempts"][0]["passed"] is False  # all-float16 failed on a search set …
    assert section["search"]["tolerance_ratio"] == pytest.approx(section["final"]["tolerance_ratio"])
    held = section["held_out"]
    assert held["seeds"] == [4, 5, 6, 7] and held["path"] is None and held["passed"] is True
    assert held["failed_sets"] == [] and 0 < held["tolerance_ratio"] < 1
    assert _last(result).startswith("PASSED | auto-fallback | 3 compiles | 1 node(s) kept float32 (/up/Mul) | ")
    assert _last(result).endswith(f"on search seeds 0-3: {section['final']['tolerance_ratio']:.3g}× tolerance | "
                                  f"held-out seeds 4-7: {held['tolerance_ratio']:.3g}× tolerance")
    assert "# Held-out (seeds 4-7): output 'y' passes" in (out / "fallback.yaml").read_text()


def test_the_colours_found_pass_diff_on_unseen_seeds(seed_dependent, run_cli):
    """Seeds 100-103 were neither searched nor held out."""
    model, out, _result = seed_dependent
    result = run_cli("diff", model, "--no-range-guards", "--colors", str(out / "fallback.yaml"),
                     "--seed", "100", "--iterations", "4")
    assert result.exit_code == 0, result.output
    assert _last(result).startswith("PASSED | float16 on llvm")


def test_a_search_that_overfits_one_seed_fails_the_held_out_check(tmp_path, run_cli):
    """--iterations 1: seed 0 passes with nothing kept; held-out seed 1 overflows → exit 1."""
    model = _seed_dependent(tmp_path / "seedy.onnx")
    out = tmp_path / "out"
    result = run_cli("convert", model, "--no-range-guards", "--auto-fallback", "--iterations", "1", "-o", str(out))
    assert result.exit_code == 1, result.output
    assert _last(result).startswith(
        "FAILED | auto-fallback | held-out check failed: output 'y' 0 NaN / 1 Inf where the reference is finite "
        "on seed 1 (search passed on seed 0) | 2 compiles | 0 node(s) kept float32 | ")
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert section["passed"] is False and section["search"]["passed"] is True
    assert section["held_out"]["seeds"] == [1, 2, 3, 4] and section["held_out"]["failed_sets"] == ["seed 1"]
    text = (out / "fallback.yaml").read_text()  # still written, and says why it is not to be trusted
    assert "# Held-out (seeds 1-4): output 'y' FAILS on seed 1: " in text and "did not generalise" in text
    assert yaml.safe_load(text)["nodes"] == []


def test_a_validation_file_the_colours_fail_exits_1(seed_dependent, tmp_path, run_cli):
    """Held-out inputs 1e5× the search's: float16 cannot even hold them."""
    model, _out, _result = seed_dependent
    validation = tmp_path / "far.npz"
    np.savez(validation, x=np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32) * 1e5)
    out = tmp_path / "out"
    result = run_cli("convert", model, "--no-range-guards", "--auto-fallback", "--validation", str(validation),
                     "-o", str(out))
    assert result.exit_code == 1, result.output
    assert _last(result).startswith(  # inf × the identity's zeros: NaN
        f"FAILED | auto-fallback | held-out check failed: output 'y' 16 NaN / 0 Inf where the reference is finite "
        f"on --validation {validation} (search passed on seeds 0-3) | 3 compiles | 1 node(s) kept float32 (/up/Mul) | ")
    assert _last(result).endswith(f"held-out --validation {validation}: failed")
    section = read_json(out / "manifest.json")["auto_fallback"]
    held = section["held_out"]
    assert held == {**held, "passed": False, "seeds": [], "path": str(validation), "sets": 1,
                    "worst_set": f"--validation {validation}", "failed_sets": [f"--validation {validation}"]}
    assert section["search"]["passed"] is True and section["passed"] is False
    assert "did not generalise" in (out / "fallback.yaml").read_text()


def test_the_search_runs_on_calibration_inputs_when_given(tmp_path, run_cli):
    """--calibration is the search's input set; the held-out seeds then start at 0."""
    model = _seed_dependent(tmp_path / "seedy.onnx")
    calibration = tmp_path / "cal.npz"
    np.savez(calibration, x=np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 16))
    out = tmp_path / "out"
    result = run_cli("convert", model, "--no-range-guards", "--calibration", str(calibration), "--auto-fallback",
                     "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert section["nodes_kept_fp32"] == ["/up/Mul"]
    assert section["search"] == {**section["search"], "passed": True, "seeds": [], "path": str(calibration),
                                 "sets": 1, "source": f"--calibration {calibration}"}
    assert section["held_out"]["seeds"] == [0, 1, 2, 3] and section["held_out"]["passed"] is True
