"""CPU kernels that TVM's default legalization does not give: packed-weight conv2d and matmul,
erf/tanh that vectorize, and cosh/sinh that compile at all.

What: ``LegalizeOps`` runs with :func:`legalize_map`, which turns

* ``relax.nn.conv2d`` in NHWC (the layout stage, :mod:`amptool.compiler.cpu_layout`, converts
  the convs it can) into :mod:`amptool.compiler.cpu_nhwc`'s kernels; one that stayed NCHW (OIHW
  constant weight, one group) into the TE compute ``amp_conv2d`` whose weight is packed at
  compile time as ``[OC/B, IC, KH, KW, B]``; with more groups (depthwise, grouped) into
  ``amp_depthwise`` (:mod:`amptool.compiler.cpu_depthwise`);
* ``relax.matmul`` with a constant 2-D right operand into ``amp_matmul`` whose weight is
  packed as ``[N/B, K, B]``;
* ``relax.erf`` / ``relax.tanh`` into TVM's polynomial ``fast_erf`` / ``fast_tanh``, with
  NaN passed through (the polynomials clamp their input, which would turn a NaN from a
  float16 overflow into a finite number and hide it from ``diff``);
* ``relax.cosh`` / ``relax.sinh`` into ``exp``-based computes: LLVM has no vector form of the
  ``tirx.cosh``/``tirx.sinh`` intrinsics, so TVM's own legalization fails to compile
  ("unknown intrinsic") as soon as the schedule vectorizes the loop, which it always does.

Why: with the weight laid out so that ``B`` output channels (one SIMD vector) sit next to
each other, the schedule in :mod:`amptool.compiler.cpu_schedules` keeps a tile of outputs in
registers, broadcasts one input value per FMA and loads the weights with one vector load —
the classic direct-convolution micro-kernel. Packing happens once, in numpy, on constants
(amptool's fp32 folding makes every weight a constant before this runs). ``libm`` erf is
scalar and ~40× slower than the polynomial; it dominated BERT's GELU.

When not: weights that are not constants, other layouts, symbolic shapes and integer dtypes
keep TVM's own legalization (and are scheduled by the generic rules); so do NCHW convs (those
the layout stage left) with channel counts 8 does not divide — NHWC ones pad their filters to
whole vectors with zeros and store only the real channels.

Preserves: the products and the summation order (input channel, then kernel row, then
kernel column; ``k`` for matmul) of TOPI's computes; low-precision inputs are cast to the
accumulation dtype (the call's output dtype) before padding, which is exact. ``fast_erf`` and
``fast_tanh`` differ from libm by at most ~3e-7 absolute on float32; cosh/sinh are within 1.5 ulp
of libm on float32 and float64 and overflow at the same |x| (onnxruntime's inf).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from amptool import _tvm
from amptool._tvm import static_shape
from amptool.compiler import bf16_pairs
from amptool.compiler.cpu_depthwise import DEPTHWISE_BLOCK, depthwise_conv2d, pack_weight
from amptool.compiler.cpu_nhwc import RAGGED_TILES
from amptool.compiler.cpu_tail_reduction import REDUCTIONS
from amptool.compiler.cpu_tail_reduction import legalization as tail_reduction
from amptool.dtypes import DTYPES

#: Block names the schedule rules look for.
CONV2D_BLOCK = "amp_conv2d"
MATMUL_BLOCK = "amp_matmul"
CONV2D_BF16_BLOCK = "amp_conv2d_bf16"
MATMUL_BF16_BLOCK = "amp_matmul_bf16"
PAIRS_BLOCK = "amp_pairs"
CROP_BLOCK = "amp_crop"
CAST_BLOCK = "amp_cast"
PAD_BLOCK = "amp_pad"
PACK_BLOCK = "amp_pack"
WIDEN_BLOCK = "amp_widen"

_FLOATS = DTYPES

#: TVM's ``OpPatternKind::kInjective``: each output element a function of some input elements.
INJECTIVE = 2
#: TVM's ``OpPatternKind::kOutEWiseFusable``: a kernel whose output elementwise steps may fuse into it.
OUT_ELEMWISE_FUSABLE = 4


def vector_lanes(target: Any, bits: int = 32) -> int:
    """SIMD lanes of ``bits``-wide values on ``target`` (16 float32 with AVX-512, 8 with AVX2)."""
    from tvm.target.codegen import llvm_get_vector_width  # noqa: PLC0415

    width = int(llvm_get_vector_width(target)) if target is not None else 128
    width = width if width > 0 else 128
    if width > 256 and _x86_without(target, "avx512f"):
        # TVM's answer ignores the features: 512 for haswell, and for emeraldrapids with -avx512f.
        # Tiles planned for 32 zmm registers then ran split over 16 ymm registers, spilling
        # (ResNet-50 built with -mattr=-avx512f: 115 → 157 ms once the tiles grew).
        width = 256
    if width > 128 and _x86_without(target, "avx"):
        width = 128  # SSE only (plain "llvm": generic x86-64)
    return max(4, width // bits)


def _x86_without(target: Any, feature: str) -> bool:
    """Whether ``target`` is an x86 target lacking ``feature`` (False off x86: nothing to judge)."""
    key = (str(target), feature)
    if key not in _X86_WITHOUT:
        from tvm.target.codegen import target_has_features  # noqa: PLC0415

        try:
            _X86_WITHOUT[key] = bool(target_has_features("sse2", target) and not target_has_features(feature, target))
        except Exception:  # noqa: BLE001 - not an x86 target
            _X86_WITHOUT[key] = False
    return _X86_WITHOUT[key]


#: L1 data cache assumed of a CPU amptool cannot ask: most x86 cores since Haswell (Zen 4 too).
DEFAULT_L1_BYTES = 32 << 10


def l1_data_bytes(target: Any) -> int:
    """The L1 data cache of ``target``'s CPU: this host's (Linux sysfs) when the target's ``mcpu`` is
    this host's CPU, else ``DEFAULT_L1_BYTES`` (a build for another CPU cannot know its caches)."""
    mcpu = str(target.attrs.get("mcpu", "")) if target is not None else ""
    if not mcpu or str(target.kind.name) != "llvm" or mcpu != _host_facts()[0]:
        return DEFAULT_L1_BYTES
    return _host_facts()[1] or DEFAULT_L1_BYTES


@functools.cache
def _host_facts() -> tuple[str, int | None]:
    """(LLVM's name for this host's CPU, its first L1 data cache in bytes or None if unreadable)."""
    import glob  # noqa: PLC0415

    size = None
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(os.path.join(index, "level")) as level, open(os.path.join(index, "type")) as kind:
                if level.read().strip() != "1" or kind.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(index, "size")) as text:
                value = text.read().strip().upper()
            size = int(value[:-1]) << {"K": 10, "M": 20}[value[-1]] if value[-1] in "KM" else int(value)
            break
        except (OSError, ValueError):
            continue
    return _tvm.host_cpu(), size


#: ``_x86_without``'s answers by (target, feature): it is asked per kernel (220 LLVM queries,
#: 0.06 s of a ResNet-50 convert), the answer fixed per target.
_X86_WITHOUT: dict[tuple[str, str], bool] = {}


def legalize_map() -> dict[str, Callable[[Any, Any], Any]]:
    """Op name → legalization for ``relax.transform.LegalizeOps(customize_legalize_map=…)``; calls
    over empty tensors are zeros or nothing (``_unless_empty``)."""
    return {name: _unless_empty(legalization) for name, legalization in {
        "relax.nn.conv2d": _legalize_conv2d,
        "relax.matmul": _legalize_matmul,
        "relax.erf": _legalize_erf,
        "relax.tanh": _legalize_tanh,
        "relax.cosh": _legalize_cosh,
        "relax.sinh": _legalize_sinh,
        "relax.nn.softmax": _legalize_softmax,
        "relax.power": _legalize_power,
        "relax.exp": _legalize_exp,
        "relax.sigmoid": _legalize_sigmoid,
        "relax.log": _legalize_log,
        "relax.nn.gelu": _legalize_gelu,
        "relax.nn.gelu_tanh": _legalize_gelu_tanh,
        "relax.image.grid_sample": _legalize_grid_sample,
        "relax.take": _legalize_take,
        **{f"relax.nn.max_pool{n}d": _legalize_max_pool for n in (1, 2, 3)},
        **dict.fromkeys(REDUCTIONS, tail_reduction(_default, _current_lanes)),
    }.items()}


#: Ops whose result is a sum over their arguments' dims: with an empty argument and a non-empty
#: result, that sum runs over nothing.
_SUMS = ("relax.nn.conv2d", "relax.matmul")


def _unless_empty(legalization: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``legalization``, except for calls over empty tensors (a zero-size dim): an empty result is
    a kernel that writes nothing, and a conv or matmul whose sum runs over nothing (zero input
    channels or a zero-length inner dim) is a constant of zeros.

    Why: the kernels here plan register tiles from the shapes and divide by them (a 3×3 conv over a
    zero-width map, padded to 2 columns, has zero output columns); TVM's conv legalization rejects
    an empty result ("negative output shape"); and a TIR reduction initialises its output inside
    the reduction loop, so one over zero iterations leaves the memory as it found it (measured:
    NaN and Inf from a float16 conv over zero channels). One guard serves every op here."""

    def legalize(bb: Any, call: Any) -> Any:
        shape = static_shape(call)
        if shape is not None and 0 in shape:
            return bb.call_te(_nothing, call.args[0], shape=shape, dtype=str(call.ty.dtype), primfunc_name_hint="empty")
        if shape is not None and str(call.op.name) in _SUMS and any(0 in (static_shape(a) or ()) for a in call.args):
            return _zeros(bb, shape, str(call.ty.dtype))
        return legalization(bb, call)

    return legalize


# --------------------------------------------------------------------------- helpers


def _nothing(source: Any, shape: list[int], dtype: str) -> Any:
    """An empty tensor (``_unless_empty``): a kernel over nothing. It takes the call's first
    argument, which it never reads, so that constant folding leaves it a kernel: an empty constant
    would be written into the library, and TVM's loader rejects a zero-size tensor there."""
    import tvm  # noqa: PLC0415
    from tvm import te  # noqa: PLC0415

    del source
    return te.compute(shape, lambda *_: tvm.tirx.const(0, dtype), name="empty")


def _zeros(bb: Any, shape: list[int], dtype: str) -> Any:
    """Zeros of ``shape`` and ``dtype`` as a constant (``_unless_empty``); bfloat16's cast from
    float32 is TVM's (numpy has no bfloat16), folded with the other constants. Not a kernel: a
    fused cast of a broadcast zero to bfloat16 fails TVM's bfloat16 legalization."""
    from tvm import relax  # noqa: PLC0415

    zeros = _constant(np.zeros(shape, np.float32))
    return zeros if dtype == "float32" else _default(bb, bb.normalize(relax.op.astype(zeros, dtype)))


def _default(bb: Any, call: Any) -> Any:
    """TVM's own legalization of ``call``."""
    from amptool.compiler.legalize_once import tvms_legalization  # noqa: PLC0415 - legalize_once imports TVM

    return tvms_legalization(bb, call)


def _legalize_take(bb: Any, call: Any) -> Any:
    """TVM's ``take``, marked injective: it fuses into the kernel that reads it.

    Why: TVM's pattern analysis calls a load at a loaded index opaque, so every gather was a
    kernel of its own — an unrolled recurrence's per-step row of its input projection among them
    (a CRNN's bidirectional GRU: 64 of its 201 kernel calls, each a 144-float copy). Each output
    element reads one input element at an index computed from its own: injective, as Relay had it."""
    from tvm import topi  # noqa: PLC0415

    return bb.call_te(topi.take, call.args[0], call.args[1], call.attrs.axis, mode=call.attrs.mode,
                      primfunc_name_hint="take", primfunc_attrs={"op_pattern": INJECTIVE})


def _block(channels: int, lanes: int) -> int | None:
    """The packing block: one SIMD vector of channels, or 8; None when neither divides."""
    for block in (lanes, 8):
        if channels % block == 0:
            return block
    return None


def accumulator_budget(lanes: int) -> int:
    """Vector accumulators a register tile may use: AVX-512 has 32 registers, AVX2 16; the rest
    hold weights and broadcast inputs."""
    return 16 if lanes >= 16 else 8


def column_tile(width: int, cap: int) -> int | None:
    """Output columns per conv register tile: a divisor of ``width`` — the largest up to ``cap``,
    else the smallest up to ``2 * cap - 2`` — or None when there is none (a remainder would put
    a bounds check in the inner loop, measured 10× slower; the kernel computes a wider output)."""
    low = next((d for d in range(min(cap, width), min(4, width) - 1, -1) if width % d == 0), None)
    if low is not None:
        return low
    return next((d for d in range(cap + 1, 2 * cap - 1) if width % d == 0), None)


#: Vector loads per FMA an AVX-512 core takes without its two FMA pipes waiting: one 64-byte
#: load a cycle beside two FMAs. ``benchmarks/register_tiles.py`` on an Ice Lake core (C tiles, a
#: weight panel from L2, broadcasts from L1; speed against 14 columns × 2 vectors, 0.57 loads per
#: FMA, six runs): 16 × 1 (1.06) 0.51–0.56×, 2 × 4 (0.75) 0.75–0.85×, 4 × 4 (0.5) 1.00–1.23×,
#: 5 × 4 … 9 × 3 (0.42–0.46) 1.04–1.25× — near the core's peak.
LOADS_PER_FMA = 0.5

#: The cost factor of a tile that computes columns past the row and crops them: in ResNet-50,
#: 4 × 5 tiles on 14-column rows and 4 × 4 on 7-column rows, which the load count puts 6% and 11%
#: ahead of 2 × 14 and 2 × 7, ran 0–12% behind them (per-kernel minima, alternated).
CROPPED_TILE_COST = 1.25


#: Weight bytes per FMA that a core's L2 feeds a register tile without its FMA pipes waiting, on
#: the CPUs ``cpu_speed.l2_bound_tiles`` names. ResNet-50's 3×3 64 → 64 conv at 56² (a 147 KB
#: panel of four vectors, L2): 4 vectors × 4 columns (16 bytes per FMA) 0.73 ms, 2 × 14 (4.6) 0.66,
#: onnxruntime 0.57; its 1×1 64 → 256 (a 16 KB panel, L1) 0.31 as 4 × 4, 0.34 as 2 × 14 (per-kernel
#: minima alternated, 2 threads, a Sapphire Rapids VM).
L2_BYTES_PER_FMA = 12.0


def tile_vectors(blocks: int, lanes: int, width: int, panel_bytes: int = 0, l1_bytes: int = 0) -> int:
    """Vectors of output channels in one NHWC register tile, for a conv of ``blocks`` vectors and
    ``width`` output columns: of the divisors of ``blocks`` up to 4 (AVX-512) or 2 (AVX2), the one
    whose tile (``nhwc_columns``) costs least per useful FMA — its loads per FMA (one broadcast
    input per column, one weight vector per channel vector: ``1/vectors + 1/columns``) where over
    ``LOADS_PER_FMA``, times the columns it computes per real one, ``CROPPED_TILE_COST`` more when
    it crops; on a tie the wider tile (fewer weight loads from L2), then fewer vectors.

    Why: with one vector per tile every FMA needs its own broadcast input load, and a core that
    issues two FMAs per cycle waits on its load ports. Measured on an Emerald Rapids core (float32,
    3-conv chains, alternated in one process): 3×3 convs 1.3–1.45× faster with several vectors (64
    channels at 56²: 9.3 → 6.5 ms for three), 1×1 256 → 256 at 56² 1.15×; AVX2 code on the same
    core (``-mattr=-avx512f``, 8 lanes), two vectors: ResNet-50 126.2 → 84.7 ms. Two vectors × 14
    columns still wait on the loads (``LOADS_PER_FMA``); four × 4 on ResNet-50's 56- and 28-column
    rows, an Ice Lake core, per-kernel minima alternated: 3×3 64 → 64 at 56² 1.71 → 1.50 ms at one
    thread, 0.87 → 0.77 at two, the 28² 1×1 reductions 0.76 → 0.67 / 0.38 → 0.35; the 28² 3×3
    convs unchanged (their 295 KB weight panels per channel block come from L2 at 16 bytes per FMA).
    An earlier session had kept 4 × 4 to convs writing more than they read, having measured the
    others 3–14% slower with it at two threads; alternated again, they were faster or level.
    """
    tiles = {v: nhwc_columns(width, lanes, v) for v in _vector_counts(blocks, lanes)}

    def cost(v: int) -> float:
        streamed = lanes * 4 / tiles[v] if panel_bytes * v > l1_bytes else 0.0
        return _tile_cost(v, tiles[v], width, streamed)

    return min(tiles, key=lambda v: (cost(v), -tiles[v], v))


def _vector_counts(blocks: int, lanes: int) -> list[int]:
    """Channel vectors a register tile may take: the divisors of ``blocks`` up to 4 (AVX-512) or 2
    (AVX2), 3 on AVX2 when ``blocks`` is odd.

    Why the 3: an odd count of AVX2 vectors (24 channels; RegNet's 24-channel groups) otherwise had
    one vector a tile, a broadcast load per FMA; 3 × 4 columns keeps as many accumulators as 2 × 6
    (12 of 16 registers). RegNet's 3×3 144 → 144 in 6 groups at 28² 0.58 → 0.33 ms (onnxruntime
    0.42), MobileNetV2's 1×1 convs to 24 channels 0.56–0.58×, its kernel sum 0.97–0.98×; an AVX2
    EPYC, 2 threads, per-call minima in both load orders. Even counts keep 2: where both divide,
    the cost model would take 3 × 4 over 2 × 6, which nothing measured."""
    most = 4 if lanes >= 16 else (3 if blocks % 2 else 2)
    return [v for v in range(1, min(most, blocks) + 1) if blocks % v == 0]


def _tile_cost(vectors: int, columns: int, width: int, streamed: float = 0.0) -> float:
    """Loads per useful FMA of a tile of ``vectors`` × ``columns`` on rows of ``width`` (``tile_vectors``),
    or the L2 bytes of weights ``streamed`` per FMA as loads where they cost more (``L2_BYTES_PER_FMA``)."""
    computed = -(-width // columns) * columns
    loads = max(LOADS_PER_FMA, 1 / vectors + 1 / columns, LOADS_PER_FMA * streamed / L2_BYTES_PER_FMA)
    per_fma = loads * computed / width
    return per_fma * (CROPPED_TILE_COST if computed != width else 1.0)


#: Channel blocks — the parallel tasks of a chunked flat tile — a flat tile keeps at least where a
#: narrower block allows (``min_tasks`` of ``flat_tile``), on the CPUs ``flat_min_tasks`` names.
#: ResNet-50's 1×1 1024 → 256 at 14² as 4 blocks of 4 vectors × 4 positions ran 0.36–0.39 ms at
#: two threads (onnxruntime 0.28), as 8 blocks of 2 × 14 0.29–0.32 — level at one thread (per-kernel
#: minima alternated, a Sapphire Rapids VM); the whole model 0.985× (paired runs). Not measured on
#: Ice Lake or Zen 4, whose tiles stay as they were.
FLAT_TASKS = 8


def flat_min_tasks(target: Any) -> int:
    """``flat_tile``'s ``min_tasks`` for ``target``: ``FLAT_TASKS`` where measured (the CPUs of
    ``cpu_speed.l2_bound_tiles``), else 1."""
    return FLAT_TASKS if _l2_bound(target) else 1


def _l2_bound(target: Any) -> bool:
    """Whether ``target`` is an llvm CPU of ``cpu_speed.l2_bound_tiles``."""
    from amptool.compiler.cpu_speed import l2_bound_tiles  # noqa: PLC0415

    if target is None or str(target.kind.name) != "llvm":
        return False
    return l2_bound_tiles(target.attrs.get("mcpu"), target.attrs.get("mattr") or ())


def flat_tile(blocks: int, lanes: int, height: int, width: int, min_tasks: int = 1) -> tuple[int, int, int] | None:
    """(channel vectors, positions per tile, positions computed) of a register tile over a conv's
    map read as one run of ``height * width`` output positions (``_flat_map`` says which convs),
    when it costs fewer loads per useful FMA than ``tile_vectors``' tile on rows of ``width``; else
    None. Positions per tile: the largest divisor of the map's size the registers hold beside the
    tile's weight vectors and broadcast (as ``nhwc_columns``), or the tile of at least half that
    wasting fewest positions — the kernel computes a multiple of it (``cpu_nhwc.flat_nhwc``), the
    extra ones dropped in the epilogue's read, not by a pass of their own.

    Why: a tile of consecutive positions may span rows (each position's input is found on its own),
    so a row length no tile divides costs no cropped columns. ResNet-50's 14-column rows took 2
    vectors × 14 columns (0.57 loads per FMA), as four vectors' tiles (up to 6 columns) crop; its
    196 positions take 4 × 4 (0.5). 1024 → 256 and 256 → 1024 at 14², per-kernel minima
    alternated on an Ice Lake core: 7% faster at one thread, 4–8% at two (chunked as
    ``WEIGHT_CHUNK_SHARE`` has it). Its 7² maps (49 positions: 2 × 7, 0.64)
    take 4 × 5 over 50. With AVX-512 a flat tile's conv runs chunked
    (``cpu_schedules_nhwc.flat_tile_loops``; its epilogue follows a channel block's whole map).

    AVX2 (16 registers): the flat tile of least waste among those holding at least the row tile's
    accumulators, unchunked. Zen 3 needs 8+ FMAs in flight per core: ResNet-50's 7² maps as 2 × 5
    over 50 positions instead of 2 × 4 over 8 of every 7 columns ran 0.81–0.94×; its 14² maps as
    2 × 4 flat (8 accumulators) instead of 2 × 5 rows (10) ran 1.15–1.30× slower (an AVX2 EPYC,
    2 threads, alternated).
    """
    if height < 2:
        return None
    row = tile_vectors(blocks, lanes, width)
    row_columns = nhwc_columns(width, lanes, row)
    best = _tile_cost(row, row_columns, width)
    positions = height * width
    flat = None
    counts = _vector_counts(blocks, lanes)[1:]  # one vector's tiles keep nhwc_columns' caps
    counts = [v for v in counts if blocks // v >= min_tasks] or counts[:1]
    for vectors in counts:
        most = min((_vector_registers(lanes) - vectors - 1) // vectors, positions)
        if lanes < 16:  # AVX2: no fewer accumulators in flight than the row tile (see Why), least waste
            fewest = -(-row * row_columns // vectors)
            if fewest > most:
                continue
            rows = min(range(fewest, most + 1), key=lambda t: (-(-positions // t) * t, -t))
        else:
            divisor = next((d for d in range(most, 1, -1) if positions % d == 0), None)
            if divisor is not None and 3 * divisor >= 2 * most:
                rows = divisor
            else:
                rows = min(range(max(2, most // 2), most + 1), key=lambda t: (-(-positions // t) * t, -t))
        computed = -(-positions // rows) * rows
        cost = max(LOADS_PER_FMA, 1 / vectors + 1 / rows) * computed / positions
        if cost < best - 1e-9:  # a tie keeps the rows
            best, flat = cost, (vectors, rows, computed)
    return flat


def _vector_registers(lanes: int) -> int:
    """SIMD registers of the ISA whose float32 vectors have ``lanes`` lanes (AVX-512 32, else 16)."""
    return 32 if lanes >= 16 else 16


def matmul_row_cap(lanes: int, vectors: int) -> int:
    """Rows a packed-matmul register tile of ``vectors`` column vectors may take: the accumulator
    budget for one vector; for several, the registers beside their weight vectors and the
    broadcast row value (as ``nhwc_columns``)."""
    if vectors == 1:
        return accumulator_budget(lanes)
    return (_vector_registers(lanes) - vectors - 1) // vectors


#: A matmul computes padded rows (a multiple of a register tile that does not divide them, then
#: crops) when that tile holds at least this many times the accumulators of the best exact one.
PAD_ROWS_GAIN = 1.5

#: ``PAD_ROWS_GAIN`` on AVX2 for one batch item's rows, where the best exact tile of a row count such
#: as 128 is 2 vectors × 4 rows, 8 accumulators: just the FMAs Zen 3 keeps in flight, so any stall
#: idles a pipe. BERT-base's 128-row products as 2 × 6 over 132 rows ran 0.96–0.97× (kernel sums
#: 147.4 → 142.7 and 141.3 → 137.2 ms, outputs bit-identical; 2 × 5 over 130, 0.96×); an AVX2 EPYC,
#: 2 threads, alternated. Not over several items: there LLVM kept some of a 2 × 6 tile's
#: accumulators in memory (ConvNeXt's 56 × 56-row MLPs padded to 2 × 6 over 60 ran 1.8–2.3× slower;
#: a 56 × 60-row product's exact 2 × 6 took 3.64 ms where 2 × 4 took 2.03), yet Swin's 64 windows ×
#: 49 rows ran 1.6× faster as 2 × 6 over 54 than as 1 × 7 (the 1.5 gain). The cause was the tile's
#: accumulator buffer, split out of the items and rows fused (``cpu_schedules.packed_matmul`` now
#: splits each item's rows); the gain over several items has not been measured again since.
PAD_ROWS_GAIN_AVX2 = 1.3


def _exact_rows(rows: int, vectors: int, lanes: int) -> int:
    """Rows of the largest tile of ``vectors`` column vectors that divides ``rows``."""
    cap = matmul_row_cap(lanes, vectors)
    return next(d for d in range(min(cap, rows), 0, -1) if rows % d == 0)


def _padded_rows(rows: int, vectors: int, lanes: int) -> tuple[int, float]:
    """``rows`` rounded up to the fewest tiles the registers allow (each as narrow as that count
    permits), and the tile's useful accumulators."""
    tiles = -(-rows // matmul_row_cap(lanes, vectors))
    return tiles * -(-rows // tiles), vectors * rows / tiles


def matmul_tile(rows: int, blocks: int, lanes: int, items: int = 1, paired: bool = False) -> tuple[int, int]:
    """(column vectors, rows computed) of a packed-matmul register tile for ``rows`` rows of each of
    ``items`` batch items and ``blocks`` vectors of columns. Vectors: of the divisors of ``blocks``
    up to 4 (AVX-512) or 3 (AVX2; 2 for ``paired`` bfloat16 weights, read as pairs of vectors only
    in even counts), the one whose tile of rows (a divisor of ``rows`` within
    ``matmul_row_cap``) holds the most accumulators, the more vectors on a tie (fewer broadcasts
    per FMA). Rows: ``rows``, unless padding them (``PAD_ROWS_GAIN``, ``PAD_ROWS_GAIN_AVX2``)
    fills the tile; the kernel then crops.

    Why the vectors: two vectors × 8 rows left 16 accumulators and one broadcast per two FMAs;
    BERT-base's 128-row projections as 3 vectors × 8 rows: fp32 153.9 → 140.6 ms (2 threads,
    Emerald Rapids, alternated in one process). Why the padding: a prime row count has no
    divisor: ViT-B/16's 197 tokens took one row per tile, one FMA per broadcast (fc1 17.6 ms
    against onnxruntime's 7.5 at one thread); as 198 rows, 3 vectors × 9, one row in 198 is wasted.
    Three on AVX2 (12 accumulators, 7 loads per 12 FMAs where 2 × 4 has 6 per 8): ConvNeXt's MLPs
    (56 rows an item, 96 and 384 columns) 1.56 ms each against 2.25 and 1.86 as 2 × 4 (onnxruntime
    1.80, 1.74); kernel sums Swin 0.78×, ConvNeXt 0.87×, BERT-base 0.96×, Llama and GPT-2 0.96–0.97×
    (an AVX2 EPYC, 2 threads, alternated). Unpaired bfloat16 weights decode each vector on its own:
    BERT-base bf16 with 3 × 4 ran 1.11×.
    """
    if rows < 1 or blocks < 1:
        return 1, rows
    most = 4 if lanes >= 16 else (2 if paired else 3)
    candidates = [v for v in range(1, min(most, blocks) + 1) if blocks % v == 0]
    exact = max(candidates, key=lambda v: (v * _exact_rows(rows, v, lanes), v))
    padded = max(candidates, key=lambda v: (_padded_rows(rows, v, lanes)[1], v))
    padded_rows, useful = _padded_rows(rows, padded, lanes)
    gain = PAD_ROWS_GAIN_AVX2 if lanes < 16 and items == 1 else PAD_ROWS_GAIN
    if useful >= gain * exact * _exact_rows(rows, exact, lanes):
        return padded, padded_rows
    return exact, rows


def matmul_vectors(rows: int, blocks: int, lanes: int, items: int = 1) -> int:
    """The column vectors of ``matmul_tile``."""
    return matmul_tile(rows, blocks, lanes, items)[0]


#: Independent FMAs a core keeps in flight: two pipes × four cycles' latency (Zen 3, Ice Lake). A
#: register tile of fewer accumulators leaves the pipes waiting whatever its loads.
FMAS_IN_FLIGHT = 8


def nhwc_columns(width: int, lanes: int, vectors: int = 1) -> int:
    """Output columns per NHWC register tile for ``width`` columns and ``vectors`` channel vectors
    (``tile_vectors``): a divisor of ``width`` near the accumulator budget (``column_tile``), else
    the tile wasting the fewest columns — the compute then covers a multiple of it and crops.
    Several vectors: where that tile holds fewer than ``FMAS_IN_FLIGHT`` accumulators (27 columns'
    divisor 3, 2 × 3) and ``RAGGED_TILES`` tiles of the widest the registers allow cover the row,
    those tiles, the last narrower (27 = 4 × 6 + 3). SqueezeNet's 27² convs (AVX2 EPYC, 2 threads,
    per-call minima alternated): 3×3 32 → 128 0.77×, 1×1 0.80–0.87×; Inception-v1's kernel sum 0.93×.
    The legalization and the schedule rules both ask here."""
    if vectors > 1:
        # Accumulators in the registers beside one weight vector per channel vector and the
        # broadcast input: one more and LLVM rotated all 28 accumulators through the registers
        # every step (ResNet-50 fp32 51 → 58 ms).
        most = (_vector_registers(lanes) - vectors - 1) // vectors
        if width <= most:
            return width
        tile = next((d for d in range(most, 1, -1) if width % d == 0), None)
        if tile is not None and 3 * tile >= 2 * most:
            return tile
        tile = min(range(max(2, most // 2), most + 1), key=lambda t: (-(-width // t) * t, -t))
        tiles = -(-width // most)
        if tile * vectors < FMAS_IN_FLIGHT and tiles <= RAGGED_TILES:
            return -(-width // tiles)
        return tile
    cap = accumulator_budget(lanes) // 2
    tile = column_tile(width, cap)
    if tile is not None and tile * 4 < cap * 3:
        # Few accumulators leave the FMA pipes waiting on their latency: take a divisor above the
        # cap while registers last (SqueezeNet's 55 columns: 5 → 11; its 3×3 conv measured 2× faster).
        wider = next((d for d in range(cap + 1, 2 * cap - 1) if width % d == 0), None)
        tile = wider or tile
    if tile is not None:
        return tile
    # No divisor (a prime width such as Inception-v3's 17): the tile whose multiple wastes the
    # fewest columns, the wider of a tie (17: 9 → 18 computed, where the cap, 8, computed 24).
    return min(range(max(4, cap // 2), 2 * cap - 1), key=lambda t: (-(-width // t) * t, -t))


def _conv_columns(out_w: int) -> int:
    """The width the conv kernel computes: ``out_w``, or the next multiple of the tile cap."""
    cap = accumulator_budget(_current_lanes()) // 2
    if column_tile(out_w, cap) is not None:
        return out_w
    return -(-out_w // cap) * cap


def _crop(wide: Any, out_w: int) -> Any:
    from tvm import te  # noqa: PLC0415

    if int(wide.shape[-1]) == out_w:
        return wide
    return te.compute((*wide.shape[:-1], out_w), lambda *i: wide(*i), name=CROP_BLOCK)


def _current_target() -> Any:
    """The target the legalization builds for (None outside a build)."""
    import tvm  # noqa: PLC0415

    return tvm.target.Target.current(allow_none=True)


def _current_lanes() -> int:
    return vector_lanes(_current_target())


def _bf16_dot_available() -> bool:
    from amptool.compiler.cpu_speed import bf16_dot_pays  # noqa: PLC0415

    target = _current_target()
    if target is None or not bf16_dot_pays(target.attrs.get("mcpu"), target.attrs.get("mattr") or ()):
        return False
    from amptool.compiler.cpu_intrinsics import has_bf16_dot  # noqa: PLC0415 - registers the intrinsic (0.3–0.6 s)

    return has_bf16_dot(target)


def _uses_bf16_dot(data: Any, weight: Any, out_dtype: str, channels: int, pad_channels: bool = False) -> bool:
    """bfloat16 inputs and weights accumulated in float32, 16-channel blocks (or, with
    ``pad_channels``, any count: the caller pads to 16s and crops), a CPU with vdpbf16ps."""
    return (str(data.ty.dtype) == "bfloat16" and str(weight.ty.dtype) == "bfloat16"
            and out_dtype == "float32" and (pad_channels or channels % 16 == 0) and _bf16_dot_available())


def _amx_plan(call: Any) -> Any:
    """``amx_plan.plan``: bfloat16 products on AMX tiles where the target has them."""
    from amptool.compiler import amx_plan  # noqa: PLC0415 - TVMScript parsing on first use

    return amx_plan.plan(call)


def _bf16_bits(array: np.ndarray) -> np.ndarray:
    """bfloat16 weights (ml_dtypes) as their uint16 bit patterns."""
    return np.ascontiguousarray(array).view(np.uint16)


def _call_te(bb: Any, compute: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``bb.call_te`` for a kernel on a packed constant: built once per legalization for its types
    (``legalize_once.call_te``)."""
    from amptool.compiler.legalize_once import call_te  # noqa: PLC0415 - legalize_once imports TVM

    return call_te(bb, compute, *args, **kwargs)


def _constant(array: np.ndarray) -> Any:
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    return relax.const(tvm.runtime.tensor(np.ascontiguousarray(array)))


def _cast_input(x: Any, dtype: str, name: str = CAST_BLOCK) -> Any:
    """``x`` in ``dtype``: itself, or a stage of its own called ``name`` that converts it (a
    schedule finds it by that name: ``CAST_BLOCK`` for an input, ``WIDEN_BLOCK`` for a matmul's
    weight; ``cpu_nhwc._widened`` makes a conv's, as this module imports that one)."""
    from tvm import te  # noqa: PLC0415

    if x.dtype == dtype:
        return x
    return te.compute(x.shape, lambda *i: x(*i).astype(dtype), name=name)


# --------------------------------------------------------------------------- conv2d


#: (data, kernel, output) layouts of the convs legalized here; any other keeps TVM's legalization.
_NCHW_CONV = ("NCHW", "OIHW", "NCHW")
_NHWC_CONV = ("NHWC", "OIHW", "NHWC")


def _legalize_conv2d(bb: Any, call: Any) -> Any:
    import tvm  # noqa: PLC0415

    attrs = call.attrs
    data, weight = call.args
    out_dtype = str(call.ty.dtype)
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if (
        layouts not in (_NCHW_CONV, _NHWC_CONV)
        or not isinstance(weight, tvm.ir.GenericConst) or static_shape(data) is None
        or str(data.ty.dtype) not in _FLOATS or out_dtype not in _FLOATS
    ):
        return _default(bb, call)
    w = _tvm.constant_view(weight)
    geometry = {"strides": [int(s) for s in attrs.strides], "padding": [int(p) for p in attrs.padding],
                "dilation": [int(d) for d in attrs.dilation]}
    if layouts == _NHWC_CONV:
        return _legalize_conv2d_nhwc(bb, call, w, geometry)
    if int(attrs.groups) != 1:
        return _call_te(bb, depthwise_conv2d, data, _constant(pack_weight(w)), **geometry, groups=int(attrs.groups),
                        out_dtype=out_dtype, primfunc_name_hint=DEPTHWISE_BLOCK)
    out_channels, in_channels, kh, kw = w.shape
    conv_args = {**geometry, "out_channels": out_channels}
    if _uses_bf16_dot(data, weight, out_dtype, out_channels):
        # [OC/16, 16, IC/2, 2, KH, KW] → [OC/16, IC/2, KH, KW, 16, 2]: one 32-value vector per tap.
        packed = _paired_bf16(w).transpose(0, 2, 4, 5, 1, 3)
        return _call_te(bb, _conv2d_bf16, data, _constant(packed), **conv_args, primfunc_name_hint=CONV2D_BF16_BLOCK)
    block = _block(out_channels, _current_lanes())
    if block is None:
        return _default(bb, call)
    packed = w.reshape(out_channels // block, block, in_channels, kh, kw).transpose(0, 2, 3, 4, 1)
    return _call_te(bb, _conv2d_packed, data, _constant(packed), **conv_args, out_dtype=out_dtype,
                      primfunc_name_hint=CONV2D_BLOCK)


def _paired_bf16(weight: np.ndarray) -> np.ndarray:
    """An OIHW bfloat16 weight's bit patterns as ``[OC/16, 16, IC/2, 2, KH, KW]``, an odd input
    channel count padded with a zero channel: the pairs ``vdpbf16ps`` multiplies."""
    out_channels, in_channels, kh, kw = weight.shape
    pairs = -(-in_channels // 2)
    bits = np.zeros((out_channels, 2 * pairs, kh, kw), dtype=np.uint16)
    bits[:, :in_channels] = _bf16_bits(weight)
    return bits.reshape(out_channels // 16, 16, pairs, 2, kh, kw)


def _legalize_conv2d_nhwc(bb: Any, call: Any, w: np.ndarray, geometry: dict[str, list[int]]) -> Any:
    """An NHWC conv (``cpu_layout`` made it so) → :mod:`amptool.compiler.cpu_nhwc`'s kernels."""
    from amptool.compiler import cpu_nhwc  # noqa: PLC0415

    data, weight = call.args
    out_dtype = str(call.ty.dtype)
    _, out_w = _output_map(data, w, geometry)
    lanes = _current_lanes()
    columns = nhwc_columns(out_w, lanes)
    groups = int(call.attrs.groups)
    out_channels = w.shape[0]
    if groups == out_channels and w.shape[1] == 1:  # depthwise
        return _call_te(bb, cpu_nhwc.depthwise_nhwc, data, _constant(cpu_nhwc.pack_depthwise_weight(w)), **geometry,
                        columns=columns, out_dtype=out_dtype, primfunc_name_hint=cpu_nhwc.DEPTHWISE_NHWC_BLOCK)
    if groups != 1:  # groups of whole vectors of output channels (cpu_layout.wants_nhwc)
        return _grouped_conv2d_nhwc(bb, call, w, geometry, out_w)
    amx = _amx_plan(call)
    if amx is not None:
        return amx.emit(bb)
    if _uses_bf16_dot(data, weight, out_dtype, out_channels, pad_channels=True):
        # Output channels padded with zero filters to a multiple of 16 and cropped after: vdpbf16ps
        # on 32 channels for 24 beats float32 FMAs on blocks of 8 (MobileNetV2's 144 → 24 conv
        # 0.27 → 0.11 ms, kernel alone).
        w = _zero_filters(w, 16)
        # [OC/16, 16, IC/2, 2, KH, KW] → [OC/16, KH, KW, IC/2, 16, 2]: one 32-value vector per (tap, pair).
        packed = _paired_bf16(w).transpose(0, 4, 5, 2, 1, 3)
        return _call_te(bb, cpu_nhwc.conv2d_nhwc_bf16, data, _constant(packed), **geometry, columns=columns,
                        out_channels=out_channels, primfunc_name_hint=cpu_nhwc.CONV2D_NHWC_BF16_BLOCK)
    block = _block(out_channels, lanes)
    if block is None or (block < lanes and out_channels > lanes):
        # Whole vectors of channels with zero filters padding the last (24 → 32, YOLO's 255 → 256):
        # two full-width FMAs beat three half-width ones, and a count 8 does not divide had no
        # packed kernel at all.
        block = lanes
        w = _zero_filters(w, block)
    if block == lanes and _vector_counts(w.shape[0] // lanes, lanes) == [1] and w.shape[0] > lanes:
        # A vector count with no divisor a tile may take (125 for SqueezeNet's 1000 classes): one
        # zero vector more gives tiles of two, not one vector and a broadcast load per FMA. Its
        # 512 → 1000 1×1 conv at 13²: 2.0 → 1.3–1.4 ms (onnxruntime 1.26); EfficientNet's 40-channel
        # convs 0.81×, the model level.
        w = _zero_filters(w, 2 * lanes)
    flat = None
    if block == lanes:
        target = _current_target()
        flat = flat_tile(w.shape[0] // lanes, lanes, *_flat_map(data, w, geometry, lanes), flat_min_tasks(target))
    if flat is not None:
        vectors, _, positions = flat
        packed = _packed_conv_weight(data, w, geometry, lanes * vectors, lanes)
        return _call_packed(bb, cpu_nhwc.flat_nhwc, data, packed, weight, vectors, **geometry, positions=positions,
                            out_dtype=out_dtype, out_channels=out_channels,
                            primfunc_name_hint=cpu_nhwc.CONV2D_NHWC_BLOCK)
    vectors = 1
    if block == lanes:
        vectors = tile_vectors(w.shape[0] // lanes, lanes, out_w, **_streamed_panel(data, w, geometry, lanes))
        block, columns = lanes * vectors, nhwc_columns(out_w, lanes, vectors)
    return _call_packed(bb, cpu_nhwc.conv2d_nhwc, data, _packed_conv_weight(data, w, geometry, block, lanes), weight,
                        vectors, **geometry, columns=columns, out_dtype=out_dtype, out_channels=out_channels,
                        primfunc_name_hint=cpu_nhwc.CONV2D_NHWC_BLOCK)


def _packed_conv_weight(data: Any, w: np.ndarray, geometry: dict[str, list[int]], block: int, lanes: int) -> np.ndarray:
    """``cpu_nhwc.pack_conv_weight`` of ``w`` in blocks of ``block`` channels, in chunks of input
    channels where the conv reduces over chunks (AVX-512, ``_weights_chunked``, a ``weight_chunk``)."""
    from amptool.compiler import cpu_nhwc  # noqa: PLC0415

    chunk = None
    # Chunks measured with AVX-512 only (on AVX2 they slowed every chunked conv: benchmarks/README).
    if lanes >= 16 and _weights_chunked(data, w, geometry):
        target = _current_target()
        chunk = weight_chunk(w.shape[1], w.shape[2] * w.shape[3], block, l1_data_bytes(target))
    return cpu_nhwc.pack_conv_weight(w, block, chunk)


def weight_chunk(in_channels: int, taps: int, block: int, l1_bytes: int) -> int | None:
    """Input channels per chunk of a conv reduced chunk by chunk (``cpu_schedules_nhwc.nhwc_tile``):
    the largest divisor of ``in_channels`` (at least 8, fewer than all) whose ``taps`` × ``block``
    float32 weights fit ``WEIGHT_CHUNK_SHARE`` of ``l1_bytes``; None when none fits.

    Why chunks: a conv whose weights outweigh its activations (ResNet-50's 7² stage) has one or two
    column tiles per row, and each tile streamed its channel block's whole weight panel (590 KB for
    3×3 × 512) from L2 for 14 FMAs per 64-byte line. Chunked, a chunk stays in L1 while every row
    of the map passes, the sums accumulating in the block's output. 3×3 512 → 512 at 7², three
    convs, alternated in one process, two runs: one thread 10.09/9.21 → 9.03/8.16 ms, two
    5.32/5.06 → 5.26/4.72 ms.
    """
    per_channel, budget = taps * block * 4, l1_bytes * WEIGHT_CHUNK_SHARE
    return next((d for d in range(in_channels - 1, 7, -1) if in_channels % d == 0 and d * per_channel <= budget), None)


def _call_packed(bb: Any, compute: Callable[..., Any], data: Any, packed: np.ndarray, weight: Any, vectors: int,
                 **kwargs: Any) -> Any:
    """``compute(data, packed, **kwargs)`` over a weight packed in blocks of ``vectors`` SIMD vectors
    (``packed.shape[-1]`` channels). A bfloat16 ``weight`` of an even vector count goes in as pairs of
    vectors (``bf16_pairs``: one load, a shift and an and per two; ``compute`` takes ``pair_lanes``).

    Why the op pattern: TVM's pattern analysis sees no multiply-add of two loads in a product whose
    weight is decoded and calls the kernel a plain reduction, which FuseOps kept apart from its bias
    and activation (BERT-base: 96 more kernels, each epilogue a pass of its own): it is the conv or
    matmul it was."""
    if str(weight.ty.dtype) != "bfloat16" or vectors % 2:
        return _call_te(bb, compute, data, _constant(packed), **kwargs)
    lanes = int(packed.shape[-1]) // vectors
    return _call_te(bb, compute, data, _constant(bf16_pairs.pack_pairs(packed, lanes)), **kwargs, pair_lanes=lanes,
                    primfunc_attrs={"op_pattern": OUT_ELEMWISE_FUSABLE})


#: Weight elements over a conv's input and output elements from which it reduces over chunks of
#: input channels (``_weights_chunked``, ``weight_chunk``), and from which a dense 1×1 conv may
#: take a flat tile with AVX-512 (``_flat_map``), whose epilogue needs that chunked order. Not
#: only where weights dominate: ResNet-50's 14² stage (1 MB of weights beside 1–1.8 MB of
#: activations) ran its 1×1 convs 6–17% faster chunked on an Ice Lake core (per-kernel minima,
#: alternated; whole runs 2 threads −2%), where the 56² stage (weights a tenth of the rest) ran
#: 10–30% slower. A flat tile unchunked, its epilogue after the channel block's map, ran a 256 →
#: 256 1×1 conv with a residual at 14² 7–13% slower than rows; chunked, level.
CHUNK_WEIGHTS = 0.5


#: The share of the L1 data cache a chunk's weights may take (``weight_chunk``;
#: also what a row tile's weight panel may fill, ``_streamed_panel``). Half of Ice Lake's 48 KB at
#: first; 5/6 (40 KB) ran ResNet-50's 14² and 7² 3×3 convs 5–11% faster (32 input channels a chunk,
#: not 16) and its 1×1 convs at 14² 2–3% (128 channels of 4-vector tiles, not 64): kernel sums −2%
#: at one and at two threads (per-kernel minima, alternated in one process).
WEIGHT_CHUNK_SHARE = 5 / 6


#: Weight bytes over a conv kernel's other bytes above which it walks its channel blocks outermost
#: (``cpu_schedules_nhwc._weights_dominate``), and above which, on AVX2, it may take a flat tile.
WEIGHTS_DOMINATE = 2.0


def _streamed_panel(data: Any, w: np.ndarray, geometry: dict[str, list[int]], lanes: int) -> dict[str, int]:
    """``tile_vectors``' panel arguments for a row-tiled conv on a CPU whose tiles are bound by the
    weights they stream from L2 (``cpu_speed.l2_bound_tiles``): the bytes of one vector's weight
    panel and the L1 share a chunk may take; none where the conv runs chunked (its weights then
    come from L1: ``weight_chunk``) or the CPU is another."""
    target = _current_target()
    if lanes < 16 or not _l2_bound(target):
        return {}
    if _weights_chunked(data, w, geometry):
        return {}
    return {"panel_bytes": w[0].size * lanes * w.itemsize, "l1_bytes": int(l1_data_bytes(target) * WEIGHT_CHUNK_SHARE)}


def _output_map(data: Any, w: np.ndarray, geometry: dict[str, list[int]]) -> tuple[int, int]:
    """(out_h, out_w) of an NHWC conv of ``data`` with OIHW weights ``w``."""
    _, height, width, _ = (int(d) for d in data.ty.shape)
    kh, kw = w.shape[2:]
    return _output_size(height, width, kh, kw, geometry["padding"], geometry["strides"], geometry["dilation"])


def _output_size(height: int, width: int, kh: int, kw: int, padding: list[int], strides: list[int],
                 dilation: list[int]) -> tuple[int, int]:
    """(out_h, out_w) of a conv over a ``height`` × ``width`` map, ``padding`` (top, left, bottom, right)."""
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    return (height + top + bottom - (kh - 1) * dh - 1) // sh + 1, (width + left + right - (kw - 1) * dw - 1) // sw + 1


def _activations(data: Any, w: np.ndarray, out_h: int, out_w: int) -> int:
    """Elements of an NHWC conv's input and output."""
    return math.prod(int(d) for d in list(data.ty.shape)[1:]) + out_h * out_w * w.shape[0]


def _weights_chunked(data: Any, w: np.ndarray, geometry: dict[str, list[int]]) -> bool:
    """Whether an AVX-512 conv's weights outweigh ``CHUNK_WEIGHTS`` of its input and output: it is
    then reduced over chunks of input channels (``weight_chunk``), its weights packed so."""
    return bool(w.size >= CHUNK_WEIGHTS * _activations(data, w, *_output_map(data, w, geometry)))


def _flat_map(data: Any, w: np.ndarray, geometry: dict[str, list[int]], lanes: int) -> tuple[int, int]:
    """(out_h, out_w) of a conv that may be computed over its map as one run of positions
    (``flat_tile``, ``cpu_nhwc.flat_nhwc``); (1, 0) for any other conv.

    AVX-512: unpadded 1×1 convs whose weights outweigh half their input and output
    (``CHUNK_WEIGHTS``): their flat tile runs chunked, and its epilogue must follow a channel block's
    whole map (see ``cpu_schedules_nhwc.flat_tile_loops``), which the chunked order does anyway.
    AVX2 (unchunked): any dense conv whose weights outweigh ``WEIGHTS_DOMINATE`` times its input and
    output, the convs that walk their channel blocks outermost in any case — a flat tile walks each
    block over the whole map. ResNet-50's 3×3 convs at 7² (2 × 4 + 2 × 3 tiles a row) ran 0.84–0.87×
    as 2 × 5 over 50 positions, at 14² (5 + 5 + 4) 0.92–1.02× as 2 × 6 over 198; at 28², where the
    weights do not dominate, 1.05–1.20×; its 14² 1×1 256 → 1024 (weights level with the rest)
    1.2× (an AVX2 EPYC, 2 threads, per-call minima alternated).
    """
    out_h, out_w = _output_map(data, w, geometry)
    if lanes >= 16:
        if w.shape[2:] != (1, 1) or any(geometry["padding"]) or not _weights_chunked(data, w, geometry):
            return 1, 0
    elif w.size <= WEIGHTS_DOMINATE * _activations(data, w, out_h, out_w):
        return 1, 0
    return out_h, out_w


def _grouped_conv2d_nhwc(bb: Any, call: Any, w: np.ndarray, geometry: dict[str, list[int]], out_w: int) -> Any:
    """A grouped NHWC conv whose groups hold whole vectors of output channels, as the NHWC conv
    kernel with each channel block reading its group's inputs (float32 FMAs, also for bfloat16:
    its weights in pairs of vectors then, as ``_call_packed`` passes them).

    Why: the grouped NCHW kernel broadcasts one weight per tap for a vector of columns, made for
    narrow groups; RegNet's 64-channel groups ran at a tenth of the FMA rate there (3×3, 128
    channels in 2 groups, 112² → 56²: 32.9 ms at one thread, onnxruntime 3.8). Its row tile weighs
    the group's weight panel as a dense conv's does (``_streamed_panel``): on a Sapphire Rapids
    class VM RegNet's 3×3 at 56² 1.76 → 1.61 ms, at 28² 0.61 → 0.55 (kernel sum 0.974×).
    """
    from amptool.compiler import cpu_nhwc  # noqa: PLC0415

    lanes = _current_lanes()
    per_group = w.shape[0] // int(call.attrs.groups)
    vectors = tile_vectors(per_group // lanes, lanes, out_w, **_streamed_panel(call.args[0], w, geometry, lanes))
    packed = _packed_conv_weight(call.args[0], w, geometry, lanes * vectors, lanes)
    return _call_packed(bb, cpu_nhwc.conv2d_nhwc, call.args[0], packed, call.args[1], vectors, **geometry,
                        columns=nhwc_columns(out_w, lanes, vectors), out_dtype=str(call.ty.dtype),
                        groups=int(call.attrs.groups),
                        primfunc_name_hint=cpu_nhwc.CONV2D_NHWC_BLOCK)


def _zero_filters(w: np.ndarray, multiple: int) -> np.ndarray:
    """A weight with zero filters appended up to a multiple of ``multiple`` output channels, its first
    axis (OIHW's; a transposed matmul weight's columns): the kernel computes them and stores only
    the real ones."""
    missing = -w.shape[0] % multiple
    return np.concatenate([w, np.zeros((missing, *w.shape[1:]), dtype=w.dtype)]) if missing else w


def _conv_geometry(
    height: int, width: int, kh: int, kw: int, padding: list[int], strides: list[int], dilation: list[int]
) -> tuple[int, int, int, int, int, int, int]:
    """(top, left, bottom, right padding, out_h, out_w, computed width) of an NCHW conv.

    The kernels compute ``wide`` ≥ ``out_w`` columns (a multiple of the register tile) and crop;
    the extra columns read extra zero padding on the right.
    """
    top, left, bottom, right = padding
    out_h, out_w = _output_size(height, width, kh, kw, padding, strides, dilation)
    wide = _conv_columns(out_w)
    right += (wide - out_w) * strides[1]
    return top, left, bottom, right, out_h, out_w, wide


def _conv2d_packed(data: Any, packed: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                   out_channels: int, out_dtype: str) -> Any:
    """NCHW conv2d over a ``[OC/B, IC, KH, KW, B]`` weight; same sum order as TOPI's conv2d_nchw."""
    from tvm import te, topi  # noqa: PLC0415

    batch, in_channels, height, width = (int(d) for d in data.shape)
    _, _, kh, kw, block = (int(d) for d in packed.shape)
    top, left, bottom, right, out_h, out_w, wide = _conv_geometry(height, width, kh, kw, padding, strides, dilation)
    (sh, sw), (dh, dw) = strides, dilation
    src = _cast_input(data, out_dtype)
    if top or left or bottom or right:
        src = topi.nn.pad(src, [0, 0, top, left], [0, 0, bottom, right], name=PAD_BLOCK)
    rc = te.reduce_axis((0, in_channels), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (batch, out_channels, out_h, wide),
        lambda n, c, y, x: te.sum(
            src[n, rc, y * sh + ry * dh, x * sw + rx * dw]
            * packed[c // block, rc, ry, rx, c % block].astype(out_dtype),
            axis=[rc, ry, rx],
        ),
        name=CONV2D_BLOCK,
    )
    return _crop(conv, out_w)


def _conv2d_bf16(data: Any, packed: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                 out_channels: int) -> Any:
    """bfloat16 NCHW conv2d for ``vdpbf16ps``: input channels in pairs, padded and packed two to a
    uint32 (``[N, IC/2, H, W]``), weights ``[OC/16, IC/2, KH, KW, 16, 2]``; float32 accumulation."""
    from tvm import te, tirx  # noqa: PLC0415

    from amptool.compiler.cpu_intrinsics import high_bf16, low_bf16, pack_pair, weight_float  # noqa: PLC0415

    batch, in_channels, height, width = (int(d) for d in data.shape)
    _, pairs, kh, kw, block, _ = (int(d) for d in packed.shape)
    top, left, bottom, right, out_h, out_w, wide = _conv_geometry(height, width, kh, kw, padding, strides, dilation)
    (sh, sw), (dh, dw) = strides, dilation

    def pair(n: Any, p: Any, y: Any, x: Any) -> Any:
        yy, xx = y - top, x - left
        low = data[n, 2 * p, yy, xx]
        if in_channels % 2:  # the last pair's high half is a zero channel
            high = data[n, tirx.min(2 * p + 1, in_channels - 1), yy, xx]
            value = tirx.if_then_else(2 * p + 1 < in_channels, pack_pair(low, high), pack_pair(low, None))
        else:
            value = pack_pair(low, data[n, 2 * p + 1, yy, xx])
        if not (top or left or bottom or right):
            return value
        inside = tirx.all(yy >= 0, yy < height, xx >= 0, xx < width)
        return tirx.if_then_else(inside, value, tirx.const(0, "uint32"))

    src = te.compute((batch, pairs, height + top + bottom, width + left + right), pair, name=PAIRS_BLOCK)
    rp = te.reduce_axis((0, pairs), "rp")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def body(n: Any, c: Any, y: Any, x: Any) -> Any:
        value = src[n, rp, y * sh + ry * dh, x * sw + rx * dw]
        w = packed[c // block, rp, ry, rx, c % block]
        return te.sum(low_bf16(value) * weight_float(w[0]) + high_bf16(value) * weight_float(w[1]),
                      axis=[rp, ry, rx])

    return _crop(te.compute((batch, out_channels, out_h, wide), body, name=CONV2D_BF16_BLOCK), out_w)


# --------------------------------------------------------------------------- matmul


def _legalize_matmul(bb: Any, call: Any) -> Any:
    import tvm  # noqa: PLC0415

    a, b = call.args
    a_shape = static_shape(a)
    out_dtype = str(call.ty.dtype)
    if a_shape is None or len(a_shape) < 2 or str(a.ty.dtype) not in _FLOATS or out_dtype not in _FLOATS:
        return _default(bb, call)
    b_shape = static_shape(b)
    if b_shape is None:
        return _default(bb, call)  # a symbolic right operand (an empty product never gets here: _unless_empty)
    if not isinstance(b, tvm.ir.GenericConst):
        return _legalize_matmul_of_activations(bb, call, a_shape, b_shape)
    w = _tvm.constant_view(b)
    if w.ndim == 3 and tuple(a_shape[:-2]) == (w.shape[0],):
        return _matmul_per_item_weights(bb, call, w, a_shape[-2])
    if w.ndim != 2:
        return _default(bb, call)
    k, n = w.shape
    amx = _amx_plan(call)
    if amx is not None:
        return amx.emit(bb)
    if _uses_bf16_dot(a, b, out_dtype, n) and k % 2 == 0:
        # [K/2, 2, N/16, 16] → [N/16, K/2, 16, 2]
        pairs = _bf16_bits(w).reshape(k // 2, 2, n // 16, 16).transpose(2, 0, 3, 1)
        return _call_te(bb, _matmul_bf16, a, _constant(pairs), n=n, primfunc_name_hint=MATMUL_BF16_BLOCK)
    lanes = _current_lanes()
    block = _block(n, lanes)
    if block is None and n <= lanes // 2:
        return _default(bb, call)
    if block is None or (block < lanes and n > lanes):
        # Zero columns padding the weight to whole vectors (a CTC head's 97 classes, an OCR
        # vocabulary; with AVX-512 any count over half a vector), cropped after: TVM's legalization
        # left such a product unscheduled — a GRU tagger's [80, 512] · [512, 97] took 2.3 ms,
        # onnxruntime's Gemm 0.095. Half-vector blocks too (1000 classes on AVX-512): ImageNet's
        # [1, 1280] · [1280, 1000] head in 8-lane blocks took 0.176 ms in bfloat16 and 0.102 in
        # float32, padded to 1008 columns 0.048 and 0.087 (kernel_times, 2 threads, Sapphire Rapids).
        block = lanes
        w = _zero_filters(w.T, lanes).T
    rows = a_shape[-2]
    vectors = 1
    if block == lanes:
        paired = str(b.ty.dtype) == "bfloat16"  # read as pairs of vectors (_call_packed)
        vectors, rows = matmul_tile(rows, w.shape[1] // lanes, lanes, math.prod(a_shape[:-2]), paired)
        block *= vectors
    packed = w.reshape(k, w.shape[1] // block, block).transpose(1, 0, 2)
    return _call_packed(bb, _matmul_packed, a, packed, b, vectors, n=n, out_dtype=out_dtype, rows=rows,
                        primfunc_name_hint=MATMUL_BLOCK)


def _matmul_per_item_weights(bb: Any, call: Any, w: np.ndarray, rows: int) -> Any:
    """``[D, M, K] · [D, K, N]`` with a constant weight per batch item — a bidirectional recurrence's
    steps, both directions in one kernel (``frontend.rnn_unroll``) — as ``MATMUL_BLOCK`` over
    ``[D, N/B, K, B]`` packed weights; TVM's legalization left it an unscheduled product. Weights
    stay in their dtype, converted per element (no bfloat16 pairs or dot products: those pack one
    matrix)."""
    a = call.args[0]
    items, k, n = w.shape
    lanes = _current_lanes()
    if n < lanes:
        return _default(bb, call)
    vectors, rows = matmul_tile(rows, -(-n // lanes), lanes, items)
    block = vectors * lanes
    padded = np.stack([_zero_filters(item.T, block).T for item in w])
    packed = padded.reshape(items, k, padded.shape[-1] // block, block).transpose(0, 2, 1, 3)
    return _call_te(bb, _matmul_packed, a, _constant(packed), n=n, out_dtype=str(call.ty.dtype), rows=rows,
                    primfunc_name_hint=MATMUL_BLOCK, primfunc_attrs={"op_pattern": OUT_ELEMWISE_FUSABLE})


def _matmul_packed(a: Any, packed: Any, *, n: int, out_dtype: str, rows: int, pair_lanes: int | None = None) -> Any:
    """``a @ w`` over a ``[N/B, K, B]`` weight (``pair_lanes``: ``bf16_pairs``' ``[N/B, K, B/2]``
    words; ``[D, N/B, K, B]``: one per item of ``a``'s only batch dim), whose zero columns past
    ``n`` are computed and cropped; leading dims of ``a`` are batch dims."""
    block = bf16_pairs.block_of(packed)
    per_item = len(packed.shape) == 4
    if not pair_lanes and not per_item:
        # A stage of its own, so the schedule may widen a column block's panel once for all its row
        # tiles (cpu_schedules.packed_matmul) instead of each weight vector at each use; else inlined.
        packed = _cast_input(packed, out_dtype, WIDEN_BLOCK)

    def weight(lead: list[Any], k: Any, j: Any) -> Any:
        if pair_lanes:
            return bf16_pairs.read(packed, (j // block, k), j % block, pair_lanes)
        if per_item:
            return packed[lead[0], j // block, k, j % block]
        return packed[j // block, k, j % block]

    return _packed_product(a, weight, n=n, out_dtype=out_dtype, rows=rows, columns=int(packed.shape[-3]) * block)


def _packed_product(a: Any, weight: Callable[[list[Any], Any, Any], Any], *, n: int, out_dtype: str, rows: int,
                    columns: int) -> Any:
    """``MATMUL_BLOCK``: ``a @ w`` with ``w[k, j]`` = ``weight(batch index, k, j)`` read from a
    packed ``[…, N/B, K, B]`` buffer; computed over ``rows`` ≥ ``a``'s rows (``matmul_tile``; the
    extra ones read its last row) and ``columns`` ≥ ``n``, then cropped."""
    from tvm import te  # noqa: PLC0415

    *batch, m, k = (int(d) for d in a.shape)
    src = _cast_input(a, out_dtype)
    rk = te.reduce_axis((0, k), "rk")

    def body(*index: Any) -> Any:
        *lead, i, j = index
        row = i if rows == m else te.min(i, m - 1)
        return te.sum(src(*lead, row, rk) * weight(lead, rk, j).astype(out_dtype), axis=[rk])

    wide = te.compute((*batch, rows, columns), body, name=MATMUL_BLOCK)
    if (rows, columns) == (m, n):
        return wide
    return te.compute((*batch, m, n), lambda *i: wide(*i), name=CROP_BLOCK)


def _legalize_matmul_of_activations(bb: Any, call: Any, a_shape: list[int], b_shape: list[int]) -> Any:
    """A matmul of two computed tensors (attention's Q·Kᵀ and P·V) whose shape TVM's schedule for
    it handles badly — a column count no vector from 4 lanes up divides, a row count without a
    divisor from 4 up to the accumulator budget —
    as ``MATMUL_BLOCK`` over the right operand packed at run time (zero columns padding it to
    whole blocks); any other keeps TVM's legalization. bfloat16 ones on an AMX target run on tiles
    (``amx_plan.plan_batched``).

    Why: ViT-B/16's 197 tokens gave Q·Kᵀ a scalar dot per output (20 ms a layer at one thread,
    onnxruntime 0.8) and P·V one row per tile (1.9 ms, onnxruntime 0.55).
    """
    from amptool.compiler import amx_plan  # noqa: PLC0415 - TVMScript parsing on first use

    amx = amx_plan.plan_batched(bb, call)
    if amx is not None:
        return amx
    b = call.args[1]
    out_dtype = str(call.ty.dtype)
    lanes = _current_lanes()
    if len(b_shape) < 2 or str(b.ty.dtype) not in _FLOATS or b_shape[-1] < lanes:
        return _default(bb, call)
    if tuple(a_shape[:-2]) != np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])):
        return _default(bb, call)  # the left operand broadcast along a batch dim: rare, left to TVM
    m, n = a_shape[-2], b_shape[-1]
    if n % lanes == 0 and any(m % d == 0 for d in range(4, accumulator_budget(lanes) + 1)):
        # TVM's own tiles these well: BERT-base's (128 tokens) ran 0.35 ms packed at 0.55
        return _default(bb, call)
    if n % lanes and any(n % d == 0 for d in range(4, lanes)):
        # A shorter vector divides the columns: TVM's tiles take it, where the packed kernel crops
        # its padded columns in a pass of its own (Whisper's 1500 × 1500 scores: 28.9 ms, packed 37.4
        # at one thread: 54 MB more through memory)
        return _default(bb, call)
    blocks = -(-n // lanes)
    vectors, rows = matmul_tile(m, blocks, lanes, math.prod(a_shape[:-2]))
    return bb.call_te(_matmul_of_activations, call.args[0], b, block=vectors * lanes, rows=rows, out_dtype=out_dtype,
                      primfunc_name_hint=MATMUL_BLOCK)


def _matmul_of_activations(a: Any, b: Any, *, block: int, rows: int, out_dtype: str) -> Any:
    """``a @ b`` with ``b`` packed to ``[…, N/block, K, block]`` (``PACK_BLOCK``) in the kernel;
    ``b``'s batch dims broadcast against ``a``'s as numpy's."""
    from tvm import te, tirx  # noqa: PLC0415

    *b_batch, k, n = (int(d) for d in b.shape)
    offset = len(a.shape) - len(b.shape)
    blocks = -(-n // block)

    def pack(*index: Any) -> Any:
        *lead, jb, kk, jj = index
        j = jb * block + jj
        return te.if_then_else(j < n, b(*lead, kk, tirx.min(j, n - 1)), tirx.const(0, b.dtype))

    packed = te.compute((*b_batch, blocks, k, block), pack, name=PACK_BLOCK)

    def weight(lead: list[Any], kk: Any, j: Any) -> Any:
        own = [0 if size == 1 else lead[offset + i] for i, size in enumerate(b_batch)]
        return packed[(*own, j // block, kk, j % block)]

    return _packed_product(a, weight, n=n, out_dtype=out_dtype, rows=rows, columns=blocks * block)


def _matmul_bf16(a: Any, packed: Any, *, n: int) -> Any:
    """bfloat16 ``a @ w`` for ``vdpbf16ps``: ``a``'s ``k`` in pairs packed two to a uint32,
    weights ``[N/16, K/2, 16, 2]``; float32 accumulation."""
    from tvm import te  # noqa: PLC0415

    from amptool.compiler.cpu_intrinsics import high_bf16, low_bf16, pack_pair, weight_float  # noqa: PLC0415

    *batch, m, k = (int(d) for d in a.shape)
    block = int(packed.shape[-2])
    src = te.compute((*batch, m, k // 2), lambda *i: pack_pair(a(*i[:-1], 2 * i[-1]), a(*i[:-1], 2 * i[-1] + 1)),
                     name=PAIRS_BLOCK)
    rp = te.reduce_axis((0, k // 2), "rp")

    def body(*index: Any) -> Any:
        *lead, j = index
        value = src(*lead, rp)
        w = packed[j // block, rp, j % block]
        return te.sum(low_bf16(value) * weight_float(w[0]) + high_bf16(value) * weight_float(w[1]), axis=[rp])

    return te.compute((*batch, m, n), body, name=MATMUL_BF16_BLOCK)


# --------------------------------------------------------------------------- erf / tanh


def _legalize_erf(bb: Any, call: Any) -> Any:
    from tvm import topi  # noqa: PLC0415

    return _legalize_unary(bb, call, topi.fast_erf, "erf")


def _legalize_max_pool(bb: Any, call: Any) -> Any:
    """float16 max pooling on float32 values: each input converted once, the window's maximum in
    float32, the result converted back — the same values (a maximum of float16 values is one;
    a window holding NaN gives what the float32 build's pooling gives, where the per-op float16
    compare-and-blend let NaN through).

    Why: computed in float16, every step of the window's maximum converts both operands, compares
    and blends float16 lanes (``vcvtph2ps`` ×2, ``vcmpltps``, a pack and ``vpblendvb``): SqueezeNet's
    first max pool ran 2.7× its float32 kernel."""
    import tvm  # noqa: PLC0415
    from tvm import topi  # noqa: PLC0415

    attrs = call.attrs
    if str(call.ty.dtype) != "float16" or attrs.out_layout != attrs.layout:
        return _default(bb, call)
    pool = {1: topi.nn.pool1d, 2: topi.nn.pool2d, 3: topi.nn.pool3d}[len(attrs.pool_size)]

    def compute(x: Any) -> Any:
        wide = pool(_cast_input(x, "float32"), kernel=attrs.pool_size, stride=attrs.strides,
                    dilation=attrs.dilation, padding=attrs.padding, pool_type="max",
                    ceil_mode=attrs.ceil_mode, layout=attrs.layout)
        # float16 pooling starts from float16's lowest finite value: a window of -inf stays that
        lowest = tvm.tirx.const(float(np.finfo(np.float16).min), "float32")
        return topi.cast(topi.maximum(wide, lowest), "float16")

    return bb.call_te(compute, call.args[0], primfunc_name_hint=str(call.op.name).split(".")[-1])


def _legalize_tanh(bb: Any, call: Any) -> Any:
    from tvm import topi  # noqa: PLC0415

    return _legalize_unary(bb, call, topi.fast_tanh, "tir_tanh")


def _legalize_unary(bb: Any, call: Any, fast: Callable[[Any], Any], name: str) -> Any:
    dtype = str(call.ty.dtype)
    if dtype not in _FLOATS:
        return _default(bb, call)

    def compute(x: Any) -> Any:
        from tvm import te, tirx  # noqa: PLC0415

        x32 = _cast_input(x, "float32")
        y = fast(x32)
        return te.compute(
            x.shape,
            lambda *i: tirx.Select(_tvm.is_nan(x32(*i)), x32(*i), y(*i)).astype(dtype),
            name=name,
        )

    return bb.call_te(compute, call.args[0], primfunc_name_hint=name)


def _legalize_power(bb: Any, call: Any) -> Any:
    from amptool.compiler.cpu_power import legalize_power  # noqa: PLC0415 - numpy-free until a power appears

    return legalize_power(bb, call, _default)


def _legalize_exp(bb: Any, call: Any) -> Any:
    from amptool.compiler.cpu_exp import legalize_exp  # noqa: PLC0415

    return legalize_exp(bb, call, _default)


def _legalize_sigmoid(bb: Any, call: Any) -> Any:
    from amptool.compiler.cpu_exp import legalize_sigmoid  # noqa: PLC0415

    return legalize_sigmoid(bb, call, _default)


def _legalize_log(bb: Any, call: Any) -> Any:
    from amptool.compiler.cpu_exp import legalize_log  # noqa: PLC0415

    return legalize_log(bb, call, _default)


def _legalize_grid_sample(bb: Any, call: Any) -> Any:
    from amptool.compiler.cpu_grid_sample import legalize_grid_sample  # noqa: PLC0415

    return legalize_grid_sample(bb, call, _default)


def _legalize_gelu(bb: Any, call: Any) -> Any:
    """ONNX's Gelu op (opset 20), TVM's formula with ``fast_erf``: TOPI's ``erf`` is a libm call."""
    from tvm import tirx, topi  # noqa: PLC0415

    def gelu(x: Any) -> Any:
        return x * (tirx.const(0.5, "float32") + topi.fast_erf(x * tirx.const(0.5 ** 0.5, "float32"))
                    * tirx.const(0.5, "float32"))

    return _legalize_unary(bb, call, gelu, "gelu")


def _legalize_gelu_tanh(bb: Any, call: Any) -> Any:
    """Gelu with ``approximate="tanh"``, TVM's formula with ``fast_tanh``."""
    from tvm import tirx, topi  # noqa: PLC0415

    def gelu_tanh(x: Any) -> Any:
        inner = x * tirx.const((2.0 / np.pi) ** 0.5, "float32") * (1 + tirx.const(0.044715, "float32") * x * x)
        return tirx.const(0.5, "float32") * x * (tirx.const(1.0, "float32") + topi.fast_tanh(inner))

    return _legalize_unary(bb, call, gelu_tanh, "gelu_tanh")


# --------------------------------------------------------------------------- softmax


def _legalize_softmax(bb: Any, call: Any) -> Any:
    """float32 softmax with TVM's polynomial ``fast_exp`` (NaN passed through): TOPI's ``exp``
    becomes a scalar libm call per element once vectorized (BERT-base: 2.6% of its run time in
    ``expf``, each [12, 128, 128] softmax 0.39 ms). The exponent ``x - max`` is ≤ 0, where
    fast_exp needs no overflow guard; below its clamp (-88.4) it returns ~1e-38 where exp
    underflows to 0, negligible next to the row's sum (which holds e^0 = 1)."""
    if str(call.ty.dtype) != "float32" or static_shape(call.args[0]) is None:
        return _default(bb, call)
    axis = int(call.attrs.axis)
    lanes = _current_lanes()

    def compute(x: Any) -> Any:
        from tvm import te, tirx  # noqa: PLC0415

        rank = len(x.shape)
        dim = axis % rank
        length = int(x.shape[dim])
        if length % lanes and dim == rank - 1 and length > lanes:
            # A row no vector width divides (ViT's 197 tokens, CLIP's 77) gets no vectorized
            # reduction (cpu_row_reduction), and TVM's scalar one took 15x onnxruntime's time at 197;
            # one only a shorter vector divides runs its exp polynomial at that width (Whisper's 1500
            # scores, 4 lanes: 24.2 ms a layer at one thread, padded 20.5). Pad it with -inf to whole
            # vectors (fast_exp gives ~1e-38 there: nothing next to the row's sum, which holds
            # e^0 = 1), crop the result.
            inf = tirx.const(float("-inf"), "float32")
            padded = lanes * -(-length // lanes)
            wide = te.compute((*x.shape[:-1], padded), lambda *i: tirx.if_then_else(
                i[-1] < length, x(*i[:-1], tirx.min(i[-1], length - 1)), inf), name="softmax_pad")
            norm = _softmax_rows(wide, dim)
            return te.compute(x.shape, lambda *i: norm(*i), name="softmax_crop")
        return _softmax_rows(x, dim)

    return bb.call_te(compute, call.args[0], primfunc_name_hint="softmax")


def _softmax_rows(x: Any, dim: int) -> Any:
    """TOPI's softmax of ``x`` along ``dim``, its exp polynomial NaN-preserving (see _legalize_softmax),
    normalized by the row sum's reciprocal: one divide per row, not one per vector (a 16-lane
    divide is several times a multiply's cost). [12, 128, 128] 0.103 → 0.092 ms, [12, 384, 384]
    1.21 → 1.19 ms (2 threads, alternated; onnxruntime multiplies by the reciprocal too)."""
    from tvm import te, tirx, topi  # noqa: PLC0415

    top = topi.max(x, axis=dim, keepdims=True)

    def reduced(i: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(0 if k == dim else v for k, v in enumerate(i))

    shifted = te.compute(x.shape, lambda *i: x(*i) - top(*reduced(i)), name="softmax_shift")
    fast = topi.fast_exp(shifted)
    exps = te.compute(x.shape, lambda *i: tirx.Select(_tvm.is_nan(shifted(*i)), shifted(*i), fast(*i)),
                      name="softmax_exp")
    total = topi.sum(exps, axis=dim, keepdims=True)
    inverse = te.compute(total.shape, lambda *i: tirx.const(1.0, "float32") / total(*i), name="softmax_inverse")
    return te.compute(x.shape, lambda *i: exps(*i) * inverse(*reduced(i)), name="softmax_norm")


# --------------------------------------------------------------------------- cosh / sinh

#: 1/3!, 1/5!, …, 1/17!: sinh's odd Taylor series to float64 precision for |x| < 1.
_SINH_SERIES = tuple(1.0 / math.factorial(k) for k in range(3, 19, 2))


def _legalize_cosh(bb: Any, call: Any) -> Any:
    return _legalize_hyperbolic(bb, call, odd=False)


def _legalize_sinh(bb: Any, call: Any) -> Any:
    return _legalize_hyperbolic(bb, call, odd=True)


def _legalize_hyperbolic(bb: Any, call: Any, *, odd: bool) -> Any:
    """cosh / sinh from ``exp``, which LLVM can vectorize (``tirx.cosh``/``sinh`` it cannot:
    "unknown intrinsic" as soon as the loop is vectorized, i.e. always in this pipeline).

    With ``t = exp(|x|/2)``: ``(t/2)·t ± (1/2)/t/t``, so the large term overflows exactly where
    cosh/sinh do (|x| ≈ 89.4 in float32, onnxruntime's inf) rather than where ``exp(|x|)`` does
    (88.7). sinh for |x| < 1 is its Taylor series (``e^x − e^−x`` cancels there). Computed in
    float32 for float16/bfloat16 (float64 for float64), then rounded once to the call's dtype.
    """
    dtype = str(call.ty.dtype)
    if dtype not in (*_FLOATS, "float64"):
        return _default(bb, call)
    compute_dtype = "float64" if dtype == "float64" else "float32"
    name = "amp_sinh" if odd else "amp_cosh"

    def compute(x: Any) -> Any:
        from tvm import te, tirx  # noqa: PLC0415

        src = _cast_input(x, compute_dtype)
        half, one = tirx.const(0.5, compute_dtype), tirx.const(1.0, compute_dtype)

        def body(*index: Any) -> Any:
            v = src(*index)
            t = tirx.exp(tirx.abs(v) * half)
            large, small = (half * t) * t, (half / t) / t
            if not odd:
                return (large + small).astype(dtype)
            square = v * v
            series = tirx.const(_SINH_SERIES[-1], compute_dtype)
            for coefficient in reversed(_SINH_SERIES[:-1]):
                series = series * square + tirx.const(coefficient, compute_dtype)
            magnitude = large - small
            outer = tirx.Select(v < tirx.const(0.0, compute_dtype), -magnitude, magnitude)
            return tirx.Select(tirx.abs(v) < one, v + v * square * series, outer).astype(dtype)

        return te.compute(x.shape, body, name=name)

    return bb.call_te(compute, call.args[0], primfunc_name_hint=name)
