"""1-D convs as 2-D ones of height 1 (``amptool.compiler.cpu_conv1d``): onnxruntime's values for
strides, dilations, asymmetric pads and groups, in float32 and bfloat16, and the conv kernels the
2-D path gives (TVM's conv1d loop nest took 139 ms for a 3-layer wav2vec2-style extractor that
now takes ~7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from tests.conftest import scheduled_kernels
from tests.onnx_checks import assert_close_to_onnxruntime, save_node_model

CASES = {
    # name: (in channels, out channels, steps, kernel, stride, pads, dilation, group)
    "kernel 10 stride 5, one input channel (a waveform's first layer)": (1, 16, 160, 10, 5, [0, 0], 1, 1),
    "kernel 3 stride 2": (16, 16, 41, 3, 2, [0, 0], 1, 1),
    "same padding": (8, 24, 30, 5, 1, [2, 2], 1, 1),
    "asymmetric pads, dilation 2": (8, 8, 30, 3, 1, [3, 1], 2, 1),
    "depthwise kernel 31 (Conformer)": (16, 16, 50, 31, 1, [15, 15], 1, 16),
    "groups 4": (16, 8, 30, 3, 1, [1, 1], 1, 4),
}


def _model(tmp_path: Path, case: str) -> tuple[str, np.ndarray]:
    cin, cout, steps, k, stride, pads, dilation, group = CASES[case]
    rng = np.random.default_rng(5)
    weight = (rng.standard_normal([cout, cin // group, k]) * 0.3).astype(np.float32)
    bias = rng.standard_normal([cout]).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k], strides=[stride], pads=pads,
                            dilations=[dilation], group=group)
    x = rng.standard_normal([1, cin, steps]).astype(np.float32)
    return save_node_model(tmp_path / "model.onnx", node, {"x": x}, {"w": weight, "b": bias}), x


@pytest.mark.parametrize("case", CASES)
def test_matches_onnxruntime(tmp_path: Path, case: str) -> None:
    path, x = _model(tmp_path, case)
    assert_close_to_onnxruntime(path, {"x": x})


def test_bfloat16_close_to_onnxruntime(tmp_path: Path) -> None:
    path, x = _model(tmp_path, "kernel 3 stride 2")
    assert_close_to_onnxruntime(path, {"x": x}, "bfloat16")


@pytest.mark.parametrize("case", ["kernel 10 stride 5, one input channel (a waveform's first layer)", "same padding"])
def test_takes_the_2d_conv_kernels(tmp_path: Path, case: str) -> None:
    path, _ = _model(tmp_path, case)
    scripts = "\n".join(scheduled_kernels(path, "float32"))
    assert "conv1d_ncw" not in scripts  # TVM's own conv1d block
    assert "amp_conv2d" in scripts
