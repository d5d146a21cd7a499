"""The depthwise/grouped conv2d kernel (``amp_depthwise``) against numpy and onnxruntime.

Shapes with remainders (odd widths, prime heights, 7x7 maps), strides 1 and 2, padding 1 and 2,
asymmetric pads, 5x5 kernels, dilation, channel multipliers and grouped convs; bias + ReLU6
fused as MobileNet's blocks are; bfloat16 data accumulated in float32. A schedule rule that
raises is skipped silently (the kernel still runs, slower), so the rules are also applied
directly here and must not decline.
"""

from __future__ import annotations

import numpy as np
import pytest

from amptool import _tvm, compiler
from amptool.compiler.targets import host_llvm_spec

TARGET = host_llvm_spec()

# (x shape, channel multiplier or (groups, in per group), kernel, stride, pads (t, l, b, r), dilation)
CASES = [
    ((1, 16, 7, 7), 1, 3, 1, (1, 1, 1, 1), 1),
    ((1, 24, 13, 17), 1, 3, 1, (1, 1, 1, 1), 1),     # odd width, prime height
    ((1, 24, 27, 27), 1, 3, 2, (1, 1, 1, 1), 1),     # stride 2, odd width
    ((2, 8, 14, 15), 1, 5, 1, (2, 2, 2, 2), 1),      # 5x5, padding 2, batch 2
    ((1, 8, 15, 15), 1, 5, 2, (2, 2, 2, 2), 1),      # EfficientNet's strided 5x5
    ((1, 8, 16, 16), 1, 3, 2, (0, 0, 1, 1), 1),      # TF SAME: end-only pads
    ((1, 8, 12, 11), 1, 3, 1, (0, 0, 0, 0), 1),      # no padding
    ((1, 8, 12, 12), 1, 3, 1, (2, 2, 2, 2), 2),      # dilation 2
    ((1, 8, 10, 9), 2, 3, 1, (1, 1, 1, 1), 1),       # channel multiplier 2
    ((1, 12, 9, 31), (3, 4), 3, 1, (1, 1, 1, 1), 1),  # grouped: 3 groups of 4 inputs, 6 outputs each
    ((1, 4, 6, 6), 1, 1, 1, (0, 0, 0, 0), 1),        # 1x1 depthwise (a per-channel scale)
    # planes large enough to be padded one by one, right before their convolution
    ((1, 8, 31, 33), 1, 3, 1, (1, 1, 1, 1), 1),
    ((1, 8, 45, 47), 1, 3, 2, (1, 1, 1, 1), 1),
    ((1, 4, 40, 40), 1, 5, 2, (2, 2, 2, 2), 1),
    ((1, 4, 29, 30), 1, 3, 2, (0, 0, 1, 1), 1),
]


def _weights(x_shape, grouping, kernel):
    channels = x_shape[1]
    if isinstance(grouping, tuple):
        groups, per_group = grouping
        return groups, (groups * 6, per_group, kernel, kernel)
    return channels, (channels * grouping, 1, kernel, kernel)


def _reference(x, w, bias, groups, stride, pads, dilation):
    """float64 grouped conv + bias + ReLU6."""
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, wd = xp.shape
    oc, per_group, kh, kw = w.shape
    out_h = (h - (kh - 1) * dilation - 1) // stride + 1
    out_w = (wd - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, oc, out_h, out_w))
    outs_per_group = oc // groups
    for o in range(oc):
        first = o // outs_per_group * per_group
        for r in range(per_group):
            for i in range(kh):
                for j in range(kw):
                    rows = xp[:, first + r, i * dilation:i * dilation + stride * out_h:stride]
                    out[:, o] += rows[:, :, j * dilation:j * dilation + stride * out_w:stride] * w[o, r, i, j]
    return np.clip(out + bias.reshape(1, -1, 1, 1), 0.0, 6.0)


def _build(x_shape, dtype, w, bias, groups, stride, pads, dilation, out_dtype="float32"):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w.astype(dtype)), strides=stride, padding=list(pads),
                                           dilation=dilation, groups=groups, out_dtype=out_dtype))
            y = bb.emit(relax.op.add(y, relax.const(bias.reshape(1, -1, 1, 1).astype(out_dtype))))
            out = bb.emit_output(bb.emit(relax.op.clip(y, 0.0, 6.0)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(compiler.compile_module(mod, TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize(("x_shape", "grouping", "kernel", "stride", "pads", "dilation"), CASES,
                         ids=[f"{c[0]}-g{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}" for c in CASES])
def test_grouped_conv_matches_numpy(x_shape, grouping, kernel, stride, pads, dilation):
    rng = np.random.default_rng(0)
    groups, w_shape = _weights(x_shape, grouping, kernel)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    bias = rng.standard_normal(w_shape[0]).astype(np.float32)
    got = _run(_build(x_shape, "float32", w, bias, groups, stride, pads, dilation), x)
    want = _reference(x, w, bias, groups, stride, pads, dilation)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("x_shape", "stride"), [((1, 16, 14, 14), 2), ((1, 8, 40, 39), 2), ((1, 8, 33, 33), 1)])
def test_bfloat16_data_accumulates_in_float32(x_shape, stride):
    """bfloat16 data and weights, float32 output: products and sums in float32 (exact inputs);
    small planes padded in one pass, large ones plane by plane (widened before the phase split)."""
    import ml_dtypes

    rng = np.random.default_rng(1)
    channels = x_shape[1]
    x = rng.standard_normal(x_shape).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((channels, 1, 3, 3)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(channels).astype(np.float32)
    got = _run(_build(x_shape, "bfloat16", w.astype(np.float32), bias, channels, stride, (1, 1, 1, 1), 1), x)
    want = _reference(x.astype(np.float32), w.astype(np.float32), bias, channels, stride, (1, 1, 1, 1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float16_output_is_rounded_once():
    """A float16 out_dtype: float32 sums rounded once to float16 (TOPI would sum in float16)."""
    rng = np.random.default_rng(3)
    x_shape = (1, 8, 30, 30)
    x = rng.standard_normal(x_shape).astype(np.float16)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float16)
    bias = rng.standard_normal(8).astype(np.float16)
    got = _run(_build(x_shape, "float16", w, bias, 8, 1, (1, 1, 1, 1), 1, out_dtype="float16"), x)
    assert got.dtype == np.float16 and got.shape == x_shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    sums = sum(xp[:, :, i:i + 30, j:j + 30] * w[:, 0, i, j].reshape(1, -1, 1, 1) for i in range(3) for j in range(3))
    want = np.clip(sums.astype(np.float16) + bias.reshape(1, -1, 1, 1), 0, 6)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def _scheduled(mod, rule, layout="NCHW"):
    """Legalize and fuse ``mod`` as the CPU pipeline does (NCHW: without its layout stage), then
    apply ``rule`` to its one kernel."""
    import tvm
    from tvm import s_tir

    from amptool.compiler import cpu, cpu_schedules

    target = _tvm.make_target(TARGET)
    with target:
        for name, passes in cpu.stage_passes(target):
            if name == "schedule":
                break
            if name != "layout" or layout == "NHWC":
                mod = tvm.transform.Sequential(passes)(mod)
        kernels = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        if layout == "NHWC":  # the input and output are transposed by kernels of their own
            kernels = [f for f in kernels if "_nhwc" in f.script()]
        assert len(kernels) == 1
        return rule(s_tir.Schedule(kernels[0]), cpu_schedules.Tiling.for_target(target))


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_rule_schedules_the_fused_kernel(stride):
    from amptool.compiler import cpu_schedules

    w = np.ones((32, 1, 3, 3), np.float32)
    mod = _build((1, 32, 28, 28), "float32", w, np.zeros(32, np.float32), 32, stride, (1, 1, 1, 1), 1)
    sch = _scheduled(mod, cpu_schedules.depthwise_conv2d)
    assert sch is not None
    script = sch.mod.script()
    assert "T.parallel" in script and "T.vectorized" in script and "amp_depthwise_src" in script


@pytest.mark.parametrize("stride", [1, 2])
def test_nhwc_depthwise_rule_schedules_the_fused_kernel(stride):
    from amptool.compiler import cpu_schedules_nhwc

    w = np.ones((32, 1, 3, 3), np.float32)
    mod = _build((1, 32, 28, 28), "float32", w, np.zeros(32, np.float32), 32, stride, (1, 1, 1, 1), 1)
    sch = _scheduled(mod, cpu_schedules_nhwc.nhwc_depthwise, layout="NHWC")
    assert sch is not None
    script = sch.mod.script()
    assert "T.parallel" in script and "T.vectorized" in script and "amp_depthwise_nhwc" in script


def test_packed_conv_rule_schedules_conv_with_bias():
    """The packed conv rule itself must not raise on a conv + bias + clip kernel (it did: every
    conv and matmul silently fell back to a generic schedule, ~50x slower)."""
    from amptool.compiler import cpu_schedules

    w = np.ones((32, 16, 1, 1), np.float32)
    mod = _build((1, 16, 14, 14), "float32", w, np.zeros(32, np.float32), 1, 1, (0, 0, 0, 0), 1)
    assert _scheduled(mod, cpu_schedules.packed_conv2d) is not None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_onnx_depthwise_block_matches_onnxruntime(tmp_path, dtype):
    """A MobileNetV2 block (depthwise 3x3 stride 2 + Clip 0..6) through amptool.convert."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import amptool

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 24, 15, 15)).astype(np.float32)
    w = (rng.standard_normal((24, 1, 3, 3)) * 0.5).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=24, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                               numpy_helper.from_array(np.array(6.0, np.float32), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "dw.onnx"
    onnx.save(model, str(path))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = amptool.convert(str(path), dtype=dtype).run({"x": x})["y"]
    tolerance = 1e-5 if dtype == "float32" else 6e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("size", "lanes", "rows", "columns"), [
    (112, 16, 8, 16), (56, 16, 8, 14), (7, 16, 7, 7), (13, 16, 8, 13), (131, 16, 1, 131), (14, 8, 2, 7),
])
def test_tile_plan(size, lanes, rows, columns):
    """Whole vectors of columns where a divisor allows, whole rows for wide primes (never scalar
    columns), at most half the accumulators; a prime height gets a partial last tile."""
    from amptool.compiler.cpu_depthwise import tile_plan
    from amptool.compiler.cpu_kernels import accumulator_budget

    assert tile_plan(size, size, lanes, accumulator_budget(lanes)) == (rows, columns)
