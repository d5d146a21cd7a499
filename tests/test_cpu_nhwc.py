"""The NHWC CPU path: the layout stage, the NHWC conv/depthwise kernels and widened bfloat16
epilogues, against onnxruntime on small CNN blocks with awkward shapes."""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import amptool
from amptool import _tvm
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import scheduled_kernels, staged_module
from tests.onnx_checks import info, onnxruntime_and_amptool, x_to_y_model

TARGET = host_llvm_spec()


def _cnn_block(seed: int = 0) -> onnx.ModelProto:
    """3 input channels (an odd pair count), odd spatial sizes (tiles with remainders), 24 channels
    (blocks of 8, float32 compute in bfloat16 builds) and 32 (bfloat16 dot products), a depthwise
    conv, Clip, a residual add, pooling and a classifier."""
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [weight("w1", 24, 3, 3, 3), weight("b1", 24), weight("wd", 24, 1, 3, 3), weight("bd", 24),
             weight("w2", 24, 24, 1, 1), weight("b2", 24), weight("w3", 32, 24, 3, 3), weight("b3", 32),
             weight("fc", 32, 10), numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd", "bd"], ["d"], group=24, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["dc"]),
        helper.make_node("Conv", ["dc", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "nhwc_block", [info("x", [1, 3, 29, 31])], [info("y", [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _lowered_kernels(path: str, dtype: str) -> str:
    """The scripts of the scheduled kernels the CPU pipeline makes of ``path``, as one text."""
    return "\n".join(scheduled_kernels(path, dtype))


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-4), ("float16", 2e-2), ("bfloat16", 6e-2)])
def test_cnn_block_matches_onnxruntime(tmp_path, dtype, tolerance):
    model = _cnn_block()
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).standard_normal((1, 3, 29, 31)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize(("dtype", "mcpu"), [("float32", None), ("bfloat16", None), ("bfloat16", "znver4"),
                                             ("bfloat16", "cooperlake")])
def test_cnn_block_runs_the_nhwc_kernels(tmp_path, dtype, mcpu):
    """bfloat16 convs are ``vdpbf16ps`` kernels where the dot product pays (znver4), float32 FMA
    kernels on converted values where it does not (an Intel server core: half the FMA rate)."""
    from amptool.compiler.cpu_amx import has_amx_bf16
    from amptool.compiler.cpu_intrinsics import has_bf16_dot
    from amptool.compiler.cpu_speed import bf16_dot_pays

    path = tmp_path / "block.onnx"
    onnx.save(_cnn_block(), str(path))
    text = "\n".join(scheduled_kernels(str(path), dtype, mcpu))
    assert '"amp_depthwise_nhwc' in text
    spec = {"kind": "llvm", "mcpu": mcpu} if mcpu else TARGET
    dot_pays = bf16_dot_pays(spec["mcpu"], spec.get("mattr", ()))
    if dtype == "bfloat16" and has_amx_bf16(_tvm.make_target(spec)):
        assert "amptool_amx_bf16_32x32" in text  # AMX tiles (cpu_amx) take the convs
    elif dtype == "bfloat16" and has_bf16_dot(_tvm.make_target(spec)) and dot_pays:
        assert '"amp_conv2d_nhwc_bf16' in text and "amptool_dpbf16" in text
        # The 24-channel convs too: zero filters pad them to 32, the epilogue stores the first 24
        # (no float32 block-of-8 kernel left).
        assert "< T.int64(24))" in text and '"amp_conv2d_nhwc_init"' not in text
    else:
        assert '"amp_conv2d_nhwc_init"' in text
    assert '"amp_conv2d_init"' not in text  # no conv left in NCHW


def test_a_layout_conversion_tvm_refuses_keeps_nchw(tmp_path):
    """TVM's ConvertLayout raises on a 3-D ReduceMax ("Invalid SLayout"): the build keeps NCHW."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 4, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("ReduceMax", ["r"], ["y"], axes=[2], keepdims=0)]
    inits.append(numpy_helper.from_array(np.array([1, 16, 64], np.int64), "shape"))
    graph = helper.make_graph(nodes, "g", [info("x", [1, 4, 8, 8])], [info("y", [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("between", [False, True])
def test_convs_in_a_long_block_take_nhwc_from_a_layout_pass_over_their_parts(tmp_path, monkeypatch, between):
    """TVM's ConvertLayout takes time growing with the square of a block's bindings (a speech model's
    two convs before 9,655 bindings of unrolled LSTMs: 19.8 s; sequencer2d_s's convs between unrolled
    2-D LSTMs, 12,274 bindings: 28.4 s). In a long block it runs on the convs' parts alone — in front
    of a long tail, or between two long stretches: the convs still become NHWC, the rest stays, the
    values are onnxruntime's — and the pass saw the parts, not the thousands of bindings around them."""
    from tvm import relax

    from amptool.compiler import cpu_layout

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, "w2"),
             numpy_helper.from_array(np.array([1, 16 * 8 * 8], np.int64), "shape"),
             numpy_helper.from_array(np.array([1, 16, 8, 8], np.int64), "image"),
             numpy_helper.from_array(np.float32(0.999), "decay"),
             numpy_helper.from_array(np.float32(0.5), "damp")]  # before a conv: no 1000x gain of rounding
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["t0"])]
    steps = cpu_layout.LAYOUT_PREFIX_BINDINGS  # a multiply and an add a step: twice the threshold
    for i in range(steps):
        nodes += [helper.make_node("Mul", [f"t{i}", "damp" if between else "decay"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", "t0"], [f"t{i + 1}" if i + 1 < steps or between else "y"])]
    if between:  # a second conv after the stretch, then another stretch
        nodes += [helper.make_node("Reshape", [f"t{steps}", "image"], ["i2"]),
                  helper.make_node("Conv", ["i2", "w2"], ["c2"], pads=[1, 1, 1, 1]),
                  helper.make_node("Reshape", ["c2", "shape"], ["u0"])]
        for i in range(steps):
            nodes += [helper.make_node("Mul", [f"u{i}", "damp"], [f"n{i}"]),
                      helper.make_node("Add", [f"n{i}", "u0"], [f"u{i + 1}" if i + 1 < steps else "y"])]
    graph = helper.make_graph(nodes, "g", [info("x", [1, 3, 8, 8])], [info("y", [1, 1024])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = str(tmp_path / "long.onnx")
    onnx.save(model, path)

    seen: list[int] = []
    convert_layout = relax.transform.ConvertLayout

    def counting(*args: Any, **kwargs: Any) -> Any:
        layout_pass = convert_layout(*args, **kwargs)

        def run(mod: Any) -> Any:
            seen.append(sum(len(block.bindings) for _, func in _tvm.relax_functions(mod) for block in func.body.blocks))
            return layout_pass(mod)

        return run

    monkeypatch.setattr(relax.transform, "ConvertLayout", counting)
    staged = staged_module(path, "float32", "layout").script()
    assert staged.count('data_layout="NHWC"') == (2 if between else 1)
    assert seen and max(seen) < 20, seen
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- widen_epilogues


def _chain(dtype: str, *, reuse: bool = False):
    """x (float32) → cast to ``dtype`` → + bias → relu → [also returned before relu if ``reuse``]."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            low = bb.emit(relax.op.astype(x, dtype))
            biased = bb.emit(relax.op.add(low, relax.const(np.arange(8, dtype=np.float32).astype(dtype))))
            out = bb.emit(relax.op.nn.relu(biased))
            result = bb.emit_output(relax.Tuple([out, biased]) if reuse else out)
        bb.emit_func_output(result)
    return bb.get()


def _ops(mod) -> list[tuple[str, str]]:
    """(op, result dtype) of every call in ``main``, in order."""
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(
        (_tvm.op_name(e), _tvm.tensor_dtype(e))) if isinstance(e, relax.Call) else None)
    return found


def test_bfloat16_chain_is_computed_in_float32_and_cast_once():
    from amptool.compiler.widen_epilogues import widen_epilogues

    widened = widen_epilogues(_chain("bfloat16"))
    assert _ops(widened) == [("relax.add", "float32"), ("relax.nn.relu", "float32"), ("relax.astype", "bfloat16")]


def test_a_value_used_elsewhere_is_still_bound_in_bfloat16():
    from amptool.compiler.widen_epilogues import widen_epilogues

    ops = _ops(widen_epilogues(_chain("bfloat16", reuse=True)))
    assert ops.count(("relax.astype", "bfloat16")) == 2  # the biased value for the tuple, the relu's
    assert ("relax.add", "bfloat16") not in ops


def test_a_float16_chain_keeps_each_rounding():
    """Computed in float32 unrounded, float16 would hide the overflows a float16 device produces:
    the cast still rounds through float16 before the add, and the add's sum is rounded by the last
    cast — after the relu, which commutes with rounding (the same values, two conversions fewer)."""
    from amptool.compiler.widen_epilogues import widen_epilogues

    assert _ops(widen_epilogues(_chain("float16"))) == [
        ("relax.astype", "float16"), ("relax.astype", "float32"), ("relax.add", "float32"),
        ("relax.nn.relu", "float32"), ("relax.astype", "float16")]


@pytest.mark.parametrize("scale", [1.0, 1e5], ids=["plain", "overflowing"])
def test_float16_epilogues_in_float32_give_the_same_bits(tmp_path, monkeypatch, scale):
    """A float16 build with its epilogues widened computes what it computed without, bit for bit —
    overflows to inf too (``overflowing``: accumulators past 65504)."""
    from amptool.compiler import widen_epilogues

    path = tmp_path / "block.onnx"
    onnx.save(_cnn_block(), str(path))
    x = (np.random.default_rng(1).standard_normal((1, 3, 29, 31)) * scale).astype(np.float32)
    amptool.convert(path, dtype="float16", output=tmp_path / "widened")
    monkeypatch.setattr(widen_epilogues, "LOW", frozenset({"bfloat16"}))
    amptool.convert(path, dtype="float16", output=tmp_path / "per_op")
    widened = np.asarray(amptool.load(tmp_path / "widened").run({"x": x})["y"])
    per_op = np.asarray(amptool.load(tmp_path / "per_op").run({"x": x})["y"])
    assert widened.tobytes() == per_op.tobytes()
    assert np.isfinite(widened).all() == (scale == 1.0)


# --------------------------------------------------------------------------- layout propagation

#: Ops after an NHWC conv, each with the attributes that name an axis or a channel: ConvertLayout
#: must carry them into NHWC (or transpose back) without changing what the model computes.
_FOLLOWERS = {
    "resize": [helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="linear")],
    "pad": [helper.make_node("Pad", ["c", "pads"], ["y"])],
    "split": [helper.make_node("Split", ["c", "halves"], ["y", "z"], axis=1)],
    "slice": [helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["y"])],
    "transpose": [helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])],
    "reduce_mean_channels": [helper.make_node("ReduceMean", ["c"], ["y"], axes=[1], keepdims=1)],
    "softmax_channels": [helper.make_node("Softmax", ["c"], ["y"], axis=1)],
    "instance_norm": [helper.make_node("InstanceNormalization", ["c", "gamma", "beta"], ["y"])],
    "concat_channels": [helper.make_node("Concat", ["c", "c"], ["y"], axis=1)],
    "scale_per_channel": [helper.make_node("Mul", ["c", "per_channel"], ["y"])],
    "prelu": [helper.make_node("PRelu", ["c", "per_channel"], ["y"])],
    "depth_to_space": [helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2)],
    "flatten": [helper.make_node("Flatten", ["c"], ["y"])],
    "avgpool": [helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
    "global_max": [helper.make_node("GlobalMaxPool", ["c"], ["y"])],
}


@pytest.mark.parametrize("follower", sorted(_FOLLOWERS))
def test_ops_after_an_nhwc_conv_match_onnxruntime(tmp_path, follower):
    rng = np.random.default_rng(4)
    channels = 16
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 8, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(np.array([0, 1, 2, 0, 0, 3, 1, 0], np.int64), "pads"),
        numpy_helper.from_array(np.array([8, 8], np.int64), "halves"),
        numpy_helper.from_array(np.array([2, 1], np.int64), "starts"),
        numpy_helper.from_array(np.array([14, 9], np.int64), "ends"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "axes"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal((channels, 1, 1)).astype(np.float32), "per_channel"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), *_FOLLOWERS[follower]]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in nodes[-1].output]
    graph = helper.make_graph(nodes, follower, [info("x", [1, 8, 10, 12])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((1, 8, 10, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})
    for name, expected in zip(nodes[-1].output, want, strict=True):
        assert got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4, err_msg=name)


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 → the nearest bfloat16 (ties to even), as float32."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _truncate_bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
def test_bfloat16_dot_products_round_their_inputs_to_nearest_even(tmp_path, op):
    """The input cast to bfloat16 fused before a ``vdpbf16ps`` kernel rounds to nearest even, as
    a bfloat16 cast does; TVM's legalization had dropped it, truncating every activation (a
    systematic bias of half a bfloat16 step). The float64 product of rounded inputs, rounded once
    to bfloat16 like the output, matches almost everywhere; truncated inputs' would not."""
    from tests.conftest import bf16_dot_target_options

    options = bf16_dot_target_options()
    if options is None:
        pytest.skip("this CPU has no AVX512-BF16")
    rng = np.random.default_rng(0)
    if op == "MatMul":
        w = rng.standard_normal((256, 64)).astype(np.float32)
        x_shape, y_shape = [32, 256], [32, 64]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        w = rng.standard_normal((32, 64, 1, 1)).astype(np.float32)
        x_shape, y_shape = [1, 64, 8, 8], [1, 32, 8, 8]
        node = helper.make_node("Conv", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "dot", [info("x", x_shape)], [info("y", y_shape)],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "dot.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    amptool.convert(path, dtype="bfloat16", output=tmp_path / "out", range_guards=False, target_options=options)
    # Values a quarter step off a bfloat16: rounding and truncation differ on most of them.
    x = (rng.standard_normal(x_shape) * (1 + 2.0 ** -9)).astype(np.float32)
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)

    def reference(inputs: np.ndarray) -> np.ndarray:
        if op == "MatMul":
            exact = inputs.astype(np.float64) @ _round_bf16(w).astype(np.float64)
        else:
            exact = np.einsum("nchw,oc->nohw", inputs.astype(np.float64), _round_bf16(w)[:, :, 0, 0].astype(np.float64))
        return _round_bf16(exact.astype(np.float32))

    assert np.mean(got == reference(_round_bf16(x))) > 0.99
    assert np.mean(got == reference(_truncate_bf16(x))) < 0.6


#: A conv reduced over chunks of input channels outside its rows (the chunk count captured), its
#: chunk loop marked for the next chunk's prefetch over the row and column tiles (``prefetch_chunks``).
_CHUNKED_ROWS = (r'for rc_0 in T\.serial\(T\.int64\((\d+)\), '
                 r'annotations=\{"amp_prefetch_next": \{[^}]*\}\}\):'
                 r"\s*for y, x_0, ry, rx, rc_1 in T\.grid")


def _two_convs() -> onnx.ModelProto:
    """A 1x1 conv on a 40x40 map with 32 → 32 channels (4 KB of weights, 200 KB of activations),
    then a 3x3 conv on a 4x4 map with 256 → 256 channels (2.4 MB of weights, 16 KB around it)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
             for n, s in (("w1", (32, 32, 1, 1)), ("w2", (256, 32, 10, 10)), ("w3", (256, 256, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"], strides=[10, 10]),
             helper.make_node("Conv", ["b", "w3"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "two_convs", [info("x", [1, 32, 40, 40])], [info("y", [1, 256, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_convs_stream_their_larger_side_once(tmp_path):
    """Rows outermost when activations dominate, channel blocks outermost when weights do (each
    thread then streams the weights once) and, where a chunk of input channels' weights fits 5/6
    of L1 (the 3×3 × 256 on a 32 KB L1: 8 channels, 18 KB), chunks of input channels outside the
    rows; all orders compute onnxruntime's numbers."""
    model = _two_convs()
    path = tmp_path / "convs.onnx"
    onnx.save(model, str(path))
    text = "\n".join(scheduled_kernels(str(path), "float32", "znver4"))  # not this host: L1 taken as 32 KB
    orders = {tuple(re.findall(r"\bfor (\w+) in T\.parallel", kernel)) for kernel in text.split("@T.prim_func")
              if '"amp_conv2d_nhwc_init"' in kernel}
    loops = sorted(loop for found in orders for loop in found)
    assert any(re.fullmatch(r"n_y_c_0\w*_fused", loop) for loop in loops), loops
    assert any(re.fullmatch(r"n_c_0_y\w*_fused", loop) for loop in loops), loops
    assert re.findall(_CHUNKED_ROWS, text) == ["32"], text
    x = np.random.default_rng(2).standard_normal((1, 32, 40, 40)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_weight_chunks_follow_the_targets_l1(tmp_path, monkeypatch):
    """A chunk of input channels takes 5/6 of the target CPU's L1 data cache: this host's when the
    build is for this host's CPU (a 48 KB L1 chunks the 3×3 × 256 by 16 channels, 37 KB), 32 KB for
    any other CPU (8 channels)."""
    import tvm

    from amptool.compiler import cpu_kernels

    assert cpu_kernels.l1_data_bytes(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) in (
        cpu_kernels.DEFAULT_L1_BYTES, cpu_kernels._host_facts()[1])
    path = tmp_path / "convs.onnx"
    onnx.save(_two_convs(), str(path))
    pattern = _CHUNKED_ROWS
    monkeypatch.setattr(cpu_kernels, "_host_facts", lambda: ("skylake-avx512", 32 << 10))
    assert re.findall(pattern, "\n".join(scheduled_kernels(str(path), "float32", "znver4"))) == ["32"]
    monkeypatch.setattr(cpu_kernels, "_host_facts", lambda: ("znver4", 48 << 10))
    assert re.findall(pattern, "\n".join(scheduled_kernels(str(path), "float32", "znver4"))) == ["16"]
    assert cpu_kernels.l1_data_bytes(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) == 48 << 10
    assert cpu_kernels.l1_data_bytes(tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})) == 32 << 10


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_odd_channel_counts_pad_to_whole_vectors(tmp_path, dtype, tolerance):
    """A YOLO-style head (255 = 3 × 85 channels, which 8 does not divide) and a 10-channel conv run
    the NHWC kernels on filters padded with zeros to whole vectors; only the real channels come
    out. They were left NCHW with TVM's generic conv (the 255 head 4.5× slower in float32)."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
             for n, s in (("w1", (255, 32, 1, 1)), ("b1", (255,)), ("w2", (10, 255, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "head", [info("x", [1, 32, 9, 11])], [info("y", [1, 10, 9, 11])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "head.onnx"
    onnx.save(model, str(path))
    # Lowered for a CPU without AMX (whose tiles would take the 1×1 conv here): the vector kernels.
    text = "\n".join(scheduled_kernels(str(path), dtype, "znver4"))
    assert text.count('"amp_conv2d_nhwc_init"') + text.count('"amp_conv2d_nhwc_bf16_init"') == 2  # both convs
    assert "< T.int64(255))" in text  # the last block of 16 stores its 15 real channels
    x = np.random.default_rng(1).standard_normal((1, 32, 9, 11)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_rows_end_in_a_narrower_tile(tmp_path, dtype, tolerance):
    """23 columns in tiles no width divides (AVX2: 4 tiles of 6, AVX-512: 2 of 12) are computed as
    they are, the last tile narrower and each row's tiles unrolled, not as 24 cropped; the sums and
    the fused residual and ReLU on the last tile's columns match onnxruntime."""
    from amptool.compiler.cpu_nhwc import NHWC_CROP_BLOCK

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = x_to_y_model(nodes, "ragged", [1, 16, 9, 23], inits)
    path = tmp_path / "ragged.onnx"
    onnx.save(model, str(path))
    if dtype == "float32":
        text = _lowered_kernels(str(path), dtype)
        assert NHWC_CROP_BLOCK not in text
        assert re.search(r"for x_0 in T\.unroll\(T\.int64\([234]\)\)", text), "the row's tiles are unrolled"
    x = rng.standard_normal((1, 16, 9, 23)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x}, dtype)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=tolerance * float(np.abs(want).max()))


def test_avx2_tiles_of_few_accumulators_take_a_ragged_row_instead() -> None:
    """On AVX2 two channel vectors × 3 columns (27 columns' divisor) hold 6 accumulators, fewer
    than the FMAs a core keeps in flight: such rows take wider tiles, the last one narrower
    (27 = 4 × 6 + 3), as long as ``RAGGED_TILES`` allows; 14 columns keep 5 + 5 + 4, 28 keep 4."""
    from amptool.compiler.cpu_kernels import FMAS_IN_FLIGHT, nhwc_columns
    from amptool.compiler.cpu_nhwc import RAGGED_TILES, ragged_row

    for width, vectors in ((9, 2), (21, 2), (26, 2), (27, 2), (10, 3), (13, 3), (14, 3)):
        tile = nhwc_columns(width, 8, vectors)
        assert tile * vectors >= FMAS_IN_FLIGHT and ragged_row(width, tile), (width, vectors, tile)
        assert -(-width // tile) <= RAGGED_TILES
    assert nhwc_columns(27, 8, 2) == 6 and nhwc_columns(14, 8, 2) == 5 and nhwc_columns(28, 8, 2) == 4
    assert nhwc_columns(27, 16, 2) == 9  # AVX-512: 18 accumulators already


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_a_27_column_conv_takes_ragged_six_column_tiles_on_avx2(tmp_path, dtype, tolerance):
    """SqueezeNet's 27² expand conv (32 → 128, 3×3): an AVX2 kernel of five unrolled 2 × 6 tiles a
    row (it took nine 2 × 3; 0.77× the time on an AVX2 EPYC), its sums matching onnxruntime."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    path = tmp_path / "wide27.onnx"
    onnx.save(x_to_y_model(nodes, "wide27", [1, 16, 6, 27], inits), str(path))
    if dtype == "float32":
        text = "\n".join(scheduled_kernels(str(path), dtype, "haswell"))
        assert re.search(r"for x_0 in T\.unroll\(T\.int64\(5\)\):\s+for x_1_init in T\.unroll\(T\.int64\(6\)\)", text)
    x = rng.standard_normal((1, 16, 6, 27)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x}, dtype)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize("width", [17, 19, 23, 29, 31, 37])
def test_prime_widths_waste_few_columns(width: int) -> None:
    """A width with no divisor in the tile range computes the next multiple of the tile that wastes
    least (Inception-v3's 17×17 grid computed 24 columns with the cap's tile of 8; now 18)."""
    from amptool.compiler.cpu_kernels import accumulator_budget, nhwc_columns

    tile = nhwc_columns(width, 16)
    computed = -(-width // tile) * tile
    assert 4 <= tile <= accumulator_budget(16) - 2
    assert computed - width <= 2, (tile, computed)


@pytest.mark.parametrize("lanes", [16, 8])
def test_register_tiles_of_several_vectors_fit_the_registers(lanes: int) -> None:
    """Every tile of ``tile_vectors`` channel vectors × ``nhwc_columns`` columns keeps its
    accumulators, one weight vector per channel vector and the broadcast input in the ISA's
    registers (AVX-512 32, AVX2 16); a row no longer than the tile is one tile, a longer one
    computes less than one tile of waste; several vectors where one broadcast can feed them."""
    from amptool.compiler.cpu_kernels import nhwc_columns, tile_vectors

    registers = 32 if lanes == 16 else 16
    assert tile_vectors(16, lanes, 56) > 1 and tile_vectors(5, lanes, 56) == 1
    assert tile_vectors(16, lanes, 1) == (4 if lanes == 16 else 2)  # one column: four FMAs per broadcast
    for blocks, width in itertools.product(range(2, 17), range(1, 120)):
        vectors = tile_vectors(blocks, lanes, width)
        assert blocks % vectors == 0 and vectors <= (4 if lanes == 16 else 3 if blocks % 2 else 2)
        if vectors == 1:
            continue
        tile = nhwc_columns(width, lanes, vectors)
        assert tile * vectors + vectors + 1 <= registers, (blocks, width, tile)
        most = (registers - vectors - 1) // vectors
        assert tile == width if width <= most else -(-width // tile) * tile - width < tile, (blocks, width, tile)


def test_tiles_take_the_fewest_loads_per_fma() -> None:
    """AVX-512 tiles cost their loads per FMA past half a load (``LOADS_PER_FMA``): 4 vectors × 4
    columns on 56-, 28- and 112-column rows, not 2 × 14 (0.5 loads per FMA, not 0.57); 2 × 14 and
    2 × 7 on 14- and 7-column rows, where four vectors' tiles would crop columns past the row
    (``CROPPED_TILE_COST``); 3 × 8 for 144 channels at 56; a cropped 2 × 8 on 15 columns, not an
    exact 1 × 5 (1.2 loads per FMA); AVX2 keeps two vectors where they fit, three for an odd count."""
    from amptool.compiler.cpu_kernels import nhwc_columns, tile_vectors

    for width in (56, 28, 112):
        assert tile_vectors(16, 16, width) == 4 and nhwc_columns(width, 16, 4) == 4
        assert tile_vectors(16, 8, width) == 2
    assert tile_vectors(16, 16, 14) == 2 and nhwc_columns(14, 16, 2) == 14
    assert tile_vectors(32, 16, 7) == 2 and nhwc_columns(7, 16, 2) == 7
    assert tile_vectors(9, 16, 56) == 3 and nhwc_columns(56, 16, 3) == 8  # 144 channels
    assert tile_vectors(2, 16, 15) == 2 and nhwc_columns(15, 16, 2) == 8
    # AVX2: three vectors × 4 columns for an odd count (24 channels), two where two divide.
    assert tile_vectors(3, 8, 28) == 3 and nhwc_columns(28, 8, 3) == 4
    assert tile_vectors(6, 8, 28) == 2 and tile_vectors(5, 8, 28) == 1


def test_dense_pointwise_convs_tile_runs_of_positions() -> None:
    """A 1×1 conv's map is one run of positions: at 14² (196) four vectors × 4 positions (0.5 loads
    per FMA) where rows of 14 columns take 2 × 14 (0.57); at 7² (49, no divisor the registers hold)
    4 × 5 over 50 positions, not 2 × 7 (0.64); Inception's 17² 4 × 5 over 290, not a cropped 3 × 9.
    None where rows already reach the floor (28², 56², three vectors × 7 at 7²), for one vector's
    tiles or a single row. AVX2: the flat tile of least waste with at least the row tile's
    accumulators — 7² as 2 × 5 over 50 (2 × 4 rows: 8), 14² as 2 × 6 over 198, not 2 × 4 (2 × 5
    rows: 10); none where the rows divide (28²: 2 × 4)."""
    from amptool.compiler.cpu_kernels import flat_tile

    assert flat_tile(16, 16, 14, 14) == (4, 4, 196) and flat_tile(64, 16, 14, 14) == (4, 4, 196)
    assert flat_tile(32, 16, 7, 7) == (4, 5, 50) and flat_tile(128, 16, 7, 7) == (4, 5, 50)
    assert flat_tile(12, 16, 17, 17) == (4, 5, 290)
    for blocks, height, width in ((16, 28, 28), (16, 56, 56), (60, 7, 7), (1, 14, 14), (5, 14, 14), (16, 1, 14)):
        assert flat_tile(blocks, 16, height, width) is None, (blocks, height, width)
    assert flat_tile(16, 8, 14, 14) == (2, 6, 198) and flat_tile(32, 8, 14, 14) == (2, 6, 198)
    assert flat_tile(64, 8, 7, 7) == (2, 5, 50) and flat_tile(256, 8, 7, 7) == (2, 5, 50)
    assert flat_tile(16, 8, 28, 28) is None


def test_golden_cove_tiles_weigh_l2_panels_and_parallel_tasks() -> None:
    """On a Sapphire Rapids class CPU a row tile whose weight panel L1 cannot hold streams it from
    L2 per column tile, so the wider tile wins: 3×3 64 → 64 at 56² (147 KB as four vectors) takes
    2 vectors × 14 columns, not 4 × 4 — which a 16 KB 1×1 panel keeps; and a flat tile keeps 8
    channel blocks (parallel tasks) where a narrower block allows: 1024 → 256 at 14² leaves the
    4-vector flat tile (4 tasks) for rows, 256 → 1024 keeps it (16). Ice Lake keeps its tiles."""
    import tvm

    from amptool.compiler.cpu_kernels import flat_min_tasks, flat_tile, tile_vectors

    assert tile_vectors(4, 16, 56) == 4
    assert tile_vectors(4, 16, 56, panel_bytes=9 * 64 * 16 * 4, l1_bytes=40 << 10) == 2
    assert tile_vectors(16, 16, 56, panel_bytes=64 * 16 * 4, l1_bytes=40 << 10) == 4
    assert flat_tile(16, 16, 14, 14, min_tasks=8) is None and flat_tile(64, 16, 14, 14, min_tasks=8) == (4, 4, 196)
    assert flat_tile(32, 16, 7, 7, min_tasks=8) == (4, 5, 50)
    def target(mcpu: str, *mattr: str) -> tvm.target.Target:
        return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mattr": list(mattr)})

    assert flat_min_tasks(target("sapphirerapids")) == 8
    assert flat_min_tasks(target("rocketlake", "+amx-bf16", "+amx-tile")) == 8
    assert flat_min_tasks(target("icelake-server")) == 1 and flat_min_tasks(target("znver4")) == 1


@pytest.mark.parametrize(("mcpu", "block"), [("sapphirerapids", 32), ("icelake-server", 64)])
def test_grouped_convs_weigh_l2_panels_on_golden_cove(tmp_path, mcpu, block):
    """A grouped conv's row tile weighs its weight panel's L2 bytes as a dense conv's does: RegNet's
    3×3, 128 channels in 2 groups of 64 at 56², takes 2-vector blocks on a Sapphire Rapids class CPU
    (its 4-vector panel, 147 KB, streamed from L2 per column tile: 1.76 → 1.61 ms in the model),
    4-vector blocks on Ice Lake."""
    rng = np.random.default_rng(22)
    w = numpy_helper.from_array((rng.standard_normal((128, 64, 3, 3)) * 0.05).astype(np.float32), "w")
    model = x_to_y_model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])], "grouped",
                         [1, 128, 56, 56], [w])
    path = tmp_path / "grouped.onnx"
    onnx.save(model, str(path))
    text = "\n".join(scheduled_kernels(str(path), "float32", mcpu))
    assert f"T.int64(3), T.int64(3), T.int64(64), T.int64({block})), \"float32\")" in text


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_heavy_convs_with_taps_tile_runs_of_positions_on_avx2(tmp_path, dtype):
    """On AVX2 a conv whose weights outweigh its activations twice over — 3×3 ones too, strided or
    dilated — is computed over its 7² map as one run of 50 positions, 2 vectors × 5 a tile (a row
    of 7 took 2 × 4 + 2 × 3, the 3-column tile starving the FMA pipes); not on AVX-512, where only
    1×1 convs go flat (chunked), nor where the weights do not dominate (28²). The stride, the
    dilation's reach into the padding and the residual epilogue give onnxruntime's values."""
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), n)
             for n, shape in (("wa", (128, 64, 3, 3)), ("wb", (128, 128, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "wb"], ["b"], dilations=[2, 2], pads=[2, 2, 2, 2]),
             helper.make_node("Add", ["b", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "taps", [info("x", [1, 64, 14, 14])], [info("y", [1, 128, 7, 7])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "taps.onnx"
    onnx.save(model, str(path))
    flat = r"T\.sblock_alloc_buffer\(\(T\.int64\(1\), T\.int64\(50\), T\.int64\(128\)\)"
    for mcpu, flat_convs in (("haswell", 2), ("icelake-server", 0)):
        convs = [k for k in scheduled_kernels(str(path), dtype, mcpu) if '"amp_conv2d_nhwc_init"' in k]
        assert len(convs) == 2 and sum(bool(re.search(flat, k)) for k in convs) == flat_convs, (mcpu, convs)
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x}, dtype)
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_image_stems_padded_copy_runs_by_rows(tmp_path, dtype):
    """A stem conv's 3-channel padded copy: rows in parallel, each interior row's columns and
    channels one run without the bounds test (its own loop, ``3 * 3 .. 3 * 33``), the border
    apart — not 3-lane vectors with a test per column. Values are onnxruntime's, with an odd height
    and batch 2."""
    rng = np.random.default_rng(14)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 3, 7, 7)) * 0.1).astype(np.float32), "w")]
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    graph = helper.make_graph([conv], "stem", [info("x", [2, 3, 29, 30])], [info("y", [2, 32, 15, 15])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "stem.onnx"
    onnx.save(model, str(path))
    kernel = next(k for k in scheduled_kernels(str(path), dtype, "icelake-server") if '"amp_conv2d_nhwc_init"' in k)
    assert re.search(r"in T\.parallel\(T\.int64\(3\), T\.int64\(32\)\)", kernel), kernel
    assert re.search(r"in range\(T\.int64\(9\), T\.int64\(99\)\)", kernel), kernel
    x = rng.standard_normal((2, 3, 29, 30)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


def _pointwise_stage(channels: int, size: int, stride: int) -> onnx.ModelProto:
    """A ResNet-style 1×1 stage: a 1×1 conv with a residual add and Relu, then a 1×1 conv of
    ``stride`` to twice the channels; weights heavy enough to be chunked."""
    rng = np.random.default_rng(12)
    scale = 1 / np.sqrt(channels)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * k).astype(np.float32), n)
             for n, s, k in (("w1", (channels, channels, 1, 1), scale), ("b1", (channels,), 1.0),
                             ("w2", (2 * channels, channels, 1, 1), scale))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
             helper.make_node("Add", ["a", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], strides=[stride, stride])]
    out = (size - 1) // stride + 1
    graph = helper.make_graph(nodes, "pointwise", [info("x", [1, channels, size, size])],
                              [info("y", [1, 2 * channels, out, out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("channels", "size", "stride", "flat"), [(256, 14, 1, 2), (256, 7, 1, 2), (512, 28, 2, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_flat_tiles_match_onnxruntime(tmp_path, channels, size, stride, flat, dtype):
    """1×1 convs at 14² and 7² on an AVX-512 target tile runs of positions across rows (``p_0``:
    196 positions 4 at a time; 49 as 50, 5 at a time, the 50th dropped), chunked over input
    channels (``rc_0``): with a residual epilogue, reading a float16 build's converted copy, and
    after a stride 2 (the subsampled copy; the 28² conv before it keeps its rows). Values are
    onnxruntime's."""
    model = _pointwise_stage(channels, size, stride)
    path = tmp_path / "pointwise.onnx"
    onnx.save(model, str(path))
    convs = [k for k in scheduled_kernels(str(path), dtype, "icelake-server") if '"amp_conv2d_nhwc_init"' in k]
    runs = 196 // 4 if size * size // stride ** 2 == 196 else 50 // 5
    # A float16 build first widens the chunk's weights to float32 (cpu_schedules_nhwc._widen_panels).
    widening = r'[\s\S]*?T\.sblock\("amp_nhwc_widen"\)[\s\S]*?' if dtype == "float16" else r"\s*"
    flat_chunks = (r'for rc_0 in T\.serial\(T\.int64\(\d+\), annotations=\{"amp_prefetch_next": \{[^}]*\}\}\):'
                   + widening + rf"for p_0, rc_1 in T\.grid\(T\.int64\({runs}\)")
    tiled = [k for k in convs if re.search(flat_chunks, k)]
    assert len(convs) == 2 and len(tiled) == flat, convs
    x = np.random.default_rng(13).standard_normal((1, channels, size, size)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


def _pointwise_conv(channels: int, out: int, size: int) -> onnx.ModelProto:
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array((rng.standard_normal((out, channels, 1, 1)) * 0.1).astype(np.float32), "w")]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "pointwise",
                              [info("x", [1, channels, size, size])], [info("y", [1, out, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("mcpu", ["icelake-server", "znver4", "haswell"])
def test_float16_weights_are_widened_a_panel_at_a_time(tmp_path, mcpu):
    """A float16 1×1 conv at 56² converts each channel block's weight panel to float32 once, inside
    its parallel loop, for the row's tiles that read it (``amp_nhwc_widen``, a panel of the 16,384
    weights); at 2² (one tile a panel) each tile converts what it reads. Values are onnxruntime's
    within float16 rounding."""
    from tests.conftest import kernel_after_pass

    for size, widened in ((56, True), (2, False)):
        path = tmp_path / f"pointwise{size}.onnx"
        onnx.save(_pointwise_conv(64, 256, size), str(path))
        conv = next(k for k in scheduled_kernels(str(path), "float16", mcpu) if '"amp_conv2d_nhwc_init"' in k)
        assert ('T.sblock("amp_nhwc_widen")' in conv) == widened, conv
    flat = kernel_after_pass(str(tmp_path / "pointwise56.onnx"), "conv2d_nhwc", "FlattenBuffer", "float16")
    panel = re.search(r"amp_nhwc_widen = T\.alloc_buffer\(\(T\.int64\((\d+)\),\)", flat)
    assert panel is not None and int(panel.group(1)) < 64 * 256, flat
    model = _pointwise_conv(64, 256, 56)
    x = np.random.default_rng(22).standard_normal((1, 64, 56, 56)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(tmp_path / "pointwise56.onnx", dtype="float16", output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * float(np.abs(want).max()))


def test_a_chunked_float16_conv_prefetches_its_next_chunk_over_the_widened_reads(tmp_path):
    """The 3×3 × 256 conv reduced chunk by chunk widens each chunk once, and its next chunk's
    float16 weights are prefetched over the tiles that read the widened one (``over``), as a
    float32 conv's are over the tiles that read them."""
    path = tmp_path / "convs.onnx"
    onnx.save(_two_convs(), str(path))
    marked = [k for k in scheduled_kernels(str(path), "float16", "znver4") if '"amp_prefetch_next"' in k]
    assert len(marked) == 1 and 'T.sblock("amp_nhwc_widen")' in marked[0], marked
    assert '"over": "amp_nhwc_widen"' in marked[0], marked[0]
    import tvm

    from amptool.compiler import stack_tiles
    from tests.conftest import staged_module

    seen: list[str] = []

    @tvm.instrument.pass_instrument
    class AfterPrefetch:
        def run_after_pass(self, module: Any, info: Any) -> None:
            if info.name == "PrefetchChunks":
                seen.append(module.script())

    mod = staged_module(str(path), "float16", "schedule", "znver4")
    name, func = next((gv.name_hint, f) for gv, f in mod.functions_items()
                      if isinstance(f, tvm.tirx.PrimFunc) and '"amp_prefetch_next"' in f.script())
    with tvm.transform.PassContext(instruments=[AfterPrefetch()]):
        tvm.compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}),
                    target=_tvm.make_target({"kind": "llvm", "mcpu": "znver4"}),
                    tir_pipeline=stack_tiles.CPU_TIR_PIPELINE)
    # 4,608 float16 weights a chunk (144 lines) over its 4 rows × 3 kernel rows, 12 lines at each,
    # from the float16 weight (param_0) — not in the widening loop, where no tile computes.
    spread = (r'for y, ry in T\.grid\(4, 3\):\s*for line in range\(12\):\s*'
              r'T\.call_extern\("void", "amptool_prefetch_l2", T\.address_of\(param_0')
    assert re.search(spread, seen[-1]), seen[-1]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_multi_vector_tiles_match_onnxruntime(tmp_path, dtype):
    """64 channels (four vectors a tile), 48 and 96 (three), 80 (five blocks: one), on rows of
    1, 3, 13 and 17 columns (one tile, a short tile, a divisor, a cropped remainder), 3×3 and 1×1;
    the weight of the first 64-channel conv packed in blocks of its tile's channels."""
    from amptool.compiler.cpu_kernels import tile_vectors, vector_lanes

    rng = np.random.default_rng(7)
    channels = [64, 48, 96, 80, 64]
    inits, nodes, x = [], [], "x"
    for i, (cin, cout) in enumerate(zip([16, *channels], channels)):
        k = 3 if i % 2 == 0 else 1
        weight = rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)
        inits.append(numpy_helper.from_array(weight.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    nodes[-1] = helper.make_node("Relu", [f"c{len(channels) - 1}"], ["y"])
    for height, width in ((5, 1), (4, 3), (3, 13), (2, 17)):
        graph = helper.make_graph(nodes, "tiles", [info("x", [1, 16, height, width])],
                                  [info("y", [1, 64, height, width])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        path = tmp_path / f"tiles{width}.onnx"
        onnx.save(model, str(path))
        if width == 13 and dtype == "float32":
            lanes = vector_lanes(_tvm.make_target(TARGET))
            block = lanes * tile_vectors(64 // lanes, lanes, width)  # the first conv's: 16 → 64
            # [OC/B, KH, KW, IC, B], or in chunks of input channels [OC/B, IC/K, KH, KW, K, B]
            layout = (rf"\(\(T\.int64\({64 // block}\), (?:T\.int64\((\d+)\), )?T\.int64\(3\), T\.int64\(3\), "
                      rf"T\.int64\((\d+)\), T\.int64\({block}\)\), \"float32\"\)")
            packed = re.findall(layout, _lowered_kernels(str(path), dtype))
            assert any(int(chunks or 1) * int(chunk) == 16 for chunks, chunk in packed), packed
        data = np.random.default_rng(width).standard_normal((1, 16, height, width)).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": data})[0]
        amptool.convert(path, dtype=dtype, output=tmp_path / f"out{width}")
        got = np.asarray(amptool.load(tmp_path / f"out{width}").run({"x": data})["y"], dtype=np.float32)
        tolerance = 1e-5 if dtype == "float32" else 2e-2
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize("strides", [[2, 2], [2, 1], [3, 2]])
def test_strided_pointwise_convs_copy_only_the_pixels_they_read(tmp_path, strides):
    """A 1×1 conv with strides (a ResNet shortcut) copies every stride-th row and column of its
    input, not all of it (a quarter of a stride-2 input), and convolves those with stride 1; odd
    sizes keep their last row and column, onnxruntime's values."""
    rng = np.random.default_rng(8)
    height, width = 15, 13
    out_h, out_w = (height - 1) // strides[0] + 1, (width - 1) // strides[1] + 1
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], strides=strides)]
    graph = helper.make_graph(nodes, "shortcut", [info("x", [1, 16, height, width])],
                              [info("y", [1, 64, out_h, out_w])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "shortcut.onnx"
    onnx.save(model, str(path))
    kernel = next(k for k in scheduled_kernels(str(path), "float32") if "T.int64(64))" in k and '"amp_nhwc_pad"' in k)
    copy = re.search(r"amp_nhwc_pad = T\.sblock_alloc_buffer\(\((.*?)\)\)", kernel)
    assert copy is not None and f"T.int64({out_h}), T.int64(" in copy.group(1), kernel
    x = rng.standard_normal((1, 16, height, width)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_unpadded_convs_read_their_input_in_place_and_mid_weight_convs_chunk(tmp_path):
    """A 1×1 conv reads its float32 input where it lies (no ``amp_nhwc_pad`` copy: a pass over the
    input for nothing); a padded 3×3 conv still copies it with its zero border. The 3×3, whose
    weights (147 KB) are between half and twice its activations (100 KB), reduces over chunks of
    input channels outside the rows (``CHUNK_WEIGHTS``). Both compute onnxruntime's numbers."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n)
             for n, s in (("w1", (64, 64, 1, 1)), ("w2", (64, 64, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = x_to_y_model(nodes, "pair", [1, 64, 14, 14], inits)
    path = tmp_path / "pair.onnx"
    onnx.save(model, str(path))
    convs = [k for k in scheduled_kernels(str(path), "float32", "icelake-server") if '"amp_conv2d_nhwc_init"' in k]
    pointwise = next(k for k in convs if "T.int64(1), T.int64(1), T.int64(64)" in k)
    spatial = next(k for k in convs if "T.int64(3), T.int64(3), T.int64(" in k)
    assert '"amp_nhwc_pad"' not in pointwise, pointwise
    assert '"amp_nhwc_pad"' in spatial, spatial
    assert re.search(_CHUNKED_ROWS, spatial), spatial
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pools_read_their_input_without_a_padded_copy(tmp_path, dtype):
    """Padded max and average pools (edges counted and not) read the conv's output where it lies,
    the padding a bound test in their reads (float16: converted there), not a padded copy of the
    whole map first; values are
    onnxruntime's (float16: within its rounding)."""
    rng = np.random.default_rng(10)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32), "w")]
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["max"], **pool),
             helper.make_node("AveragePool", ["c"], ["avg"], count_include_pad=0, **pool),
             helper.make_node("AveragePool", ["c"], ["avg_pad"], count_include_pad=1, **pool)]
    outputs = [info(name, [1, 32, 10, 9]) for name in ("max", "avg", "avg_pad")]
    graph = helper.make_graph(nodes, "pools", [info("x", [1, 16, 19, 17])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "pools.onnx"
    onnx.save(model, str(path))
    pools = [k for k in scheduled_kernels(str(path), dtype) if 'T.sblock("pool_' in k]
    assert len(pools) == 3 and not any("pad_temp" in k for k in pools), pools
    # A float16 max pool's float32 copy of its input is read where it is made, not a pass of its own.
    assert not any('T.sblock("amp_cast")' in k for k in pools), pools
    x = rng.standard_normal((1, 16, 19, 17)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    for name, expected in zip(("max", "avg", "avg_pad"), want):
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=tolerance * float(np.abs(expected).max()))


def test_a_pool_padding_its_contiguous_axis_keeps_the_padded_copy(tmp_path):
    """A standalone NCHW max pool pads W, its vectorized axis: inlined, the bounds test would run
    in every lane (a 5×5 pool 0.9 → 4.7 ms), so its padded copy stays; values are onnxruntime's."""
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    model = x_to_y_model([pool], "pool", [1, 32, 20, 20])
    path = tmp_path / "pool.onnx"
    onnx.save(model, str(path))
    kernel = next(k for k in scheduled_kernels(str(path), "float32") if 'T.sblock("pool_' in k)
    assert "pad_temp" in kernel, kernel
    x = np.random.default_rng(11).standard_normal((1, 32, 20, 20)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    np.testing.assert_array_equal(amptool.load(tmp_path / "out").run({"x": x})["y"], want)


def test_paired_bfloat16_weights_decode_to_the_original_channels():
    """``bf16_pairs.pack_pairs`` puts two channel vectors in one vector of uint32 words; decoding
    as ``paired_float`` does (low half shifted up, high half masked) gives back every weight."""
    import ml_dtypes

    from amptool.compiler.bf16_pairs import pack_pairs
    from amptool.compiler.cpu_nhwc import pack_conv_weight

    rng = np.random.default_rng(16)
    lanes, block = 8, 32
    w = rng.standard_normal((64, 5, 3, 2)).astype(ml_dtypes.bfloat16)
    words = pack_pairs(pack_conv_weight(w, block), lanes)
    assert words.dtype == np.uint32 and words.shape == (2, 3, 2, 5, block // 2)
    for c in range(64):
        q = c % block
        word = words[c // block, :, :, :, q // (2 * lanes) * lanes + q % lanes]
        bits = (word << 16) if (q // lanes) % 2 == 0 else (word & 0xFFFF0000)
        np.testing.assert_array_equal(bits.view(np.float32), w[c].astype(np.float32).transpose(1, 2, 0))


@pytest.mark.parametrize(("group", "taps", "size", "channels"), [(1, 3, 28, (32, 64)), (2, 3, 28, (32, 64)),
                                                              (1, 1, 7, (256, 512))])
def test_bfloat16_convs_without_dot_products_read_paired_weights(tmp_path, group, taps, size, channels):
    """Without ``vdpbf16ps`` a bfloat16 conv of several channel vectors — grouped too, and a 1×1
    conv over a small map computed as one run of positions (``flat_tile``) — reads its weights as
    uint32 pairs of vectors (one load, a shift and an and per two vectors: ResNet-50 and RegNet
    bfloat16 on an AVX2 EPYC, see benchmarks/README.md); its values are the float32 sums of the
    bfloat16 inputs."""
    import ml_dtypes

    rng = np.random.default_rng(17)
    inputs, outputs = channels

    def bf16(a):
        return a.astype(ml_dtypes.bfloat16).astype(np.float32)  # exact in bfloat16, so the build changes nothing

    w = numpy_helper.from_array(bf16(rng.standard_normal((outputs, inputs // group, taps, taps)) * 0.1), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[taps // 2] * 4, group=group)
    model = x_to_y_model([conv], "conv", [1, inputs, size, size], [w])
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = outputs
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    for mcpu in ("cooperlake", "haswell"):  # AVX-512 with the slow dot product and no AMX (FMA kernels), AVX2
        (kernel,) = [k for k in scheduled_kernels(str(path), "bfloat16", mcpu) if '"amp_conv2d_nhwc_init"' in k]
        assert re.search(r'param_\d+: T\.Buffer\(.*?, "uint32"\)', kernel), kernel  # the packed weight
        if taps == 1 and mcpu == "haswell":  # positions × channels: the flat tile's product (2 × 5 over 50)
            flat = rf"T\.sblock_alloc_buffer\(\(T\.int64\(1\), T\.int64\(50\), T\.int64\({outputs}\)\)"
            assert re.search(flat, kernel), kernel
    x = bf16(rng.standard_normal((1, inputs, size, size)))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="bfloat16", output=tmp_path / "out", target_options=["-mattr=-avx512bf16"])
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-3 * float(np.abs(want).max()))


def test_a_one_row_conv_runs_its_column_tiles_in_parallel(tmp_path):
    """A conv1d (a one-row NHWC map) of 64 channels is a single block of AVX-512 channel tiles:
    with only its rows and channel blocks parallel — and its 600 KB padded copy under the row
    loop — it ran on one thread (Whisper's stem convs 2× slower than at two). Its column tiles
    are parallel too, the copy whole; values are onnxruntime's."""
    rng = np.random.default_rng(15)
    w = numpy_helper.from_array((rng.standard_normal((64, 64, 3)) * 0.05).astype(np.float32), "w")
    model = x_to_y_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], "conv1d", [1, 64, 2400], [w])
    path = tmp_path / "conv1d.onnx"
    onnx.save(model, str(path))
    (kernel,) = [k for k in scheduled_kernels(str(path), "float32", "icelake-server") if '"amp_nhwc_pad"' in k]
    conv_loop = kernel[kernel.index('T.sblock("amp_nhwc_pad")'):]
    assert re.search(r"in T\.parallel\(T\.int64\(400\)\)", conv_loop), kernel  # 2400 columns / 6
    x = rng.standard_normal((1, 64, 2400)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def _conv_relu(inputs: int, outputs: int, height: int, width: int, kernel: int = 3, stride: int = 1) -> onnx.ModelProto:
    """x → Conv (``kernel``² taps, padded to keep the map at stride 1, no bias) → Relu → y."""
    rng = np.random.default_rng(16)
    w = numpy_helper.from_array((rng.standard_normal((outputs, inputs, kernel, kernel)) * 0.05).astype(np.float32), "w")
    pad = kernel // 2
    out = [1, outputs, (height + 2 * pad - kernel) // stride + 1, (width + 2 * pad - kernel) // stride + 1]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[pad] * 4, strides=[stride] * 2),
                               helper.make_node("Relu", ["c"], ["y"])], "conv_relu",
                              [info("x", [1, inputs, height, width])], [info("y", out)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("mcpu", ["icelake-server", "haswell"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_convs_of_one_channel_block_run_their_rows_in_parallel(tmp_path, caplog, dtype, mcpu):
    """A conv whose output channels make a single register-tile block (a CRNN's 32 → 64 at 8 × 32,
    256 → 32 at 8²) has its rows in the parallel loop: reduced chunk by chunk, its only parallel
    loop had been the blocks' (one thread of two busy: 0.060 ms at one thread and at two, 0.034 now;
    onnxruntime 0.032), and a float16 conv whose weights dominate widened its panel between two
    loops fused for the threads, which TVM refused (the rule skipped, a generic schedule 64× slower
    on AVX2). The conv rule applies; values are onnxruntime's."""
    import logging

    caplog.set_level(logging.DEBUG, logger="amptool.compiler.cpu_schedules")
    for shape in ((32, 64, 8, 32), (256, 32, 8, 8)):
        path = tmp_path / f"conv{shape[0]}.onnx"
        model = _conv_relu(*shape)
        onnx.save(model, str(path))
        (conv,) = [k for k in scheduled_kernels(str(path), dtype, mcpu) if '"amp_conv2d_nhwc_update"' in k]
        tile = conv[:conv.index('T.sblock("amp_conv2d_nhwc_update")')]
        threads = re.findall(r"in T\.parallel\(T\.int64\((\d+)\)\)", tile)
        assert threads and int(threads[-1]) >= 8, conv
        assert "nhwc_conv2d skipped" not in caplog.text, caplog.text
    x = np.random.default_rng(17).standard_normal((1, 256, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out", target_options=[f"-mcpu={mcpu}"])
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


#: (input channels, output channels, height, width, kernel, stride): one channel block or many, weights
#: or activations dominating, a conv1d-like map, a pointwise conv, a strided one.
_SCHEDULED_CONVS = [(32, 64, 8, 32, 3, 1), (256, 32, 8, 8, 3, 1), (64, 48, 4, 64, 3, 1), (512, 512, 7, 7, 3, 1),
                    (64, 64, 1, 600, 3, 1), (1024, 256, 14, 14, 1, 1), (24, 144, 56, 56, 1, 1), (64, 128, 28, 28, 3, 2)]


@pytest.mark.parametrize("mcpu", ["icelake-server", "znver4", "haswell"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_no_schedule_rule_gives_up_on_a_conv(tmp_path, caplog, dtype, mcpu):
    """The schedule rules' errors are swallowed (the next rule, or a generic schedule, takes the
    kernel), so a rule that raises on a shape is silent: a float16 conv whose weights dominate had its
    rule skipped on AVX2, its generic schedule 64× slower. Across convs of the shapes networks have, no
    rule gives up."""
    import logging

    caplog.set_level(logging.DEBUG, logger="amptool.compiler.cpu_schedules")
    for inputs, outputs, height, width, kernel, stride in _SCHEDULED_CONVS:
        path = tmp_path / f"conv{inputs}_{outputs}_{height}x{width}.onnx"
        onnx.save(_conv_relu(inputs, outputs, height, width, kernel, stride), str(path))
        kernels = scheduled_kernels(str(path), dtype, mcpu)
        assert any(re.search(r'"amp_conv2d_nhwc(_bf16)?_update', k) for k in kernels), path.name
    assert "skipped" not in caplog.text, caplog.text


@pytest.mark.parametrize(("size", "per_row"), [(64, True), (16, False)])
def test_large_maps_copy_their_padded_input_a_row_band_at_a_time(tmp_path, size, per_row):
    """A padded conv whose input copy is ≥ ROW_COPY_BYTES (64 channels at 64²: 1.1 MB) makes it
    under the row loop, three rows per output row, instead of writing the whole padded map out
    and reading it back; a small map (16²) keeps the whole copy. Values are onnxruntime's."""
    rng = np.random.default_rng(14)
    w = numpy_helper.from_array((rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = x_to_y_model(nodes, "conv", [1, 64, size, size], [w])
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    (kernel,) = [k for k in scheduled_kernels(str(path), "float32", "icelake-server") if '"amp_nhwc_pad"' in k]
    copy_loop = kernel[:kernel.index('T.sblock("amp_nhwc_pad")')].rsplit("T.parallel", 1)[-1]
    assert ("n_y_fused" in kernel and "T.grid(T.int64(1), T.int64(3)" in copy_loop) == per_row, kernel
    x = rng.standard_normal((1, 64, size, size)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_a_tensor_read_by_several_nhwc_convs_is_transposed_once(tmp_path):
    """Two branches read the input (an Inception block, a transposed conv's phase convs): ConvertLayout
    gave each conv its own NCHW → NHWC copy; one serves both. Values stay onnxruntime's."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, k, k)) * 0.1).astype(np.float32), f"w{k}")
             for k in (1, 3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w3"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    path = tmp_path / "branches.onnx"
    onnx.save(x_to_y_model(nodes, "branches", [1, 16, 12, 12], inits), str(path))
    script = staged_module(str(path), "float32", "layout")["main"].script()
    assert script.count("R.permute_dims(x, ") == 1, script
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_convs_before_a_recurrent_layer_run_nhwc(tmp_path):
    """A text recogniser's shape: convs, then a GRU whose unrolled steps are stacked. TVM's layout
    rule for ``stack`` fails on every call, which kept the whole module (its convs too) in NCHW;
    stacks become concats first."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 1, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([2], np.int64), "axes"),
             numpy_helper.from_array((rng.standard_normal((1, 18, 8)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, 18, 6)) * 0.3).astype(np.float32), "R")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 1, 0, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Squeeze", ["r", "axes"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[2, 0, 1]),
             helper.make_node("GRU", ["t", "W", "R"], ["y"], hidden_size=6)]
    graph = helper.make_graph(nodes, "crnn", [info("x", [1, 4, 1, 12])], [info("y", [12, 1, 1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "crnn.onnx"
    onnx.save(model, str(path))
    assert '"amp_conv2d_nhwc_init"' in "\n".join(scheduled_kernels(str(path), "float32"))
    x = rng.standard_normal((1, 4, 1, 12)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_convs_around_a_dropout_run_nhwc(tmp_path):
    """Model-zoo exports (SqueezeNet, Inception-v1) keep a Dropout: TVM's layout pass refused the
    (output, mask) tuple of its converter and left every conv in NCHW. At inference it is the input
    and a mask of trues (bool, as onnxruntime's; TVM's was float)."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
             for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Dropout", ["a"], ["d", "mask"]),
             helper.make_node("Conv", ["d", "w1"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "dropout", [info("x", [1, 8, 10, 10])],
                              [info("y", [1, 8, 10, 10]), info("mask", [1, 8, 10, 10], TensorProto.BOOL)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "dropout.onnx"
    onnx.save(model, str(path))
    text = "\n".join(scheduled_kernels(str(path), "float32"))
    assert '"amp_conv2d_nhwc_init"' in text and '"amp_conv2d_init"' not in text
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
    assert np.asarray(got["mask"]).dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(got["mask"]), want[1])


def test_a_channels_last_block_between_convs_keeps_no_transposes(tmp_path):
    """ConvNeXt's block: conv, transpose to channels last, LayerNorm and a Linear, transpose back,
    the residual added in NCHW, then the next conv. In NHWC the transposes cancel: only the model's
    input and output are transposed (each block had a copy to NCHW and back for its residual add,
    and a transpose pair around each LayerNorm)."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.2).astype(np.float32), "lin"),
             numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(16, np.float32), "beta")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "lin"], ["m"]),
             helper.make_node("Transpose", ["m"], ["b"], perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["c", "b"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["y"])]
    model = x_to_y_model(nodes, "channels_last", [1, 16, 8, 8], inits)
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    script = staged_module(str(path), "float32", "layout")["main"].script()
    assert script.count("R.permute_dims(") == 2, script  # the input to NHWC, the output back
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
