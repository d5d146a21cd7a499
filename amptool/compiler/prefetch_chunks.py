"""Prefetch of a kernel's next weight chunk, spread over the work of the current one.

What: ``PrefetchChunks``, a host TIR pass for LLVM targets. A kernel that reads its weights one
chunk at a time and reuses each chunk over several tiles — a conv reduced over chunks of input
channels (``cpu_schedules_nhwc``), a matmul's column-block panel reused by every row tile
(``cpu_schedules.packed_matmul``) — marks its loop over chunks ``NEXT_CHUNK``. Along the loops
from there down to the innermost one that reads the weight (or the float32 copy of each chunk a
float16 conv's tiles read, which the plan names), at the first level whose iterations
each take at most ``BURST_LINES`` of the next chunk's cache lines — or, where no level does, in
groups of iterations of the innermost loop, split for it — a prefetch into L2 of that point's
share. The next chunk starts where the current one ends (the packed weights lay a block's chunks
and the blocks one after another), and the current one's first element is the weight's load with
every loop inside at its start.

Why: a chunk's weights come from memory during its first tile only (the others reuse them from
cache), so memory idled while the later tiles computed and the first tile waited on it.
ResNet-50's 7² and 14² convs stream 1–9 MB of weights a call, BERT's feed-forward matmuls 9 MB,
from L3 or DRAM in a whole-model run. Spread, not in one burst a tile: a burst of more lines than
a core has fill buffers (~16) stalls it (a 3×3 512 → 512 at 7² with 83 lines a row: 5% slower
than none; 9 lines per tap: 30% faster). The prefetch is a linked LLVM function whose call
touches only inaccessible memory (``PREFETCH_IR``): TVM's ``llvm.prefetch`` call counts as a
read of any buffer, and LLVM then stored the tile's accumulators to memory around it each step.

When not: loops without the annotation; a chunk whose weight reads no single loop nest holds.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
import tvm_ffi
from tvm import ir, tirx

#: The annotation of a kernel's loop over chunks: ``{"elements": from one chunk's first weight to
#: the next one's, "weight": the weight buffer's name, "tiles": iterations of the loop itself in
#: one chunk}`` (1 for a loop over chunks; a matmul's loop over column blocks × row tiles, fused,
#: has its row tiles).
NEXT_CHUNK = "amp_prefetch_next"

#: Bytes a prefetch brings (a cache line).
LINE_BYTES = 64

#: The most lines prefetched at one point: about the L1 fill buffers of a core (Golden Cove 16,
#: Zen 4 22), beyond which a prefetch waits for a free one.
BURST_LINES = 16

#: ``amptool_prefetch_l2(ptr)``: ``prefetcht1`` of the line at ``ptr``. Linked into the kernel's
#: LLVM module and inlined (TVM's ``pragma_import_llvm``); the intrinsic call's memory effects
#: narrowed to inaccessible memory, so LLVM keeps values of other buffers in registers across it.
PREFETCH_IR = """
define void @amptool_prefetch_l2(ptr %line) alwaysinline {
entry:
  call void @llvm.prefetch.p0(ptr %line, i32 0, i32 2, i32 1) #0
  ret void
}
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
attributes #0 = { nounwind willreturn memory(inaccessiblemem: readwrite) }
"""


def chunk_plan(elements: int, weight: str, tiles: int = 1, over: str | None = None) -> dict[str, Any]:
    """The ``NEXT_CHUNK`` annotation of a loop over chunks of ``elements`` of the buffer named
    ``weight``, ``tiles`` iterations of the loop itself a chunk. ``over``: the buffer whose reads the
    prefetches are spread over, when not ``weight`` itself (a float16 conv's tiles read each chunk
    widened to float32 into a buffer of its own, ``cpu_schedules_nhwc._widen_panels``)."""
    plan = {"elements": elements, "weight": weight, "tiles": tiles}
    return {**plan, "over": over} if over else plan


def _vars_in(expr: Any) -> list[Any]:
    found: list[Any] = []
    tvm_ffi.structural_walk(expr, (tirx.Var, found.append))
    return found


def _substituted(node: Any, values: dict[Any, Any]) -> Any:
    return tvm_ffi.structural_map(node, (tirx.Var, lambda var: values.get(var, var)))


def _resolved(expr: Any, binds: dict[Any, Any]) -> Any:
    """``expr`` with the body's let-bound variables replaced by their values, recursively."""
    while any(v in binds for v in _vars_in(expr)):
        expr = _substituted(expr, binds)
    return expr


def _weight_loads(stmt: Any, weight: str) -> list[Any]:
    loads: list[Any] = []

    def load(node: Any) -> None:
        if str(node.source.name) == weight:
            loads.append(node)

    tvm_ffi.structural_walk(stmt, (ir.expr.TensorLoad, load))
    return loads


def _chunk_start(loop: Any, weight: str) -> tuple[Any, Any] | None:
    """(buffer, index) of the current chunk's first weight: the first vector load of ``weight``
    in ``loop``'s body, every loop inside at its start; None when there is none."""
    binds: dict[Any, Any] = {}
    inner: dict[Any, Any] = {}
    tvm_ffi.structural_walk(loop.body, (tirx.Bind, lambda node: binds.__setitem__(node.var, node.value)))
    tvm_ffi.structural_walk(loop.body, (tirx.For, lambda node: inner.__setitem__(node.loop_var, node.min)))
    for load in _weight_loads(loop.body, weight):
        if len(load.indices) == 1 and isinstance(load.indices[0], tirx.Ramp):
            return load.source, _substituted(_resolved(load.indices[0].base, binds), inner)
    return None


def _loops_at(stmt: Any) -> list[Any]:
    """The loops of ``stmt`` not inside another loop of it."""
    if isinstance(stmt, tirx.For):
        return [stmt]
    if isinstance(stmt, tirx.SeqStmt):
        return [loop for part in stmt.seq for loop in _loops_at(part)]
    if isinstance(stmt, tirx.IfThenElse):
        return [*_loops_at(stmt.then_case), *(_loops_at(stmt.else_case) if stmt.else_case is not None else [])]
    body = getattr(stmt, "body", None)
    return _loops_at(body) if isinstance(body, tirx.Stmt) else []


def _path(loop: Any, weight: str) -> list[Any]:
    """The loops from inside ``loop`` down to the innermost one that reads ``weight``, while one
    loop of constant extent at each level holds all its reads (so not into a row's unrolled tiles)."""
    path: list[Any] = []
    body = loop.body
    while True:
        holders = [inner for inner in _loops_at(body) if _weight_loads(inner, weight)]
        if len(holders) != 1 or not isinstance(holders[0].extent, tirx.IntImm):
            return path
        path.append(holders[0])
        body = holders[0].body


def _rebuilt(loop: Any, body: Any) -> Any:
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, annotations=loop.annotations)


def _groups(extent: int, lines: float) -> int:
    """Groups to split an innermost loop of ``extent`` iterations into for ``lines`` lines an
    iteration of the loop around it: the fewest that ``extent`` divides into and that take at most
    one line each (all the iterations when fewer than the lines)."""
    return next((g for g in range(1, extent + 1) if extent % g == 0 and g >= lines), extent)


def _prefetch_at(levels: list[Any], lines: int, tiles: int) -> tuple[int, int]:
    """(level, groups): the loop of ``levels`` (outermost first) whose body takes the prefetches —
    the first whose iterations each take at most ``BURST_LINES`` — and the groups its body is split
    into (1: none; the innermost loop's, where no level takes few enough). ``tiles``: points the
    annotated loop has in one chunk."""
    count = tiles
    for depth, loop in enumerate(levels[:-1]):
        count *= int(loop.extent.value)
        if lines / count <= BURST_LINES:
            return depth, 1
    return len(levels) - 1, _groups(int(levels[-1].extent.value), lines / count)


def _split(loop: Any, groups: int, head: Any) -> Any:
    """``loop`` as ``groups`` runs of its iterations, ``head`` (a function of the group's index)
    before each run."""
    extent = int(loop.extent.value)
    if groups == extent:
        return _rebuilt(loop, tirx.SeqStmt([head(loop.loop_var - loop.min), loop.body]))
    dtype = loop.loop_var.ty.dtype
    group, step = tirx.Var(f"{loop.loop_var.name}_group", dtype), tirx.Var(f"{loop.loop_var.name}_step", dtype)
    size = extent // groups
    body = _substituted(loop.body, {loop.loop_var: loop.min + group * size + step})
    run = tirx.For(step, 0, size, loop.kind, body)
    return tirx.For(group, 0, groups, tirx.ForKind.SERIAL, tirx.SeqStmt([head(group), run]))


def _prefetch(buffer: Any, index: Any) -> Any:
    """A prefetch of ``buffer[index]``, the index kept inside the buffer: the last chunk's next
    one lies past its end (a prefetch does not fault, but an address outside is not defined in LLVM)."""
    last = tirx.IntImm(index.ty.dtype, math.prod(int(d) for d in buffer.shape) - 1)
    inside = tirx.BufferLoad(buffer, [tirx.min(index, last)])
    return tirx.Evaluate(tirx.call_extern("void", "amptool_prefetch_l2", tirx.address_of(inside)))


def _prefetched(loop: Any) -> Any:
    """A loop annotated ``NEXT_CHUNK`` with its work prefetching the next chunk."""
    plan = loop.annotations.get(NEXT_CHUNK) if loop.annotations else None
    if plan is None:
        return loop
    elements, weight, tiles = int(plan["elements"]), str(plan["weight"]), int(plan["tiles"])
    loop = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body,
                    annotations={key: value for key, value in loop.annotations.items() if key != NEXT_CHUNK})
    levels = _path(loop, str(plan.get("over", weight)))
    found = _chunk_start(loop, weight) if levels else None
    if found is None:
        return loop
    buffer, first = found
    dtype = first.ty.dtype
    per_line = LINE_BYTES * 8 // (buffer.dtype.bits * buffer.dtype.lanes)
    lines = -(-elements // per_line)
    depth, groups = _prefetch_at(levels, lines, tiles)
    split = depth == len(levels) - 1  # the innermost loop, in groups
    # Which point of the chunk's work an iteration is, row-major: the annotated loop's place in
    # its chunk, then the loops down to the prefetch (and the group).
    point: Any = tirx.IntImm(dtype, 0)
    if tiles > 1:
        point = tirx.floormod(tirx.Cast(dtype, loop.loop_var - loop.min), tiles)
    points = tiles
    for inner in levels[:depth] if split else levels[:depth + 1]:
        point = point * int(inner.extent.value) + tirx.Cast(dtype, inner.loop_var - inner.min)
        points *= int(inner.extent.value)
    points *= groups if split else 1
    next_chunk = first + tirx.IntImm(dtype, elements)

    def head(group: Any) -> Any:
        """A point's prefetches: its share of the lines (or, with more points than lines, the
        line its share starts in)."""
        at = point * groups + tirx.Cast(dtype, group) if split else point
        if points >= lines:  # at · lines in 64 bits: an LLM's panel (33K lines) over 700K points overflows 32
            start = tirx.Cast(dtype, tirx.floordiv(tirx.Cast("int64", at) * lines, points))
            return _prefetch(buffer, next_chunk + start * per_line)
        share = -(-lines // points)
        line = tirx.Var("line", dtype)
        return tirx.For(line, 0, share, tirx.ForKind.SERIAL,
                        _prefetch(buffer, next_chunk + (at * share + line) * per_line))

    target = levels[depth]
    placed = _split(target, groups, head) if split else _rebuilt(target, tirx.SeqStmt([head(None), target.body]))
    body = tvm_ffi.structural_map(loop.body, (tirx.For, lambda node: placed if node.same_as(target) else node))
    linked = tirx.AttrStmt(tirx.IntImm("int32", 0), "pragma_import_llvm", tvm.ir.StringImm(PREFETCH_IR), body)
    return _rebuilt(loop, linked)


def _prefetch_chunks(func: Any, _mod: Any, _ctx: Any) -> Any:
    return tvm_ffi.structural_map(func, (tirx.For, _prefetched))


PrefetchChunks = tirx.transform.prim_func_pass(_prefetch_chunks, opt_level=0, name="PrefetchChunks")
