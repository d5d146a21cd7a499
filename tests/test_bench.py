"""``amptool bench``: JSON contract, variants, ratios, artifact input, user errors. Never timing."""

from __future__ import annotations

import math

import pytest

from amptool.bench import ONNXRUNTIME, BenchReport, VariantTiming
from tests.conftest import read_json

FAST = ("--rounds", "1", "--runs", "2", "--threads", "1")


def test_json_contract_and_summary_line(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float16", "--dtype", "bfloat16", *FAST,
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    assert data["threads"] == 1
    variants = [r["variant"] for r in data["results"]]
    assert variants == [ONNXRUNTIME, "amptool-float32", "amptool-float16", "amptool-bfloat16"]
    for r in data["results"]:
        assert r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"]
        assert r["runs"] == 2
    assert set(data["ratios"]) == {
        "amptool-float32/onnxruntime-float32",
        "amptool-float16/onnxruntime-float32", "amptool-float16/amptool-float32",
        "amptool-bfloat16/onnxruntime-float32", "amptool-bfloat16/amptool-float32",
    }
    assert all(v > 0 for v in data["ratios"].values())
    assert data["host"]["llvm_cpu"] and data["versions"]["apache-tvm"]
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("BENCH | amptool-float32 ") and last.endswith("| threads 1")


def test_float32_is_timed_once(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float32", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [r["variant"] for r in read_json(out)["results"]] == [ONNXRUNTIME, "amptool-float32"]


def test_artifact_is_timed_against_fresh_float32(zoo_model, run_cli, tmp_path):
    artifact = tmp_path / "art"
    assert run_cli("convert", zoo_model("tiny_cnn"), "--dtype", "bfloat16", "-o", str(artifact)).exit_code == 0
    out = tmp_path / "bench.json"
    result = run_cli("bench", str(artifact), *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    assert [r["variant"] for r in data["results"]] == [ONNXRUNTIME, "amptool-float32", "amptool-bfloat16"]
    assert data["results"][2]["build_s"] is None  # loaded, not built


def test_batch_pins_a_dynamic_batch(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("dynamic_batch_cnn"), "--batch", "3", "--dtype", "float32", *FAST,
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out)["inputs"][0]["shape"] == [3, 3, 32, 32]


def test_build_options_reach_the_builds(zoo_model, run_cli, tmp_path):
    """bench takes convert's build options: a fixed input is baked in (no longer an input)."""
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("mlp_with_bool_mask"), "--fixed-input", "mask=1", "--no-concretize",
                     "--low-precision-io", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [i["name"] for i in read_json(out)["inputs"]] == ["x"]


def test_artifact_refuses_build_options(zoo_model, run_cli, tmp_path):
    artifact = tmp_path / "art"
    assert run_cli("convert", zoo_model("tiny_cnn"), "-o", str(artifact)).exit_code == 0
    result = run_cli("bench", str(artifact), "--no-prepare", "--colors", "builtin:aggressive", *FAST)
    assert result.exit_code == 2
    assert "colors, prepare cannot change it" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--threads", "0"), "--threads must be at least 1"),
        (("--dtype", "float8"), "float8"),
        (("--batch", "4"), "declared [1, 3, 32, 32]"),
    ],
)
def test_user_errors_exit_2(zoo_model, run_cli, args, message):
    result = run_cli("bench", zoo_model("tiny_cnn"), *args)
    assert result.exit_code == 2
    assert message in result.output


def test_ratios_are_medians_over_medians():
    def timing(name: str, times: list[float]) -> VariantTiming:
        return VariantTiming(name, times_ms=times)

    report = BenchReport(
        model="m", target="llvm", threads=2, tvm_threads=2, inputs=[],
        results=[timing(ONNXRUNTIME, [2.0, 2.0, 100.0]), timing("amptool-float32", [3.0, 3.0, 3.0]),
                 timing("amptool-float16", [1.5, 1.5, 1.5])],
        host={}, versions={}, date="",
    )
    assert report.ratio("amptool-float32", ONNXRUNTIME) == pytest.approx(1.5)
    assert report.ratios()["amptool-float16/amptool-float32"] == pytest.approx(0.5)
    assert math.isnan(VariantTiming("x").median_ms)
