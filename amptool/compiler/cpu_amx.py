"""bfloat16 matmuls and convs on Intel AMX tiles: constant weights, float32 results.

What: each task computes a 32 × 32 output block as four 16 × 16 float32 tiles, with every 32-deep
step of ``K`` two A tiles (16 rows × 32 bfloat16) and two B tiles (16 ``k`` pairs × 16 columns ×
2) feeding four ``tdpbf16ps`` — 32 768 multiply-adds per four instructions. The micro-kernel is
LLVM IR (:data:`LLVM_IR`) imported into the module with ``pragma_import_llvm`` and called from a
hand-written PrimFunc that walks the blocks in parallel; A is read where it lies (rows are
``K`` bfloat16 apart), B is the weight packed at compile time as ``[N/16, K/2, 16, 2]`` (the
layout ``vdpbf16ps`` kernels use), zero columns padding ``N`` to 32s. A 1×1 stride-1 NHWC conv
is that matmul over its pixels; any other NHWC conv (``cpu_amx_conv``) sums the same
micro-kernel over its taps, each an offset into zero-padded phase images of the input (one per
stride phase: a strided read becomes a stride-1 one), channels padded to 32s.

Why: an AMX server core's ``vdpbf16ps`` runs at half its float32 FMA rate (``cpu_speed``), so
without tiles bfloat16 was no faster than float32, while OpenVINO's bfloat16 uses them: on the
Sapphire-Rapids-class VM this was written on, BERT-base bf16 took 84.9 ms against OpenVINO's
22.6, ResNet-50 31.1 against 6.9. A 128 × 768 × 768 product takes 0.15 ms on two cores here
(~1 TFLOP/s), numpy's float32 0.64. With them (``cpu_speed.py``, 2 threads): BERT-base bf16 84.9 →
21.7 ms, ResNet-50 31.1 → 7.8 ms (float32 29.6), the epilogues inside (``amx_epilogues``) kernel
sum 8.4 → 6.8 ms; benchmarks/README.md has the steps.

When: the target has AMX-BF16 and AMX-TILE (``-mattr`` from the host's flags when the VM's model
number hides them: ``_tvm.host_feature_corrections``), the inputs are bfloat16 accumulated in
float32, and there are at least 32 rows (a tail block is moved back to end at the last row: rows
computed twice, equal) — ``amx_plan`` decides; a matmul's ``K`` a multiple of 32 or one even step
under 32 (the tile configuration's A row bytes and B rows shortened for it; a conv pads its
channels). Fewer rows (a decode step's one) stay on the vector kernels, which the weights' memory
traffic bounds either way.

A task is a strip of blocks, a column block over the row blocks or a row block over the column
blocks, whichever walks the larger operand once; tasks are dealt to parallel workers in contiguous
runs (``parallel_workers``), each loading the tile configuration (palette 1, eight 16 × 64-byte
tiles) once and keeping its epilogue tile on its stack.

Linux hands a process the AMX state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``; without it the first tile instruction is SIGILL): the micro-kernel makes
that system call itself (``_CONFIGURE``, once per loaded library), so the exported ``.so`` runs
in any process.

Numerics: ``tdpbf16ps`` adds each pair's products in float32 with round-to-nearest-even and
treats bfloat16 denormal inputs as zero — rounding-level differences from a sequential sum, as
``vdpbf16ps``.
"""

# TVMScript buffer annotations are calls, which mypy rejects.
# mypy: disable-error-code="valid-type"
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Rows and columns of the output block one micro-kernel call computes (2 × 2 tiles of 16 × 16).
BLOCK = 32
#: ``K`` per step: one A tile row holds 32 bfloat16 (64 bytes).
DEPTH = 32
_FUNCTION = "amptool_amx_bf16_32x32"
#: Asks Linux for the tile state (once per library) and loads the tile configuration: once per
#: parallel task, before its blocks (the configuration is per thread, and every kernel here uses one).
_CONFIGURE = "amptool_amx_configure"
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

#: ``C[32, 32] = Σ_taps A_tap[32, K] · B_tap`` — a matmul is one tap; a conv's taps are the kernel's
#: (row, column) offsets into a zero-padded image, ``A_t = a + offsets[t]`` bytes. ``ldc``/``lda``:
#: the row strides of C and A in bytes; ``ldb``: the bytes from one 16-column weight block to the
#: next; ``steps``: K / 32 per tap (B runs on through the taps). Tiles 0-3 hold C, 4-5 A, 6-7 B,
#: all 16 rows × 64 bytes (palette 1): one configuration serves every call.
LLVM_IR = f"""
@amptool_amx_permitted = internal global i32 0
declare i64 @syscall(i64, ...)
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8)
declare void @llvm.x86.tileloadd64(i8, ptr, i64)
declare void @llvm.x86.tdpbf16ps(i8, i8, i8)
declare void @llvm.x86.tilestored64(i8, ptr, i64)
define void @{_CONFIGURE}(i64 %a_bytes, i64 %b_rows) alwaysinline {{
entry:
  %config = alloca [64 x i8], align 64
  %permitted = load i32, ptr @amptool_amx_permitted
  %known = icmp ne i32 %permitted, 0
  br i1 %known, label %configure, label %request
request:
  %ignored = call i64 (i64, ...) @syscall(i64 {_SYS_ARCH_PRCTL}, i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})
  store i32 1, ptr @amptool_amx_permitted
  br label %configure
configure:
  store <4 x i128> zeroinitializer, ptr %config, align 64
  store i8 1, ptr %config
  %colsb = getelementptr i8, ptr %config, i64 16
  store <8 x i16> <i16 64, i16 64, i16 64, i16 64, i16 64, i16 64, i16 64, i16 64>, ptr %colsb
  %rows = getelementptr i8, ptr %config, i64 48
  store <8 x i8> <i8 16, i8 16, i8 16, i8 16, i8 16, i8 16, i8 16, i8 16>, ptr %rows
  %a_colsb = trunc i64 %a_bytes to i16
  %a4 = getelementptr i8, ptr %config, i64 24
  store i16 %a_colsb, ptr %a4
  %a5 = getelementptr i8, ptr %config, i64 26
  store i16 %a_colsb, ptr %a5
  %b_count = trunc i64 %b_rows to i8
  %b6 = getelementptr i8, ptr %config, i64 54
  store i8 %b_count, ptr %b6
  %b7 = getelementptr i8, ptr %config, i64 55
  store i8 %b_count, ptr %b7
  call void @llvm.x86.ldtilecfg(ptr %config)
  ret void
}}
define void @{_FUNCTION}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps, ptr %offsets,
                         i64 %taps) alwaysinline {{
entry:
  call void @llvm.x86.tilezero(i8 0)
  call void @llvm.x86.tilezero(i8 1)
  call void @llvm.x86.tilezero(i8 2)
  call void @llvm.x86.tilezero(i8 3)
  %a16 = mul i64 %lda, 16
  %b1 = getelementptr i8, ptr %b, i64 %ldb
  br label %tap
tap:
  %t = phi i64 [0, %entry], [%next_tap, %tap_done]
  %t_at = getelementptr i64, ptr %offsets, i64 %t
  %t_offset = load i64, ptr %t_at
  %a0 = getelementptr i8, ptr %a, i64 %t_offset
  %a1 = getelementptr i8, ptr %a0, i64 %a16
  %t_steps = mul i64 %t, %steps
  br label %step
step:
  %s = phi i64 [0, %tap], [%next, %step]
  %aoff = mul i64 %s, 64
  %k = add i64 %t_steps, %s
  %boff = mul i64 %k, 1024
  %pa0 = getelementptr i8, ptr %a0, i64 %aoff
  %pa1 = getelementptr i8, ptr %a1, i64 %aoff
  %pb0 = getelementptr i8, ptr %b, i64 %boff
  %pb1 = getelementptr i8, ptr %b1, i64 %boff
  call void @llvm.x86.tileloadd64(i8 4, ptr %pa0, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 5, ptr %pa1, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 6, ptr %pb0, i64 64)
  call void @llvm.x86.tileloadd64(i8 7, ptr %pb1, i64 64)
  call void @llvm.x86.tdpbf16ps(i8 0, i8 4, i8 6)
  call void @llvm.x86.tdpbf16ps(i8 1, i8 4, i8 7)
  call void @llvm.x86.tdpbf16ps(i8 2, i8 5, i8 6)
  call void @llvm.x86.tdpbf16ps(i8 3, i8 5, i8 7)
  %next = add i64 %s, 1
  %done = icmp eq i64 %next, %steps
  br i1 %done, label %tap_done, label %step
tap_done:
  %next_tap = add i64 %t, 1
  %all = icmp eq i64 %next_tap, %taps
  br i1 %all, label %store, label %tap
store:
  %c16 = mul i64 %ldc, 16
  %c1 = getelementptr i8, ptr %c, i64 64
  %c2 = getelementptr i8, ptr %c, i64 %c16
  %c3 = getelementptr i8, ptr %c2, i64 64
  call void @llvm.x86.tilestored64(i8 0, ptr %c, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 1, ptr %c1, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 2, ptr %c2, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 3, ptr %c3, i64 %ldc)
  ret void
}}
"""


def has_amx_bf16(target: Any) -> bool:
    """Whether ``target`` (an LLVM Target) has AMX tiles with bfloat16 products."""
    from tvm.target.codegen import target_has_features  # noqa: PLC0415

    try:
        return bool(target_has_features("amx-bf16", target)) and bool(target_has_features("amx-tile", target))
    except Exception:  # noqa: BLE001 - not an x86 target
        return False


def fits(rows: int, k: int) -> bool:
    """Whether a ``[rows, k]`` bfloat16 left operand suits the micro-kernel (see the module doc):
    ``k`` in 32-deep steps, or one shorter even step (A tiles of ``k`` values, B tiles of ``k/2``
    pairs: MobileNetV2's 16- and 24-channel 1×1 convs read their input as it is)."""
    return rows >= BLOCK and k > 0 and (k % DEPTH == 0 or (k < DEPTH and k % 2 == 0))


def pack_weight(bits: Any) -> Any:
    """``[K, N]`` bfloat16 bit patterns (uint16) → ``[N'/16, K/2, 16, 2]``, ``N'`` the columns padded
    with zeros to a multiple of 32."""
    import numpy as np  # noqa: PLC0415

    k, n = bits.shape
    padded = np.zeros((k, -(-n // BLOCK) * BLOCK), dtype=np.uint16)
    padded[:, :n] = bits
    return np.ascontiguousarray(padded.reshape(k // 2, 2, padded.shape[1] // 16, 16).transpose(2, 0, 3, 1))


@dataclass(frozen=True)
class Epilogue:
    """What a kernel does to each float32 sum before storing it, in this order: add a bias per
    output channel, add a residual tensor of the output's shape (read in ``residual``'s dtype),
    the ``clamps`` in their order (``("max", 0.0)`` is ReLU; a ReLU6 is a max and a min), and store
    in ``dtype`` — a conv's or matmul's bias, ResNet's shortcut, ReLU/ReLU6 and the cast to bfloat16
    (``amx_epilogues`` finds them)."""

    bias: tuple[float, ...] | None = None
    residual: str | None = None
    clamps: tuple[tuple[str, float], ...] = ()
    dtype: str = "float32"

    @property
    def plain(self) -> bool:
        return self == PLAIN

    def apply(self, total: Any, bias: Any, channel: Any, residual: Any, at: Any) -> Any:
        """The stored value of float32 ``total`` (TIR) at output channel ``channel`` and flat
        output index ``at``, reading the ``bias`` and ``residual`` buffers only when it has them."""
        from tvm import tirx  # noqa: PLC0415

        value = total
        if self.bias is not None:
            value = value + bias[channel]
        if self.residual is not None:
            value = value + residual[at].astype("float32")
        for kind, bound in self.clamps:
            value = (tirx.max if kind == "max" else tirx.min)(value, tirx.const(bound, "float32"))
        return value.astype(self.dtype)

    def shapes(self, out_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        """(bias shape, residual shape, residual dtype) of the kernel's parameters: one element where
        the epilogue has none (the parameter is then a zero the kernel never reads)."""
        return ((len(self.bias),) if self.bias is not None else (1,),
                out_shape if self.residual is not None else (1,), self.residual or "float32")

    def arguments(self, residual: Any) -> list[Any]:
        """The Relax arguments for the bias and residual parameters."""
        import numpy as np  # noqa: PLC0415
        import tvm  # noqa: PLC0415
        from tvm import relax  # noqa: PLC0415

        bias = np.asarray(self.bias if self.bias is not None else (0.0,), dtype=np.float32)
        dummy = relax.const(tvm.runtime.tensor(np.zeros((1,), np.float32)))
        return [relax.const(tvm.runtime.tensor(bias)), residual if self.residual is not None else dummy]


#: No epilogue: the float32 sums stored as they are.
PLAIN = Epilogue()


def strips(row_blocks: int, col_blocks: int, *, by_columns: bool) -> tuple[int, int, tuple[int, int, int, int]]:
    """(parallel tasks, blocks per task, (rt, ri, ct, ci)): a task is a strip of blocks (dealt to
    workers: ``parallel_workers``), and block (task, inner) is at row block ``task·rt + inner·ri``,
    column block ``task·ct + inner·ci``. ``by_columns``: a column block over every row block, else the
    reverse — so the larger operand is walked once: a weight wider than the rows are many (BERT's
    128 × 3072) column block by column block, each read once; many rows by a narrow weight (ResNet's
    first 1×1 convs: 3136 × 256) row block by row block, the output written in whole rows
    ([3136, 64] · [64, 256] 0.36 → 0.15 ms)."""
    if by_columns:
        return col_blocks, row_blocks, (0, 1, 1, 0)
    return row_blocks, col_blocks, (1, 0, 0, 1)


#: Parallel iterations a kernel's tasks are dealt to, per core of the building machine (a host
#: build runs where it was built; elsewhere only the grain is off): each iteration a contiguous run of
#: tasks loading the tile configuration once (``ldtilecfg``) and declaring its 4 KB epilogue tile
#: once. One iteration a task had made AMX kernels MobileNetV2's largest callers of TVM's workspace
#: pool (the tile was a "local" buffer: 4% of a bfloat16 run in Alloc/FreeWorkspace, perf): dealt to
#: 64 iterations its kernel sum went 1.58 → 1.47 ms (stem 0.174 → 0.130, its 32 → 16 1×1 conv 0.055 →
#: 0.029; OpenVINO 0.103 and 0.030), to 16 (8 a core here) 1.46 (per-kernel minima alternated, 2
#: threads); the tile now a global-scope buffer that ``stack_tiles`` keeps on the stack, 0.99× more.
WORKERS_PER_CORE = 8


def parallel_workers(tasks: int, cores: int | None = None) -> int:
    """Parallel iterations for ``tasks`` strips: ``WORKERS_PER_CORE`` a core (``cores``, default this
    machine's), fewer when there are fewer tasks, more when each would get over 8. A worker's tasks
    are ``[w · tasks // workers, (w + 1) · tasks // workers)``: no two differ by more than one."""
    import os  # noqa: PLC0415

    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return min(tasks, max(WORKERS_PER_CORE * cores, -(-tasks // 8)))


def matmul_primfunc(lead: tuple[int, ...], k: int, n: int, epilogue: Epilogue = PLAIN) -> Any:
    """The PrimFunc ``(A [*lead, k] bfloat16, B packed uint16, bias, residual) → C [*lead, n]``, the
    leading axes taken as one of rows: each parallel task a strip of 32 × 32 blocks; the last row
    block ends at the last row. A block goes straight to C without an epilogue, else through a
    local tile, its values through ``epilogue`` — as does a last column block of ``n`` no
    multiple of 32 (only its real columns stored)."""
    import math  # noqa: PLC0415

    from tvm.script import tirx as T  # noqa: PLC0415

    rows = math.prod(lead)
    row_blocks = -(-rows // BLOCK)
    col_blocks = -(-n // BLOCK)
    direct_cols = n // BLOCK  # column blocks stored straight from the tiles, without an epilogue
    pairs = k // 2
    ldb = pairs * 16 * 2 * 2  # bytes of one 16-column block of B
    steps = max(1, k // DEPTH)  # (a k under 32 is one short step)
    bias_shape, residual_shape, residual_dtype = epilogue.shapes(tuple(lead) + (n,))
    residual_size = math.prod(residual_shape)
    tail = n % BLOCK  # columns of a last, partial block
    out_dtype = epilogue.dtype
    tasks, inner_blocks, (rt, ri, ct, ci) = strips(row_blocks, col_blocks, by_columns=n >= rows)
    workers = parallel_workers(tasks)

    @T.prim_func(private=True)
    def amx_matmul(x: T.Buffer((*lead, k), "bfloat16"), b: T.Buffer((col_blocks * 2, pairs, 16, 2), "uint16"),
                   bias: T.Buffer(bias_shape, "float32"), residual: T.Buffer(residual_shape, residual_dtype),
                   y: T.Buffer((*lead, n), out_dtype)) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        # TVM's bfloat16 legalization retypes ``x``'s pointer to float32 in ``access_ptr``; its bits
        # are what the tiles load, so they are addressed through a uint16 view of the same data.
        bits = T.decl_buffer((rows, k), "uint16", data=x.data)
        c = T.decl_buffer((rows, n), out_dtype, data=y.data)
        flat = T.decl_buffer((residual_size,), residual_dtype, data=residual.data)
        for worker in T.parallel(workers):
            with T.attr(0, "pragma_import_llvm", LLVM_IR):
                origin = T.decl_buffer((1,), "int64", scope="local")
                origin[0] = T.int64(0)
                tile = T.decl_buffer((BLOCK, BLOCK), "float32")  # 4 KB: kept on the stack (stack_tiles)
                T.evaluate(T.call_extern("void", _CONFIGURE, T.int64(min(k, DEPTH) * 2), T.int64(min(k, DEPTH) // 2)))
                for task in T.serial(worker * tasks // workers, (worker + 1) * tasks // workers):
                    for inner in T.serial(inner_blocks):
                        row = T.min((task * rt + inner * ri) * BLOCK, rows - BLOCK)
                        col = task * ct + inner * ci
                        if epilogue.plain and col < direct_cols:  # (the first test is Python's: no bfloat16 C here)
                            T.evaluate(T.call_extern(
                                "void", _FUNCTION, c.access_ptr("w", offset=row * n + col * BLOCK), T.int64(n * 4),
                                bits.access_ptr("r", offset=row * k), T.int64(k * 2),
                                b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(steps),
                                origin.access_ptr("r"), T.int64(1)))
                        else:
                            T.evaluate(T.call_extern(
                                "void", _FUNCTION, tile.access_ptr("w"), T.int64(BLOCK * 4),
                                bits.access_ptr("r", offset=row * k), T.int64(k * 2),
                                b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(steps),
                                origin.access_ptr("r"), T.int64(1)))
                            for r in T.serial(BLOCK):
                                if tail == 0 or col * BLOCK + BLOCK <= n:  # (no tail: Python's True, one branch)
                                    for j in T.vectorized(BLOCK):
                                        c[row + r, col * BLOCK + j] = epilogue.apply(
                                            tile[r, j], bias, col * BLOCK + j, flat, (row + r) * n + col * BLOCK + j)
                                else:
                                    for j in T.vectorized(tail):
                                        c[row + r, col * BLOCK + j] = epilogue.apply(
                                            tile[r, j], bias, col * BLOCK + j, flat, (row + r) * n + col * BLOCK + j)

    return amx_matmul


def emit_matmul(bb: Any, x: Any, lead: tuple[int, ...], weight_bits: Any, epilogue: Epilogue = PLAIN,
                residual: Any = None) -> Any:
    """The call of :func:`matmul_primfunc` on ``x`` (``[*lead, K]`` bfloat16) and a constant weight
    given as its ``[K, N]`` bfloat16 bit patterns; ``[*lead, N]`` in the epilogue's dtype. Opaque to
    FuseOps: the kernel is hand-written, no schedule could take a fused epilogue (``amx_epilogues``
    puts the common ones in)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    k, n = weight_bits.shape
    gvar = bb.add_func(matmul_primfunc(lead, k, n, epilogue), "amx_matmul")
    packed = relax.const(tvm.runtime.tensor(pack_weight(weight_bits)))
    return relax.call_tir(gvar, [x, packed, *epilogue.arguments(residual)],
                          relax.TensorType([*lead, n], epilogue.dtype))
