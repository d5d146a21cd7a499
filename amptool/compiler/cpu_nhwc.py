"""NHWC convolutions for the CPU: the TE computes and their schedule rules.

What: ``cpu_layout`` turns convolutions to NHWC (channels innermost) for the whole chain of
layers between them; ``cpu_kernels`` legalizes each NHWC ``relax.nn.conv2d`` here:

* ``amp_conv2d_nhwc`` (one group) — ``out[n, y, x, c] = Σ_{ry, rx, rc} in[n, y', x', rc] ·
  w[c/B, ry, rx, rc, c%B]``, the weight packed at compile time so that ``B`` output channels
  (one vector) are adjacent; register tile ``T`` columns × ``B`` channels, one broadcast input
  and one vector weight load per ``T`` FMAs.
  A conv whose weights outweigh its activations may instead run over its map as one run of
  positions, ``out[n, p, c]`` (``flat_nhwc``), its tile spanning rows (``cpu_kernels.flat_tile``).
* ``amp_conv2d_nhwc_bf16`` — the same tile for bfloat16 on CPUs with AVX512-BF16: input
  channels in pairs (adjacent in NHWC), weight ``[OC/16, KH, KW, IC/2, 16, 2]``, each
  16-channel × pair step one ``vdpbf16ps`` (:mod:`amptool.compiler.cpu_intrinsics`).
* ``amp_depthwise_nhwc`` — ``out[n, y, x, c] = Σ_{ry, rx} in[n, y', x', c] · w[ry, rx, c]``:
  vectors along channels, ``T`` columns of accumulators, the zero padding read in place.

Why: with NCHW activations every conv's register tile (columns × channels) had to be
transposed on the way out, and depthwise layers vectorized along rows with padded copies; in
NHWC a tile is contiguous in the output and the fused bias/activation/residual epilogue stores
it as is. Measured on MobileNetV2's layers (float32, 2 threads, kernels alone): 1×1 convs
1.0–1.6× faster, depthwise 2–5× faster. onnxruntime and OpenVINO keep blocked layouts between
layers for the same reason.

When not: see ``cpu_layout.wants_nhwc``; everything else keeps NCHW.

Preserves: products of the NCHW kernels, summed kernel row, kernel column, then input channel
(the NCHW kernels sum input channel first): rounding-level differences only. Accumulation is in
the call's output dtype (float32 after mixed precision); depthwise always accumulates float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool.compiler.cpu_depthwise import INTERIOR_ATTR

#: Block names the schedule rules look for.
CONV2D_NHWC_BLOCK = "amp_conv2d_nhwc"
CONV2D_NHWC_BF16_BLOCK = "amp_conv2d_nhwc_bf16"
DEPTHWISE_NHWC_BLOCK = "amp_depthwise_nhwc"
NHWC_PAD_BLOCK = "amp_nhwc_pad"
NHWC_PAIRS_BLOCK = "amp_nhwc_pairs"
NHWC_CROP_BLOCK = "amp_nhwc_crop"
NHWC_CHANNEL_CROP_BLOCK = "amp_nhwc_channel_crop"
NHWC_WIDEN_BLOCK = "amp_nhwc_widen"

#: Depthwise accumulation dtype (and its packed weight's).
ACCUMULATE = "float32"


# --------------------------------------------------------------------------- weights (numpy)


def pack_conv_weight(weight: np.ndarray, block: int, chunk: int | None = None) -> np.ndarray:
    """OIHW → ``[OC/B, KH, KW, IC, B]``; with a ``chunk`` of ``K`` input channels (a conv reduced
    chunk by chunk, ``cpu_kernels.weight_chunk``) ``[OC/B, IC/K, KH, KW, K, B]``: each chunk's
    weights one run, in the order its tiles read them, each block's chunks one after the other —
    the stream ``prefetch_chunks`` reads ahead."""
    oc, ic, kh, kw = weight.shape
    blocked = weight.reshape(oc // block, block, ic, kh, kw)
    if chunk is None:
        return np.ascontiguousarray(blocked.transpose(0, 3, 4, 2, 1))
    chunked = blocked.reshape(oc // block, block, ic // chunk, chunk, kh, kw)
    return np.ascontiguousarray(chunked.transpose(0, 2, 4, 5, 3, 1))


def weight_geometry(packed: Any) -> tuple[int, int, int, int, int | None]:
    """(blocks, KH, KW, input channels, chunk) of a ``pack_conv_weight`` buffer (chunk None: unchunked)."""
    shape = [int(d) for d in packed.shape]
    if len(shape) == 6:
        blocks, chunks, kh, kw, chunk, _ = shape
        return blocks, kh, kw, chunks * chunk, chunk
    blocks, kh, kw, in_channels, _ = shape
    return blocks, kh, kw, in_channels, None


def pack_depthwise_weight(weight: np.ndarray) -> np.ndarray:
    """``[C, 1, KH, KW]`` → ``[KH, KW, C]`` in float32 (exact for float16/bfloat16)."""
    return np.ascontiguousarray(np.asarray(weight).astype(ACCUMULATE)[:, 0].transpose(1, 2, 0))


# --------------------------------------------------------------------------- computes (TE)


#: Column tiles a row may take and still end in a narrower tile (``ragged_row``): each row's tiles
#: are unrolled, each a copy of the conv's reduction loops. Five: 27 columns as 4 × 6 + 3
#: (``cpu_kernels.nhwc_columns``).
RAGGED_TILES = 5


def ragged_row(width: int, columns: int) -> bool:
    """Whether a conv computes exactly its ``width`` output columns in tiles of ``columns``, the
    last tile narrower, rather than a multiple of the tile, cropped. The schedule
    (``cpu_schedules_nhwc.nhwc_tile``) unrolls the row's few tiles, so each tile's bound is a
    constant and no test is left in its loops.

    Why: the cropped columns were whole FMAs for nothing. ResNet-50's 14-column rows took 2 × 5
    tiles over 15 columns (7% more FMAs) on an AVX2 EPYC; computing 5 + 5 + 4, its 14² 1×1 convs ran
    0.89–0.96× and its 14² 3×3 ones 0.96–1.00× the cropped time (per-call minima over 60 alternated
    rounds, 2 threads). Its 7-column rows (4 + 3 instead of 4 + 4) were level: a 3-column tile of
    6 accumulators does not keep Zen 3's FMA pipes full.
    """
    return width % columns != 0 and -(-width // columns) <= RAGGED_TILES


def _geometry(height: int, width: int, kh: int, kw: int, padding: list[int], strides: list[int],
              dilation: list[int], columns: int, ragged: bool = False) -> tuple[int, int, int, int]:
    """(out_h, out_w, computed width, extra right padding): ``columns`` divides the computed width,
    unless the kernel takes ``ragged`` rows and ``ragged_row`` says so (then it is ``out_w``)."""
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    wide = out_w if ragged and ragged_row(out_w, columns) else -(-out_w // columns) * columns
    return out_h, out_w, wide, (wide - out_w) * sw


def _crop(wide: Any, out_w: int) -> Any:
    from tvm import te  # noqa: PLC0415

    if int(wide.shape[2]) == out_w:
        return wide
    n, h, _, c = (int(d) for d in wide.shape)
    return te.compute((n, h, out_w, c), lambda *i: wide(*i), name=NHWC_CROP_BLOCK)


def _padded(data: Any, top: int, left: int, bottom: int, right: int, dtype: str, name: str) -> Any:
    """``data`` cast to ``dtype`` with zero rows/columns around it (one pass, before the conv);
    ``data`` itself when there is neither padding nor a cast.

    Why not copy anyway: the copy is a pass over the whole input before the conv reads it again,
    and an unpadded input (every 1×1 conv) gains nothing from it. On an Ice Lake core (1.25 MB L2)
    the copy cost ResNet-50's 1×1 convs 10–35% each (256 → 64 at 56², 1 thread: 1.65 → 1.07 ms),
    whole runs 2% (2 threads, alternated in one process) and MobileNetV2 8–10%.
    """
    from tvm import te, tirx  # noqa: PLC0415

    if not (top or left or bottom or right) and str(data.dtype) == dtype:
        return data
    batch, height, width, channels = (int(d) for d in data.shape)

    def value(n: Any, y: Any, x: Any, c: Any) -> Any:
        v = data[n, y - top, x - left, c].astype(dtype)
        if not (top or left or bottom or right):
            return v
        inside = tirx.all(y >= top, y < height + top, x >= left, x < width + left)
        return tirx.if_then_else(inside, v, tirx.const(0, dtype))

    # The rows and columns that read inside the input: there a schedule may copy without the test.
    interior = [top, top + height, left, left + width]
    return te.compute((batch, height + top + bottom, width + left + right, channels), value, name=name,
                      attrs={INTERIOR_ATTR: interior})


def _subsampled(data: Any, sh: int, sw: int, out_h: int, out_w: int, wide: int, dtype: str) -> Any:
    """``data[:, ::sh, ::sw]`` cast to ``dtype``, ``wide - out_w`` zero columns on the right."""
    from tvm import te, tirx  # noqa: PLC0415

    batch, _, _, channels = (int(d) for d in data.shape)

    def value(n: Any, y: Any, x: Any, c: Any) -> Any:
        if wide == out_w:
            return data[n, y * sh, x * sw, c].astype(dtype)
        inside = data[n, y * sh, tirx.min(x, out_w - 1) * sw, c].astype(dtype)
        return tirx.if_then_else(x < out_w, inside, tirx.const(0, dtype))

    return te.compute((batch, out_h, wide, channels), value, name=NHWC_PAD_BLOCK)


def _conv_source(data: Any, kernel: tuple[int, int], padding: list[int], strides: list[int], out_h: int, out_w: int,
                 wide: int, dtype: str) -> tuple[Any, tuple[int, int]]:
    """A conv's input in ``dtype`` and the strides to read it at, for ``wide`` ≥ ``out_w`` computed
    columns: a strided unpadded 1×1 conv (a ResNet shortcut) reads every sh-th row and sw-th column
    only — those are copied (a quarter of a stride-2 input) and read densely, at stride 1; any other
    reads its padded copy, with the columns past ``out_w`` more padding on the right."""
    sh, sw = strides
    if kernel == (1, 1) and not any(padding) and (sh, sw) != (1, 1):
        return _subsampled(data, sh, sw, out_h, out_w, wide, dtype), (1, 1)
    top, left, bottom, right = padding
    return _padded(data, top, left, bottom, right + (wide - out_w) * sw, dtype, NHWC_PAD_BLOCK), (sh, sw)


def _weight(packed: Any, c: Any, taps: tuple[Any, Any, Any], pair_lanes: int | None, dtype: str) -> Any:
    """Output channel ``c``'s weight at ``taps`` (kernel row, column, input channel) of a
    ``pack_conv_weight`` buffer in ``dtype``, or of ``bf16_pairs``' words (``pair_lanes``)."""
    from amptool.compiler import bf16_pairs  # noqa: PLC0415

    block = bf16_pairs.block_of(packed)
    chunk = weight_geometry(packed)[4]
    ry, rx, rc = taps
    lead = (c // block, ry, rx, rc) if chunk is None else (c // block, rc // chunk, ry, rx, rc % chunk)
    if pair_lanes:  # bf16_pairs: two channel vectors per word
        return bf16_pairs.read(packed, lead, c % block, pair_lanes)
    return packed[(*lead, c % block)].astype(dtype)


def _widened(packed: Any, dtype: str, pair_lanes: int | None) -> Any:
    """``packed`` read through a stage that converts it to ``dtype`` (``NHWC_WIDEN_BLOCK``), for the
    schedule to convert each weight panel once for all the tiles that read it, or to inline
    (``cpu_schedules_nhwc._widen_panels``); ``packed`` itself when it is in ``dtype`` already or
    is ``bf16_pairs``' words."""
    from tvm import te  # noqa: PLC0415

    if pair_lanes or str(packed.dtype) == dtype:
        return packed
    return te.compute(packed.shape, lambda *i: packed(*i).astype(dtype), name=NHWC_WIDEN_BLOCK)


def conv2d_nhwc(data: Any, packed: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                columns: int, out_dtype: str, out_channels: int | None = None, groups: int = 1,
                pair_lanes: int | None = None) -> Any:
    """NHWC conv2d over a ``[OC/B, KH, KW, IC/groups, B]`` weight (``pair_lanes``: ``bf16_pairs``'
    ``[…, B/2]`` words of vectors of that many lanes), ``columns`` output columns per
    tile (``cpu_kernels.nhwc_columns``). ``out_channels``: fewer than the weights' (zero filters
    padding them to whole blocks): cropped. ``groups``: each block of ``B`` output channels lies
    in one group (``B`` divides the group's channels) and reads that group's input channels."""
    from tvm import te  # noqa: PLC0415

    from amptool.compiler import bf16_pairs  # noqa: PLC0415

    batch, height, width, _ = (int(d) for d in data.shape)
    blocks, kh, kw, in_channels, _ = weight_geometry(packed)
    block = bf16_pairs.block_of(packed)
    blocks_per_group = blocks // groups
    out_h, out_w, wide, _ = _geometry(height, width, kh, kw, padding, strides, dilation, columns, ragged=True)
    src, (sh, sw) = _conv_source(data, (kh, kw), padding, strides, out_h, out_w, wide, out_dtype)
    packed = _widened(packed, out_dtype, pair_lanes)
    dh, dw = dilation
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rc = te.reduce_axis((0, in_channels), "rc")
    def channel(c: Any) -> Any:
        """The input channel ``rc`` of ``c``'s group: from the block index, so a tile's broadcast
        input does not depend on its vector lane."""
        return rc if groups == 1 else c // block // blocks_per_group * in_channels + rc

    conv = te.compute(
        (batch, out_h, wide, blocks * block),
        lambda n, y, x, c: te.sum(src[n, y * sh + ry * dh, x * sw + rx * dw, channel(c)]
                                  * _weight(packed, c, (ry, rx, rc), pair_lanes, out_dtype), axis=[ry, rx, rc]),
        name=CONV2D_NHWC_BLOCK,
    )
    return _crop_channels(_crop(conv, out_w), out_channels)


def flat_nhwc(data: Any, packed: Any, *, strides: list[int], padding: list[int], dilation: list[int],
              positions: int, out_dtype: str, out_channels: int | None = None, pair_lanes: int | None = None) -> Any:
    """A conv as a product over one run of output positions (``cpu_kernels.flat_tile``): ``out[n, p,
    c] = Σ in[n, y·sh + ry·dh, x·sw + rx·dw, rc] · w[c/B, ry, rx, rc, c%B]`` with ``(y, x)`` the
    ``p``-th position of the map, for ``positions`` ≥ the map's (a multiple of the register tile;
    the ones past the map read its last and are dropped), then read back as ``[n, y, x, c]`` (the
    epilogue reads ``out[n, y·W + x, c]``). An unpadded 1×1 conv reads its input (strided: the
    subsampled copy) with no tap loops; any other the padded copy. ``pair_lanes``: a ``bf16_pairs``
    weight, as ``conv2d_nhwc`` takes it. Same sums as ``conv2d_nhwc``."""
    from tvm import te, tirx  # noqa: PLC0415

    from amptool.compiler import bf16_pairs  # noqa: PLC0415

    batch, height, width, _ = (int(d) for d in data.shape)
    blocks, kh, kw, in_channels, _ = weight_geometry(packed)
    block = bf16_pairs.block_of(packed)
    out_h, out_w, _, _ = _geometry(height, width, kh, kw, padding, strides, dilation, 1)
    src, (sh, sw) = _conv_source(data, (kh, kw), padding, strides, out_h, out_w, out_w, out_dtype)
    packed = _widened(packed, out_dtype, pair_lanes)
    dh, dw = dilation
    last = out_h * out_w - 1
    taps = [] if (kh, kw) == (1, 1) else [te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")]
    ry, rx = taps or (0, 0)
    rc = te.reduce_axis((0, in_channels), "rc")

    def position(p: Any) -> tuple[Any, Any]:
        q = p if positions == last + 1 else tirx.min(p, last)
        return q // out_w * sh + ry * dh, q % out_w * sw + rx * dw

    conv = te.compute(
        (batch, positions, blocks * block),
        lambda n, p, c: te.sum(src[(n, *position(p), rc)] * _weight(packed, c, (ry, rx, rc), pair_lanes, out_dtype),
                               axis=[*taps, rc]),
        name=CONV2D_NHWC_BLOCK,
    )
    rows = te.compute((batch, out_h, out_w, blocks * block), lambda n, y, x, c: conv[n, y * out_w + x, c],
                      name=NHWC_CROP_BLOCK)
    return _crop_channels(rows, out_channels)


def _crop_channels(conv: Any, out_channels: int | None) -> Any:
    """The first ``out_channels`` channels of an NHWC ``conv`` (all when None)."""
    from tvm import te  # noqa: PLC0415

    if out_channels is None or out_channels == int(conv.shape[3]):
        return conv
    return te.compute((*conv.shape[:3], out_channels), lambda *i: conv(*i), name=NHWC_CHANNEL_CROP_BLOCK)


def conv2d_nhwc_bf16(data: Any, packed: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                     columns: int, out_channels: int | None = None) -> Any:
    """bfloat16 NHWC conv2d for ``vdpbf16ps``: the input padded with its channel pairs packed two
    to a uint32 (``[N, H, W, IC/2]``), weights ``[OC/16, KH, KW, IC/2, 16, 2]``; float32 sums.
    ``out_channels``: fewer than the weights' (zero filters padding them to 16s): cropped."""
    from tvm import te, tirx  # noqa: PLC0415

    from amptool.compiler.cpu_intrinsics import high_bf16, low_bf16, pack_pair, weight_float  # noqa: PLC0415

    batch, height, width, in_channels = (int(d) for d in data.shape)
    blocks, kh, kw, pairs, block, _ = (int(d) for d in packed.shape)
    out_h, out_w, wide, extra = _geometry(height, width, kh, kw, padding, strides, dilation, columns)
    top, left, bottom, right = padding
    right += extra
    (sh, sw), (dh, dw) = strides, dilation

    def pair(n: Any, y: Any, x: Any, p: Any) -> Any:
        yy, xx = y - top, x - left
        low = data[n, yy, xx, 2 * p]
        if in_channels % 2:  # the last pair's high half is a zero channel
            high = data[n, yy, xx, tirx.min(2 * p + 1, in_channels - 1)]
            value = tirx.if_then_else(2 * p + 1 < in_channels, pack_pair(low, high), pack_pair(low, None))
        else:
            value = pack_pair(low, data[n, yy, xx, 2 * p + 1])
        if not (top or left or bottom or right):
            return value
        inside = tirx.all(yy >= 0, yy < height, xx >= 0, xx < width)
        return tirx.if_then_else(inside, value, tirx.const(0, "uint32"))

    src = te.compute((batch, height + top + bottom, width + left + right, pairs), pair, name=NHWC_PAIRS_BLOCK)
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rp = te.reduce_axis((0, pairs), "rp")

    def body(n: Any, y: Any, x: Any, c: Any) -> Any:
        value = src[n, y * sh + ry * dh, x * sw + rx * dw, rp]
        w = packed[c // block, ry, rx, rp, c % block]
        return te.sum(low_bf16(value) * weight_float(w[0]) + high_bf16(value) * weight_float(w[1]),
                      axis=[ry, rx, rp])

    conv = _crop(te.compute((batch, out_h, wide, blocks * block), body, name=CONV2D_NHWC_BF16_BLOCK), out_w)
    return _crop_channels(conv, out_channels)


def depthwise_nhwc(data: Any, weight: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                   columns: int, out_dtype: str) -> Any:
    """NHWC depthwise conv2d (channel multiplier 1) over a ``[KH, KW, C]`` float32 ``weight``;
    the padding is read in place (a copy first measured 2–7× slower on MobileNetV2's layers)."""
    from tvm import te, tirx  # noqa: PLC0415

    batch, height, width, channels = (int(d) for d in data.shape)
    kh, kw, _ = (int(d) for d in weight.shape)
    out_h, out_w, wide, _extra = _geometry(height, width, kh, kw, padding, strides, dilation, columns)
    top, left = padding[0], padding[1]
    (sh, sw), (dh, dw) = strides, dilation
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def tap(n: Any, y: Any, x: Any, c: Any) -> Any:
        yy, xx = y * sh + ry * dh - top, x * sw + rx * dw - left
        inside = tirx.all(yy >= 0, yy < height, xx >= 0, xx < width)
        value = tirx.if_then_else(inside, data[n, yy, xx, c].astype(ACCUMULATE), tirx.const(0, ACCUMULATE))
        return te.sum(value * weight[ry, rx, c], axis=[ry, rx])

    conv = te.compute((batch, out_h, wide, channels), tap, name=DEPTHWISE_NHWC_BLOCK)
    if out_dtype != ACCUMULATE:
        conv = te.compute(conv.shape, lambda *i: conv(*i).astype(out_dtype), name=DEPTHWISE_NHWC_BLOCK + "_cast")
    return _crop(conv, out_w)
