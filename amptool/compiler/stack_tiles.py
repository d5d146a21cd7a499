"""Register tiles on the stack: a CPU kernel's small scratch buffers kept out of TVM's workspace pool.

What: ``CPU_TIR_PIPELINE``, TVM's own TIR pipeline with three passes before ``LowerTVMBuiltin``:
``prefetch_chunks.PrefetchChunks`` (a chunked conv's next weights read ahead),
``dynamic_shares.DynamicShares`` (parallel loops claimed on demand), then this module's: each
``global`` buffer of a constant size from 1024 bytes up to ``STACK_TILE_BYTES`` is annotated to stay a stack
allocation (TVM's ``disable_lower_builtin``). ``split_codegen`` compiles LLVM targets with it.

Why: TVM turns every CPU allocation of 1024 bytes or more into a ``TVMBackendAllocWorkspace``
call — and a conv's register tile (16 AVX-512 accumulators: exactly 1024 bytes) is such an
allocation. LLVM cannot see through the pool's pointer, so each tile was zeroed by a ``memset``
call and stored to memory after its reduction, for an epilogue that reads it straight back. On
the stack the tile is promoted to registers: no ``memset``, no stores. Per-kernel sums at two
threads, alternated in one process (Ice Lake): MobileNetV2 0.927×, BERT-base 0.954×, ResNet-50
0.982× (its 56² 1×1 convs 8–22% faster at one thread); outputs bit-identical.

When not: GPU targets (a device allocation must stay the device API's), symbolic or zero sizes
(an empty tensor's buffer: LLVM's codegen refuses a zero-size stack allocation), buffers
over ``STACK_TILE_BYTES`` (a conv's whole-map accumulator is summed chunk after chunk in memory
anyway, and worker threads' stacks are not to be spent on it).
"""

from __future__ import annotations

import math
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx

from amptool.compiler.dynamic_shares import DynamicShares
from amptool.compiler.prefetch_chunks import PrefetchChunks

#: The largest buffer kept on the stack: a register tile is at most 32 × 64 bytes with AVX-512.
STACK_TILE_BYTES = 4096

#: TVM's ``runtime::kMaxStackAlloca``: smaller allocations are stack ones already.
TVMS_STACK_LIMIT = 1024

#: The registered name of the CPU pipeline (``tvm.compile(..., tir_pipeline=CPU_TIR_PIPELINE)``).
CPU_TIR_PIPELINE = "amptool_cpu"

#: TVM's ``transform::kDisableLowerTVMBuiltin``: the allocation stays an ``alloca``.
_ON_STACK = "disable_lower_builtin"


def tir_pipeline_for(target: Any) -> str:
    """The TIR pipeline to compile ``target``'s kernels with."""
    return CPU_TIR_PIPELINE if str(target.kind.name) == "llvm" else "default"


def buffer_bytes(buffer: Any) -> int:
    """A TIR buffer's bytes; TypeError for a symbolic shape."""
    return math.prod(int(d) for d in buffer.shape) * buffer.dtype.bits * buffer.dtype.lanes // 8


def _on_stack(alloc: Any) -> Any:
    buffer = alloc.buffer
    try:
        size = buffer_bytes(buffer)
    except TypeError:  # a symbolic extent
        return alloc
    if buffer.scope() != "global" or not TVMS_STACK_LIMIT <= size <= STACK_TILE_BYTES:
        return alloc  # below TVM's own limit it is on the stack already (or empty: TVM's pool serves it)
    annotations = dict(alloc.annotations) if alloc.annotations else {}
    annotations[_ON_STACK] = tirx.IntImm("bool", 1)  # TVM's pass refuses a Python bool
    return tirx.AllocBuffer(buffer, annotations, alloc.span)


def _keep_tiles_on_stack(func: Any, _mod: Any, _ctx: Any) -> Any:
    return tvm_ffi.structural_map(func, (tirx.AllocBuffer, _on_stack))


KeepTilesOnStack = tirx.transform.prim_func_pass(_keep_tiles_on_stack, opt_level=0, name="KeepTilesOnStack")


def _cpu_pipeline() -> tuple[Any, Any, Any]:
    """TVM's default pipeline, ``PrefetchChunks``, ``DynamicShares`` and ``KeepTilesOnStack`` first
    among the host's finalizing passes (``PrefetchChunks`` before the parallel loops are cut; a
    loop's segment counters are a buffer ``KeepTilesOnStack`` may keep on the stack)."""
    pipeline, finalize_host, finalize_device = tirx.get_tir_pipeline("default")
    passes = [PrefetchChunks, DynamicShares, KeepTilesOnStack]
    return pipeline, lambda: tvm.ir.transform.Sequential([*passes, finalize_host()]), finalize_device


tirx.register_tir_pipeline(CPU_TIR_PIPELINE, _cpu_pipeline)
