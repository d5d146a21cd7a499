"""The CPU pipeline's own kernels against numpy over shapes that stress tiling.

amptool legalizes matmul/conv2d itself and schedules every kernel (amptool.compiler); a tiling
bug there is a silent miscompile that no fp16 statistic can explain. This sweep covers batch
and row counts that are and are not multiples of the register tiles, widths with remainders
(1000 = 62·16 + 8) and shapes taken from real models (GPT-2's tied LM head: 2×24 rows × 1000).
"""

from __future__ import annotations

import numpy as np
import pytest

from amptool import compiler
from amptool.compiler.targets import host_llvm_spec

MATMULS = [
    ((2, 24, 128), (128, 1000), True),   # GPT-2 LM head, left-padded batch of 2
    ((1, 24, 128), (128, 1000), True),
    ((2, 16, 128), (128, 1000), True),
    ((3, 7, 33), (33, 17), True),
    ((48, 128), (128, 384), True),
    ((5, 64), (64, 10), True),
    ((2, 4, 24, 32), (2, 4, 32, 24), False),  # attention scores
    ((2, 4, 24, 24), (2, 4, 24, 32), False),
    ((2, 3, 5, 9), (9, 11), True),
    # Probabilities · V of ONNX's attention_4d_causal_nonpad_batch_prefill: an AVX2 tile of three
    # 2-row items straddled the outer batch axis (16 of 96 values wrong); items of [4, 6] in tiles
    # of 8 (an AVX-512 row cap) would straddle it too.
    ((3, 2, 2, 6), (3, 2, 6, 8), False),
    ((4, 6, 2, 6), (4, 6, 6, 16), False),
]


@pytest.mark.parametrize(("extents", "cap", "items"), [
    ([3, 2], 3, 2),  # 3 items would cover 1.5 rows of the outer axis
    ([4, 6], 8, 6),  # 8 neither divides nor is divided by 6
    ([2, 3], 6, 6),  # everything: a box
    ([6, 2], 5, 4),  # two whole inner runs × a divisor (2) of 6
    ([1, 12], 8, 6),
    ([7], 4, 1),
])
def test_a_matmul_row_tile_covers_a_box_of_batch_items(extents, cap, items):
    from amptool.compiler.cpu_schedules import _box_items

    assert _box_items(extents, cap) == items


def _build_and_run(make, args, params):
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(make()))
        bb.emit_func_output(out)
    executable = compiler.compile_module(bb.get(), host_llvm_spec())
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@pytest.mark.parametrize(("a_shape", "b_shape", "b_constant"), MATMULS, ids=[str(m[:2]) for m in MATMULS])
def test_matmul_matches_numpy(a_shape, b_shape, b_constant):
    from tvm import relax

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    x = relax.Var("x", relax.TensorType(a_shape, "float32"))
    if b_constant:
        params, args = [x], [a]
        weight = relax.const(b)
    else:
        weight = relax.Var("w", relax.TensorType(b_shape, "float32"))
        params, args = [x, weight], [a, b]
    got = _build_and_run(lambda: relax.op.matmul(x, weight), args, params)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-4)


CONVS = [
    ((1, 3, 17, 23), (8, 3, 3, 3), 1, 1, 1),
    ((2, 16, 14, 14), (32, 16, 1, 1), 1, 0, 1),
    ((1, 24, 27, 27), (24, 1, 3, 3), 2, 1, 24),   # depthwise, stride 2, odd width
    ((1, 12, 9, 31), (18, 4, 3, 3), 1, 1, 3),     # grouped
    ((1, 64, 7, 7), (1000, 64, 1, 1), 1, 0, 1),   # 1000-channel head
]


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "pad", "groups"), CONVS, ids=[str(c[:2]) for c in CONVS])
def test_conv2d_matches_onnxruntime(x_shape, w_shape, stride, pad, groups):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from tvm import relax

    rng = np.random.default_rng(1)
    x_np = rng.standard_normal(x_shape).astype(np.float32)
    w_np = (rng.standard_normal(w_shape) * 0.2).astype(np.float32)
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    got = _build_and_run(
        lambda: relax.op.nn.conv2d(x, relax.const(w_np), strides=stride, padding=pad, groups=groups), [x_np], [x]
    )
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4, group=groups)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w_np, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x_np})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pads", [(0, 1), (1, 0), (1, 1), (0, 3)])
def test_pad_after_conv_is_not_fused_into_the_conv_tiles(pads):
    """A pad consuming a conv writes positions the conv's tiles never visit: fused into them as an
    epilogue, the end-only pads came back as garbage/NaN (TF-style SAME pads are end-only)."""
    from tvm import relax

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    xv = relax.Var("x", relax.TensorType((1, 4, 16, 16), "float32"))
    wv = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    width = [0, 0, 0, 0, pads[0], pads[1], pads[0], pads[1]]

    def make():
        conv = relax.op.nn.conv2d(xv, wv, padding=1)
        return relax.op.nn.pad(relax.op.nn.relu(conv), width)

    got = _build_and_run(make, [x, w], [xv, wv])
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((1, 8, 16, 16))
    for i in range(3):
        for j in range(3):
            conv += np.einsum("nchw,oc->nohw", padded[:, :, i:i + 16, j:j + 16], w[:, :, i, j])
    want = np.pad(np.maximum(conv, 0), ((0, 0), (0, 0), pads, pads))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("divisor", "scaled"), [
    (np.float32(np.sqrt(2.0)), True),            # GELU's x / √2
    (np.full((1, 1), 8.0, np.float32), True),    # attention's / √d, as a [1, 1] constant
    (np.float32(0.0), True),                     # ±inf and NaN as onnxruntime's (TVM's division failed to build)
    (np.float32(1e-39), False),                  # a subnormal: its reciprocal overflows
    (np.array([2.0, 4.0, 8.0], np.float32), False),  # several values
])
def test_division_by_one_constant_is_a_product_with_its_reciprocal(tmp_path, divisor, scaled):
    """``x / c`` for one constant value ``c`` is ``x · (1/c)`` (no vector division), within one
    float32 rounding of onnxruntime's quotient; other divisions stay divisions."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from amptool.app.convert import ConvertConfig, build_model
    from tests.conftest import scheduled_kernels

    graph = helper.make_graph([helper.make_node("Div", ["x", "c"], ["y"])], "div",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(divisor, np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "div.onnx")
    onnx.save(model, path)
    text = "\n".join(scheduled_kernels(path, "float32"))
    assert ('"scaled"' in text) == scaled and (" / " in text or "T.Div" in text) != scaled, text
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    x[0, 0] = 0.0
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2 ** -22, atol=0)


def test_float64_division_by_a_constant_keeps_float64_precision(tmp_path):
    """A float64 ``x / c`` as a product is computed in float64: within two float64 roundings of
    the quotient, not float32's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from amptool.app.convert import ConvertConfig, build_model

    graph = helper.make_graph([helper.make_node("Div", ["x", "c"], ["y"])], "div",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [64])],
                              [numpy_helper.from_array(np.float64(3.0), "c")])
    path = str(tmp_path / "div64.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(1).standard_normal(64)
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, x / 3.0, rtol=2 ** -51, atol=0)
