"""Activation range guard: ops whose calibrated activations overflow the low dtype stay fp32."""

from __future__ import annotations

import numpy as np
import pytest

from amptool.app.calibrate import activation_peaks
from tests.conftest import read_json, single_error
from tests.onnx_checks import amplifier_model


def test_peaks_cover_node_inputs_and_outputs():
    x = np.full((2, 64), 2.0, dtype=np.float32)
    calibration = activation_peaks(amplifier_model(), {"x": x}, source="test")
    assert calibration.skipped is None
    assert calibration.peaks["/amp1/MatMul"] == pytest.approx(400.0)
    assert calibration.peaks["/amp2/MatMul"] == pytest.approx(80000.0)
    assert calibration.peaks["/shrink/Mul"] == pytest.approx(80000.0)  # its *input* is huge
    assert calibration.peaks["/out/Relu"] == pytest.approx(8.0)


def test_guard_keeps_overflowing_ops_fp32_and_diff_passes(amplifier, run_cli, tmp_path):
    out = tmp_path / "art"
    assert run_cli("convert", amplifier, "-o", str(out)).exit_code == 0
    result = run_cli("diff", amplifier, "--artifact", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    guarded = {g["node"] for g in manifest["guarded"] if g["kind"] == "activation"}
    assert guarded == {"/amp2/MatMul"}  # /shrink/Mul follows its fp32 input without a guard
    assert manifest["ops_by_dtype"]["relax.matmul"].get("float16") == 1
    assert manifest["activation_guard"]["nodes_over_limit"] >= 2
    assert manifest["activation_guard"]["limit"] == pytest.approx(65504 / 16)


def test_without_guards_the_same_model_fails_with_inf(amplifier, run_cli):
    result = run_cli("diff", amplifier, "--no-range-guards")
    assert result.exit_code == 1, result.output
    assert "Inf" in result.output.strip().splitlines()[-1]


def test_activation_max_from_yaml_moves_the_bound(amplifier, run_cli, tmp_path):
    colors = tmp_path / "loose.yaml"
    colors.write_text("version: 1\nextends: builtin:default\nactivation_max: 1.0e9\n")
    result = run_cli("diff", amplifier, "--colors", str(colors))
    assert result.exit_code == 1, result.output  # bound above the overflow: nothing guarded


@pytest.mark.parametrize("value", ["-1", "'big'", "true"])
def test_bad_activation_max_is_a_one_line_error(amplifier, run_cli, tmp_path, value):
    colors = tmp_path / "bad.yaml"
    colors.write_text(f"version: 1\nactivation_max: {value}\n")
    result = run_cli("convert", amplifier, "--colors", str(colors), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "activation_max" in result.output and single_error(result.output)
    assert not (tmp_path / "out").exists()


def test_calibration_file_is_used_and_checked(amplifier, run_cli, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.full((2, 64), 1e-3, dtype=np.float32))  # tiny: nothing overflows
    out = tmp_path / "art"
    result = run_cli("convert", amplifier, "--calibration", str(calib), "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    assert manifest["activation_guard"]["source"] == str(calib)
    assert manifest["guarded_by_kind"].get("activation", 0) == 0

    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, nope=np.zeros((2, 64), dtype=np.float32))
    result = run_cli("convert", amplifier, "--calibration", str(wrong), "-o", str(tmp_path / "art2"))
    assert result.exit_code == 2 and "nope" in result.output or "x" in result.output
