"""``prefetch_chunks``: a conv reduced chunk by chunk prefetches its next chunk's weights, spread
over the tiles of the current chunk, without changing what it computes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm.script import tirx as T

from amptool import _tvm
from amptool.compiler import stack_tiles
from amptool.compiler.cpu_nhwc import pack_conv_weight, weight_geometry
from amptool.compiler.prefetch_chunks import BURST_LINES, NEXT_CHUNK, chunk_plan
from amptool.compiler.targets import host_llvm_spec
from tests.onnx_checks import onnxruntime_and_amptool, x_to_y_model
from tests.test_cpu_nhwc import _two_convs

LANES = 16

#: The prefetch call in a kernel's TIR.
_PREFETCH = r'T\.call_extern\("void", "amptool_prefetch_l2"'


def _chunked_kernel(blocks: int, rows: int, chunks: int, chunk: int) -> Any:
    """``out[c, y, :] = Σ_k x[y, k] · w[c, k // chunk, k % chunk, :]``, reduced chunk by chunk
    outside the rows — a chunked conv's loop nest, its chunk loop marked as the schedule marks it."""

    @T.prim_func(s_tir=True)
    def chunked(x: T.Buffer((rows, chunks * chunk), "float32"), w: T.Buffer((blocks, chunks, chunk, LANES), "float32"),
                out: T.Buffer((blocks, rows, LANES), "float32")):
        T.func_attr({"global_symbol": "chunked", "tirx.noalias": True})
        for c in T.parallel(blocks):
            for y, lane in T.grid(rows, LANES):
                with T.sblock("init"):
                    vc, vy, vl = T.axis.remap("SSS", [c, y, lane])
                    out[vc, vy, vl] = T.float32(0)
            for rco in T.serial(chunks, annotations={NEXT_CHUNK: chunk_plan(chunk * LANES, "w")}):
                for y, k in T.grid(rows, chunk):
                    for lane in T.vectorized(LANES):
                        with T.sblock("sum"):
                            vc, vr, vy, vk, vl = T.axis.remap("SRSRS", [c, rco, y, k, lane])
                            out[vc, vy, vl] = out[vc, vy, vl] + x[vy, vr * chunk + vk] * w[vc, vr, vk, vl]

    return chunked


@tvm.instrument.pass_instrument
class _AfterPrefetch:
    """The kernel's TIR right after ``PrefetchChunks``."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run_after_pass(self, module: Any, info: Any) -> None:
        if info.name == "PrefetchChunks":
            self.scripts.append(module.script())


def _built(blocks: int, rows: int, chunks: int, chunk: int) -> tuple[str, str, str]:
    """(TIR after the pass, LLVM IR, assembly) of the kernel built with amptool's CPU pipeline;
    checks its output against numpy's."""
    seen = _AfterPrefetch()
    with tvm.transform.PassContext(instruments=[seen]):
        lib = tvm.compile(tvm.IRModule({"chunked": _chunked_kernel(blocks, rows, chunks, chunk)}),
                          target=_tvm.make_target(host_llvm_spec()), tir_pipeline=stack_tiles.CPU_TIR_PIPELINE)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, chunks * chunk)).astype(np.float32)
    w = rng.standard_normal((blocks, chunks, chunk, LANES)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((blocks, rows, LANES), np.float32))
    lib["chunked"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    want = np.einsum("yk,ckl->cyl", x.astype(np.float64), w.reshape(blocks, chunks * chunk, LANES).astype(np.float64))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4)
    return seen.scripts[-1], lib.mod.inspect_source("ll"), lib.mod.inspect_source("asm")


def test_few_lines_a_tile_are_prefetched_at_each_tile():
    """32 lines a chunk over 4 rows: 8 lines (≤ ``BURST_LINES``) at the start of each row, from
    the element after the chunk (row ``y`` its ``y``-th eighth); the intrinsic call narrowed to
    inaccessible memory, and the CPU's ``prefetcht1`` in the code."""
    assert BURST_LINES >= 32 // 4
    tir, llvm_ir, asm = _built(blocks=2, rows=4, chunks=3, chunk=32)
    assert re.search(r"for y in range\(4\):\s*for line in range\(8\):\s*" + _PREFETCH, tir), tir
    # The next chunk starts chunk × 16 = 512 elements on; 16 floats a line.
    index = r"c \* 1536 \+ rco \* 512 .*\+ 512 \+ \(T\.Cast\(\"int32\", y\) \* 8 \+ line\) \* 16, 3071\)"
    assert re.search(index, tir), tir
    assert "inaccessiblemem: readwrite" in llvm_ir
    assert "prefetcht1" in asm


def test_a_tile_of_many_lines_spreads_them_over_groups_of_the_innermost_loop():
    """128 lines a chunk over 2 rows (64 a row, more than a burst): the innermost loop (128 steps)
    runs in 64 groups of 2, one line before each group — the next chunk's lines in order."""
    tir, _, _ = _built(blocks=2, rows=2, chunks=2, chunk=128)
    assert re.search(r"for y, k_group in T\.grid\(2, 64\):\s*" + _PREFETCH, tir), tir
    assert re.search(r"for k_step in range\(2\):", tir), tir
    # Group g of row y: line (64·y + g) · 128 lines // 128 points, the product in 64 bits.
    assert ('T.Cast("int64", T.Cast("int32", y) * 64 + T.Cast("int32", k_group)) * T.int64(128) // T.int64(128)) * 16'
            in tir), tir


def test_chunked_weights_are_one_run_a_chunk():
    """``[OC/B, IC/K, KH, KW, K, B]``: each chunk's weights (all taps of its K input channels)
    one run, read back by ``weight_geometry``."""
    w = np.random.default_rng(1).standard_normal((64, 48, 3, 3)).astype(np.float32)
    packed = pack_conv_weight(w, 32, chunk=16)
    assert packed.shape == (2, 3, 3, 3, 16, 32)
    assert weight_geometry(packed) == (2, 3, 3, 48, 16)
    b, q, i, j, k, lane = 1, 2, 0, 2, 5, 7
    assert packed[b, q, i, j, k, lane] == w[b * 32 + lane, q * 16 + k, i, j]
    assert weight_geometry(pack_conv_weight(w, 32)) == (2, 3, 3, 48, None)


@pytest.mark.parametrize("mcpu", ["znver4", "haswell"])
def test_only_chunked_convs_are_marked(tmp_path, mcpu):
    """An AVX-512 build chunks the 3×3 × 256 (weights 2.4 MB beside 16 KB) and marks its chunk
    loop; an AVX2 one does not chunk (measured slower there) and marks nothing."""
    from tests.conftest import scheduled_kernels

    path = tmp_path / "convs.onnx"
    onnx.save(_two_convs(), str(path))
    text = "\n".join(scheduled_kernels(str(path), "float32", mcpu))
    assert text.count(f'"{NEXT_CHUNK}"') == (1 if mcpu == "znver4" else 0)


def _feed_forward(rows: int) -> onnx.ModelProto:
    """``x [1, rows, 256] → MatMul 256 × 1024 → Relu → MatMul 1024 × 256 → y``: a transformer's
    feed-forward block (1 MB of weights each)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), n)
             for n, s in (("w1", (256, 1024)), ("w2", (1024, 256)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return x_to_y_model(nodes, "feed_forward", [1, rows, 256], inits)


@pytest.mark.parametrize(("rows", "marked"), [(64, 2), (1, 0)])
def test_matmuls_prefetch_the_next_panel_over_their_row_tiles(tmp_path, rows, marked):
    """Each matmul of 64 rows marks its loop over column blocks × row tiles (more than one tile a
    panel); a one-row matmul (a GEMV: each panel read once) marks nothing. Values are onnxruntime's."""
    from tests.conftest import scheduled_kernels

    path = tmp_path / "ffn.onnx"
    onnx.save(_feed_forward(rows), str(path))
    kernels = scheduled_kernels(str(path), "float32", "znver4")
    plans = [re.search(r'"amp_prefetch_next": \{"elements": (\d+), "tiles": (\d+), "weight": "(\w+)"\}', k)
             for k in kernels]
    plans = [p for p in plans if p]
    assert len(plans) == marked, kernels
    for plan in plans:  # a whole panel (K × a block of columns), several row tiles
        assert int(plan[1]) % 256 == 0 and int(plan[2]) > 1
    x = np.random.default_rng(4).standard_normal((1, rows, 256)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize(("rows", "widened"), [(64, True), (8, False)])
def test_float16_matmuls_widen_each_panel_once_for_its_row_tiles(tmp_path, rows, widened):
    """A float16 matmul of 64 rows converts each column block's weight panel to float32 once
    (``amp_widen``, under its loop over blocks) for its row tiles, the next panel prefetched over the
    tiles' reads of the widened one; with two row tiles a panel (8 rows) each tile converts what it
    reads and the loop over blocks × row tiles is marked as a float32 one. Values are onnxruntime's
    within float16 rounding."""
    from tests.conftest import scheduled_kernels

    path = tmp_path / "ffn.onnx"
    onnx.save(_feed_forward(rows), str(path))
    matmuls = [k for k in scheduled_kernels(str(path), "float16", "znver4") if '"amp_matmul_init"' in k]
    assert len(matmuls) == 2
    for kernel in matmuls:
        assert ('T.sblock("amp_widen")' in kernel) == widened, kernel
        plan = re.search(r'"amp_prefetch_next": \{[^}]*\}', kernel)
        assert plan is not None and ('"over": "amp_widen"' in plan[0]) == widened, kernel
    x = np.random.default_rng(4).standard_normal((1, rows, 256)).astype(np.float32)
    want, got = onnxruntime_and_amptool(str(path), {"x": x}, dtype="float16")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * float(np.abs(want).max()))
