"""``stack_tiles``: CPU kernels keep register-tile-sized scratch buffers on the stack, larger ones in
TVM's workspace pool, and compute the same either way."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm.script import tirx as T

import amptool
from amptool import _tvm
from amptool.compiler import stack_tiles
from tests.onnx_checks import x_to_y_model


def _tile_kernel(columns: int):
    """Rows in parallel, each summing into a ``columns``-float scratch row before an epilogue reads
    it: the shape of a conv's register tile (256 floats: the 1024 bytes of 16 AVX-512 vectors)."""

    @T.prim_func(s_tir=True)
    def tile(a: T.Buffer((8, columns), "float32"), b: T.Buffer((8, columns), "float32")):
        T.func_attr({"global_symbol": "tile", "tirx.noalias": True})
        acc = T.sblock_alloc_buffer((8, columns), "float32")
        for i in T.parallel(8):
            for j in range(columns):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    acc[vi, vj] = T.float32(0)
            for k, j in T.grid(4, columns):
                with T.sblock("sum"):
                    vi, vk, vj = T.axis.remap("SRS", [i, k, j])
                    acc[vi, vj] = acc[vi, vj] + a[vi, vj] * T.float32(vk + 1)
            for j in range(columns):
                with T.sblock("out"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    b[vi, vj] = acc[vi, vj] + T.float32(1)

    return tile


def _compiled(columns: int, pipeline: str):
    """(the LLVM IR, the output on seeded input) of the kernel built with ``pipeline``."""
    target = _tvm.make_target({"kind": "llvm"})
    lib = tvm.compile(tvm.IRModule({"tile": _tile_kernel(columns)}), target=target, tir_pipeline=pipeline)
    x = np.random.default_rng(0).standard_normal((8, columns)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((8, columns), np.float32))
    lib["tile"](tvm.runtime.tensor(x), out)
    np.testing.assert_allclose(out.numpy(), x * 10 + 1, rtol=1e-6, atol=1e-6)
    return lib.mod.inspect_source("ll"), out.numpy()


@pytest.mark.parametrize(("columns", "on_stack"), [(256, True), (stack_tiles.STACK_TILE_BYTES // 4, True),
                                                   (stack_tiles.STACK_TILE_BYTES // 4 + 16, False)])
def test_a_tile_up_to_the_limit_stays_on_the_stack(columns, on_stack):
    tvms_ir, tvms_out = _compiled(columns, "default")
    ours_ir, ours_out = _compiled(columns, stack_tiles.CPU_TIR_PIPELINE)
    assert "TVMBackendAllocWorkspace" in tvms_ir  # TVM's own rule: 1024 bytes or more go to the pool
    assert ("TVMBackendAllocWorkspace" not in ours_ir) == on_stack
    np.testing.assert_array_equal(ours_out, tvms_out)


def test_only_cpu_targets_take_the_pipeline():
    assert stack_tiles.tir_pipeline_for(_tvm.make_target({"kind": "llvm"})) == stack_tiles.CPU_TIR_PIPELINE
    assert stack_tiles.tir_pipeline_for(_tvm.make_target({"kind": "cuda", "arch": "sm_90"})) == "default"


@tvm.instrument.pass_instrument
class _PassNames:
    def __init__(self) -> None:
        self.names: list[str] = []

    def run_before_pass(self, _mod, info) -> None:
        self.names.append(info.name)


def test_a_cpu_convert_compiles_its_kernels_with_the_pipeline(tmp_path):
    """Every kernel of an llvm build passes through ``KeepTilesOnStack`` (split over threads or not)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((64, 64, 1, 1)) * 0.1).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    onnx.save(x_to_y_model(nodes, "conv_relu", [1, 64, 8, 8], [weight]), tmp_path / "m.onnx")
    names = _PassNames()
    with tvm.transform.PassContext(instruments=[names]):
        amptool.convert(tmp_path / "m.onnx", dtype="float32", output=tmp_path / "out")
    assert names.names.count("KeepTilesOnStack") >= 1
    assert names.names.count("KeepTilesOnStack") == names.names.count("tirx.LowerTVMBuiltin")
