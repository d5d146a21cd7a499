"""Bilinear GridSample (optical-flow warps, RAFT's correlation lookups) with its coefficients
computed once per output pixel, not once per channel.

What: ``relax.image.grid_sample`` in NCHW, bilinear, zeros or border padding, static shapes,
legalized as two steps: per output pixel the four taps' clamped row/column indices and their
weights (a zero weight for a tap outside the map under zeros padding), then per channel four
gathers weighted by them, in float32 (a float16/bfloat16 input and output are cast around it).

Why: TOPI's kernel evaluates the grid's unnormalisation, floors, bounds tests and weights inside
the channel loop — the same arithmetic 64 times for a 64-channel map. GridSample 64×48×64 (the
op sweep's), 2 threads, an Ice Lake core: 1.46 → 0.28 ms (onnxruntime 0.29 ms).

When not: other layouts, nearest/bicubic modes, reflection padding, symbolic shapes: TVM's own
legalization.

Preserves: ONNX's (and PyTorch's) bilinear weights, ``align_corners`` both ways, up to float32
rounding of the weights' products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amptool._tvm import static_shape

_MODES = {"bilinear", "linear"}
_PADDINGS = {"zeros", "border"}


def legalize_grid_sample(bb: Any, call: Any, default: Callable[[Any, Any], Any]) -> Any:
    """The two-step kernel (module docstring) where it applies, else ``default``."""
    attrs = call.attrs
    data_shape, grid_shape = (static_shape(arg) for arg in call.args)
    if (str(attrs.method) not in _MODES or str(attrs.layout) != "NCHW" or str(attrs.padding_mode) not in _PADDINGS
            or data_shape is None or grid_shape is None or len(data_shape) != 4):
        return default(bb, call)
    align = bool(attrs.align_corners)
    border = str(attrs.padding_mode) == "border"
    taps = bb.emit(bb.call_te(lambda grid: _taps(grid, data_shape, align, border), call.args[1],
                              primfunc_name_hint="grid_sample_taps"))
    rows = bb.emit(_item(taps, 0))
    cols = bb.emit(_item(taps, 1))
    weights = bb.emit(_item(taps, 2))
    return bb.call_te(_sample, call.args[0], rows, cols, weights, primfunc_name_hint="grid_sample")


def _item(value: Any, index: int) -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax.TupleGetItem(value, index)


def _taps(grid: Any, data_shape: list[int], align: bool, border: bool) -> list[Any]:
    """Per output pixel: rows [N, 2, H', W'] and columns [N, 2, H', W'] (int32, clamped into the
    map) of the two rows/columns around the sampling point, and the four taps' weights
    [N, 4, H', W'] (row-major: (y0, x0), (y0, x1), (y1, x0), (y1, x1))."""
    from tvm import te, tirx  # noqa: PLC0415

    batch, _, height, width = data_shape
    _, _, out_h, out_w = (int(d) for d in grid.shape)
    f32 = "float32"

    def position(n: Any, axis: int, y: Any, x: Any, size: int) -> Any:
        """The grid's coordinate along ``axis`` (0: x, 1: y) in pixels."""
        v = grid[n, axis, y, x].astype(f32)
        if align:
            p = (v + 1.0) * tirx.const((size - 1) / 2.0, f32)
        else:
            p = ((v + 1.0) * tirx.const(float(size), f32) - 1.0) * tirx.const(0.5, f32)
        if border:
            p = tirx.max(tirx.min(p, tirx.const(float(size - 1), f32)), tirx.const(0.0, f32))
        return p

    ys = te.compute((batch, out_h, out_w), lambda n, y, x: position(n, 1, y, x, height), name="grid_sample_y")
    xs = te.compute((batch, out_h, out_w), lambda n, y, x: position(n, 0, y, x, width), name="grid_sample_x")

    def low(p: Any) -> Any:
        return tirx.floor(p)

    def index(p: Any, step: Any, size: int) -> Any:
        """The tap's index, clamped into the map (its weight is zero when it lies outside)."""
        i = (low(p) + step.astype(f32)).astype("int32")
        return tirx.max(tirx.min(i, size - 1), 0)

    rows = te.compute((batch, 2, out_h, out_w), lambda n, k, y, x: index(ys[n, y, x], k, height),
                      name="grid_sample_rows")
    cols = te.compute((batch, 2, out_h, out_w), lambda n, k, y, x: index(xs[n, y, x], k, width),
                      name="grid_sample_cols")

    def along(p: Any, step: Any, size: int) -> Any:
        """Weight of tap ``step`` (0 or 1) along one axis; zero outside the map."""
        frac = p - low(p)
        w = tirx.Select(step == 0, 1.0 - frac, frac)
        tap = low(p) + step.astype(f32)
        inside = tirx.all(tap >= 0.0, tap <= tirx.const(float(size - 1), f32))
        return tirx.Select(inside, w, tirx.const(0.0, f32))

    weights = te.compute(
        (batch, 4, out_h, out_w),
        lambda n, k, y, x: along(ys[n, y, x], k // 2, height) * along(xs[n, y, x], k % 2, width),
        name="grid_sample_weights")
    return [rows, cols, weights]


def _sample(data: Any, rows: Any, cols: Any, weights: Any) -> Any:
    """out[n, c, y, x] = Σ over the four taps of weight × data at the tap, in float32."""
    from tvm import te  # noqa: PLC0415

    batch, channels, _, _ = (int(d) for d in data.shape)
    _, _, out_h, out_w = (int(d) for d in weights.shape)
    dtype = str(data.dtype)

    def tap(n: Any, c: Any, y: Any, x: Any, k: int) -> Any:
        return weights[n, k, y, x] * data[n, c, rows[n, k // 2, y, x], cols[n, k % 2, y, x]].astype("float32")

    def value(n: Any, c: Any, y: Any, x: Any) -> Any:
        return (tap(n, c, y, x, 0) + tap(n, c, y, x, 1) + tap(n, c, y, x, 2) + tap(n, c, y, x, 3)).astype(dtype)

    return te.compute((batch, channels, out_h, out_w), value, name="grid_sample")
