"""Tensor cores for every float16 / bfloat16 matmul and convolution on CUDA.

TVM 0.27's DLight ``Matmul`` rule hands a GEMM to its tensor-core rule
(``MatmulTensorization``: wmma 16x16x16 fragments in dynamic shared memory, fp32 or fp16
accumulation) only when every extent of the GEMM exceeds 64, and only for float16. A BERT
attention product (K = 64 per head) or a ResNet convolution with 64 output channels or a 7x7
map then runs on the FMA units, and bfloat16 always does. ``TensorCoreMatmul`` calls TVM's own
``MatmulTensorization`` for every float16 GEMM-shaped kernel whatever its extents (its
``pad_einsum`` pads each dimension to the tile, so small extents cost idle lanes, not
correctness), and for bfloat16 on sm_80+ with fp32 accumulation. Convolutions count: DLight
reads a legalized conv2d as an implicit GEMM (output pixels x output channels x Cin·KH·KW), and
the schedule gathers the input patches into shared memory.

bfloat16: TVM registers wmma intrinsics for float16 and int8 only. ``register_bf16_wmma``
registers the bfloat16 ones from TVM's own generators (same descriptions, dtype changed;
CUDA's ``wmma::fragment<…, __nv_bfloat16, …>`` exists on sm_80+), and the schedule is
TVM's, run with its intrinsic-name lookup pointed at them (``_bf16_intrinsics``).

GEMV-shaped kernels (one output row, e.g. a classifier head at batch 1) are no GEMM to DLight
(an extent-1 axis is trivial) and go to its GEMV rule: they are memory-bound.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (
    MatmulTensorization,
    get_in_out_dtypes,
    get_index_map,
    get_reduction_blocks,
)

from amptool.compiler.targets import arch_version

#: Input dtype → (minimum sm version, accumulator dtypes TVM's schedule can tensorize).
TENSOR_CORE_DTYPES = {"float16": (70, ("float16", "float32")), "bfloat16": (80, ("float32",))}


def sm_version(target: Any) -> int:
    """80 for a CUDA target with arch sm_80 (90 for sm_90a: DLight's ``check_sm_version`` reads
    that as -1); -1 for anything else."""
    if str(target.kind.name) != "cuda":
        return -1
    return arch_version(str(target.attrs.get("arch", "")))


class TensorCoreMatmul(GPUScheduleRule):
    """Every float16/bfloat16 GEMM-shaped PrimFunc (matmul, batch matmul, conv) → TVM's wmma
    schedule (``MatmulTensorization``)."""

    def apply(self, func: Any, target: Any, tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc):
            return None
        if "dlight.do_not_tensorize" in func.attrs.keys():  # noqa: SIM118 (DictAttrs)
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        reduction = get_reduction_blocks(sch, blocks)
        if reduction is None:
            return None
        block = sch.get(reduction[0])
        if not get_index_map(block):  # not GEMM-shaped; one output row (a GEMV) is not either
            return None
        in_dtype, out_dtype = (str(d) for d in get_in_out_dtypes(block))
        min_sm, accumulators = TENSOR_CORE_DTYPES.get(in_dtype, (10**9, ()))
        if sm_version(target) < min_sm or out_dtype not in accumulators:
            return None
        if in_dtype == "bfloat16":
            register_bf16_wmma()
            with _bf16_intrinsics():
                return MatmulTensorization().apply(func, target, tunable)
        return MatmulTensorization().apply(func, target, tunable)


#: The bfloat16 intrinsics MatmulTensorization needs (it loads B transposed, accumulates fp32).
BF16_LOAD_A = "wmma_load_16x16x16_bf16_a_shared_dyn"
BF16_LOAD_B = "wmma_load_16x16x16_bf16_b_trans_shared_dyn"
BF16_SYNC = "wmma_sync_16x16x16_bf16bf16f32_trans"


@functools.cache
def register_bf16_wmma() -> None:
    """Register bfloat16 wmma load/sync intrinsics from TVM's generators (once per process)."""
    from tvm.s_tir import TensorIntrin  # noqa: PLC0415
    from tvm.s_tir.tensor_intrin import cuda  # noqa: PLC0415

    TensorIntrin.register(BF16_LOAD_A, *cuda.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn", False, False))
    TensorIntrin.register(BF16_LOAD_B, *cuda.get_wmma_load_intrin(16, 16, 16, "bfloat16", "shared.dyn", True, True))
    TensorIntrin.register(BF16_SYNC, *cuda.get_wmma_sync_intrin(16, 16, 16, "bfloat16", "float32", True))


@contextlib.contextmanager
def _bf16_intrinsics() -> Iterator[None]:
    """MatmulTensorization asks ``get_wmma_intrin_group`` for float16 names; within the block
    the fp32-accumulating group names the bfloat16 load and sync intrinsics instead (the fp16
    accumulating fallback is left as is: wmma has no bf16 accumulator, so it fails to match and
    the rule returns None). Restored on exit."""
    from tvm.s_tir.tensor_intrin import cuda  # noqa: PLC0415

    original = cuda.get_wmma_intrin_group

    def bf16_group(load_scope: str, store_scope: str, in_dtype: str, out_dtype: str, trans_b: bool) -> Any:
        group = dict(original(load_scope, store_scope, in_dtype, out_dtype, trans_b))
        if in_dtype == "float16" and out_dtype == "float32" and load_scope == "shared.dyn" and trans_b:
            group.update(load_a=BF16_LOAD_A, load_b=BF16_LOAD_B, compute=BF16_SYNC)
        return group

    cuda.get_wmma_intrin_group = bf16_group
    try:
        yield
    finally:
        cuda.get_wmma_intrin_group = original
