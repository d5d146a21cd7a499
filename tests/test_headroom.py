"""``inspect --headroom``: per-node margins to the low dtype's limits, and ``--write-colors`` lists
that ``--colors`` reads back (issue 17: a ready-made block list)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from amptool.app.calibrate import Calibration, Floor
from amptool.app.headroom import colors_yaml, measure_headroom
from amptool.colors import load_policy
from tests.conftest import read_json, single_error
from tests.onnx_checks import x_to_y_model


def _tiny_values() -> onnx.ModelProto:
    """x·1e-9 (flushes to zero in float16) → ·1e9 → Relu: fine in float32, zeros in float16."""
    inits = [numpy_helper.from_array(np.array(1e-9, np.float32), "down"),
             numpy_helper.from_array(np.array(1e9, np.float32), "up")]
    nodes = [helper.make_node("Mul", ["x", "down"], ["t"], name="/down/Mul"),
             helper.make_node("Mul", ["t", "up"], ["u"], name="/up/Mul"),
             helper.make_node("Relu", ["u"], ["y"], name="/out/Relu")]
    return x_to_y_model(nodes, "tiny", [2, 64], inits)


def test_headroom_json_gives_margins_per_node(amplifier, run_cli, tmp_path):
    report = tmp_path / "inspect.json"
    result = run_cli("inspect", amplifier, "--headroom", "--json", str(report))
    assert result.exit_code == 0, result.output
    assert "headroom in float16" in result.output
    headroom = read_json(report)["headroom"]
    assert headroom["dtype"] == "float16" and headroom["margin"] == 16 and headroom["dtype_max"] == 65504
    nodes = {n["name"]: n for n in headroom["nodes"]}
    assert set(nodes) == {"/amp1/MatMul", "/amp2/MatMul", "/shrink/Mul", "/out/Relu"}
    for node in nodes.values():
        assert node["overflow_margin"] == pytest.approx(65504 / node["max_abs"])
    assert nodes["/amp2/MatMul"]["overflow_margin"] < 1  # it overflows float16 outright
    # seeded inputs: |x| ≈ 500 after the first MatMul (margin 130), 1e5 after the second
    assert set(headroom["under_margin"]) == {"/amp2/MatMul", "/shrink/Mul"}
    assert nodes["/amp1/MatMul"]["overflow_margin"] > 16
    assert headroom["nodes"][0]["under_margin"]  # tightest first
    assert nodes["/out/Relu"]["flushed_fraction"] == 0


def test_underflow_is_measured(run_cli, tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_values(), path)
    report = tmp_path / "inspect.json"
    result = run_cli("inspect", str(path), "--headroom", "--json", str(report))
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in read_json(report)["headroom"]["nodes"]}
    assert nodes["/down/Mul"]["flushed_fraction"] > 0.9 and nodes["/down/Mul"]["subnormal_fraction"] == 1
    assert nodes["/down/Mul"]["under_margin"] and not nodes["/out/Relu"]["under_margin"]
    assert nodes["/down/Mul"]["min_nonzero"] < 1e-9
    bf16 = tmp_path / "bf16.json"
    assert run_cli("inspect", str(path), "--headroom", "--dtype", "bf16", "--json", str(bf16)).exit_code == 0
    assert {n["name"]: n for n in read_json(bf16)["headroom"]["nodes"]}["/down/Mul"]["flushed_fraction"] == 0


def test_written_colors_round_trip_through_colors(amplifier, run_cli, tmp_path):
    keep = tmp_path / "lists" / "keep.yaml"  # a directory that does not exist yet
    result = run_cli("inspect", amplifier, "--write-colors", str(keep), "--margin", "1")
    assert result.exit_code == 0, result.output
    assert "2 node(s) under the 1x margin" in result.output
    assert [p for p in os.listdir(keep.parent) if p != "keep.yaml"] == []  # no temporary left behind
    policy = load_policy(str(keep))
    assert [r.match for r in policy.node_rules] == ["/amp2/MatMul", "/shrink/Mul"]

    # Read back with the range guards off: the list alone keeps the node float32.
    report = tmp_path / "again.json"
    result = run_cli("inspect", amplifier, "--colors", str(keep), "--no-range-guards", "--json", str(report))
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in read_json(report)["nodes"]}
    for name in ("/amp2/MatMul", "/shrink/Mul"):
        assert nodes[name]["color"] == "never" and nodes[name]["dtype"] == "float32"
    assert nodes["/amp1/MatMul"]["dtype"] == "float16"
    assert run_cli("diff", amplifier, "--no-range-guards").exit_code == 1  # Inf without the list
    result = run_cli("diff", amplifier, "--colors", str(keep), "--no-range-guards")
    assert result.exit_code == 0, result.output
    out = tmp_path / "art"
    assert run_cli("convert", amplifier, "--colors", str(keep), "--no-range-guards", "-o", str(out)).exit_code == 0
    assert {"match": "/amp2/MatMul", "color": "never"} in read_json(out / "manifest.json")["colors"]["nodes"]


def test_written_list_keeps_the_users_colours(amplifier, run_cli, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: 1\nextends: builtin:default\nnever: {add: [Relu]}\n")
    keep = tmp_path / "sub" / "keep.yaml"
    result = run_cli("inspect", amplifier, "--colors", str(mine), "--exclude-op", "Mul", "--exclude-node", "/amp1/*",
                     "--write-colors", str(keep), "--margin", "1")
    assert result.exit_code == 0, result.output
    policy = load_policy(str(keep))  # extends ../mine.yaml, relative to the written file
    assert str(mine) in policy.sources
    assert policy.onnx_colors["Relu"].value == "never" and policy.onnx_colors["Mul"].value == "never"
    assert {r.match for r in policy.node_rules} == {"/amp2/MatMul", "/shrink/Mul", "/amp1/*"}


def test_node_names_are_matched_literally(tmp_path):
    names = ["/a[0]/Mul*", "/b?/", "plain"]
    calibration = Calibration(peaks={n: 1e5 for n in names} | {"/a0/Mul": 1e5, "safe": 1.0},
                              floors={"safe": Floor()})
    headroom = measure_headroom(calibration, {}, "float16", 16)
    assert set(headroom.under_margin) == {*names, "/a0/Mul"}
    keep = tmp_path / "keep.yaml"
    keep.write_text(colors_yaml(headroom, "m.onnx", None, str(keep)))
    policy = load_policy(str(keep))
    for name in [*names, "/a0/Mul"]:
        assert sum(rule.matches(name) for rule in policy.node_rules) == 1, name
    assert not any(rule.matches("safe") or rule.matches("/a0/MulX") for rule in policy.node_rules)


@pytest.mark.parametrize("case", ["directory", "under_a_file", "float32", "margin"])
def test_bad_requests_are_one_line_errors(amplifier, run_cli, tmp_path, case):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    args = {
        "directory": ["--write-colors", str(tmp_path)],
        "under_a_file": ["--write-colors", str(blocker / "keep.yaml")],
        "float32": ["--headroom", "--dtype", "float32"],
        "margin": ["--headroom", "--margin", "0.5"],
    }[case]
    result = run_cli("inspect", amplifier, *args)
    assert result.exit_code == 2, result.output
    assert single_error(result.output) and "Traceback" not in result.output
    assert blocker.read_text() == "x"


def test_headroom_with_range_guards_off_still_calibrates(amplifier, run_cli, tmp_path):
    report = tmp_path / "inspect.json"
    result = run_cli("inspect", amplifier, "--headroom", "--no-range-guards", "--json", str(report))
    assert result.exit_code == 0, result.output
    data = read_json(report)
    assert data["guarded_activations"] == [] and data["activation_guard"] is None
    assert "/amp2/MatMul" in data["headroom"]["under_margin"]
