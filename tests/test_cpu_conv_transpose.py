"""Transposed convs as phase convs (``amptool.compiler.cpu_conv_transpose``): onnxruntime's values
for strides, kernels, asymmetric pads and output padding in 1-D and 2-D, the zero-dilated input
gone from the kernels, and the calls it must leave to TVM (groups, dilation) still right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from tests.conftest import scheduled_kernels
from tests.onnx_checks import assert_close_to_onnxruntime, save_node_model

CASES = {
    # name: (in channels, out channels, input spatial, kernel, stride, pads, output padding, group, dilation)
    "3x3 stride 2, output padding (a decoder's upsampling)": (8, 16, [7, 8], 3, 2, [1, 1, 1, 1], [1, 1], 1, 1),
    "4x4 stride 2 (GAN generator)": (8, 16, [7, 8], 4, 2, [1, 1, 1, 1], [0, 0], 1, 1),
    "2x2 stride 2 (U-Net)": (8, 16, [5, 6], 2, 2, [0, 0, 0, 0], [0, 0], 1, 1),
    "3x3 stride 1": (8, 16, [5, 6], 3, 1, [1, 1, 1, 1], [0, 0], 1, 1),
    "5x5 stride 3, asymmetric pads": (3, 5, [6, 7], 5, 3, [2, 1, 0, 2], [1, 2], 1, 1),
    "1x1 stride 2, output padding past the input": (4, 4, [4, 5], 1, 2, [0, 0, 0, 0], [1, 1], 1, 1),
    "1-D, 16 taps stride 8 (a vocoder's upsampling)": (8, 16, [20], 16, 8, [4, 4], [0], 1, 1),
    "1-D, 5 taps stride 2 (phases of 3 and 2 taps)": (8, 16, [20], 5, 2, [2, 2], [1], 1, 1),
    "groups 2 (left to TVM)": (8, 8, [5, 6], 3, 2, [1, 1, 1, 1], [1, 1], 2, 1),
    "dilation 2 (left to TVM)": (8, 8, [5, 6], 3, 2, [1, 1, 1, 1], [0, 0], 1, 2),
}


def _model(tmp_path: Path, case: str) -> tuple[str, np.ndarray]:
    cin, cout, spatial, k, stride, pads, output_padding, group, dilation = CASES[case]
    dims = len(spatial)
    rng = np.random.default_rng(3)
    weight = rng.standard_normal([cin, cout // group, *([k] * dims)]).astype(np.float32)
    bias = rng.standard_normal([cout]).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[stride] * dims, pads=pads,
                            output_padding=output_padding, kernel_shape=[k] * dims, group=group,
                            dilations=[dilation] * dims)
    x = rng.standard_normal([1, cin, *spatial]).astype(np.float32)
    return save_node_model(tmp_path / "model.onnx", node, {"x": x}, {"w": weight, "b": bias}), x


@pytest.mark.parametrize("case", CASES)
def test_matches_onnxruntime(tmp_path: Path, case: str) -> None:
    path, x = _model(tmp_path, case)
    assert_close_to_onnxruntime(path, {"x": x})


@pytest.mark.parametrize("case", [c for c in CASES if "left to TVM" not in c])
def test_no_zero_dilated_input_is_built(tmp_path: Path, case: str) -> None:
    """TVM's own legalization builds ``data_dilate`` (zeros between the pixels) and flips the
    kernel on every call (``kernel_transform``); the phase conv needs neither."""
    path, _ = _model(tmp_path, case)
    scripts = "\n".join(scheduled_kernels(path, "float32"))
    assert "data_dilate" not in scripts and "kernel_transform" not in scripts
    assert "conv" in scripts


@pytest.mark.parametrize("case", ["4x4 stride 2 (GAN generator)",
                                  "3x3 stride 2, output padding (a decoder's upsampling)"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_phase_weights(tmp_path: Path, dtype: str, case: str) -> None:
    """The weights are rearranged in the dtype they were converted to (bf16 via ml_dtypes)."""
    path, x = _model(tmp_path, case)
    assert_close_to_onnxruntime(path, {"x": x}, dtype)


@pytest.mark.parametrize(("case", "taps"), [
    ("3x3 stride 2, output padding (a decoder's upsampling)", [(2, 2), (2, 1), (1, 2), (1, 1)]),
    ("4x4 stride 2 (GAN generator)", [(2, 2)]),
    ("1-D, 5 taps stride 2 (phases of 3 and 2 taps)", [(3,), (2,)]),
    # phases 0, 1, 2 of 5 taps at stride 3 meet 2, 2 and 1 of them: 25 in all, not 36
    ("5x5 stride 3, asymmetric pads", [(a, b) for a in (2, 2, 1) for b in (2, 2, 1)]),
])
def test_each_phase_takes_only_its_real_taps(tmp_path: Path, case: str, taps: list[tuple[int, ...]]) -> None:
    """A kernel the stride does not divide gives the phases different tap counts (3×3 stride 2:
    4, 2, 2 and 1): a conv per phase multiplies by those 9 taps, not 16 zero-filled ones. A kernel
    it divides (4×4 stride 2) stays one conv over all phases."""
    import tvm

    from amptool import _tvm
    from amptool.app.convert import ConvertConfig, rewrite_model
    from amptool.compiler.cpu_conv_transpose import split_conv_transpose

    path, _ = _model(tmp_path, case)
    mod = split_conv_transpose(rewrite_model(ConvertConfig(model=path, dtype="float32")).passes.mod)
    convs = [tvm.ir.Op.get(f"relax.nn.conv{dims}d") for dims in (1, 2)]
    weights: list[tuple[int, ...]] = []
    _tvm.any_call(mod, lambda call: any(_tvm.calls_op(call, c) for c in convs)
                  and weights.append(_tvm.static_shape(call.args[1])))
    assert [tuple(shape[2:]) for shape in weights] == taps
