"""Schedule rules for CPU kernels (DLight style: PrimFunc → Schedule, or None to pass).

What: after fusion each kernel is one PrimFunc; the first rule that applies schedules it.

* ``packed_conv2d`` / ``packed_matmul`` (and their bfloat16 twins in ``cpu_schedules_bf16``,
  one ``vdpbf16ps`` per 16 channels × 2 inputs) — the ``amp_conv2d`` / ``amp_matmul`` blocks of
  :mod:`amptool.compiler.cpu_kernels`: a register tile of ``rows × vector`` accumulators (rows:
  output columns or matrix rows, unrolled; vector: the packed output channels), the reduction
  loops around it, the outer loops fused and parallel, the fused epilogue (bias, residual
  add, activation, cast) computed per tile while it is in cache.
* ``depthwise_conv2d`` (tried by ``packed_conv2d``) — ``amp_depthwise``: planes in parallel,
  each plane's padded copy right before its tiles of rows × vectorized columns, bias/ReLU6 fused.
* ``tiled_reduction`` — any other single reduction whose innermost spatial axis is contiguous
  or broadcast in every operand (pooling, convolutions with non-constant weights, attention
  matmuls): the same tiling, vectorized along that axis.
* ``vector_row_reduction`` (``cpu_row_reduction``) — softmax, layer norm, RMS norm, reductions
  over the contiguous last axis: one vector of partial results per row.
* ``row_reduction`` — TVM's ``dlight.cpu.Reduction``: the row reductions the rule above passes.
* ``injective`` — elementwise, broadcast, transpose, pad and cast kernels: outer loops
  parallel, innermost loop vectorized.
* ``parallel_outer`` — anything else: leading spatial loops of every block in parallel.

Why: TVM 0.27 has CPU rules only for GEMV and row reductions and applies none by default.

Kernels under ``MIN_PARALLEL_WORK`` loop iterations stay on one thread.

When not: a rule that does not recognise a kernel returns None; a schedule primitive that
raises (an unexpected loop structure) is logged and the next rule is tried, so a kernel is at
worst left unscheduled — slower, never wrong. Symbolic extents pass to ``parallel_outer``.

Preserves: values. Schedules reorder loops but keep each reduction's order (the reduction
loops stay in their original order around the register tile) — except ``vector_row_reduction``,
whose lanes of partial sums add in a different order (float rounding; max/min exact).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.sym import detect_linear_equation

from amptool.compiler.bf16_pairs import block_of
from amptool.compiler.cpu_depthwise import (
    DEPTHWISE_BLOCK,
    DEPTHWISE_SRC_BLOCK,
    DEPTHWISE_WIDEN_BLOCK,
    INTERIOR_ATTR,
    tile_plan,
)
from amptool.compiler.cpu_kernels import (
    CAST_BLOCK,
    CONV2D_BLOCK,
    DEFAULT_L1_BYTES,
    MATMUL_BLOCK,
    PAD_BLOCK,
    WIDEN_BLOCK,
    accumulator_budget,
    column_tile,
    flat_min_tasks,
    l1_data_bytes,
    matmul_row_cap,
    vector_lanes,
)
from amptool.compiler.prefetch_chunks import NEXT_CHUNK, chunk_plan

log = logging.getLogger(__name__)

Rule = Callable[[Any, "Tiling"], Any]


#: Padded input planes (rows × columns) from which ``depthwise_conv2d`` copies each plane right
#: before its convolution rather than all in one pass before (measured on MobileNetV2's 7x7 maps).
LARGE_PLANE = 512

#: Loop iterations below which a kernel runs on one thread: waking the pool's workers costs
#: microseconds when they spin and a scheduler time slice when the machine is busy.
MIN_PARALLEL_WORK = 1 << 16


@dataclass(frozen=True)
class Tiling:
    """Register budget of the target: SIMD lanes (float32) and how many accumulators fit; its L1
    data cache; and whether the kernel at hand is worth running in parallel."""

    lanes: int
    accumulators: int
    parallel: bool = True
    l1_bytes: int = DEFAULT_L1_BYTES
    flat_tasks: int = 1  # cpu_kernels.flat_min_tasks

    @staticmethod
    def for_target(target: Any) -> Tiling:
        lanes = vector_lanes(target)
        return Tiling(lanes=lanes, accumulators=accumulator_budget(lanes), l1_bytes=l1_data_bytes(target),
                      flat_tasks=flat_min_tasks(target))


class Guarded(dlight.ScheduleRule):
    """Adapts a rule function; a schedule error means 'not applicable', logged, never fatal.
    ``requires``: the block a kernel must have for the rule to apply (checked before a Schedule
    is made: a probed build's ~1,000 kernels × 12 rules spent most of their 2.3 s there)."""

    def __init__(self, fn: Rule, tiling: Tiling | None, requires: str | None = None) -> None:
        self.fn, self.tiling, self.requires = fn, tiling, requires

    def apply(self, func: Any, target: Any, _tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc):
            return None
        try:
            facts = _kernel_facts(func)
            if self.requires is not None and self.requires not in facts.blocks:
                return None
            tiling = self.tiling or _tiling_for(target)
            tiling = replace(tiling, parallel=facts.work is None or facts.work >= MIN_PARALLEL_WORK)
            sch = self.fn(s_tir.Schedule(func), tiling)
        except Exception as err:  # noqa: BLE001 - TVM raises many types; the next rule decides
            log.debug("schedule rule %s skipped: %s", self.fn.__name__, str(err).splitlines()[-1:])
            return None
        if sch is not None:
            _schedule_leftovers(sch, tiling)
        return sch


def _schedule_leftovers(sch: Any, tiling: Tiling) -> None:
    """Parallelize and vectorize the elementwise steps a rule left as it found them: serial scalar
    loops at the root. A rule schedules its main block and what it can fuse; the rest of a fused
    kernel (a GRU cell's gates around its recurrent matmul: sigmoid before, tanh and the blend after,
    each step over 256 values) otherwise ran one scalar at a time on one thread."""
    if not isinstance(sch, s_tir.Schedule) or not _has_root(sch):
        return

    def leftovers() -> list[Any]:
        found = []
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            if (loops and all(iv.iter_type == SPATIAL for iv in sch.get(block).iter_vars)
                    and all(sch.get(loop).kind == tirx.ForKind.SERIAL and not sch.get(loop).annotations
                            for loop in loops)):
                found.append(block)
        return found

    for block in leftovers()[:-1]:  # into their readers first: one pass instead of one per step
        readers = sch.get_consumers(block)
        if readers and all(iv.iter_type == SPATIAL for r in readers for iv in sch.get(r).iter_vars):
            try_inline(sch, block)  # (never into a reduction: it would be computed again at every step)
    for block in leftovers():
        try:
            _parallel_vectorized(sch, block, _block_tiling(sch, block, tiling))
        except Exception as err:  # noqa: BLE001 - left as it was: scalar, still correct
            log.debug("leftover %s not vectorized: %s", sch.get(block).name_hint, str(err).splitlines()[-1:])


def _block_tiling(sch: Any, block: Any, tiling: Tiling) -> Tiling:
    """``tiling`` for one block of a kernel: parallel only if that block's own loops are worth it."""
    work = math.prod(_extent(sch, loop) or MIN_PARALLEL_WORK for loop in sch.get_loops(block))
    return replace(tiling, parallel=tiling.parallel and work >= MIN_PARALLEL_WORK)


def _writes_output(sch: Any, block: Any) -> bool:
    """Whether ``block`` writes one of the kernel's parameters (params are buffers in TVM 0.27)."""
    params = list(sch.mod["main"].params)
    return any(any(region.source.same_as(p) for p in params) for region in sch.get(block).writes)


#: ``IterVar.iter_type`` of a data-parallel (spatial) block variable.
SPATIAL = 0


@dataclass(frozen=True)
class _KernelFacts:
    """What every rule asks of an unscheduled kernel: its loop iterations and its blocks' names."""

    work: int | None
    blocks: frozenset[str]


#: The last kernel's facts (DLight tries the rules on one kernel after the other): handle → (kernel, facts).
_LAST_KERNEL: dict[int, tuple[Any, _KernelFacts]] = {}
#: Tiling per target (handle → (target, tiling)); vector_lanes asks LLVM each time.
_TILINGS: dict[int, tuple[Any, Tiling]] = {}


def _kernel_facts(func: Any) -> _KernelFacts:
    hit = _LAST_KERNEL.get(func.__chandle__())
    if hit is not None:
        return hit[1]
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))] if _has_root(sch) else []
    facts = _KernelFacts(_work(sch), frozenset(blocks))
    _LAST_KERNEL.clear()
    _LAST_KERNEL[func.__chandle__()] = (func, facts)  # the kernel kept alive: its handle stays its own
    return facts


def _tiling_for(target: Any) -> Tiling:
    hit = _TILINGS.get(target.__chandle__())
    if hit is None:
        if len(_TILINGS) > 16:
            _TILINGS.clear()
        hit = _TILINGS[target.__chandle__()] = (target, Tiling.for_target(target))
    return hit[1]


def _work(sch: Any) -> int | None:
    """Loop iterations of an unscheduled kernel (sum over its blocks); None if symbolic."""
    total = 0
    for block in sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []:
        count = 1
        for loop in sch.get_loops(block):
            extent = _extent(sch, loop)
            if extent is None:
                return None
            count *= extent
        total += count
    return total


def _has_root(sch: Any) -> bool:
    return _find_block(sch, "root") is not None


def _parallel(sch: Any, loops: Sequence[Any], tiling: Tiling) -> Any:
    """Fuse ``loops`` and run them in parallel if the kernel is big enough; returns the loop."""
    loop = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if tiling.parallel:
        sch.parallel(loop)
    return loop


# --------------------------------------------------------------------------- helpers


def _extent(sch: Any, loop: Any) -> int | None:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _divisor(n: int, cap: int, low: int = 1) -> int | None:
    """The largest divisor of ``n`` in ``[low, cap]``."""
    for d in range(min(cap, n), low - 1, -1):
        if n % d == 0:
            return d
    return None


def _find_block(sch: Any, name: str) -> Any | None:
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - not in this kernel
        return None


#: Expression nodes an inlining may create (the producer's value × its reads in the consumer).
#: ``cpu_exp``'s log reads its operand 188 times and exp is 323 nodes: Mish, tanh(log(1 + exp(x))),
#: inlined whole was a tree of ~10⁶ nodes that took 190 s to compile; above this the producer is
#: computed on its own (a loop nest of its own, or a step of its own under the epilogue's tile).
INLINE_LIMIT = 4000


def try_inline(sch: Any, block: Any) -> bool:
    """``compute_inline(block)`` unless that makes an expression over ``INLINE_LIMIT`` nodes or
    TVM refuses; whether it did."""
    stmt = sch.get(block)
    if not isinstance(stmt.body, tirx.BufferStore):
        return False
    if _size(stmt.body.value) * max(_most_reads(sch, block), 1) > INLINE_LIMIT:
        return False
    try:
        sch.compute_inline(block)
    except Exception:  # noqa: BLE001 - not inlinable here (a reduction, a consumer reading other indices): kept
        log.debug("%s not inlined", stmt.name_hint)
        return False
    return True


def _size(expr: Any) -> int:
    count = [0]
    tvm_ffi.structural_walk(expr, (ir.expr.Expr, lambda _node: count.__setitem__(0, count[0] + 1)))
    return count[0]


def _most_reads(sch: Any, block: Any) -> int:
    """The most loads of ``block``'s output (a BufferStore's buffer) in any one of its consumers."""
    buffer = sch.get(block).body.buffer
    return max((_loads_of(sch.get(c), buffer) for c in sch.get_consumers(block)), default=0)


def _loads_of(stmt: Any, buffer: Any) -> int:
    count = [0]

    def seen(load: Any) -> None:
        if load.source.same_as(buffer):
            count[0] += 1

    tvm_ffi.structural_walk(stmt.body, (ir.expr.TensorLoad, seen))  # what tirx.BufferLoad builds in 0.27
    return count[0]


def _epilogue_at(sch: Any, block: Any, loop: Any, chain: list[Any] | None = None) -> Any | None:
    """Inline the elementwise chain after ``block`` (``_epilogue_chain``, unless given) and compute
    its last step under ``loop`` (steps ``try_inline`` keeps: each its own vectorized step under
    ``loop``, in order).

    Without consumers the block's output is the kernel's: a write-back stage plays that role.
    Returns the epilogue block.
    """
    chain = chain or _epilogue_chain(sch, block)
    kept = [step for step in chain[:-1] if not try_inline(sch, step)]
    for step in kept:
        sch.reverse_compute_at(step, loop, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(step)[-1])
    sch.reverse_compute_at(chain[-1], loop, preserve_unit_loops=True)
    return chain[-1]


def _epilogue_chain(sch: Any, block: Any) -> list[Any]:
    """The elementwise chain after ``block`` (a write-back stage when there is none), its other
    inputs' producers inlined (``_inline_side_inputs``)."""
    chain = []
    current = block
    while True:
        consumers = sch.get_consumers(current)
        if len(consumers) != 1 or _writes_more(sch, consumers[0], block):
            # A consumer writing more elements than the block (a pad, a concat) has positions no tile
            # of the block visits: computed under them, those rows/columns were never written (NaN).
            break
        chain.append(consumers[0])
        current = consumers[0]
    if not chain:
        chain = [sch.cache_write(block, 0, "global")]
    _inline_side_inputs(sch, chain, block)
    return chain


def _inline_side_inputs(sch: Any, chain: list[Any], block: Any) -> None:
    """Inline the elementwise producers of an epilogue's other inputs (a residual cast to float32
    by ``widen_epilogues``): left at the root, they keep the epilogue from moving under the tile."""
    own = {sch.get(b).name_hint for b in (block, *chain)}
    refused: set[str] = set()
    for step in chain:
        # Again after each inline: an inlined producer's own producers (a squeeze before a cast,
        # a bfloat16 RNN step's hidden-state residual) become the step's, and must go too.
        while True:
            side = [p for p in sch.get_producers(step) if sch.get(p).name_hint not in own | refused]
            if not side:
                break
            for producer in side:
                name = sch.get(producer).name_hint
                if not try_inline(sch, producer):
                    refused.add(name)  # not inlinable (a reduction): the epilogue stays where it is


def _writes_more(sch: Any, consumer: Any, block: Any) -> bool:
    """Whether ``consumer`` writes more elements than ``block`` (unknown sizes count as more).
    A layout change or a crop writes no more, and every position it writes derives from the block's."""

    def size(b: Any) -> int | None:
        writes = sch.get(b).writes
        if len(writes) != 1:
            return None
        try:
            return math.prod(int(d) for d in writes[0].source.shape)
        except TypeError:  # a symbolic dim
            return None

    produced, consumed = size(block), size(consumer)
    return produced is None or consumed is None or consumed > produced


def _schedule_prologue(sch: Any, block: Any, skip: Any, tiling: Tiling, vectorize: bool = True) -> None:
    """Schedule injective producers of ``block`` that sit at the root (pad, cast, pairs), unless a
    rule already has (a loop of theirs is parallel)."""
    for producer in sch.get_producers(block):
        loops = sch.get_loops(producer)
        if loops and not sch.get(loops[0]).same_as(sch.get(skip)) and not _has_parallel_loop(sch, loops):
            _parallel_vectorized(sch, producer, tiling, vectorize)


def _has_parallel_loop(sch: Any, loops: Sequence[Any]) -> bool:
    return any(sch.get(loop).kind == tirx.ForKind.PARALLEL for loop in loops)


def _parallel_vectorized(sch: Any, block: Any, tiling: Tiling, vectorize: bool = True) -> None:
    """Outer loops fused and parallel; the innermost (≥ 8 elements, fused if needed; split into
    chunks of at most 4 vectors) vectorized. LLVM took minutes on 384-lane vectors of gathers."""
    loops = sch.get_loops(block)
    extents = [_extent(sch, loop) for loop in loops]
    if not loops or None in extents:
        if loops:
            _parallel(sch, loops[:1], tiling)
        return
    sizes = [int(e) for e in extents if e is not None]
    if 0 in sizes:
        return  # a zero-size tensor (a Split piece of length 0): nothing to run, and TVM refuses to vectorize it
    widest = 4 * tiling.lanes
    k = len(loops) - 1
    while k > 0 and sizes[k] < 8 and sizes[k] * sizes[k - 1] <= widest:
        sizes[k - 1] *= sizes[k]
        k -= 1
    inner = sch.fuse(*loops[k:]) if k < len(loops) - 1 else loops[-1]
    outer = list(loops[:k])
    runs = _selected_runs(sch, block) if k == len(loops) - 1 else None
    runs = math.gcd(runs, sizes[k]) if runs else None  # runs that also tile the axis: no bounds test
    # a concat along this axis: each vector within one input's run (see _selected_runs), in whole
    # vectors, else whole SSE vectors; runs no such vector divides (a pad's bound of 1) as before
    chunk = next((d for step in (tiling.lanes, 4) for d in range(widest - widest % step, 0, -step)
                  if runs % d == 0), None) if runs is not None and runs < sizes[k] else None
    if chunk is not None:
        head, inner = sch.split(inner, [None, chunk])
        outer.append(head)
    elif sizes[k] > widest:
        chunk = _divisor(sizes[k], widest, tiling.lanes) or _divisor(sizes[k], widest, 4)
        if chunk is None:
            vectorize = False  # a large prime: leave it to LLVM
        else:
            head, inner = sch.split(inner, [None, chunk])
            outer.append(head)
    if outer:
        _parallel(sch, outer, tiling)
    if vectorize:
        sch.vectorize(inner)


_COMPARISONS = (tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ, tirx.NE)


def _is_select(call: Any) -> bool:
    """Whether a TIR call is ``if_then_else`` (a concat's or a pad's choice between values)."""
    return bool(call.op.same_as(ir.Op.get("prim.if_then_else")))


def _selected_runs(sch: Any, block: Any) -> int | None:
    """The length of the runs along the block's last axis over which every ``if_then_else`` it
    selects by that axis alone (a concat's ``c < 32 ? a : …``) decides alike: the gcd of the
    bounds it compares the axis with. None when it selects by no such bound.

    Why: a vector that spans two inputs of a concat has a condition that differs between its lanes,
    and TVM then runs its loop as scalars: YOLOv8's concat of three 16-channel pieces in vectors of
    24 took 0.29 ms for 307 K values, a concat of 32-channel pieces in vectors of 32 0.11 ms for
    819 K. Inside one run the lanes agree, but TVM cannot see it until ``uniform_selects`` compares
    the axis per vector."""
    stmt = sch.get(block)
    if not stmt.iter_vars:
        return None
    axis = stmt.iter_vars[-1].var
    bounds: list[int] = []

    def compare(node: Any) -> None:
        if not isinstance(node, _COMPARISONS):
            return
        for side, other in ((node.a, node.b), (node.b, node.a)):
            coef = detect_linear_equation(side, [axis])
            if (isinstance(other, tirx.IntImm) and len(coef) == 2 and isinstance(coef[0], tirx.IntImm)
                    and int(coef[0]) == 1 and isinstance(coef[1], tirx.IntImm)):
                bounds.append(abs(int(other) - int(coef[1])))

    def select(call: Any) -> None:
        if _is_select(call):
            tvm_ffi.structural_walk(call.args[0], (ir.expr.Expr, compare))

    tvm_ffi.structural_walk(stmt.body, (ir.expr.Call, select))
    runs = math.gcd(*bounds) if bounds else 0
    return runs or None


def vector_steps(sch: Any, loop: Any, tiling: Tiling) -> Any:
    """A loop of several vectors (an NHWC conv's or a packed matmul's register tile, see
    ``cpu_kernels.tile_vectors``) as an unrolled loop of one-vector steps; returns the vectorized
    loop. LLVM handed a 48-lane vector widens it to 64 and shuffles it through the stack:
    MobileNetV2's 24 → 144 conv took 9.1 instead of 0.3 ms."""
    extent = _extent(sch, loop)
    if extent is not None and extent > tiling.lanes and extent % tiling.lanes == 0:
        steps, loop = sch.split(loop, [None, tiling.lanes])
        sch.unroll(steps)
    sch.vectorize(loop)
    return loop


def _finish(sch: Any, block: Any, epilogue: Any, outer: Sequence[Any], first_reduction: Any,
            unrolled: Any | None, vector: Any, epilogue_vector: str, tiling: Tiling) -> None:
    """Shared tail of the tiled rules: unroll/vectorize, parallel outer loops, split init."""
    if epilogue_vector == "inner":
        sch.vectorize(sch.get_loops(epilogue)[-1])
    if unrolled is not None:
        sch.unroll(unrolled)
    sch.vectorize(vector)
    parallel = _parallel(sch, outer, tiling)
    init = sch.decompose_reduction(block, first_reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    _schedule_prologue(sch, block, parallel, tiling)


# --------------------------------------------------------------------------- rules


def _column_tile(width: int, cap: int) -> int:
    """The kernels compute a width that ``column_tile`` divides; ``cap`` (a bounds check in the
    inner loop) only for widths they did not plan, such as a different target's."""
    return column_tile(width, cap) or min(cap, width)


def packed_conv2d(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_conv2d``: tile = ``T`` output columns × one packed vector of output channels."""
    conv = _find_block(sch, CONV2D_BLOCK)
    if conv is None:
        return None
    block = int(sch.get(conv).reads[1].source.shape[-1])
    cap = max(1, tiling.accumulators // max(1, block // tiling.lanes) // 2)
    tiled = _conv_tile(sch, conv, block, cap)
    if tiled is None:
        return None
    outer, first_reduction, xi, ci, epilogue = tiled
    for producer in sch.get_producers(conv):
        if sch.get(producer).name_hint == PAD_BLOCK:
            for cast in sch.get_producers(producer):
                if sch.get(cast).name_hint == CAST_BLOCK:
                    sch.compute_inline(cast)  # cast while padding: one pass over the input
    _finish(sch, conv, epilogue, outer, first_reduction, xi, ci, "done", tiling)
    return sch


def _conv_tile(sch: Any, conv: Any, block: int, cap: int) -> tuple[list[Any], Any, Any, Any, Any] | None:
    """Split an NCHW conv into the register tile shared by both packed conv kernels.

    Loop order ``n, channel block, row, column tile | reductions | T columns, B channels``; the
    epilogue computed per tile. Returns (outer loops, first reduction loop, column loop, channel
    loop, epilogue block).
    """
    n, c, y, x, *reductions = sch.get_loops(conv)
    width = _extent(sch, x)
    if width is None:
        return None
    tile = _column_tile(width, cap)
    co, ci = sch.split(c, [None, block])
    xo, xi = sch.split(x, [None, tile])
    sch.reorder(n, co, y, xo, *reductions, xi, ci)
    epilogue = _epilogue_at(sch, conv, xo)
    # Accumulators channel-innermost, so each is one vector in memory: with the NCHW order a
    # tile is a strided [B, T] patch that LLVM may split into scalars (measured 9× slower).
    sch.transform_layout(conv, ("write", 0), lambda b, ch, row, col: (b, row, ch // block, col, ch % block))
    # The output is contiguous along columns: full vectors of columns store along columns
    # (reading the accumulators transposed, from L1), short rows along channels.
    e_loops = sch.get_loops(epilogue)[-4:]
    if tile % 8 == 0:
        sch.vectorize(e_loops[-1])
    else:
        sch.reorder(e_loops[0], e_loops[2], e_loops[3], e_loops[1])
        sch.vectorize(e_loops[1])
    return [n, co, y], reductions[0], xi, ci, epilogue


def depthwise_conv2d(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_depthwise``: per output plane (parallel), its padded input planes computed first
    (still in cache when read), then tiles of ``R`` rows × ``V`` columns (``tile_plan``): per
    tap one weight broadcast and ``R`` contiguous vector loads; the epilogue per tile."""
    conv = _find_block(sch, DEPTHWISE_BLOCK)
    src = _find_block(sch, DEPTHWISE_SRC_BLOCK)
    if conv is None or src is None:
        return None
    n, c, y, x, *reductions = sch.get_loops(conv)
    height, width, per_group = _extent(sch, y), _extent(sch, x), _extent(sch, reductions[0])
    if height is None or width is None or per_group is None:
        return None
    # One output channel per group (depthwise, multiplier 1): no two planes read one input plane.
    in_channels = int(sch.get(src).writes[0].source.shape[1])
    own_planes = in_channels == int(sch.get(conv).writes[0].source.shape[1]) * per_group
    rows, columns = tile_plan(height, width, tiling.lanes, tiling.accumulators)
    yo, yi = sch.split(y, [None, rows])
    xo, xi = sch.split(x, [None, columns])
    sch.reorder(n, c, yo, xo, *reductions, yi, xi)
    epilogue = _epilogue_at(sch, conv, xo)
    sch.vectorize(sch.get_loops(epilogue)[-1])
    sch.unroll(yi)
    sch.vectorize(xi)
    plane = _parallel(sch, [n, c], tiling)
    init = sch.decompose_reduction(conv, reductions[0])
    sch.vectorize(sch.get_loops(init)[-1])
    # A plane's padded copy computed right before its convolution is still in cache when read, but
    # costs loop overhead per plane: small planes (7x7 maps) are copied in one pass before.
    rows_read, _phases, columns_read = (int(d) for d in sch.get(src).writes[0].source.shape[2:])
    widen = _find_block(sch, DEPTHWISE_WIDEN_BLOCK)
    if own_planes and rows_read * columns_read >= LARGE_PLANE:
        sch.compute_at(src, plane, preserve_unit_loops=True)
        if widen is not None:
            sch.compute_at(widen, plane, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(widen)[-1])
    else:  # also when output channels share input planes: each would pad them again
        _parallel(sch, sch.get_loops(src)[:2], tiling)
        if widen is not None:
            _parallel_vectorized(sch, widen, tiling)
    _copy_without_bounds_tests(sch, src)
    return sch


def _copy_without_bounds_tests(sch: Any, src: Any) -> None:
    """Vectorize the padded copy along its columns, with the rows and columns that read inside the
    input (``INTERIOR_ATTR``) in loops of their own, where the bounds test simplifies away: along
    a vector it makes TVM scalarize the copy (measured slower than the convolution itself)."""
    first_row, end_row, first_column, end_column = (int(v) for v in sch.get(src).annotations[INTERIOR_ATTR])
    *_, y, _phase, _column = sch.get_loops(src)
    row_parts = _partition(sch, y, first_row, end_row)
    for index, part in enumerate(row_parts):
        interior = first_row < end_row and (len(row_parts) == 1 or index == (1 if first_row > 0 else 0))
        column = sch.get_loops(_leaf_block(sch, part))[-1]
        for piece in _partition(sch, column, first_column, end_column) if interior else [column]:
            sch.vectorize(piece)


def _partition(sch: Any, loop: Any, start: int, end: int) -> list[Any]:
    """Split ``loop`` into ``[0, start)``, ``[start, end)``, ``[end, extent)``, empty parts left out."""
    extent = _extent(sch, loop) or 0
    sizes = [size for size in (start, end - start, extent - end) if size > 0]
    if len(sizes) < 2:
        return [loop]
    return list(sch.loop_partition(loop, [*sizes[:-1], None]))


def _leaf_block(sch: Any, loop: Any) -> Any:
    """The computing block under ``loop`` (loop_partition wraps each part in opaque blocks)."""
    block = sch.get_child_blocks(loop)[0]
    while not sch.get(block).iter_vars:
        block = sch.get_child_blocks(block)[0]
    return block


#: Independent accumulator vectors a few-row ``packed_matmul`` tile reaches by taking column blocks
#: side by side. 1×2048 · 2048×1000 (blocks of 8): 0.14–0.15 → 0.08–0.09 ms at 5; but 1×2048 · 2048×8192 (67 MB
#: of weights, blocks of 32) went 1.55 → 2.1 ms at 16 (8 weight streams per task): each block is
#: its own stream, so few.
GEMV_VECTORS = 6


def packed_matmul(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_matmul``: tile = ``R`` rows × one packed block of columns (1–2 vectors)."""
    mm = _find_block(sch, MATMUL_BLOCK)
    if mm is None:
        return None
    widen, weight = weight_through(sch, mm, WIDEN_BLOCK)
    *batch, m, n, k = sch.get_loops(mm)
    block = block_of(weight)
    m_rows = _extent(sch, m)
    items = [_extent(sch, loop) for loop in batch]
    if m_rows is None or None in items:
        return None
    vectors = max(1, block // tiling.lanes)
    cap = max(1, matmul_row_cap(tiling.lanes, vectors))
    # A tile of the fused batch×rows loop must not straddle two batch items: the epilogue
    # computed under it then wrote the wrong rows (GPT-2's 2×24-row LM head: cosine 0.92).
    tile = _divisor(m_rows, cap) or 1
    if batch and tile == m_rows:
        # Items of few rows (m = 1: a sequence-first [S, 1, E] operand, an RNN's input projection)
        # share a tile whole, so the weight is read once per tile, not once per row: [128, 1, 768] ·
        # [768, 768] 3.4 → 0.73 ms (onnxruntime 0.78). Whole items keep the epilogue's rows exact.
        tile *= _box_items(items, cap // m_rows)  # type: ignore[arg-type]
    blocks = (_extent(sch, n) or 0) // block
    if tile <= m_rows:
        # Within one item: split the rows alone, the items and the row tiles fused outside. The
        # tile's accumulators are then a [tile, block] buffer at constant offsets that LLVM keeps in
        # registers; split out of the fused loop, its rows were a division's bounds and the buffer a
        # workspace allocation indexed at run time.
        ro, ri = sch.split(m, [None, tile])
        ro = sch.fuse(*batch, ro) if batch else ro
    else:
        ro, ri = sch.split(sch.fuse(*batch, m), [None, tile])
    no, ni = sch.split(n, [None, block])
    # Few rows (a GEMV: a classifier head, an RNN step, LLM decoding) leave accumulators spare: the
    # tile takes several column blocks too, so each k step issues independent FMAs instead of one
    # chain (1×2048 · 2048×1000 ran at one FMA per latency). The sum order per column is unchanged.
    group = _divisor(blocks, max(1, GEMV_VECTORS // (vectors * tile))) or 1
    # Column blocks outermost: one packed weight panel stays in L2 while all rows pass.
    if group > 1:
        no, nb = sch.split(no, [None, group])
        sch.reorder(no, ro, k, ri, nb, ni)
        sch.unroll(nb)
    else:
        sch.reorder(no, ro, k, ri, ni)
    row_tiles = _extent(sch, ro) or 1
    panel = (widen is not None and group == 1 and row_tiles >= WIDEN_REUSE and blocks >= PANEL_MIN_BLOCKS
             and math.prod(int(d) for d in weight.shape[1:]) * 4 <= WIDEN_PANEL_BYTES)
    if widen is not None and not panel:
        sch.compute_inline(widen)
    chain = _epilogue_chain(sch, mm)
    if group == 1 and _crops_columns(sch, chain[-1], blocks * block):
        epilogue = _cropping_epilogue(sch, chain, tiling)
    else:
        epilogue = _epilogue_at(sch, mm, ro, chain)
        vector_steps(sch, sch.get_loops(epilogue)[-1], tiling)
    ni = vector_steps(sch, ni, tiling)
    if panel:
        _widen_panel(sch, mm, widen, no, tiling)
        _finish(sch, mm, epilogue, [no], k, ri, ni, "done", tiling)
    else:
        _finish(sch, mm, epilogue, [no, ro], k, ri, ni, "done", tiling)
        _prefetch_next_panel(sch, mm, weight, row_tiles, group)
    return sch


#: The most bytes a weight panel widened to float32 may take (``_widen_panel``, and a conv's,
#: ``cpu_schedules_nhwc._widen_panels``): it stays in L2 beside the tiles' inputs while they read it.
WIDEN_PANEL_BYTES = 1 << 20

#: The fewest register tiles that read a panel for it to be widened once for them.
WIDEN_REUSE = 4

#: The fewest column blocks for which a matmul widens each block's weight panel once (``_widen_panel``):
#: its loop over blocks is then the only parallel one, so it needs a few blocks a thread.
PANEL_MIN_BLOCKS = 8


def _widen_panel(sch: Any, mm: Any, widen: Any, blocks: Any, tiling: Tiling) -> None:
    """A float16 weight's column-block panel converted to float32 once per block, into a buffer its
    row tiles read, the next block's panel prefetched over those reads; the loop over blocks is then
    the parallel one (its row tiles inside).

    Why: each tile converted each weight vector it read, one more instruction on the FMA ports per
    three vectors' 24 FMAs of an 8 × 3-vector tile. Whole float16 runs, paired: BERT-base 0.96×,
    GPT-2 0.96×, ViT 0.92×, ConvNeXt 0.97×, T5 0.98×; Whisper, wav2vec2, Llama, GRU level; the LSTM
    1.02× (its widened matmuls 0.85×, its step kernels slower: the effect ``cpu_schedules_nhwc.
    _widen_panels`` describes)."""
    weight = sch.get(widen).reads[0].source
    panel = math.prod(int(d) for d in weight.shape[1:])
    widened = widen_under(sch, widen, mm, blocks, panel, tiling)
    sch.annotate(blocks, NEXT_CHUNK, chunk_plan(panel, str(weight.name), over=widened))


def widen_under(sch: Any, widen: Any, consumer: Any, loop: Any, elements: int, tiling: Tiling) -> str:
    """The widening stage ``widen`` computed under ``loop`` of its ``consumer`` — the ``elements`` of
    one panel, one vector a step (LLVM shuffled a 48-lane vector through the stack); returns the
    widened buffer's name."""
    sch.compute_at(widen, loop, preserve_unit_loops=True)
    shared = [sch.get(lp) for lp in sch.get_loops(consumer)]
    inner = [lp for lp in sch.get_loops(widen) if not any(sch.get(lp).same_as(other) for other in shared)]
    run = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    if elements % tiling.lanes == 0:
        run = sch.split(run, [None, tiling.lanes])[1]
    sch.vectorize(run)
    return str(sch.get(widen).writes[0].source.name)


def producer_named(sch: Any, block: Any, name: str) -> Any | None:
    """The producer of ``block`` whose block is called ``name``, or None."""
    return next((p for p in sch.get_producers(block) if sch.get(p).name_hint == name), None)


def weight_through(sch: Any, block: Any, widen_name: str) -> tuple[Any | None, Any]:
    """(the widening stage called ``widen_name`` that ``block`` reads its weight, its second operand,
    through, or None; the weight buffer itself)."""
    widen = producer_named(sch, block, widen_name)
    return widen, sch.get(widen).reads[0].source if widen is not None else sch.get(block).reads[1].source


def _prefetch_next_panel(sch: Any, mm: Any, weight: Any, row_tiles: int, group: int) -> None:
    """Mark a matmul's loop over column blocks × row tiles for ``prefetch_chunks``: the next
    block's weight panel prefetched over the row tiles of the current one. Not for one row tile (a
    GEMV streams its panels once, which the hardware prefetcher follows) or per-item weights.

    Why: a panel came from memory during its first row tile only; the other tiles read it from L2.
    BERT-base's 3072 → 768 matmul (9.4 MB of weights) took 2.36 ms in the model, 1.79 alone
    (onnxruntime 2.05 and 1.72).
    """
    if row_tiles < 2 or len(weight.shape) != 3:
        return
    panel = group * math.prod(int(d) for d in weight.shape[1:])
    sch.annotate(sch.get_loops(mm)[0], NEXT_CHUNK, chunk_plan(panel, str(weight.name), row_tiles))


def _box_items(extents: list[int], cap: int) -> int:
    """The most batch items, up to ``cap``, a tile of the fused batch loops (``extents`` outermost
    first) may take so that every tile is a box: whole runs of the inner batch axes times a divisor
    of the next one out.

    Why a box: the epilogue computed under the tile covers the bounding box of the tile's items.
    Three items of a [3, 2] batch (attention probabilities · V, [3, 2, 2, 6] · [3, 2, 6, 8], on an
    AVX2 core whose 6-row tiles hold three 2-row items) span two items of the outer axis, so the
    box took four: the epilogue stored an item not yet computed, and the item's own rows, computed
    under the previous tile, were gone from the tile's compacted buffer — 16 of 96 values wrong.
    """
    total = math.prod(extents)
    for count in range(min(cap, total), 1, -1):
        rest = count
        for extent in reversed(extents):
            if rest % extent:
                rest = 1 if extent % rest == 0 else 0  # a divisor of this axis: a box; else none
                break
            rest //= extent
        if rest == 1:  # whole inner runs times a divisor of the next axis: divides the total too
            return count
    return 1


def _crops_columns(sch: Any, epilogue: Any, columns: int) -> bool:
    """Whether the epilogue writes fewer than the ``columns`` the matmul computes (a matmul of
    two computed tensors whose right operand was padded to whole blocks)."""
    try:
        return int(sch.get(epilogue).writes[0].source.shape[-1]) < columns
    except TypeError:
        return False


def _cropping_epilogue(sch: Any, chain: list[Any], tiling: Tiling) -> Any:
    """An epilogue that crops the matmul's padded columns as a pass of its own after it: rows in
    parallel, each row's whole vectors vectorized and the rest scalar; its elementwise steps inlined.

    Why: under the tile, the last column block's bounds test on a vector's lanes made TVM scalarize
    the whole epilogue — ViT's 197 × 197 attention scores took 3.47 ms, where the same product over
    208 columns took 1.76."""
    for step in chain[:-1]:
        try_inline(sch, step)
    last = chain[-1]
    *outer, column = sch.get_loops(last)
    width = _extent(sch, column) or 0
    if outer:
        _parallel(sch, outer, tiling)
    whole = width // tiling.lanes * tiling.lanes
    if whole >= tiling.lanes:
        head = _partition(sch, column, whole, width)[0]
        _, lanes = sch.split(head, [None, tiling.lanes])
        sch.vectorize(lanes)
    return last


def tiled_reduction(sch: Any, tiling: Tiling) -> Any | None:
    """One reduction block whose innermost spatial axis is contiguous in every operand."""
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    reductions = [info for info in infos if not info.is_injective()]
    if len(reductions) != 1:
        return None
    info = reductions[0]
    kinds = info.dom_kind()
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if spatial == 0 or spatial == len(kinds) or set(kinds[spatial:]) != {"R"}:
        return None
    block = info.block_rv
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    extents = [_extent(sch, loop) for loop in loops]
    if None in extents or len(stmt.writes) != 1:
        return None
    if _inline_operand_producers(sch, block):
        stmt = sch.get(block)
    sizes = [int(e) for e in extents if e is not None]
    vec = next((i for i in reversed(range(spatial)) if sizes[i] > 1), None)
    if vec is None:
        return None
    var = stmt.iter_vars[vec].var
    if _stride(stmt.writes[0], var) != 1:
        return None
    if any(s is None or s > 2 for s in (_stride(r, var) for r in stmt.reads)):
        return None
    # One vector (a shorter one when the axis is short): wider tiles of odd widths were split
    # into scalars by LLVM.
    width = _divisor(sizes[vec], tiling.lanes, min(4, sizes[vec]))
    if width is None:
        return None
    # Row axis: a spatial loop that some operand does not depend on (its loads are reused).
    row = next((i for i in reversed(range(spatial)) if i != vec and sizes[i] > 1
                and any(_stride(r, stmt.iter_vars[i].var) == 0 for r in stmt.reads)), None)
    wide = WIDE_TILE_VECTORS * tiling.lanes
    if row is not None and _converts_operands(stmt) and sizes[vec] % wide == 0:
        width = wide
    vectors = max(1, -(-width // tiling.lanes))
    vo, vi = sch.split(loops[vec], [None, width])
    outer = [loop for i, loop in enumerate(loops[:spatial]) if i not in (vec, row)]
    unrolled = None
    if row is not None:
        rows = _divisor(sizes[row], max(1, tiling.accumulators // vectors)) or 1
        ro, unrolled = sch.split(loops[row], [None, rows])
        outer.append(ro)
    outer.append(vo)
    sch.reorder(*outer, *loops[spatial:], *([unrolled] if unrolled is not None else []), vi)
    epilogue = _epilogue_at(sch, block, outer[-1])
    _finish(sch, block, epilogue, outer, loops[spatial], unrolled, vi, "inner", tiling)
    return sch


def _inline_operand_producers(sch: Any, block: Any) -> bool:
    """A reduction over a single operand (max or average pooling): its elementwise producers (the
    padded copy, a cast) inlined into its reads; whether any was.

    Why: the padded copy was a whole pass over the input, written and read again, before a pool
    that reads each element a few times from cache anyway. ResNet-50's 3×3/2 max pool of
    112² × 64 (float32, 1 thread, an Ice Lake core): 0.91 → 0.35 ms (onnxruntime 0.22), the
    average pool 0.75 → 0.29 ms (onnxruntime 0.28). A conv's taps (two operands) keep the copy:
    the bounds test would sit in its inner loop. Pads of the contiguous axis stay copies
    (``_keeps_innermost_axis``).
    """
    stmt = sch.get(block)
    output = stmt.writes[0].source
    if len([r for r in stmt.reads if not r.source.same_as(output)]) != 1:
        return False
    inlined = False
    # Until none is left: the producer of an inlined one (a float16 input's cast, under the padded
    # copy) is the block's own producer next. Left as a pass of its own, that cast wrote ResNet-50's
    # 112² × 64 input out in float32 and the float16 max pool took 3× its float32 kernel.
    while any([try_inline(sch, producer) for producer in sch.get_producers(block)
               if _keeps_innermost_axis(sch.get(producer)) and _cheap(sch.get(producer))]):
        inlined = True
    return inlined


#: Expression nodes a producer inlined into a pool may have: a pool reads each input element
#: once per window that covers it (25 times for 5×5 stride 1), so only a pad (32 nodes) or a
#: cast is recomputed there, never an activation's polynomial.
CHEAP_PRODUCER = 64


def _cheap(stmt: Any) -> bool:
    return isinstance(stmt.body, tirx.BufferStore) and _size(stmt.body.value) <= CHEAP_PRODUCER


def _keeps_innermost_axis(stmt: Any) -> bool:
    """Whether a producer's output has its inputs' innermost extent (pads no contiguous axis).

    Inlined, a pad of the vectorized axis (an NCHW pool's W) puts its bounds test in every lane:
    a standalone NCHW 5×5 max pool went 0.9 → 4.7 ms. An NHWC pool pads H and W, not C."""
    try:
        innermost = int(stmt.writes[0].source.shape[-1])
        return all(int(read.source.shape[-1]) == innermost for read in stmt.reads)
    except (TypeError, IndexError):  # a symbolic or 0-d shape
        return False


#: Vectors per row of a ``tiled_reduction`` tile whose operands are converted as they are read
#: (bfloat16/float16 attention products summed in float32): each broadcast row value and each
#: loaded vector is converted once per tile step, so a tile of 4 rows × 4 vectors does 16 FMAs per
#: 8 conversions where 16 rows × 1 vector did 16 per 17. BERT-base bf16's q·kᵀ 0.25–0.32 → 0.14–0.15
#: ms and p·v 0.23–0.27 → 0.12–0.15 ms per call (kernels alone, 2 threads); float32 operands (nothing to
#: convert: the row value is a broadcast memory operand of its FMA) keep one vector.
WIDE_TILE_VECTORS = 4


def _converts_operands(stmt: Any) -> bool:
    """Whether a reduction block reads an operand of another dtype than it accumulates in."""
    accumulated = str(stmt.writes[0].source.dtype)
    return any(str(read.source.dtype) != accumulated for read in stmt.reads)


def _stride(region: Any, var: Any) -> int | None:
    """Flat stride of an access along ``var``: 0 broadcast, 1 contiguous, None non-affine."""
    total, scale = 0, 1
    shape = region.source.shape
    for index in reversed(range(len(region.region))):
        coef = detect_linear_equation(region.region[index].min, [var])
        dim = shape[index]
        if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm) or not isinstance(dim, tirx.IntImm):
            return None
        total += int(coef[0]) * scale
        scale *= int(dim)
    return total


def _concat_read_often(sch: Any, block: Any) -> bool:
    """Whether ``block`` selects between other buffers' values (a concat) and a consumer reads it
    more than once (an activation's polynomial: ``exp_f32`` reads its operand 29 times).

    Why: inlined there, each read is the whole select over gathered loads again. YOLOv8's scores,
    concatenated over three scales and then put through a sigmoid, took 1.1 ms as scalars and 2.5
    ms as vectors of such selects; computed once, a chunk at a time before the sigmoid, 0.20 ms."""
    stmt = sch.get(block)
    if not isinstance(stmt.body, tirx.BufferStore) or not _selects_buffers(stmt.body.value):
        return False
    return _most_reads(sch, block) > 1


def _selects_buffers(expr: Any) -> bool:
    """Whether ``expr`` has an ``if_then_else`` whose branches both read a buffer (a concat's; a
    pad's has a constant branch)."""
    found = [False]

    def reads(branch: Any) -> bool:
        loads = [False]
        tvm_ffi.structural_walk(branch, (ir.expr.TensorLoad, lambda _load: loads.__setitem__(0, True)))
        return loads[0]

    def select(call: Any) -> None:
        if _is_select(call) and reads(call.args[1]) and reads(call.args[2]):
            found[0] = True

    tvm_ffi.structural_walk(expr, (ir.expr.Call, select))
    return found[0]


#: The most blocks an elementwise kernel inlines into its last. Each inlining rewrites and
#: re-analyses the consumer, whose expression grows with every producer: the concat of a
#: 300-iteration Loop's scan outputs (256 ``expand_dims`` fused into it) took 50 ms an inlining,
#: 14 s in all; at 97 blocks 14 ms (1.3 s in all). Past this, each block is a loop nest of its
#: own, a copy each at run time: 0.85× for those 256 steps, but 1.34× for a CRNN's 67 (0.022 ms).
INLINE_BLOCKS = 96


def injective(sch: Any, tiling: Tiling) -> Any | None:
    """Elementwise/broadcast/transpose chains: inline into the last block, parallel + vectorize."""
    infos = normalize_prim_func(sch)
    if not infos or not all(info.is_injective() for info in infos):
        return None
    many = len(infos) > INLINE_BLOCKS
    kept = [info.block_rv for info in infos[:-1]
            if many or _concat_read_often(sch, info.block_rv) or not try_inline(sch, info.block_rv)]
    last = infos[-1].block_rv
    if many or sum(_writes_output(sch, block) for block in (*kept, last)) > 1:
        # Too many blocks to inline, or several outputs (a Split: an RNN's projection cut into its
        # timesteps), none of which can be computed inside another's loops: each is a loop nest of
        # its own, on one thread when small. The rule failed on several outputs, and the fallback
        # ran each of 50 768-value pieces as a parallel scalar loop: 0.19 ms for what takes 0.003 ms.
        for block in (*kept, last):
            _parallel_vectorized(sch, block, _block_tiling(sch, block, tiling))
        return sch
    if not _tile_transpose(sch, last, tiling):
        _parallel_vectorized(sch, last, tiling)
    loops = sch.get_loops(last)
    for block in reversed(kept):
        # Computed chunk by chunk right before the chunk that reads it (one vector's worth, in
        # L1): as whole tensors of their own they made Mish 4× slower than one inlined step.
        if len(loops) >= 2:
            sch.compute_at(block, loops[-2], preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(block)[-1])
        else:
            _parallel_vectorized(sch, block, tiling)
    return sch


#: Side of the square tiles a transpose is copied in: 16 float32 are one cache line.
TRANSPOSE_TILE = 16


def _tile_transpose(sch: Any, block: Any, tiling: Tiling) -> bool:
    """Copy a transpose in square tiles: its innermost loop vectorized as before, but with the loop
    along which the input is contiguous just outside it, split to the same tile.

    Why: vectorized along the output's last axis alone, a layout change such as NHWC → NCHW reads
    every value of a vector from another cache line and comes back to each line once per channel,
    long after it left the cache: a 56×56×256 map took 3.6 ms (onnxruntime's reorder 0.43 ms).
    Tiled, the 16 lines a tile reads stay in L1 for its 16 vectors. The same holds when the columns
    are no affine function of the output's (a transposed conv's phase interleave reads
    ``x[h/2, w/2, …]``: 0.24 → 0.10 ms for 64×56² at a model's output) and for several reads
    contiguous along one axis (a concat; Llama's rotary embedding into a transposed K: 0.28 → 0.12
    ms), with reads that stay put along the columns (a per-channel bias) beside them. Returns False
    (nothing done) when the block is no such copy or an extent has no divisor from 4 to 16.
    """
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    extents = [_extent(sch, loop) for loop in loops]
    if len(loops) < 2 or None in extents or len(stmt.iter_vars) != len(loops):
        return False
    if any(int(iv.iter_type) != SPATIAL for iv in stmt.iter_vars):
        return False
    variables = [iv.var for iv in stmt.iter_vars]
    # The reads that move along the last axis (a transpose's one, a concat's several); others (a
    # per-channel bias) stay put along it. Each must be contiguous along one same other axis.
    moving = [read for read in stmt.reads if _stride(read, variables[-1]) != 0]
    strides = [[_stride(read, var) for var in variables] for read in moving]
    contiguous = [i for i in range(len(variables) - 1) if strides and all(s[i] == 1 for s in strides)]
    if any(s[-1] == 1 for s in strides) or not contiguous:
        return False  # not a transpose: contiguous along the last axis, or along no other
    along = contiguous[-1]
    # The largest divisors up to a line (56 columns: 14): a remainder would test bounds per element.
    tiles = [_divisor(extent, TRANSPOSE_TILE, 4) for extent in (extents[along], extents[-1]) if extent is not None]
    if len(tiles) != 2 or None in tiles:
        return False
    outer_c, inner_c = sch.split(loops[along], [None, tiles[0]])
    outer_x, inner_x = sch.split(loops[-1], [None, tiles[1]])
    rest = [loop for i, loop in enumerate(loops[:-1]) if i != along]
    sch.reorder(*rest, outer_c, outer_x, inner_c, inner_x)
    _parallel(sch, [*rest, outer_c, outer_x], tiling)
    sch.vectorize(inner_x)
    return True


def row_reduction(sch: Any, tiling: Tiling) -> Any | None:
    """TVM's ``dlight.cpu.Reduction`` (softmax, layer norm), for kernels worth parallelizing."""
    if not tiling.parallel:
        return None
    from tvm.target import Target  # noqa: PLC0415

    return dlight.cpu.Reduction().apply(sch.mod["main"], Target.current(allow_none=False), False)


def parallel_outer(sch: Any, tiling: Tiling) -> Any | None:
    """Leading spatial loops of every block in parallel; nothing else."""
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    for info in infos:
        kinds = info.dom_kind()
        count = len(kinds) - len(kinds.lstrip("S"))
        loops = sch.get_loops(info.block_rv)
        if count:
            _parallel(sch, loops[:count], tiling)
    return sch
