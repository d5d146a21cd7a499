"""Cancellation guard: an Add/Sub whose result is far below its operands stays float32, with the
ops that make its operands (issue 17: RAFT's ``flow = coords1 - coords0``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from amptool.app.calibrate import activation_peaks, cancellation_ratio
from amptool.app.convert import ConvertConfig
from amptool.app.inspect import inspect_model
from amptool.colors.policy import DEFAULT_CANCELLATION_LIMIT
from tests.conftest import read_json, single_error
from tests.onnx_checks import x_to_y_model


def raft_class(h: int = 16, w: int = 16) -> onnx.ModelProto:
    """RAFT's coordinate update in small: coords1 = grid (100..475) + conv(x) is read by a
    correlation-like Mul → Conv and by flow = coords1 - grid → ·4 → Tanh, joined at the output.

    In float16 coords1 is stored with a spacing of up to 0.25, so flow (|flow| < 1) loses most of
    its bits: cosine 0.98 against float32. The fusion of Add and Sub into one kernel would hide
    it (the simplifier cancels the grid), hence the second reader of coords1."""
    ys, xs = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
    grid = np.stack([100 + xs * 25, 100 + ys * 25])[None].astype(np.float32)
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(grid, "grid"),
        numpy_helper.from_array((rng.standard_normal((2, 2, 3, 3)) * 0.1).astype(np.float32), "k"),
        numpy_helper.from_array((rng.standard_normal((2, 2, 1, 1)) * 0.5).astype(np.float32), "k2"),
        numpy_helper.from_array(np.array(4.0, np.float32), "gain"),
        numpy_helper.from_array(np.array(1 / 512, np.float32), "norm"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["delta"], name="/update/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["grid", "delta"], ["coords1"], name="/coords1/Add"),
        helper.make_node("Mul", ["coords1", "norm"], ["coords_n"], name="/corr/Mul"),
        helper.make_node("Conv", ["coords_n", "k2"], ["corr"], name="/corr/Conv"),
        helper.make_node("Sub", ["coords1", "grid"], ["flow"], name="/flow/Sub"),
        helper.make_node("Mul", ["flow", "gain"], ["scaled"], name="/scale/Mul"),
        helper.make_node("Tanh", ["scaled"], ["motion"], name="/motion/Tanh"),
        helper.make_node("Add", ["motion", "corr"], ["y"], name="/out/Add"),
    ]
    return x_to_y_model(nodes, "raft_class", [1, 2, h, w], inits)


@pytest.fixture
def raft(tmp_path):
    path = tmp_path / "raft_class.onnx"
    onnx.save(raft_class(), path)
    return str(path)


def test_ratio_sees_cancellation_but_not_zero_crossings():
    rng = np.random.default_rng(0)
    grid = rng.uniform(100, 500, 4096).astype(np.float32)
    offset = rng.uniform(-1, 1, 4096).astype(np.float32)
    assert cancellation_ratio(grid + offset, grid, offset) > 100
    # a residual add of mixed signs: many elements land near 0, the tensor's scale does not
    a, b = rng.standard_normal((2, 4096)).astype(np.float32)
    ratio = cancellation_ratio(a, b, a + b)
    assert ratio is not None and ratio < 4
    assert cancellation_ratio(np.ones(8, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32)) is None
    assert cancellation_ratio(np.ones(8, np.int64), np.ones(8, np.int64), np.zeros(8, np.int64)) is None


def test_calibration_records_the_sub_and_what_makes_its_operands():
    x = np.random.default_rng(1).standard_normal((1, 2, 16, 16)).astype(np.float32)
    calibration = activation_peaks(raft_class(), {"x": x}, source="test")
    flow = calibration.cancellation["/flow/Sub"]
    assert flow.ratio > 50 * DEFAULT_CANCELLATION_LIMIT
    assert flow.feeds == ("/coords1/Add",)  # the grid is a constant: nothing makes it
    assert calibration.cancellation["/coords1/Add"].ratio < 2
    assert calibration.cancellation["/out/Add"].ratio < DEFAULT_CANCELLATION_LIMIT


def test_raft_class_diff_passes_because_of_the_guard(raft, run_cli):
    guarded = run_cli("diff", raft, "--dtype", "float16")
    assert guarded.exit_code == 0, guarded.output
    assert guarded.output.strip().splitlines()[-1].startswith("PASSED")
    unguarded = run_cli("diff", raft, "--dtype", "float16", "--no-cancellation-guard")
    assert unguarded.exit_code == 1, unguarded.output
    assert unguarded.output.strip().splitlines()[-1].startswith("FAILED")


def test_manifest_reports_the_guard(raft, run_cli, tmp_path):
    out = tmp_path / "art"
    assert run_cli("convert", raft, "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    cancelled = {g["node"]: g["reason"] for g in manifest["guarded"] if g["kind"] == "cancellation"}
    # The Add making coords1 is kept; the Sub then follows its float32 input without a guard.
    assert set(cancelled) == {"/coords1/Add"} and "/flow/Sub" in cancelled["/coords1/Add"]
    assert manifest["guarded_by_kind"]["cancellation"] == 1
    summary = manifest["cancellation_guard"]
    assert summary["limit"] == DEFAULT_CANCELLATION_LIMIT and summary["nodes_over_limit"] == 1
    assert summary["nodes_measured"] == 3
    assert manifest["ops_by_dtype"]["relax.subtract"] == {"float32": 1}


def test_switches_flag_range_guards_and_yaml_limit(raft, tmp_path):
    def cancelled(**kwargs):
        report = inspect_model(ConvertConfig(model=raft, **kwargs))
        return [g.node for g in report.rewritten.passes.report.guarded if g.kind == "cancellation"], report

    assert cancelled()[0] == ["/coords1/Add"]
    nodes, report = cancelled(cancellation_guard=False)
    assert nodes == [] and report.as_json()["cancellation_guard"] is None
    assert cancelled(range_guards=False)[0] == []
    loose = tmp_path / "loose.yaml"
    loose.write_text("version: 1\nextends: builtin:default\ncancellation_limit: 1.0e5\n")
    assert cancelled(colors=str(loose))[0] == []  # the bound is above the measured 1.7e3
    tight = tmp_path / "tight.yaml"
    tight.write_text("version: 1\nextends: builtin:default\ncancellation_limit: 1.1\n")  # /out/Add (1.19) too
    nodes, report = cancelled(colors=str(tight))
    assert {"/coords1/Add", "/corr/Conv"} <= set(nodes)  # the conv makes an operand of /out/Add
    assert report.as_json()["cancellation_guard"]["nodes_over_limit"] == 2


@pytest.mark.parametrize("value", ["0.5", "'big'", "true", "-3"])
def test_bad_cancellation_limit_is_a_one_line_error(raft, run_cli, tmp_path, value):
    colors = tmp_path / "bad.yaml"
    colors.write_text(f"version: 1\ncancellation_limit: {value}\n")
    result = run_cli("inspect", raft, "--colors", str(colors))
    assert result.exit_code == 2
    assert "cancellation_limit" in result.output and single_error(result.output)


@pytest.mark.parametrize("name", ["resnet_like", "transformer_encoder"])
def test_residual_and_layernorm_adds_do_not_trip(zoo_model, name):
    """Sums of mixed signs cross zero at a few elements; the guard must not keep them float32."""
    report = inspect_model(ConvertConfig(model=zoo_model(name)))
    calibration = report.rewritten.calibration
    assert calibration is not None and len(calibration.cancellation) >= 4
    assert max(c.ratio for c in calibration.cancellation.values()) < DEFAULT_CANCELLATION_LIMIT / 4
    assert [g for g in report.rewritten.passes.report.guarded if g.kind == "cancellation"] == []
