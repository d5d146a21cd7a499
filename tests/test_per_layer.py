"""``diff --per-layer``: node outputs mapped to Relax bindings, compared, and the first jump named."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

from amptool import _tvm
from amptool.app.convert import ConvertConfig, rewrite_model
from amptool.app.diff import DiffConfig
from amptool.app.per_layer import LAYER_KEYS, compare_layers
from amptool.app.probe import Probe, compile_probed, expose_bindings, plan_probes
from amptool.compare.tolerance import default_tolerance
from amptool.errors import UserError
from tests.conftest import read_json, single_error


def _last(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_per_layer_names_the_first_broken_node(zoo_model, run_cli, tmp_path):
    """The issue's done-when: x1e5 cast to float16 is inf; the report says where it started."""
    path = tmp_path / "r.json"
    result = run_cli("diff", zoo_model("scale_beyond_fp16"), "--no-range-guards", "--per-layer", "--json", str(path))
    assert result.exit_code == 1, result.output
    assert "per-layer: error first jumps at '/scale_up/Mul' (Mul): 16 NaN/Inf" in result.output
    assert _last(result).startswith("FAILED | float16 on llvm")  # the verdict stays the last line
    report = read_json(path)
    assert report["first_jump"] == "/scale_up/Mul"
    layers = report["layers"]
    assert [layer["node"] for layer in layers] == ["/fc/MatMul", "/scale_up/Mul", "/scale_down/Mul", "/relu/Relu"]
    for layer in layers:
        assert set(LAYER_KEYS) <= set(layer)
    assert [layer["jump"] for layer in layers] == [False, True, False, False]  # inherited, not new
    assert layers[1]["jump_reason"] == "nonfinite" and layers[1]["inf"] == 16
    assert layers[0]["max_abs"] < 1e-3 and layers[0]["cosine"] > 0.9999
    assert report["compared"] == 4 and report["skipped"] == {}


def test_correct_conversion_has_no_jump(zoo_model, run_cli, tmp_path):
    path = tmp_path / "r.json"
    result = run_cli("diff", zoo_model("tiny_cnn"), "--per-layer", "--json", str(path))
    assert result.exit_code == 0, result.output
    report = read_json(path)
    assert report["first_jump"] is None
    assert len(report["layers"]) == 9 and not any(layer["jump"] for layer in report["layers"])
    assert {layer["dtype"] for layer in report["layers"]} == {"float16", "float32"}
    assert "per-layer: no jump in 9 nodes compared" in result.output


@pytest.mark.parametrize("fields", [{"artifact": "out"}, {"reference_outputs": "r.npz"}])
def test_per_layer_refuses_what_it_cannot_use(fields):
    with pytest.raises(UserError, match="--per-layer converts the model itself"):
        DiffConfig(convert=ConvertConfig(model="m.onnx"), per_layer=True, **fields)


def test_per_layer_with_artifact_is_a_one_line_error(zoo_model, run_cli, tmp_path):
    result = run_cli("diff", zoo_model("tiny_cnn"), "--per-layer", "--artifact", str(tmp_path))
    assert result.exit_code == 2
    assert "error: --per-layer converts the model itself and runs onnxruntime, so it cannot use --artifact" in (
        result.output)
    assert single_error(result.output)


# --------------------------------------------------------------------------- mapping and probing

_SPLIT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8] x) => (float[2, 4] y) {
    a, b = Split <axis = 1> (x)
    s = Mul (a, b)
    y = Relu (s)
}
"""


def test_multi_output_nodes_map_to_their_indexed_bindings(tmp_path):
    model = onnx.parser.parse_model(_SPLIT)
    path = tmp_path / "split.onnx"
    onnx.save(model, path)
    rewritten = rewrite_model(ConvertConfig(model=str(path)))
    assert rewritten.imported is not None
    probes, skipped = plan_probes(rewritten.prepared, rewritten.passes.mod, rewritten.imported.provenance,
                                  rewritten.passes.report.decisions, "float16")
    split = rewritten.prepared.graph.node[0].name
    by_tensor = {p.tensor: p for p in probes}
    assert by_tensor["a"].node == by_tensor["b"].node == split
    assert set(by_tensor) == {"a", "b", "s", "y"} and not skipped

    probed = expose_bindings(rewritten.passes.mod, [p.var for p in probes])
    ret = probed["main"].body.body  # (original result, *probes)
    assert len(ret.fields) == 1 + len(probes)
    assert all(_tvm.tensor_dtype(field) == "float32" for field in ret.fields)
    _tvm.assert_well_formed(probed, "test")

    # Split's converter returns one tuple value: each output is probed through its item.
    model = compile_probed(rewritten.passes.mod, rewritten.passes.report.decisions, rewritten.prepared,
                           rewritten.imported.provenance, rewritten.inputs, ["y"], "float16", {"kind": "llvm"})
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
    outputs, values = model.run({"x": x})
    np.testing.assert_array_equal(values["a"], x[:, :4])
    np.testing.assert_array_equal(values["b"], x[:, 4:])
    np.testing.assert_allclose(outputs["y"], x[:, :4] * x[:, 4:], rtol=1e-3)


def test_jumps_are_relative_to_magnitude_and_to_the_inputs():
    """Growth of 20x over the input is a jump; one float16 rounding of an exact input is not,
    nor is a large relative error on a tensor far below the magnitude floor (atol/rtol = 0.1)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[64] x) => (float[64] d) {
        a = Relu (x)
        b = Sigmoid (a)
        c = Mul (b, b)
        d = Neg (c)
    }
    """)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    rng = np.random.default_rng(0)
    u = 2.0**-11
    a = rng.uniform(1.0, 2.0, 64)
    b = rng.uniform(1e-5, 1e-4, 64)  # tiny tensor
    c = rng.uniform(1.0, 2.0, 64)
    d = -c
    reference = {"a": a, "b": b, "c": c, "d": d}
    converted = {
        "a": a * (1 + u * rng.uniform(-1, 1, 64)),  # one rounding
        "b": b * 1.05,  # 5 % off, but |b| ≤ 1e-4 ≪ 0.1
        "c": c + 20 * u * 2.0 * np.sign(rng.uniform(-1, 1, 64)),  # ~20x the input's error
        "d": -(c + 20 * u * 2.0),
    }
    probes = [Probe(f"n{i}", n.op_type, n.output[0], f"v{i}", "float16") for i, n in enumerate(model.graph.node)]
    report = compare_layers(model, probes, reference, converted, "float16", default_tolerance("float16"))
    jumps = {layer["node"]: layer["jump_reason"] for layer in report.layers}
    assert jumps == {"n0": None, "n1": None, "n2": "growth", "n3": None}
    assert report.first_jump == "n2"
    np.testing.assert_allclose(report.layers[1]["rel_err"], 0.05 * 1e-4 / (1e-4 + 0.1), rtol=0.2)


def test_an_op_that_narrows_the_range_is_not_a_jump():
    """Sigmoid of a wide input: the error it carries, measured against [0, 1] instead of ±60,
    looks 10× larger by max|ref|; its RMS growth says the error did not grow (nudenet)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4096] x) => (float[4096] s) {
        a = Relu (x)
        s = Sigmoid (a)
    }
    """)
    model.graph.node[0].name, model.graph.node[1].name = "wide", "narrow"
    rng = np.random.default_rng(1)
    a = np.concatenate([[60.0], rng.normal(0, 3, 4095)])
    noise = 0.06 * rng.uniform(-1, 1, a.shape)
    sig = 1 / (1 + np.exp(-a))
    reference = {"a": a, "s": sig}
    converted = {"a": a + noise, "s": 1 / (1 + np.exp(-(a + noise)))}
    probes = [Probe("wide", "Relu", "a", "v0", "float16"), Probe("narrow", "Sigmoid", "s", "v1", "float16")]
    report = compare_layers(model, probes, reference, converted, "float16")
    narrow = report.layers[1]
    assert narrow["growth"] > 10 and narrow["rms_growth"] < 10
    assert report.first_jump is None
