"""Exp, Sigmoid and Log on the CPU as vectorized polynomials (``amptool.compiler.cpu_exp``): within
an ulp or two of the exact values across float32's whole range, special values as libm's, and
no ``expf``/``logf`` call left in the library (the call kept the loops scalar)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import amptool

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.7229, 89.5, -87.33, -103.9, -104.5, -150.0],
                   dtype=np.float32)


def _build(tmp_path: Path, op: str, n: int, dtype: str = "float32") -> amptool.Artifact:
    tmp_path.mkdir(exist_ok=True)
    model = onnx.parser.parse_model(f"""<ir_version: 9, opset_import: ["" : 18]>
    g (float[{n}] x) => (float[{n}] y) {{ y = {op} (x) }}""")
    path = tmp_path / f"{op}.onnx"
    onnx.save(model, path)
    amptool.convert(path, dtype=dtype, output=tmp_path / op)
    return amptool.load(tmp_path / op)


def _exact(op: str, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == "Log":
            return np.log(x64)
        return np.exp(x64) if op == "Exp" else 1.0 / (1.0 + np.exp(-x64))


def _range(op: str) -> np.ndarray:
    if op != "Log":
        return np.concatenate([np.linspace(-110.0, 95.0, 100_001, dtype=np.float32), SPECIAL])
    rng = np.random.default_rng(0)
    return np.concatenate([np.geomspace(1e-45, 3e38, 100_001).astype(np.float32),  # subnormals to FLT_MAX
                           rng.uniform(0.5, 2.0, 20_000).astype(np.float32), SPECIAL, np.float32([-1.0, 1.0])])


@pytest.mark.parametrize(("op", "max_ulps"), [("Exp", 1.0), ("Sigmoid", 2.5), ("Log", 1.0)])
def test_within_ulps_of_the_exact_value_across_the_range(tmp_path: Path, op: str, max_ulps: float) -> None:
    x = _range(op)
    got = np.asarray(_build(tmp_path, op, x.size).run({"x": x})["y"])
    exact = _exact(op, x)
    with np.errstate(over="ignore"):
        want = exact.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(got[want == 0], want[want == 0])  # log(1) is 0, exp(-150) 0
    ulps = np.abs(got[normal] - exact[normal]) / np.spacing(want[normal]).astype(np.float64)
    assert ulps.max() <= max_ulps, (ulps.max(), x[normal][ulps.argmax()])
    tiny = np.isfinite(want) & ~normal  # subnormal and zero results: what expf gives, to a few 1e-39
    np.testing.assert_allclose(got[tiny], want[tiny], rtol=0, atol=3e-39)


@pytest.mark.parametrize("op", ["Exp", "Sigmoid", "Elu", "Log", "Softplus", "Mish"])
def test_no_libm_call_left(tmp_path: Path, op: str) -> None:
    _build(tmp_path, op, 4096)
    listing = subprocess.run(["objdump", "-d", str(tmp_path / op / "model.so")], capture_output=True, text=True,
                             check=True).stdout
    assert not re.search(r"\bcall\s.*<(expf|logf)@plt>", listing)


def test_bfloat16_and_float16_builds(tmp_path: Path) -> None:
    x = np.linspace(-12.0, 12.0, 257, dtype=np.float32)
    for dtype, rtol in (("bfloat16", 1e-2), ("float16", 1e-3)):
        got = np.asarray(_build(tmp_path / dtype, "Sigmoid", x.size, dtype).run({"x": x})["y"], dtype=np.float32)
        np.testing.assert_allclose(got, _exact("Sigmoid", x), rtol=rtol, atol=1e-3)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_op_matches_onnxruntime_without_libm(tmp_path: Path, approximate: str) -> None:
    """ONNX's Gelu (opset 20): TVM's legalization called erff (or tanhf) per element."""
    import onnxruntime as ort

    x = np.concatenate([np.linspace(-12.0, 12.0, 4001, dtype=np.float32), np.float32([np.nan, np.inf, 0.0, -0.0])])
    model = onnx.parser.parse_model(f"""<ir_version: 10, opset_import: ["" : 20]>
    g (float[{x.size}] x) => (float[{x.size}] y) {{ y = Gelu <approximate = "{approximate}"> (x) }}""")
    path = tmp_path / "gelu.onnx"
    onnx.save(model, path)
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    listing = subprocess.run(["objdump", "-d", str(tmp_path / "out" / "model.so")], capture_output=True, text=True,
                             check=True).stdout
    assert not re.search(r"\bcall\s.*<(erff|tanhf|expf)@plt>", listing)


def _elementwise(function, x: np.ndarray) -> np.ndarray:
    """``function`` (a TIR scalar expression builder) over ``x``, compiled for the host CPU."""
    import tvm
    from tvm import te

    from amptool import _tvm

    placeholder = te.placeholder((x.size,), "float32", name="x")
    out = te.compute((x.size,), lambda i: function(placeholder[i]), name="y")
    lib = tvm.compile(te.create_prim_func([placeholder, out]), target=_tvm.make_target({"kind": "llvm"}))
    result = tvm.runtime.tensor(np.zeros(x.size, np.float32))
    lib(tvm.runtime.tensor(x), result)
    return result.numpy()


def test_the_softmax_exp_equals_exp_down_to_the_normal_range_and_is_zero_below() -> None:
    """``exp_nonpositive_f32`` (attention's exp of shifted scores): ``exp_f32``'s values bit for bit
    from ``LOWEST_NORMAL`` to 0, exactly 0 below it and for a masked score (-inf), NaN kept."""
    from amptool.compiler.cpu_exp import LOWEST_NORMAL, exp_f32, exp_nonpositive_f32

    low = np.float32(LOWEST_NORMAL)
    x = np.concatenate([np.linspace(-110.0, 0.0, 50_001, dtype=np.float32),
                        np.float32([-np.inf, np.nan, -0.0, low, np.nextafter(low, np.float32(0)),
                                    np.nextafter(low, np.float32(-1))])])
    got, full = _elementwise(exp_nonpositive_f32, x), _elementwise(exp_f32, x)
    normal = x >= low
    np.testing.assert_array_equal(got[normal], full[normal])
    assert (got[x < low] == 0).all() and np.isnan(got[np.isnan(x)]).all()
    assert got[x == -np.inf][0] == 0
