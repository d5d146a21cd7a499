"""Schedule rules for the NHWC kernels of :mod:`amptool.compiler.cpu_nhwc`.

What: one register tile per step — ``T`` output columns (unrolled) × ``B`` output channels (one
vector) — with the reductions (kernel row, kernel column, input channel) around it, the outer
loops (batch, row, channel block) fused and parallel, and the fused epilogue (bias, residual,
activation, cast) computed per tile, vectorized along channels; the depthwise conv unrolls its
taps. The bfloat16 conv's rule (the same tile, each 16-channel × input-pair step one
``vdpbf16ps``) is ``cpu_schedules_bf16.nhwc_conv2d_bf16``, imported only when a kernel needs it.

When not: kernels without these blocks (the rule returns None for the next one).
Preserves: each output's summation order (the reduction loops keep their order).
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

from amptool.compiler.bf16_pairs import block_of
from amptool.compiler.cpu_depthwise import INTERIOR_ATTR
from amptool.compiler.cpu_kernels import WEIGHTS_DOMINATE, flat_tile, nhwc_columns
from amptool.compiler.cpu_nhwc import (
    CONV2D_NHWC_BLOCK,
    DEPTHWISE_NHWC_BLOCK,
    NHWC_PAD_BLOCK,
    NHWC_WIDEN_BLOCK,
    ragged_row,
    weight_geometry,
)
from amptool.compiler.cpu_schedules import (
    WIDEN_PANEL_BYTES,
    WIDEN_REUSE,
    Tiling,
    _epilogue_at,
    _epilogue_chain,
    _extent,
    _find_block,
    _finish,
    _leaf_block,
    _parallel,
    _partition,
    producer_named,
    try_inline,
    vector_steps,
    weight_through,
    widen_under,
)
from amptool.compiler.prefetch_chunks import NEXT_CHUNK, chunk_plan
from amptool.compiler.stack_tiles import buffer_bytes

log = logging.getLogger(__name__)


def nhwc_tile(sch: Any, conv: Any, block: int, tiling: Tiling,
              chunk_weights: bool = False) -> tuple[list[Any], list[Any], Any, Any, Any] | None:
    """Split ``n, y, x, c | reductions`` into ``n, y, c/B, x/T | reductions | T, B`` — or ``n, c/B,
    y, x/T | …`` when the weights outweigh the input (``_weights_dominate``), or, where the weight
    is packed in chunks (``_weight_chunk``), ``n, c/B, rc/K, y, x/T | ry, rx, K | T, B``; returns
    (outer loops, reduction loops, column loop, channel loop, epilogue block). ``chunk_weights``:
    the weight is ``cpu_nhwc.pack_conv_weight``'s (the bf16 dot kernel's is 6-D too, not chunks)."""
    n, y, x, c, *reductions = sch.get_loops(conv)
    width = _extent(sch, x)
    if width is None or _extent(sch, c) is None:
        return None
    tile = nhwc_columns(width, tiling.lanes, max(1, block // tiling.lanes))
    ragged = ragged_row(width, tile)
    if width % tile and not ragged:
        return None  # the compute was planned for another target's tile: leave it to the generic rules
    co, ci = sch.split(c, [None, block])
    xo, xi = sch.split(x, [None, tile])
    if ragged:
        # The last tile's columns past the row are a bound on its block, a constant in each
        # unrolled copy of the tile loop: the unrolled code has no test left (cpu_nhwc.ragged_row).
        sch.unroll(xo)
    chunk = _weight_chunk(sch, conv) if chunk_weights and len(reductions) == 3 else None
    row_tiles, rows = (_extent(sch, loop) or 1 for loop in (xo, y))
    if chunk is not None:
        ry, rx, rc = reductions
        rco, rci = sch.split(rc, [None, chunk])
        reductions = [rco, ry, rx, rci]
        if not _fewer_steps(sch, [n, co], CHUNKED_BLOCKS):
            sch.reorder(n, co, rco, y, xo, ry, rx, rci, xi, ci)
            widened = _widen_panels(sch, conv, rco, rows * row_tiles, tiling, per_chunk=True)
            _prefetch_next_chunk(sch, conv, rco, widened)
            # Accumulated over the chunks in the block's output, a channel block's whole map at a time.
            return [n, co], reductions, xi, ci, _epilogue_at(sch, conv, co)
        # Too few channel blocks to share among the threads (the chunk loop, a reduction, cannot be
        # parallel): each tile reduces over every chunk, the rows parallel as for unchunked weights.
    if _weights_dominate(sch, conv):
        sch.reorder(n, co, y, xo, *reductions, xi, ci)
        outer = [n, co, y]
    else:
        sch.reorder(n, y, co, xo, *reductions, xi, ci)
        outer = [n, y] if _copy_rows_at(sch, conv, y, tiling) else [n, y, co]
    if _fewer_steps(sch, outer) and not ragged:
        # A conv1d is a one-row map: a 64-channel one has a single block of AVX-512 channel tiles,
        # and left all threads but one idle.
        outer.append(xo)
    # A widening stage sits under the innermost parallel loop or deeper (none between fused loops);
    # one channel block's panel is the whole weight, widened once before the tiles, in parallel.
    if _extent(sch, co) == 1:
        _widen_panels(sch, conv, None, rows * row_tiles, tiling)
    elif outer[-1] is xo:
        _widen_panels(sch, conv, xo, 1, tiling)
    elif outer[1] is y:
        _widen_panels(sch, conv, co, row_tiles, tiling)
    elif not _fewer_steps(sch, outer[:2]) and _widen_panels(sch, conv, co, rows * row_tiles, tiling):
        outer.pop()  # a block's panel for its whole map, the rows in turn
    else:
        _widen_panels(sch, conv, y, row_tiles, tiling)
    epilogue = _epilogue_at(sch, conv, xo)
    return outer, reductions, xi, ci, epilogue


def _fewer_steps(sch: Any, loops: list[Any], steps: int | None = None) -> bool:
    """Whether ``loops`` together iterate fewer than ``steps`` (``PARALLEL_STEPS``) times (False when symbolic)."""
    extents = [_extent(sch, loop) for loop in loops]
    return None not in extents and math.prod(extents) < (steps or PARALLEL_STEPS)  # type: ignore[arg-type]


def flat_tile_loops(sch: Any, conv: Any, block: int,
                    tiling: Tiling) -> tuple[list[Any], list[Any], Any, Any, Any] | None:
    """``cpu_nhwc.flat_nhwc``'s ``n, p, c | taps, rc`` as ``n, c/B, rc/K, p/T | taps, K | T, B``
    (its ``cpu_kernels.flat_tile``; ``K`` from ``_weight_chunk``, without chunks ``n, c/B, p/T |
    taps, rc | T, B``), the epilogue after each channel block's whole map: under a tile of positions
    that spans two rows it would cover both rows whole (MobileNetV2's 384 → 64 at 14², 1.6× slower
    so). Returns what ``nhwc_tile`` does; None when the tile is not the one planned."""
    n, p, c, *taps, rc = sch.get_loops(conv)
    rows_block = sch.get_consumers(conv)[0]  # [n, y, x, c]: the map's shape
    height, width = (int(d) for d in sch.get(rows_block).writes[0].source.shape[1:3])
    channels = _extent(sch, c)
    if channels is None or channels % tiling.lanes:
        return None
    flat = flat_tile(channels // tiling.lanes, tiling.lanes, height, width, tiling.flat_tasks)
    if flat is None or flat[0] * tiling.lanes != block or flat[2] != _extent(sch, p):
        return None
    co, ci = sch.split(c, [None, block])
    po, pi = sch.split(p, [None, flat[1]])
    chunk = _weight_chunk(sch, conv)
    tiles = _extent(sch, po) or 1
    if chunk is None:
        sch.reorder(n, co, po, *taps, rc, pi, ci)
        _widen_panels(sch, conv, co, tiles, tiling)
        reductions = [*taps, rc]
    else:
        rco, rci = sch.split(rc, [None, chunk])
        sch.reorder(n, co, rco, po, *taps, rci, pi, ci)
        _prefetch_next_chunk(sch, conv, rco, _widen_panels(sch, conv, rco, tiles, tiling, per_chunk=True))
        reductions = [rco, *taps, rci]
    # The steps writing the map (an injective step of another shape, if fusion ever brought one,
    # stays at the root for the leftover rule).
    chain = list(itertools.takewhile(lambda step: _writes_map(sch, step, height, width), _epilogue_chain(sch, conv)))
    if not chain:
        return None
    kept = [step for step in chain[:-1] if not try_inline(sch, step)]
    for step in [*kept, chain[-1]]:
        # The epilogue's rows and columns as one run too: it reads ``out[n, y·W + x, c]``, and TVM
        # bounded a run of ``y·W + x`` longer than the map (the dropped positions) as one column.
        sch.transform_block_layout(step, lambda n, y, x, c: (n, y * width + x, c))
    return [n, co], reductions, pi, ci, _epilogue_at(sch, conv, co, [*kept, chain[-1]])


def _writes_map(sch: Any, step: Any, height: int, width: int) -> bool:
    """Whether ``step`` is a 4-D block writing an ``[n, height, width, c]`` tensor over its own four loops."""
    writes = sch.get(step).writes
    if len(writes) != 1 or len(sch.get_loops(step)) != 4:
        return False
    shape = writes[0].source.shape
    return len(shape) == 4 and [_int_or_none(d) for d in shape[1:3]] == [height, width]


def _int_or_none(dim: Any) -> int | None:
    try:
        return int(dim)
    except TypeError:
        return None


def _copy_narrow_rows(sch: Any, conv: Any, tiling: Tiling) -> None:
    """Schedule a padded input copy of fewer channels than a vector (an image's 3) as rows: each
    row's columns and channels one run, the part that reads inside the input (``INTERIOR_ATTR``) a
    loop of its own without the bounds test, the zero border apart; rows in parallel. Nothing for
    other convs.

    Why: scheduled like any copy, its 3 channels were a 3-lane vector with the bounds test per
    column — ResNet-50's stem copy took 0.17–0.19 ms of the stem's 1.7 at one thread.
    """
    pad = producer_named(sch, conv, NHWC_PAD_BLOCK)
    if pad is None or INTERIOR_ATTR not in sch.get(pad).annotations:
        return
    loops = sch.get_loops(pad)
    channels = _extent(sch, loops[-1]) if len(loops) == 4 else None
    if channels is None or channels >= tiling.lanes:
        return
    top, end_row, left, end_column = (int(v) for v in sch.get(pad).annotations[INTERIOR_ATTR])
    if end_row <= top or end_column <= left:
        return  # no row reads the input
    _, y, x, c = loops
    sch.fuse(x, c)
    inside = _partition(sch, y, top, end_row)[1 if top > 0 else 0]
    run = sch.get_loops(_leaf_block(sch, inside))[-1]
    # Without the bounds test the inside run is a plain copy, which LLVM vectorizes itself (a
    # partitioned loop does not start at 0, and TVM splits only loops that do).
    _partition(sch, run, left * channels, end_column * channels)
    sch.parallel(inside)


#: Copied-input bytes from which a padded conv copies its input a band of rows at a time.
ROW_COPY_BYTES = 512 << 10

#: Parallel iterations a conv's outer loops should offer the threads: under it, a conv neither
#: copies its input a band of rows at a time (its row loop alone would be parallel) nor leaves its
#: column tiles out of the parallel loop. Not more: ResNet-50's 14² 1×1 convs (14 rows, a 5-column
#: tile's padded copy of 860 KB) ran 3–7% slower copied whole (an AVX2 EPYC, 2 threads).
PARALLEL_STEPS = 8


#: Channel blocks (× batch) from which a conv whose weights are packed in chunks reduces chunk by
#: chunk, its blocks alone parallel; with fewer (one), its rows are parallel and each tile reduces
#: over every chunk. A CRNN's 32 → 64 conv at 8 × 32 (one block) ran on one of two threads: 0.060 →
#: 0.034 ms (onnxruntime 0.032), the model 0.89×. Not more: ResNet-50's 128 → 128 convs at 28² (two
#: blocks) ran 1.09× slower with their rows parallel (float16 1.38×), a U-Net's 256 → 256 at 32²
#: (four) made the model 1.055× slower (2 threads, alternated).
CHUNKED_BLOCKS = 2


def _copy_rows_at(sch: Any, conv: Any, y: Any, tiling: Tiling) -> bool:
    """Move the conv's padded input copy under its row loop ``y`` (the rows of that output row's
    taps, all channel blocks after it reading them); whether it did. Then only the row loop is
    parallel. Not below ``ROW_COPY_BYTES`` or for channel counts no vector divides.

    Why: copied whole, a map larger than L2 is written out and read back; a band of rows stays in
    cache (each input row is copied once per output row that reads it, from cache). 3×3 64 → 64
    convs, alternated: 112² 4.31/4.27 → 4.14/4.18 ms (2 threads), 8.00 → 7.60 ms (1 thread); 56²
    1.84/1.84 → 1.81/1.76 ms; at 28² (a 400 KB copy) ±1%, and ResNet-50's 28² stage was 3–14%
    slower per conv with its rows alone in parallel (an Ice Lake core). With the threshold,
    ResNet-50's 56² 3×3 convs 0–8% and its first 28² one (a 1.6 MB copy) 13% faster per kernel.

    Not for fewer rows (batch × height) than ``PARALLEL_STEPS``: a conv1d is a one-row map, and
    Whisper's 384 → 384 stem conv over 1,500 frames (a 2.3 MB copy) ran on one thread — 14.2 ms at
    one thread and at two, 7.1 ms copied whole (onnxruntime's two stem convs 11.8 ms; an AVX2
    EPYC, 2 threads).
    """
    pad = producer_named(sch, conv, NHWC_PAD_BLOCK)
    if pad is None or _fewer_steps(sch, sch.get_loops(conv)[:2]):
        return False
    copy = sch.get(pad).writes[0].source
    try:
        channels = int(copy.shape[-1])
        size = buffer_bytes(copy)
    except TypeError:  # a symbolic shape
        return False
    if size < ROW_COPY_BYTES or channels % tiling.lanes:
        return False
    sch.compute_at(pad, y, preserve_unit_loops=True)
    _, lanes = sch.split(sch.get_loops(pad)[-1], [None, tiling.lanes])
    sch.vectorize(lanes)
    return True


def _weight_chunk(sch: Any, conv: Any) -> int | None:
    """Input channels per chunk of a conv whose weights the legalization packed in chunks
    (``cpu_kernels.weight_chunk``, ``cpu_nhwc.pack_conv_weight``); None for unchunked weights."""
    return weight_geometry(sch.get(conv).reads[1].source)[4]


def _prefetch_next_chunk(sch: Any, conv: Any, chunks: Any, widened: str | None = None) -> None:
    """Mark the loop over ``chunks`` for ``prefetch_chunks``: the next chunk's weights prefetched
    a share at a time over the tiles of the map (``widened``: the chunk's float32 copy the tiles
    read, ``_widen_panels``)."""
    weight = _weight_param(sch, conv)
    elements = math.prod(int(d) for d in weight.shape[2:])
    sch.annotate(chunks, NEXT_CHUNK, chunk_plan(elements, str(weight.name), over=widened))


def _weight_param(sch: Any, conv: Any) -> Any:
    """The conv's packed weight buffer, read through its widening stage where it has one."""
    return weight_through(sch, conv, NHWC_WIDEN_BLOCK)[1]


def _widen_panels(sch: Any, conv: Any, loop: Any | None, tiles: int, tiling: Tiling,
                  per_chunk: bool = False) -> str | None:
    """Convert a float16 conv's weight panel (what one iteration of ``loop`` reads: a channel
    block's, or with ``per_chunk`` a chunk's) to float32 once, under ``loop``, for the ``tiles``
    register tiles that read it — where at least ``WIDEN_REUSE`` do and it takes at most
    ``WIDEN_PANEL_BYTES``; else each tile converts the weight vectors it reads. Without ``loop``
    (one channel block: its panel is the whole weight) the stage stays at the root, a parallel
    pass before the tiles. Returns the panel buffer's name when widened.

    Why: a tile converts each weight vector for a few positions' FMAs (a quarter more work on the
    FMA ports under a 4-position tile): ResNet-50's float16 1×1 convs at 56² and 28² ran 1.3–1.6×
    their float32 ones. Whole float16 runs, paired (benchmarks/README.md, twenty-eighth session):
    ResNet-50 0.94×, U-Net 0.93×, CRNN 0.88×, RegNet 0.95×, YOLO 0.96×; SegFormer and RAFT 1.03×
    slower, every kernel after the first widened one ~7% slower though unchanged (not explained;
    not the allocation, the vector width or the code layout). Why not the whole weight once a
    call: its float32 copy, written to memory each call and read back, slowed EfficientNet-B0 and
    MobileNetV2 1.05× and 1.03×.
    """
    widen, weight = weight_through(sch, conv, NHWC_WIDEN_BLOCK)
    if widen is None:
        return None
    _, kh, kw, in_channels, chunk = weight_geometry(weight)
    per_panel = kh * kw * (chunk if per_chunk and chunk else in_channels) * int(weight.shape[-1])
    if tiles < WIDEN_REUSE or per_panel * 4 > WIDEN_PANEL_BYTES:
        sch.compute_inline(widen)
        return None
    if loop is None:
        return str(sch.get(widen).writes[0].source.name)  # at the root: the leftover rule's parallel loop
    return widen_under(sch, widen, conv, loop, per_panel, tiling)


def _weights_dominate(sch: Any, conv: Any) -> bool:
    """Whether the conv's loop over channel blocks should go outside its loop over rows (weights
    over ``WEIGHTS_DOMINATE`` times the other bytes).

    Rows outermost, every row reads all the weights while the row's input, output and residual
    stay in cache; channel blocks outermost, every block passes over all of those while its
    weight panel stays in cache. Each thread streams the larger side once that way: channel
    blocks go outermost when the weights outweigh everything else the kernel reads and writes.
    ResNet-50 float32, 2 threads, minimum in-run time of each kernel over 12 alternated rounds:
    the 7x7 stage's convs (2–9 MB of weights) 7–19% faster channels-first (3×3 × 512: 3.23 →
    2.62 ms); the whole run's difference is within this machine's noise.
    """
    weight = _weight_param(sch, conv)
    try:
        rest = sum(buffer_bytes(b) for b in sch.mod["main"].params if not b.same_as(weight))  # params are buffers
        return buffer_bytes(weight) > WEIGHTS_DOMINATE * rest
    except TypeError:  # a symbolic shape: keep rows outermost
        return False


def nhwc_conv2d(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_conv2d_nhwc``: the packed weight's block is the channel vector."""
    conv = _find_block(sch, CONV2D_NHWC_BLOCK)
    if conv is None:
        return None
    block = block_of(sch.get(conv).reads[1].source)
    if len(sch.get(conv).writes[0].source.shape) == 3:  # flat_nhwc's [n, p, c]
        tiled = flat_tile_loops(sch, conv, block, tiling)
    else:
        tiled = nhwc_tile(sch, conv, block, tiling, chunk_weights=True)
    if tiled is None:
        return None
    outer, reductions, xi, ci, epilogue = tiled
    try:
        _copy_narrow_rows(sch, conv, tiling)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; the copy keeps the generic prologue
        log.debug("narrow padded copy left to the prologue rule: %s", str(err).splitlines()[-1:])
    ci = vector_steps(sch, ci, tiling)
    vector_steps(sch, sch.get_loops(epilogue)[-1], tiling)
    _finish(sch, conv, epilogue, outer, reductions[0], xi, ci, "done", tiling)
    return sch


def nhwc_depthwise(sch: Any, tiling: Tiling) -> Any | None:
    """``amp_depthwise_nhwc``: taps unrolled; rows in parallel, channel blocks inside."""
    conv = _find_block(sch, DEPTHWISE_NHWC_BLOCK)
    if conv is None:
        return None
    n, y, x, c, ry, rx = sch.get_loops(conv)
    channels, width = _extent(sch, c), _extent(sch, x)
    if channels is None or width is None:
        return None
    block = tiling.lanes if channels % tiling.lanes == 0 else 8
    tile = nhwc_columns(width, tiling.lanes)
    if channels % block or width % tile:
        return None
    co, ci = sch.split(c, [None, block])
    xo, xi = sch.split(x, [None, tile])
    sch.reorder(n, y, co, xo, ry, rx, xi, ci)
    epilogue = _epilogue_at(sch, conv, xo)
    sch.vectorize(sch.get_loops(epilogue)[-1])
    for loop in (ry, rx, xi):
        sch.unroll(loop)
    sch.vectorize(ci)
    _parallel(sch, [n, y], tiling)
    init = sch.decompose_reduction(conv, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch

