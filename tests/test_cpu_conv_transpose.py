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


def _decoder_model(tmp_path: Path, second_reader: bool = False, spatial_offset: bool = False) -> tuple[str, np.ndarray]:
    """ConvTranspose 3×3 stride 2 (bias) → ·scale → +shift (a folded BatchNorm, per channel) → Sigmoid
    → y. ``second_reader``: the shifted value is also added to y (read twice: the chain stops there).
    ``spatial_offset``: the shift varies over the pixels (not a per-channel constant)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(5)
    cin, cout, spatial = 8, 16, [6, 7]
    shift_shape = [1, cout, *(2 * s for s in spatial)] if spatial_offset else [cout, 1, 1]
    inits = {"w": rng.standard_normal([cin, cout, 3, 3]).astype(np.float32),
             "b": rng.standard_normal([cout]).astype(np.float32),
             "scale": rng.uniform(0.5, 1.5, [cout, 1, 1]).astype(np.float32),
             "shift": rng.standard_normal(shift_shape).astype(np.float32)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1],
                              output_padding=[1, 1], kernel_shape=[3, 3]),
             helper.make_node("Mul", ["t", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "shift"], ["shifted"]),
             helper.make_node("Sigmoid", ["shifted"], ["s" if second_reader else "y"])]
    if second_reader:
        nodes.append(helper.make_node("Add", ["s", "shifted"], ["y"]))
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, *spatial])
    graph = helper.make_graph(nodes, "decoder", [x_info],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / "decoder.onnx")
    onnx.save(model, path)
    return path, rng.standard_normal([1, cin, *spatial]).astype(np.float32)


def _ops_after_crop(path: str, dtype: str) -> list[str]:
    """The ops bound after the first strided_slice (the crop) once the transposed conv is split."""
    from amptool import _tvm
    from amptool.app.convert import ConvertConfig, rewrite_model
    from amptool.compiler.cpu_conv_transpose import split_conv_transpose

    mod = split_conv_transpose(rewrite_model(ConvertConfig(model=path, dtype=dtype)).passes.mod)
    names = [_tvm.op_name(call) for call in _tvm.bound_calls(mod["main"])]
    return names[names.index("relax.strided_slice") + 1:]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_ops_after_a_transposed_conv_run_before_its_interleave(tmp_path: Path, dtype: str) -> None:
    """Bias, a folded BatchNorm's multiply and add, the activation and a low dtype's cast run on the
    phase convs' outputs, where they join the conv's epilogue; nothing is left after the crop (but
    the model output's cast back to float32), and the values are onnxruntime's."""
    path, x = _decoder_model(tmp_path)
    assert_close_to_onnxruntime(path, {"x": x}, dtype)
    assert [op for op in _ops_after_crop(path, dtype) if op != "relax.astype"] == []


@pytest.mark.parametrize(("second_reader", "spatial_offset", "left"), [
    (True, False, ["relax.sigmoid", "relax.add"]),  # the shifted value is read twice: the chain stops at it
    (False, True, ["relax.add", "relax.sigmoid"]),  # a shift over pixels is no per-channel constant
])
def test_a_chain_stops_where_moving_it_would_not_be_exact(tmp_path: Path, second_reader: bool, spatial_offset: bool,
                                                          left: list[str]) -> None:
    path, x = _decoder_model(tmp_path, second_reader, spatial_offset)
    assert_close_to_onnxruntime(path, {"x": x})
    assert _ops_after_crop(path, "float32") == left
