"""``Pow`` by a constant multiple of ¼ on the CPU (``amptool.compiler.cpu_power``): square roots and
products instead of libm's ``powf`` per element — C's ``pow`` on every special value, within an
ulp or two elsewhere, and no ``pow`` call left in the library."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

import amptool
from amptool.compiler.cpu_power import quarter_steps

SPECIAL = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -2.0, -0.5, 1e-30, 1e30, 3.7, 0.5, 1.0, 2.0, 1e-3, 65504.0],
                   dtype=np.float32)


def _model(tmp_path: Path, exponent: float, n: int) -> Path:
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[{n}] x) => (float[{n}] y) <float e = {{{exponent!r}}}> {{ y = Pow (x, e) }}""")
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "pow.onnx"
    onnx.save(model, path)
    return path


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([SPECIAL, rng.uniform(0.0, 10.0, 49).astype(np.float32),
                           rng.uniform(-3.0, 3.0, 32).astype(np.float32)])


@pytest.mark.parametrize("exponent", [3.0, 0.75, 0.5, 0.25, 1.5, 2.5, 4.75, -0.5, -0.75, -3.0, -1.25])
def test_matches_onnxruntime_on_special_values_and_within_ulps(tmp_path: Path, exponent: float) -> None:
    """onnxruntime's Pow is C's pow (numpy's is not: it takes √ for ½, NaN at -inf)."""
    x = _inputs()
    path = _model(tmp_path, exponent, x.size)
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    infinite = np.isinf(want)
    np.testing.assert_array_equal(got[infinite], want[infinite])
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=4e-7, atol=0)
    c_pow = np.array([math.pow(v, exponent) if v > 0 else np.nan for v in x.astype(np.float64)])
    positive = (x > 0) & finite
    np.testing.assert_allclose(got[positive], c_pow[positive].astype(np.float32), rtol=4e-7, atol=0)


def test_no_pow_call_left_and_other_exponents_still_use_it(tmp_path: Path) -> None:
    for exponent, calls_pow in ((3.0, False), (0.75, False), (0.3, True)):
        path = _model(tmp_path, exponent, 4096)
        out = tmp_path / f"out{exponent}"
        amptool.convert(path, dtype="float32", output=out)
        listing = subprocess.run(["objdump", "-d", str(out / "model.so")], capture_output=True, text=True,
                                 check=True).stdout
        assert bool(re.search(r"\bcall\s.*<powf?@plt>", listing)) == calls_pow, exponent


@pytest.mark.parametrize(("exponent", "steps"), [(0.75, 3), (3.0, 12), (-0.5, -2), (4.75, 19), (1.0, None),
                                                 (2.0, None), (0.0, None), (0.3, None), (5.0, None),
                                                 (float("nan"), None), (float("inf"), None)])
def test_which_exponents_are_taken(exponent: float, steps: int | None) -> None:
    assert quarter_steps(exponent) == steps


def test_bfloat16_build_keeps_the_roots(tmp_path: Path) -> None:
    x = np.abs(_inputs()[15:]) + np.float32(0.1)
    path = _model(tmp_path, 0.75, x.size)
    amptool.convert(path, dtype="bfloat16", output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, np.power(x, np.float32(0.75)), rtol=1e-2)
