"""Depthwise and grouped NCHW conv2d for the CPU: the TE compute and its register-tile plan.

What: ``relax.nn.conv2d`` with ``groups > 1`` (depthwise with any channel multiplier, and
general grouped convolutions), a constant weight and static shapes becomes ``amp_depthwise``
(legalized in :mod:`amptool.compiler.cpu_kernels`, scheduled by ``depthwise_conv2d`` in
:mod:`amptool.compiler.cpu_schedules`):

* ``amp_depthwise_src`` — the input planes padded and cast to float32, split by column phase
  for strided convs: ``src[n, c, y, p, q] = data[n, c, y - top, q·sw + p - left]``. Output
  column ``x`` then reads tap ``rx`` at ``q = x + (rx·dw) // sw`` of phase ``(rx·dw) % sw``:
  contiguous in ``x`` for every stride, so one vector load per tap instead of a gather (TVM
  scalarizes strided vector loads: MobileNetV2's stride-2 layers ran 3× slower per output);
* ``amp_depthwise`` — ``out[n, co, y, x] = Σ_{rc, ry, rx} src[…] · w[co, rc, ry, rx]`` in
  float32 (the weight cast at compile time), then cast to the call's dtype.

Why: the schedule vectorizes along output columns (one weight broadcast per tap, ``R`` rows of
accumulators), computes each plane's padded copy right before its outputs while it is in L1/L2
(TVM's legalization pads the whole tensor in a separate pass), and fuses bias/ReLU6/clip.

When not: non-constant weights, other layouts and symbolic shapes keep TVM's legalization.

Preserves: TOPI ``group_conv2d_nchw``'s products and summation order (input channel of the
group, kernel row, kernel column); low-precision inputs are cast to float32 while padding, which
is exact. Accumulation is float32 even for a float16/bfloat16 output dtype (TOPI would
accumulate in the output dtype), rounded once at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Block names the schedule rule looks for.
DEPTHWISE_BLOCK = "amp_depthwise"
DEPTHWISE_SRC_BLOCK = "amp_depthwise_src"
DEPTHWISE_CAST_BLOCK = "amp_depthwise_cast"
DEPTHWISE_WIDEN_BLOCK = "amp_depthwise_widen"
#: The source block's annotation: [first, end) rows and [first, end) columns ``q`` inside the input.
INTERIOR_ATTR = "amp_interior"

#: Accumulation dtype (and the packed weight's).
ACCUMULATE = "float32"


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """The OIHW weight in the accumulation dtype (exact for float16/bfloat16): the kernel
    broadcasts one scalar per tap, so OIHW is already the layout it reads."""
    return np.ascontiguousarray(np.asarray(weight).astype(ACCUMULATE))


def depthwise_conv2d(data: Any, weight: Any, *, strides: list[int], padding: list[int], dilation: list[int],
                     groups: int, out_dtype: str) -> Any:
    """Grouped NCHW conv2d over an OIHW float32 ``weight`` (see the module docstring)."""
    from tvm import te, tirx  # noqa: PLC0415

    batch, in_channels, height, width = (int(d) for d in data.shape)
    out_channels, per_group, kh, kw = (int(d) for d in weight.shape)
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1
    columns = out_w + (kw - 1) * dw // sw
    outputs_per_group = out_channels // groups
    if sw > 1 and str(data.dtype) != ACCUMULATE:
        # The phase split gathers every sw-th value: gathered as 16-bit values and widened after,
        # the copy took 2.5x as long as from float32 (MobileNetV2's bfloat16 stride-2 layers).
        narrow = data
        data = te.compute(narrow.shape, lambda *i: narrow(*i).astype(ACCUMULATE), name=DEPTHWISE_WIDEN_BLOCK)

    def source(n: Any, c: Any, y: Any, p: Any, q: Any) -> Any:
        yy, xx = y - top, q * sw + p - left
        value = data[n, c, yy, xx].astype(ACCUMULATE)
        inside = tirx.all(yy >= 0, yy < height, xx >= 0, xx < width)
        return tirx.if_then_else(inside, value, tirx.const(0, ACCUMULATE))

    # Rows and columns q that read inside the input for every phase: there the schedule copies
    # without the bounds test (one that varies along a vector makes TVM scalarize the loop).
    first_column = min(-(-left // sw), columns)
    end_column = max(first_column, min((width + left) // sw, columns))
    interior = [min(top, rows), min(top + height, rows), first_column, end_column]
    src = te.compute((batch, in_channels, rows, sw, columns), source, name=DEPTHWISE_SRC_BLOCK,
                     attrs={INTERIOR_ATTR: interior})
    rc = te.reduce_axis((0, per_group), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (batch, out_channels, out_h, out_w),
        lambda n, co, y, x: te.sum(
            src[n, co // outputs_per_group * per_group + rc, y * sh + ry * dh, rx * dw % sw, x + rx * dw // sw]
            * weight[co, rc, ry, rx],
            axis=[rc, ry, rx],
        ),
        name=DEPTHWISE_BLOCK,
    )
    if out_dtype == ACCUMULATE:
        return conv
    return te.compute(conv.shape, lambda *i: conv(*i).astype(out_dtype), name=DEPTHWISE_CAST_BLOCK)


def tile_plan(out_h: int, out_w: int, lanes: int, accumulators: int) -> tuple[int, int]:
    """(rows, columns) of the register tile. Columns: a divisor of ``out_w``, or all of it (up to 8
    vectors, or when no divisor fills half a vector), that fills its vectors best. Rows: a divisor
    of ``out_h`` with ``rows × vectors`` at most half the accumulator budget (AVX-512: 8 rows of
    112 columns took half the time of 16, which spilled; 5x5 kernels ran the same with 7 or 14)."""

    def fill(columns: int) -> tuple[float, int]:
        vectors = -(-columns // lanes)
        return columns / (vectors * lanes), -abs(vectors - 1)

    candidates = [d for d in range(1, min(out_w, 4 * lanes) + 1) if out_w % d == 0]
    columns = max(candidates, key=fill)
    if out_w <= 8 * lanes or fill(columns)[0] < 0.5:  # wide primes: whole rows, not scalar columns
        columns = max([columns, out_w], key=fill)
    vectors = -(-columns // lanes)
    cap = max(1, max(4, accumulators // 2) // vectors)
    rows = next(d for d in range(min(cap, out_h), 0, -1) if out_h % d == 0)
    if rows < min(cap, out_h) // 2:  # a prime height: a partial last tile beats one-row tiles
        rows = min(cap, out_h)
    return rows, columns
