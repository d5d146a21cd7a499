"""A kernel whose schedule TVM refuses at codegen is rebuilt with a plain schedule, with a warning,
instead of failing the convert (``amptool.compiler.schedule_fallback``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from amptool.app.convert import ConvertConfig, build_model
from amptool.compiler import cpu_row_reduction


def _softmax_model(tmp_path: Path) -> str:
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8] x, float[4, 64] z) => (float[1, 8] y, float[4, 64] w) {
        y = Softmax <axis = -1> (x)
        w = Softmax <axis = -1> (z)
    }""")
    path = tmp_path / "softmax.onnx"
    onnx.save(model, path)
    return str(path)


def _vectorize_eight_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: the row-reduction rule puts a softmax's whole 8-wide body under a vectorized loop."""
    parallel = cpu_row_reduction._parallel

    def vectorize_the_8_columns(sch: Any, loops: list[Any], tiling: Any) -> Any:
        if len(loops) == 1 and sch.get(loops[0]).extent == 8:
            sch.vectorize(loops[0])
            return loops[0]
        return parallel(sch, loops, tiling)

    monkeypatch.setattr(cpu_row_reduction, "_rows_shared", lambda *_: True)
    monkeypatch.setattr(cpu_row_reduction, "_parallel", vectorize_the_8_columns)


def test_a_schedule_tvm_refuses_falls_back_per_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A row-reduction schedule that puts a 1x8 softmax's whole body under a vectorized loop (a bug
    the rule once had: its shared-rows check came from it) is accepted by the schedule and refused by
    TVM's VectorizeLoop at codegen; the 4x64 softmax's schedule is fine and stays."""
    _vectorize_eight_columns(monkeypatch)
    path = _softmax_model(tmp_path)
    x = np.random.default_rng(0).normal(size=(1, 8)).astype(np.float32)
    z = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="amptool.compiler.schedule_fallback"):
        result = build_model(ConvertConfig(model=path, dtype="float32"))
    warnings = [r.getMessage() for r in caplog.records if "does not compile" in r.getMessage()]
    assert len(warnings) == 1 and "built with a plain schedule" in warnings[0]
    got = result.compiled().run({"x": x, "z": z})
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x, "z": z})
    np.testing.assert_allclose(got["y"], want[0], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(got["w"], want[1], rtol=2e-6, atol=1e-7)


def test_without_the_fault_nothing_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="amptool.compiler.schedule_fallback"):
        build_model(ConvertConfig(model=_softmax_model(tmp_path), dtype="float32"))
    assert not [r for r in caplog.records if "does not compile" in r.getMessage()]


def test_a_kernel_writing_in_place_falls_back_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """softmax(x) + softmax(z): the add fuses into one softmax's kernel, which writes over the other's
    dead output (``in_place``) and has no unscheduled twin of its name; its plain schedule is made to
    write in place too, so the VM's call still matches. (The 4x64 softmax compiles: a fault in every
    kernel is the compiler's, not a schedule's.)"""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8] x, float[1, 8] z, float[4, 64] q) => (float[1, 8] y, float[4, 64] w) {
        r = Softmax <axis = -1> (z)
        s = Softmax <axis = -1> (x)
        y = Add(s, r)
        w = Softmax <axis = -1> (q)
    }""")
    path = str(tmp_path / "softmax_add.onnx")
    onnx.save(model, path)
    _vectorize_eight_columns(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="amptool.compiler.schedule_fallback"):
        result = build_model(ConvertConfig(model=path, dtype="float32"))
    warnings = [r.getMessage() for r in caplog.records if "does not compile" in r.getMessage()]
    assert any("_inplace" in w for w in warnings), warnings
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(1, 8)), "z": rng.normal(size=(1, 8)), "q": rng.normal(size=(4, 64))}
    feeds = {name: value.astype(np.float32) for name, value in feeds.items()}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y", "w"], feeds)
    got = result.compiled().run(feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(got["w"], want[1], rtol=2e-6, atol=1e-7)
