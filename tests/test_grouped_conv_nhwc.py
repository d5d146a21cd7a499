"""Grouped convs whose groups hold whole vectors of output channels (RegNet's 64-channel groups; its
24-channel ones on AVX2) run as the NHWC conv kernel, each channel block reading its own group's
inputs; narrower groups keep the grouped NCHW kernel. Values against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import amptool
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import scheduled_kernels
from tests.onnx_checks import info

tvm = pytest.importorskip("tvm")


def _grouped(groups: int, per_group_in: int, per_group_out: int, stride: int, size: int = 15) -> onnx.ModelProto:
    """conv 3×3 (groups) + bias + ReLU, then a 1×1 conv mixing the groups; odd sizes."""
    rng = np.random.default_rng(groups * 100 + stride)
    cin, cout = groups * per_group_in, groups * per_group_out
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in
             (("w", (cout, per_group_in, 3, 3)), ("b", (cout,)), ("w2", (8, cout, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=groups, strides=[stride, stride],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    out = (size - 1) // stride + 1
    graph = helper.make_graph(nodes, "grouped", [info("x", [1, cin, size, size + 2])],
                              [info("y", [1, 8, out, (size + 1) // stride + 1 if stride > 1 else size + 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("groups", "per_in", "per_out", "stride"), [
    (2, 16, 16, 1), (2, 24, 32, 2), (4, 8, 16, 1), (3, 64, 64, 2),
])
@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("bfloat16", 6e-2)])
def test_wide_groups_run_the_nhwc_conv_and_match_onnxruntime(tmp_path: Path, groups: int, per_in: int,
                                                             per_out: int, stride: int, dtype: str,
                                                             tolerance: float) -> None:
    """Each channel block's inputs are its group's: a block reading another group's channels (or
    the whole input) gives wrong values. The grouped NCHW kernel ran RegNet's 64-channel groups at
    a tenth of the FMA rate (32.9 → 4.0 ms at one thread; onnxruntime 3.8). Scheduled for a CPU
    without AMX (whose tiles take bfloat16 groups of 32 channels or more, one conv a group:
    ``amx_groups``); the values are this host's build's."""
    model = _grouped(groups, per_in, per_out, stride)
    path = tmp_path / "grouped.onnx"
    onnx.save(model, str(path))
    text = "\n".join(scheduled_kernels(str(path), dtype, "znver4"))
    assert '"amp_conv2d_nhwc_init"' in text and '"amp_depthwise' not in text
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    x = x.astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype=dtype, output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


def test_narrow_groups_keep_the_grouped_kernel(tmp_path: Path) -> None:
    """4 output channels per group (no whole vector on any x86 target): the grouped NCHW kernel."""
    path = tmp_path / "narrow.onnx"
    onnx.save(_grouped(8, 4, 4, 1), str(path))
    assert '"amp_depthwise' in "\n".join(scheduled_kernels(str(path), "float32"))


def _host_lanes() -> int:
    from amptool import _tvm
    from amptool.compiler.cpu_kernels import vector_lanes

    return vector_lanes(_tvm.make_target(host_llvm_spec()))


def test_groups_of_whole_target_vectors_run_the_nhwc_conv(tmp_path: Path) -> None:
    """RegNet's 24-channel groups: three AVX2 vectors — the NHWC conv with a three-vector tile on
    an AVX2 build (it ran 3.1× onnxruntime in the NCHW grouped kernel), the grouped kernel where a
    vector is 16 lanes. Values against onnxruntime either way."""
    model = _grouped(6, 24, 24, 1, size=14)
    path = tmp_path / "regnet_groups.onnx"
    onnx.save(model, str(path))
    text = "\n".join(scheduled_kernels(str(path), "float32"))
    assert ('"amp_depthwise' not in text) == (24 % _host_lanes() == 0)
    x = np.random.default_rng(2).standard_normal([1, 144, 14, 16]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = np.asarray(amptool.load(tmp_path / "out").run({"x": x})["y"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_an_empty_map_keeps_the_grouped_kernel(tmp_path: Path) -> None:
    """A zero-width map has no register tile to plan (the NHWC kernel's split divided by zero):
    it stays NCHW, and its empty result is a kernel that writes nothing (tests/test_empty_tensors.py)."""
    w = numpy_helper.from_array(np.full((32, 16, 3, 3), 0.1, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])], "empty",
                              [info("x", [1, 32, 8, 0])], [info("y", [1, 32, 8, 0])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "empty.onnx"
    onnx.save(model, str(path))
    amptool.convert(path, dtype="float32", output=tmp_path / "out")
    got = amptool.load(tmp_path / "out").run({"x": np.zeros((1, 32, 8, 0), np.float32)})["y"]
    assert np.asarray(got).shape == (1, 32, 8, 0)
