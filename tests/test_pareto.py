"""``convert --auto-fallback --pareto``: every search step built normally, checked on held-out sets
and timed in its own process; ``--target-margin`` searches past "within tolerance"."""

from __future__ import annotations

import pytest

from amptool.app.fallback import within_margin
from tests.conftest import read_json, single_error
from tests.test_auto_fallback import _seed_dependent


@pytest.fixture(scope="module")
def pareto_run(tmp_path_factory):
    from click.testing import CliRunner

    from amptool.cli.main import cli

    root = tmp_path_factory.mktemp("pareto")
    model = _seed_dependent(root / "seedy.onnx")
    pareto = root / "steps.json"
    result = CliRunner().invoke(cli, ["convert", model, "--no-range-guards", "--auto-fallback", "--pareto",
                                      str(pareto), "-o", str(root / "out")], catch_exceptions=False)
    return root, model, pareto, result


def test_pareto_lists_each_step_with_accuracy_and_latency(pareto_run):
    root, _model, pareto, result = pareto_run
    assert result.exit_code == 0, result.output
    report = read_json(pareto)
    steps = report["steps"]
    assert len(steps) >= 3
    assert [s["step"] for s in steps] == ["0 kept", "1 kept", "float32"]
    for step in steps:
        assert step["latency_ms"] > 0 and step["latency_vs_float32"] > 0
        assert step["tolerance_ratio"] is not None and isinstance(step["held_out_passed"], bool)
    first, chosen, fp32 = steps
    assert not first["held_out_passed"] and first["failure"]  # float16 overflows on held-out seeds
    assert chosen["chosen"] and chosen["held_out_passed"] and chosen["nodes"] == ["/up/Mul"]
    assert 0.0 < chosen["fraction_low_precision"] < first["fraction_low_precision"] == 1.0
    assert fp32["all_float32"] and fp32["fraction_low_precision"] == 0.0 and fp32["latency_vs_float32"] == 1.0
    assert sum(s["chosen"] for s in steps) == 1
    assert set(report["frontier"]) <= {s["step"] for s in steps} and "0 kept" not in report["frontier"]
    assert report["pareto_compiles"] >= 1  # the float32 build at least
    manifest = read_json(root / "out" / "manifest.json")
    assert manifest["auto_fallback"]["pareto_steps"] == 3
    assert "speed/accuracy per step" in result.output


def test_target_margin_keeps_falling_back(tmp_path, run_cli):
    """Keeping /up/Mul passes at 0.034x tolerance; a 0.02 margin needs one node more."""
    model = _seed_dependent(tmp_path / "seedy.onnx")
    out = tmp_path / "out"
    result = run_cli("convert", model, "--no-range-guards", "--auto-fallback", "--target-margin", "0.02",
                     "-o", str(out))
    assert result.exit_code == 0, result.output
    section = read_json(out / "manifest.json")["auto_fallback"]
    assert len(section["nodes_kept_fp32"]) >= 2
    assert section["target_margin"] == 0.02 and section["target_margin_met"] is True
    missed = [a for a in section["attempts"] if a["failure"] and "--target-margin" in a["failure"]]
    assert missed and missed[0]["kept"] == 1


@pytest.mark.parametrize(("args", "needle"), [
    (("--pareto", "p.json"), "only used by --auto-fallback"),
    (("--target-margin", "0.5"), "only used by --auto-fallback"),
    (("--auto-fallback", "--pareto-plot", "p.png"), "no --pareto FILE.json"),
    (("--auto-fallback", "--target-margin", "1.5"), "(0, 1]"),
    (("--auto-fallback", "--pareto", "a_file/p.json"), "cannot be created"),
])
def test_bad_pareto_flags(zoo_model, run_cli, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a directory")
    result = run_cli("convert", zoo_model("tiny_cnn"), *args, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and single_error(result.output), result.output
    assert needle in result.output
    assert not (tmp_path / "out").exists()


def test_within_margin():
    outputs = [{"tolerance_ratio": 0.3}, {"tolerance_ratio": None}]
    assert within_margin(outputs, None) and within_margin(outputs, 0.3) and not within_margin(outputs, 0.2)


def _step(label: str, latency_ms: float, ratio: float, passed: bool):
    from amptool.app.fallback_verify import Verdict
    from amptool.app.pareto import Step

    outputs = ({"name": "y", "passed": passed, "tolerance_ratio": ratio, "failure": None if passed else "over"},)
    verdict = Verdict("seeds", (1,), None, 1, outputs, () if passed else ("seed 1",), "seed 1")
    return Step(label, (), 0.5, 0.5, verdict, False, latency_ms)


def test_frontier_holds_only_passing_steps_no_other_passing_step_beats():
    """A failing build is never an option, even when timing noise makes it the fastest."""
    from amptool.app.pareto import _frontier

    steps = [_step("0 kept", 1.0, 40.0, passed=False), _step("1 kept", 1.3, 0.03, passed=True),
             _step("2 kept", 1.4, 0.05, passed=True), _step("float32", 1.2, 0.0, passed=True)]
    assert _frontier(steps) == ["float32"]  # faster and more accurate than both passing steps
    steps[1].latency_ms = 1.1
    assert _frontier(steps) == ["1 kept", "float32"]  # "2 kept" loses to both on both axes
