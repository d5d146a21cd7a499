"""Products of two computed bfloat16 tensors on AMX tiles: attention's ``Q·Kᵀ`` and ``P·V``.

What: ``[*batch, M, K] · [*batch, K, N]`` with float32 results, each batch item's right operand
packed at run time — in the kernel, one parallel pass — into the ``[N'/16, K/2, 16, 2]`` layout of
:mod:`amptool.compiler.cpu_amx`'s micro-kernel (zero columns padding ``N`` to 32s), then the same
32 × 32 blocks as a constant-weight matmul: a task is one item's strip of 32 rows over all its
column blocks, tasks dealt to workers as there (``cpu_amx.parallel_workers``). Full column blocks
go straight to the output, a last partial one through a tile. A ``K`` that is no multiple of 32
(ViT's 197 keys, Whisper's 1500): whole steps from A where it lies, the last partial one from a
zero-padded copy of the strip's rows into a second tile, the two added as the block is stored.

Why: the constant-weight kernels left attention's products on float32 FMAs over converted values;
BERT-base bfloat16 spent 2.5 of its 19.7 ms kernel sum there (12 layers × 0.107 ms for ``Q·Kᵀ``,
0.104 for ``P·V``; 235 GFLOP/s on two cores, the tiles' matmuls ~1.5 TFLOP/s).

When: ``amx_plan.plan_batched`` — bfloat16 operands accumulated in float32, the same batch dims,
static shapes, at least 32 rows an item, ``K`` over 32 or one even step under it, a target with
AMX-BF16; ``cpu_attention`` then leaves such an attention unfused (``amx_plan.takes_attention``).
Numerics: the micro-kernel's (the padded step adds zeros).
"""

# TVMScript buffer annotations are calls, which mypy rejects.
# mypy: disable-error-code="valid-type"
from __future__ import annotations

import math
from typing import Any

from amptool.compiler.cpu_amx import _CONFIGURE, _FUNCTION, BLOCK, DEPTH, LLVM_IR, parallel_workers


def batched_primfunc(batch: tuple[int, ...], m: int, k: int, n: int) -> Any:
    """The PrimFunc ``(A [*batch, m, k] bfloat16, B [*batch, k, n] bfloat16) → C [*batch, m, n]
    float32``. ``k``: whole 32-deep steps read from A where it lies, then a last partial step (a
    sequence length such as ViT's 197) from a zero-padded copy of the block's 32 rows, into a tile of
    its own added as the block is stored; or one short even step under 32."""
    from tvm.script import tirx as T  # noqa: PLC0415

    items = math.prod(batch)
    row_blocks, col_blocks = -(-m // BLOCK), -(-n // BLOCK)
    short = k < DEPTH  # one short step: the tile configuration's A rows and B rows shortened
    steps = 1 if short else k // DEPTH
    rest = 0 if short else k % DEPTH
    depth = k if short else (steps + (rest > 0)) * DEPTH  # packed B's rows: zeros past k
    pairs = depth // 2
    ldb = pairs * 16 * 2 * 2  # bytes of one 16-column block of packed B
    item_words = col_blocks * BLOCK * depth  # uint16 of one item's packed B
    full_cols, tail = n // BLOCK, n % BLOCK
    tasks = items * row_blocks
    workers = parallel_workers(tasks)
    a_bytes, b_rows = (k * 2, k // 2) if short else (DEPTH * 2, DEPTH // 2)

    @T.prim_func(private=True)
    def amx_batched(x: T.Buffer((*batch, m, k), "bfloat16"), w: T.Buffer((*batch, k, n), "bfloat16"),
                    y: T.Buffer((*batch, m, n), "float32")) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        # bfloat16 bits through uint16 views (as cpu_amx's kernels: TVM retypes bfloat16 pointers)
        a_bits = T.decl_buffer((items * m * k,), "uint16", data=x.data)
        b_bits = T.decl_buffer((items * k * n,), "uint16", data=w.data)
        c = T.decl_buffer((items * m * n,), "float32", data=y.data)
        packed = T.decl_buffer((items * item_words,), "uint16")
        for item in T.parallel(items):
            for block, pair in T.grid(col_blocks * 2, pairs):
                for lane, half in T.grid(16, 2):
                    column, row = block * 16 + lane, 2 * pair + half
                    packed[item * item_words + ((block * pairs + pair) * 16 + lane) * 2 + half] = T.if_then_else(
                        column < n and row < k, b_bits[item * k * n + T.min(row, k - 1) * n + T.min(column, n - 1)],
                        T.uint16(0))
        for worker in T.parallel(workers):
            with T.attr(0, "pragma_import_llvm", LLVM_IR):
                origin = T.decl_buffer((1,), "int64", scope="local")
                origin[0] = T.int64(0)
                tile = T.decl_buffer((BLOCK, BLOCK), "float32")  # 4 KB: kept on the stack (stack_tiles)
                part = T.decl_buffer((BLOCK, BLOCK), "float32")  # the last partial step's sums
                rows = T.decl_buffer((BLOCK * DEPTH,), "uint16")  # its A: 32 rows × 32, zero-padded
                T.evaluate(T.call_extern("void", _CONFIGURE, T.int64(a_bytes), T.int64(b_rows)))
                for task in T.serial(worker * tasks // workers, (worker + 1) * tasks // workers):
                    start = task // row_blocks * m + T.min(task % row_blocks * BLOCK, m - BLOCK)
                    if rest > 0:  # the strip's last partial step, once for all its column blocks
                        for r, e in T.grid(BLOCK, DEPTH):
                            rows[r * DEPTH + e] = T.if_then_else(
                                e < rest, a_bits[(start + r) * k + steps * DEPTH + T.min(e, rest - 1)], T.uint16(0))
                    for col in T.serial(col_blocks):
                        at = task // row_blocks * item_words + col * 2 * pairs * 32  # the block's packed B
                        if rest == 0 and (tail == 0 or col < full_cols):  # (Python's bool where it can)
                            T.evaluate(T.call_extern(
                                "void", _FUNCTION, c.access_ptr("w", offset=start * n + col * BLOCK), T.int64(n * 4),
                                a_bits.access_ptr("r", offset=start * k), T.int64(k * 2),
                                packed.access_ptr("r", offset=at), T.int64(ldb), T.int64(steps), origin.access_ptr("r"),
                                T.int64(1)))
                        else:
                            T.evaluate(T.call_extern(
                                "void", _FUNCTION, tile.access_ptr("w"), T.int64(BLOCK * 4),
                                a_bits.access_ptr("r", offset=start * k), T.int64(k * 2),
                                packed.access_ptr("r", offset=at), T.int64(ldb), T.int64(steps), origin.access_ptr("r"),
                                T.int64(1)))
                            if rest > 0:
                                T.evaluate(T.call_extern(
                                    "void", _FUNCTION, part.access_ptr("w"), T.int64(BLOCK * 4), rows.access_ptr("r"),
                                    T.int64(DEPTH * 2), packed.access_ptr("r", offset=at + steps * DEPTH * 16),
                                    T.int64(ldb), T.int64(1), origin.access_ptr("r"), T.int64(1)))
                            for r in T.serial(BLOCK):
                                if tail == 0 or col < full_cols:
                                    for j in T.vectorized(BLOCK):
                                        c[(start + r) * n + col * BLOCK + j] = tile[r, j] + (part[r, j] if rest > 0
                                                                                             else T.float32(0))
                                else:
                                    for j in T.vectorized(tail):
                                        c[(start + r) * n + col * BLOCK + j] = tile[r, j] + (part[r, j] if rest > 0
                                                                                             else T.float32(0))

    return amx_batched


def emit_batched(bb: Any, a: Any, b: Any, batch: tuple[int, ...], m: int, k: int, n: int) -> Any:
    """The call of :func:`batched_primfunc` on ``a`` and ``b``; ``[*batch, m, n]`` float32."""
    from tvm import relax  # noqa: PLC0415

    gvar = bb.add_func(batched_primfunc(batch, m, k, n), "amx_batched")
    return relax.call_tir(gvar, [a, b], relax.TensorType([*batch, m, n], "float32"))
