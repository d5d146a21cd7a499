"""Row reductions (softmax, layer norm, RMS norm, mean/variance) with vectorized partial sums.

What: a kernel of row reductions and elementwise steps that share their leading (row) axes —
softmax = max → exp → sum → divide — gets each reduction over the contiguous innermost axis
split into ``lanes`` partial results (``rfactor``): one vector accumulator per row, combined
across its lanes once at the end. Every block then runs per row under one parallel loop, the
elementwise steps vectorized, single-use ones inlined into their consumer.

Why: TVM's ``dlight.cpu.Reduction`` (the rule this one goes before) leaves each reduction a
scalar chain: a BERT-base layer norm summed its 768 values one dependent add after the other,
twice per row (0.105 ms per call; the rows' arithmetic is ~10× less), and softmax did the same
over its 128 scores. It notes that ``rfactor`` needs the block first under its loop, so here
the reductions are factored before anything moves under the row loop.

A kernel whose reductions each write one value (one row of everything: GroupNorm(1, C)) and whose
elementwise steps broadcast it back over the elements runs each reduction once at its root, the
elementwise steps after it, parallel (``_whole_reductions``).

When not: a reduction over an axis that is not contiguous in its inputs (softmax over channels
of NCHW), over fewer than two vectors, or of a length no power-of-two vector width ≥ 4 divides:
the rule passes and dlight's takes the kernel. (A kernel may hold a reduction shorter than a
vector, left scalar, beside one it factors: ``cpu_tail_reduction`` splits lengths no vector
divides so.)

Preserves: values up to float rounding — ``lanes`` partial sums added together at the end are
a different order of additions from one chain (max and min are exact).
"""

from __future__ import annotations

import math
from typing import Any

from tvm.s_tir.dlight.analysis import normalize_prim_func

from amptool.compiler.cpu_schedules import SPATIAL as _SPATIAL
from amptool.compiler.cpu_schedules import (
    Tiling,
    _extent,
    _parallel,
    _parallel_vectorized,
    _partition,
    _stride,
    try_inline,
)
from amptool.compiler.cpu_tail_reduction import ROW_VECTOR_WIDTHS


def vector_row_reduction(sch: Any, tiling: Tiling) -> Any | None:
    """Schedule a row-reduction kernel with ``lanes``-wide partial reductions (see module doc)."""
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    reductions = [info for info in infos if not info.is_injective()]
    if not reductions:
        return None
    if all(_one_value(sch, info) for info in reductions) and len(infos) > len(reductions) and \
            max(_reduced(sch, info) for info in reductions) >= WHOLE_REDUCTION_MIN:
        return _whole_reductions(sch, reductions, tiling)
    rows = min(_leading_spatial(info.dom_kind()) for info in infos)
    if rows == 0:
        return None
    widths = [_plan(sch, info, tiling) for info in reductions]
    if None in widths or not any(widths) or not _rows_shared(sch, infos, rows):
        return None
    for info, width in zip(reductions, widths, strict=True):
        if width:
            factor_lanes(sch, info.block_rv, width)
    return _schedule_rows(sch, rows, tiling)


#: Fewest values a reduction over everything must take for ``_whole_reductions``: dlight's schedule
#: repeats it for each output element, N² adds — at 256, ~65,000 (a few µs); a 1×8 softmax stays its.
WHOLE_REDUCTION_MIN = 256


def _reduced(sch: Any, info: Any) -> int:
    """How many values a reduction block combines into each result (0 when not static)."""
    loops = sch.get_loops(info.block_rv)
    sizes = [_extent(sch, loop) for loop, kind in zip(loops, info.dom_kind(), strict=False) if kind == "R"]
    return math.prod(int(size) for size in sizes if size is not None) if None not in sizes else 0


def _one_value(sch: Any, info: Any) -> bool:
    """Whether a reduction block writes a single value (every spatial loop of extent 1)."""
    loops = sch.get_loops(info.block_rv)
    return all(_extent(sch, loop) == 1 for loop, kind in zip(loops, info.dom_kind(), strict=False) if kind == "S")


def _whole_reductions(sch: Any, reductions: list[Any], tiling: Tiling) -> Any | None:
    """Reductions over every element (one row: GroupNorm(1, C) exported as an InstanceNormalization
    over ``[1, 1, C·H·W]``) whose results the kernel's elementwise steps broadcast back over those
    elements: each reduction runs once, lanes-wide, at the root; the elementwise steps run after it,
    parallel and vectorized. dlight's rule computed the reduction inside the elementwise loop, once
    per output element — quadratic: poolformer_s12's norms took 145 s of a 150 s diff."""
    widths = [_plan(sch, info, tiling) for info in reductions]
    if None in widths:
        return None
    for info, width in zip(reductions, widths, strict=True):
        if width:
            factor_lanes(sch, info.block_rv, width)
    _inline_single_use(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        if not all(iv.iter_type == _SPATIAL for iv in stmt.iter_vars):
            if str(stmt.name_hint).endswith("_rf"):
                _loops_in_iteration_order(sch, block)  # as a compute_at leaves them: vector_partials' premise
                vector_partials(sch, block)
        elif any((_extent(sch, loop) or 0) > 1 for loop in sch.get_loops(block)):
            _parallel_vectorized(sch, block, tiling)
    return sch


def _loops_in_iteration_order(sch: Any, block: Any) -> None:
    """Reorder ``block``'s loops to the order of the iteration variables they bind (rfactor puts its
    factored loop first)."""
    import tvm_ffi  # noqa: PLC0415
    from tvm import s_tir  # noqa: PLC0415

    name, found = sch.get(block).name_hint, []
    tvm_ffi.structural_walk(sch.mod["main"], (s_tir.SBlockRealize, lambda r: found.append(r)
                                              if r.block.name_hint == name else None))
    loops = {sch.get(loop).loop_var: loop for loop in sch.get_loops(block)}
    ordered = [next(loop for var, loop in loops.items() if var.same_as(value)) for value in found[0].iter_values]
    sch.reorder(*ordered)


def _rows_shared(sch: Any, infos: list[Any], rows: int) -> bool:
    """Whether every block's first ``rows`` loops have the last block's extents, the last block's
    being its first ``rows`` loops or all of them (a mean over the last axes writes one value per
    row): everything then moves under its row loops. (Normalisation may drop a unit row from one
    block and not another: a 1×8 softmax's last block had the 8 columns as its first loop, and
    everything went under that loop, vectorized — TVM refused.)"""
    def extents(info: Any) -> list[int | None]:
        return [_extent(sch, loop) for loop in sch.get_loops(info.block_rv)]

    last = extents(infos[-1])
    per_row = len(last) == rows and len(infos[-1].dom_kind()) == rows
    return (len(last) > rows or per_row) and all(extents(info)[:rows] == last[:rows] for info in infos)


def _leading_spatial(kinds: str) -> int:
    return len(kinds) - len(kinds.lstrip("S"))


def _plan(sch: Any, info: Any, tiling: Tiling) -> int | None:
    """The vector width for one reduction block, or None if it cannot be factored:
    its reduction axes must trail its spatial ones and the innermost be contiguous (or
    broadcast) in every input, with a length a vector width divides at least twice. 0 for a
    reduction of fewer values than a vector, left a scalar loop: the tail of a longer one
    (``cpu_tail_reduction``), when another reduction of the kernel is factored."""
    kinds = info.dom_kind()
    spatial = _leading_spatial(kinds)
    if spatial == len(kinds) or set(kinds[spatial:]) != {"R"}:
        return None
    stmt = sch.get(info.block_rv)
    extents = [_extent(sch, loop) for loop in sch.get_loops(info.block_rv)]
    if None in extents or len(stmt.writes) != 1:
        return None
    innermost = stmt.iter_vars[-1].var
    strides = [_stride(read, innermost) for read in stmt.reads]
    if any(s not in (0, 1) for s in strides) or 1 not in strides:
        return None
    length = int(extents[-1] or 0)
    width = next((w for w in ROW_VECTOR_WIDTHS if w <= tiling.lanes and length % w == 0 and length >= 2 * w), None)
    if width is None and len(kinds) - spatial == 1 and length < tiling.lanes:
        return 0
    return width


def factor_lanes(sch: Any, block: Any, width: int) -> Any:
    """Split ``block``'s innermost reduction loop into ``[length / width, width]`` and factor out
    the inner part: a block reducing into ``width`` partial results (a new innermost dimension of
    its buffer; returned), then ``block`` combining them. Before any ``compute_at``: rfactor wants
    the block first under its loops."""
    inner = sch.get_loops(block)[-1]
    _, lanes = sch.split(inner, [None, width])
    return sch.rfactor(lanes, factor_axis=len(sch.get(block).writes[0].source.shape))


def _schedule_rows(sch: Any, rows: int, tiling: Tiling) -> Any:
    """Every block per row under the last block's (parallel) row loop; partial reductions with
    their lanes innermost and vectorized; elementwise blocks vectorized, single-use ones inlined."""
    _inline_single_use(sch)
    *earlier, last = sch.get_child_blocks(sch.get_sblock("root"))
    # (a kernel ending in its reduction ends combining lanes; one ending in a value per row has no columns)
    columns = len(sch.get_loops(last)) > rows and all(iv.iter_type == _SPATIAL for iv in sch.get(last).iter_vars)
    row_loop = _parallel(sch, sch.get_loops(last)[:rows], tiling)
    for block in reversed(earlier):
        sch.compute_at(block, row_loop, preserve_unit_loops=True)
    for block in earlier:
        _schedule_block(sch, block, tiling)
    if columns:  # (last: a loop partition wraps the block, and nothing could move under it after)
        _vectorize_innermost(sch, last, tiling)
    return sch


def _inline_single_use(sch: Any) -> None:
    """Compute each elementwise block read by exactly one other block inside that consumer:
    one pass over the row less (softmax's shift and exp become one step). Until none is left: an
    inline can leave its producer with one consumer less (softmax's shift was read by the exp and
    by the NaN select around it)."""
    tried: set[str] = set()
    while True:
        *earlier, _last = sch.get_child_blocks(sch.get_sblock("root"))
        for block in earlier:
            stmt = sch.get(block)
            if (stmt.name_hint not in tried and all(iv.iter_type == _SPATIAL for iv in stmt.iter_vars)
                    and len(sch.get_consumers(block)) == 1):
                tried.add(stmt.name_hint)
                if try_inline(sch, block):
                    break
        else:
            return


def _schedule_block(sch: Any, block: Any, tiling: Tiling) -> None:
    stmt = sch.get(block)
    if all(iv.iter_type == _SPATIAL for iv in stmt.iter_vars):
        _vectorize_innermost(sch, block, tiling)
        return
    if not str(stmt.name_hint).endswith("_rf"):
        return  # the step combining a row's partial results: ``width`` scalars
    vector_partials(sch, block)


def vector_partials(sch: Any, block: Any) -> None:
    """An rfactor block (``factor_lanes``) after ``compute_at(preserve_unit_loops=True)``, which
    made its loops in iteration-variable order, the lanes (a spatial variable, the last index it
    writes) outside the reduction: the lanes innermost and vectorized, so each step of the
    reduction adds one vector; its init vectorized."""
    stmt = sch.get(block)
    lane_var = stmt.writes[0].region[-1].min
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    lanes = next(loop for loop, iv in zip(loops, stmt.iter_vars, strict=True) if iv.var.same_as(lane_var))
    reductions = [loop for loop, iv in zip(loops, stmt.iter_vars, strict=True) if iv.iter_type != _SPATIAL]
    sch.reorder(*reductions, lanes)
    sch.vectorize(lanes)
    init = sch.decompose_reduction(block, reductions[0])
    sch.vectorize(sch.get_loops(init)[-1])


def _vectorize_innermost(sch: Any, block: Any, tiling: Tiling) -> None:
    loops = sch.get_loops(block)
    extent = _extent(sch, loops[-1]) if loops else None
    if extent is None or extent < 4:
        return
    # Narrow vectors (8, 4) only for a row shorter than one whole vector: a longer one takes whole
    # vectors and a scalar tail — Whisper's 1500-key softmax wrote its rows 4 lanes at a time
    # (1500 = 375 · 4), its bf16 kernel 7.9 ms.
    narrow = (8, 4) if extent < tiling.lanes else ()
    width = next((w for w in (4 * tiling.lanes, 2 * tiling.lanes, tiling.lanes, *narrow) if extent % w == 0), None)
    if width is None:
        if extent >= tiling.lanes:  # whole vectors, then a scalar tail (a bounds test in the vector scalarizes it)
            head = _partition(sch, loops[-1], extent // tiling.lanes * tiling.lanes, extent)[0]
            _, lanes = sch.split(head, [None, tiling.lanes])
            sch.vectorize(lanes)
        return
    if width < extent:
        _, loops_inner = sch.split(loops[-1], [None, width])
        sch.vectorize(loops_inner)
    else:
        sch.vectorize(loops[-1])
