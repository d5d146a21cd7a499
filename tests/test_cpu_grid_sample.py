"""GridSample's CPU kernel (amptool.compiler.cpu_grid_sample) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import amptool
from tests.conftest import scheduled_kernels
from tests.onnx_checks import info


def _model(mode: str, padding: str, align: int, opset: int = 16) -> onnx.ModelProto:
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    graph = helper.make_graph([node], "warp", [info("x", [2, 8, 9, 13]), info("g", [2, 7, 11, 2])],
                              [info("y", [2, 8, 7, 11])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    grid = rng.uniform(-1.3, 1.3, (2, 7, 11, 2)).astype(np.float32)  # some taps outside the map
    grid[0, 0, :4] = [[-1, -1], [1, 1], [-1, 1], [0, 0]]  # the corners and the centre exactly
    return {"x": rng.standard_normal((2, 8, 9, 13)).astype(np.float32), "g": grid}


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_matches_onnxruntime(tmp_path, mode, padding, align):
    """Every mode × padding × align_corners gives onnxruntime's values: bilinear with zeros or
    border padding through amptool's two-step kernel, the rest through TVM's."""
    model = _model(mode, padding, align)
    path = tmp_path / "warp.onnx"
    onnx.save(model, str(path))
    feeds = _feeds(3)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bilinear_grid_sample_computes_its_taps_once_per_pixel(tmp_path):
    """The bilinear kernel's weights and indices are a step of their own over the output pixels
    (one per pixel, not per channel: TOPI's kernel redid them for every channel, 5× onnxruntime's
    time on 64 channels); a float16 build computes the taps in float32 and stays within float16
    rounding of onnxruntime."""
    path = tmp_path / "warp.onnx"
    onnx.save(_model("bilinear", "zeros", 0), str(path))
    kernels = scheduled_kernels(str(path), "float32")
    assert any('T.sblock("grid_sample_weights")' in k for k in kernels), kernels
    sample = next(k for k in kernels if 'T.sblock("grid_sample")' in k)
    assert "T.floor" not in sample, sample
    feeds = _feeds(4)
    want = ort.InferenceSession(str(path)).run(None, feeds)[0]
    amptool.convert(path, dtype="float16", output=tmp_path / "out16")
    got = amptool.load(tmp_path / "out16").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * float(np.abs(want).max()))
