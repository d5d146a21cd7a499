"""Schedule rules for the bfloat16 kernels: ``packed_conv2d``/``packed_matmul``/``nhwc_conv2d``'s
register tiles with each 16-channel × input-pair step one ``vdpbf16ps``
(:mod:`amptool.compiler.cpu_intrinsics`).

When not: targets without AVX512-BF16 never produce these blocks (``cpu_kernels`` checks the
target first). Preserves: values up to the instruction's rounding (see ``cpu_intrinsics``).
"""

from __future__ import annotations

from typing import Any

from amptool.compiler.cpu_intrinsics import DOT_BF16, LLVM_IR
from amptool.compiler.cpu_kernels import CONV2D_BF16_BLOCK, MATMUL_BF16_BLOCK
from amptool.compiler.cpu_nhwc import CONV2D_NHWC_BF16_BLOCK
from amptool.compiler.cpu_schedules import (
    Tiling,
    _conv_tile,
    _divisor,
    _epilogue_at,
    _extent,
    _find_block,
    _parallel,
    _schedule_prologue,
    try_inline,
)
from amptool.compiler.cpu_schedules_nhwc import nhwc_tile


def packed_conv2d_bf16(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_conv2d_bf16``: ``packed_conv2d``'s tile, each 16-channel × input-pair step one
    ``vdpbf16ps`` (:mod:`amptool.compiler.cpu_intrinsics`)."""
    conv = _find_block(sch, CONV2D_BF16_BLOCK)
    if conv is None:
        return None
    tiled = _conv_tile(sch, conv, 16, max(1, tiling.accumulators // 2))
    if tiled is None:
        return None
    outer, first_reduction, xi, ci, _epilogue = tiled
    return _dot_tile(sch, conv, outer, first_reduction, xi, ci, tiling)


def nhwc_conv2d_bf16(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_conv2d_nhwc_bf16``: ``cpu_schedules_nhwc``'s tile, 16 channels × one input pair per
    ``vdpbf16ps``."""
    conv = _find_block(sch, CONV2D_NHWC_BF16_BLOCK)
    if conv is None:
        return None
    tiled = nhwc_tile(sch, conv, 16, tiling)
    if tiled is None:
        return None
    outer, reductions, xi, ci, epilogue = tiled
    sch.vectorize(sch.get_loops(epilogue)[-1])
    return _dot_tile(sch, conv, outer, reductions[0], xi, ci, tiling)


def _dot_tile(sch: Any, conv: Any, outer: list[Any], first_reduction: Any, xi: Any, ci: Any, tiling: Tiling) -> Any:
    """The tail both conv rules share: columns unrolled, outer loops parallel (importing the
    intrinsic's LLVM function), the reduction's init split off, the producers scheduled, and the
    16-channel step tensorized."""
    sch.unroll(xi)
    parallel = _parallel(sch, outer, tiling)
    sch.annotate(parallel, "pragma_import_llvm", LLVM_IR)
    init = sch.decompose_reduction(conv, first_reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    _inline_into_pairs(sch, conv)
    _schedule_prologue(sch, conv, parallel, tiling)
    sch.tensorize(ci, DOT_BF16)  # last: the block is replaced
    return sch


def _inline_into_pairs(sch: Any, block: Any) -> None:
    """Compute the elementwise producers of ``block``'s pairs stage (a fused cast to bfloat16)
    inside it. Left at the root, a cast ran as a serial loop over the whole input — after TVM's
    bfloat16 legalization a plain float32 copy (a memcpy per BERT projection, ~5% of a run)."""
    for pairs in sch.get_producers(block):
        for producer in sch.get_producers(pairs):
            try_inline(sch, producer)  # not inlinable (a reduction, a pad read twice): stays at the root


def packed_matmul_bf16(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_matmul_bf16``: rows × 16 columns, each 16-column × k-pair step one ``vdpbf16ps``."""
    mm = _find_block(sch, MATMUL_BF16_BLOCK)
    if mm is None:
        return None
    *batch, m, n, rp = list(sch.get_loops(mm))
    if batch and _extent(sch, m) == 1:
        # One row per item (a sequence-first [S, 1, E]): the items are the rows, so a tile holds
        # several and reads the weight once for them ([128, 1, 768] · [768, 768] 2.0 → 0.4 ms, as
        # [1, 128, 768]); the unit row loop goes outside with the other batch loops.
        batch, m = [*batch[:-1], m], batch[-1]
    m_rows = _extent(sch, m)
    if m_rows is None or any(_extent(sch, loop) is None for loop in batch):
        return None
    tile = _divisor(m_rows, max(1, tiling.accumulators // 2)) or 1
    # Batch loops stay separate from the rows (as packed_matmul's within an item): tensorize
    # blockizes the tile, which fails on the // and % bindings a fused batch×rows split leaves
    # (BERT's [2, 16, 128] projections then fell back to a scalar kernel, 10× slower than float32).
    ro, ri = sch.split(m, [None, tile])
    no, ni = sch.split(n, [None, 16])
    sch.reorder(no, *batch, ro, rp, ri, ni)
    epilogue = _epilogue_at(sch, mm, ro)
    sch.vectorize(sch.get_loops(epilogue)[-1])
    sch.unroll(ri)
    parallel = _parallel(sch, [no, *batch, ro], tiling)
    sch.annotate(parallel, "pragma_import_llvm", LLVM_IR)
    init = sch.decompose_reduction(mm, rp)
    sch.vectorize(sch.get_loops(init)[-1])
    # The pairs stage gathers every other element of a row; vectorized it took LLVM minutes and
    # runs no faster than the scalar loop (it is ~5% of the matmul).
    _inline_into_pairs(sch, mm)
    _schedule_prologue(sch, mm, parallel, tiling, vectorize=False)
    sch.tensorize(ni, DOT_BF16)  # last: the block is replaced
    return sch
