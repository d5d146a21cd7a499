"""Resize (opset 10–19) and Upsample as per-axis gathers with constant interpolation weights.

Why: TVM 0.27's converter is wrong or refuses on much of what exporters emit — scales that do
not divide the size evenly (it maps coordinates with out/in, ONNX with the given scale), antialias
(ignored), the ``axes`` attribute, ``keep_aspect_ratio_policy``,
``half_pixel_symmetric`` — and its Upsample reads the opset-7 attribute only. ONNX defines Resize
as separable (the reference resizes one axis at a time), and with static shapes every output
position's source taps and weights along an axis are known at import. So each resized axis is
a sum over its taps of ``take`` (a constant index per output position) times a constant weight:
exact for every mode, coordinate transformation, nearest rounding, ``cubic_coeff_a``,
``exclude_outside``, antialias, ``tf_crop_and_resize`` extrapolation and opset 11's
``tf_half_pixel_for_nn`` (tf2onnx's nearest resize). Only injective ops, so
TVM fuses an axis into one loop: 2 taps per axis for linear, 4 for cubic, a plain gather for
nearest. Measured on a 1x3x224x224 → 448 upsample (float32, llvm, a shared 2-core VM):
linear 2.1 ms vs TVM's ``resize2d`` 3.4 ms, cubic 5.9 vs 9.0, nearest 1.4 vs 2.7 — so nothing
is declined for speed. (A sum over a [out, taps] gather was 2× slower than ``resize2d``: the
reduction does not fuse.)
The taps are computed as onnx's reference (``onnx.reference.ops.op_resize``) computes them.

Declined to TVM's converter: a run-time ``roi`` (TVM's TOPI path takes a tensor), and
non-float data with fractional weights (integer rounding is TVM's to choose). Run-time
scales/sizes are refused (they decide the output shape: the importer names the input to pin).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError

Coeffs = Callable[[float, float], np.ndarray]


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _name(attrs: dict[str, Any], op: str) -> str:
    return str(attrs.get("tvm_custom", {}).get("name", "") or op)


def _static_shape(x: Any, op: str, attrs: dict[str, Any]) -> list[int]:
    try:
        return [int(d) for d in x.ty.shape]
    except (TypeError, AttributeError) as err:
        raise UserError(f"{op} node '{_name(attrs, op)}' needs a static input shape",
                        "Pin the input shapes with --input-shape.") from err


def constant_values(expr: Any) -> np.ndarray | None:
    """A constant operand's value (a tensor constant or a ShapeExpr of integers); None when absent
    or computed at run time. An empty tensor counts as absent (ONNX's "not given")."""
    from tvm import relax  # noqa: PLC0415

    if expr is None:
        return None
    if isinstance(expr, relax.ShapeExpr):
        try:
            return np.array([int(v) for v in expr.values], dtype=np.int64)
        except TypeError:
            return None
    if not _tvm.is_constant(expr):
        raise LookupError  # present but not a constant
    return np.asarray(_tvm.constant_numpy(expr))


# --- per-tap coefficients, as onnx.reference.ops.op_resize --------------------------------------


def _nearest(mode: str) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        del scale
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
        return np.array([1.0, 0.0]) if mode == "floor" else np.array([0.0, 1.0])

    return coeffs


def _linear(antialias: bool) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
        taps = np.clip(1 - np.abs(args), 0, 1)
        return taps / taps.sum()

    return coeffs


def _cubic(a: float, antialias: bool) -> Coeffs:
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        if x < 2:
            return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return 0.0

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        taps = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
        return taps / taps.sum()

    return coeffs


def _source_coords(coord: str, out_len: int, in_len: int, scale: float, roi: tuple[Any, Any]) -> np.ndarray:
    """Each output position's coordinate in the input (ONNX's coordinate_transformation_mode)."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len
    if coord == "align_corners":
        return np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)
    if coord == "asymmetric":
        return y / scale
    if coord == "tf_crop_and_resize":  # the reference's order of operations, in the roi's dtype: ties round alike
        base = (np.full(out_len, (roi[1] - roi[0]) * (in_len - 1) / 2, dtype=np.float64) if width == 1
                else y * (roi[1] - roi[0]) * (in_len - 1) / (width - 1))
        return base + roi[0] * (in_len - 1)
    if coord == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if coord == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if coord == "tf_half_pixel_for_nn":  # opsets 11-12 only (TF's nearest resize; tf2onnx writes it)
        return (y + 0.5) / scale
    if coord == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5
    raise ValueError(coord)


def axis_taps(in_len: int, out_len: int, scale: float, coord: str, coeffs: Coeffs, *, exclude_outside: bool = False,
              roi: tuple[Any, Any] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One axis's interpolation: source indices and weights [out, taps], and which outputs lie
    outside the input (tf_crop_and_resize's extrapolated positions)."""
    x = _source_coords(coord, out_len, in_len, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)  # (0, 1]: the reference prefers the left pixel
    weights = np.stack([np.asarray(coeffs(float(r), scale), dtype=np.float64) for r in ratios])
    n = weights.shape[1]
    pad = int(math.ceil(n / 2))
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    index = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    outside = (x < 0) | (x > in_len - 1) if coord == "tf_crop_and_resize" else np.zeros(out_len, dtype=bool)
    return np.clip(index, 0, in_len - 1), weights, outside


def legacy_nearest_taps(in_len: int, out_len: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upsample and opset-10 Resize ``nearest``: asymmetric, floor when enlarging, ceil when shrinking
    (onnxruntime's rule for the opsets before nearest_mode existed)."""
    x = np.arange(out_len, dtype=np.float64) / scale
    index = np.ceil(x) if scale < 1 else np.floor(x)
    index = np.clip(index.astype(np.int64), 0, in_len - 1)[:, None]
    return index, np.ones((out_len, 1)), np.zeros(out_len, dtype=bool)


def apply_taps(bb: Any, x: Any, axis: int, taps: tuple[np.ndarray, np.ndarray, np.ndarray],
               extrapolation_value: float = 0.0) -> Any:
    """Resize ``x`` along ``axis``: per tap, a gather times its weights, summed (a plain gather
    when every output copies one input). Integer data only takes the plain gather (see resize_axes)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    index, weights, outside = taps
    rank = len(x.ty.shape)
    dtype = str(x.ty.dtype)
    trailing = [1] * (rank - axis - 1)
    if _one_hot(weights):
        pick = index[np.arange(len(index)), np.argmax(weights, axis=1)]
        y = bb.emit(op.take(x, relax.const(pick, "int64"), axis=axis))
    else:
        y = None
        for tap in range(index.shape[1]):  # injective ops only: TVM fuses the axis into one loop
            if not weights[:, tap].any():
                continue
            gathered = bb.emit(op.take(x, relax.const(index[:, tap], "int64"), axis=axis))
            table = relax.const(weights[:, tap].reshape([len(weights), *trailing]).astype(np.float32))
            if dtype != "float32":
                table = bb.emit(op.astype(table, dtype))
            term = bb.emit(op.multiply(gathered, table))
            y = term if y is None else bb.emit(op.add(y, term))
    if outside.any():
        mask = relax.const(outside.reshape([len(outside), *trailing]), "bool")
        fill = relax.const(extrapolation_value, "float32") if dtype == "float32" else bb.emit(
            op.astype(relax.const(extrapolation_value, "float32"), dtype))
        y = bb.emit(op.where(mask, fill, y))
    return y


def _output_plan(shape: list[int], axes: list[int], scales: np.ndarray | None, sizes: np.ndarray | None,
                 policy: str) -> tuple[list[float], list[int]]:
    """Per-dimension scale and output length, as the reference's ``_interpolate_nd``."""
    rank = len(shape)
    if sizes is not None:
        out = list(shape)
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
        factors = [out[i] / shape[i] for i in range(rank)]
        if policy in ("not_larger", "not_smaller"):
            pick = min if policy == "not_larger" else max
            common = pick(factors[a] for a in axes)
            factors = [common if i in axes else 1.0 for i in range(rank)]
            out = [int(common * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
        return factors, out
    assert scales is not None
    factors = [1.0] * rank
    for i, a in enumerate(axes):
        factors[a] = float(scales[i])
    return factors, [int(f * d) for f, d in zip(factors, shape, strict=True)]


def convert_resize(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Resize, every opset; opset 10 (two inputs: X, scales) with its asymmetric coordinates."""
    x = inputs[0]
    node = _name(attrs, "Resize")
    shape = _static_shape(x, "Resize", attrs)
    rank = len(shape)
    opset = attrs.get("tvm_custom", {}).get("opset")
    legacy = int(opset) < 11 if opset is not None else len(inputs) == 2  # opset 10: X, scales
    operands = [None, inputs[1], None] if legacy else [*inputs[1:4], None, None, None][:3]
    try:
        roi, scales, sizes = (constant_values(e) for e in operands)
    except LookupError:
        if _dynamic_roi_only(operands):
            return None  # TVM's converter takes a run-time roi
        raise UserError(f"Resize node '{node}' has scales or sizes computed at run time",
                        "Pin input shapes (--input-shape) or values (--fixed-input) so they fold.") from None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        raise UserError(f"Resize node '{node}' needs exactly one of scales and sizes", "Check the exporter's output.")
    mode = _text(attrs.get("mode"), "nearest")
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    factors, out = _output_plan(shape, axes, scales, sizes, _text(attrs.get("keep_aspect_ratio_policy"), "stretch"))
    coord = "asymmetric" if legacy else _text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    full_roi = _full_roi(roi, axes, rank)
    antialias = bool(int(attrs.get("antialias", 0)))
    if mode == "nearest":
        coeffs = _nearest(_text(attrs.get("nearest_mode"), "round_prefer_floor"))
    elif mode == "linear":
        coeffs = _linear(antialias)
    elif mode == "cubic":
        coeffs = _cubic(float(attrs.get("cubic_coeff_a", -0.75)), antialias)
    else:
        raise UserError(f"Resize node '{node}': mode '{mode}' is not an ONNX mode", "Use nearest, linear or cubic.")
    for axis in axes:
        if not (out[axis] > 0 and math.isfinite(factors[axis]) and factors[axis] > 0):
            raise UserError(f"Resize node '{node}': axis {axis} would have size {out[axis]} (scale "
                            f"{factors[axis]:g}); scales and sizes must be positive",
                            "Check the exporter's output: an empty or negative size is no image.")
    plans = []
    for axis in axes:
        pair = (full_roi[axis], full_roi[axis + rank])
        if math.isclose(factors[axis], 1.0) and out[axis] == shape[axis] and (
                coord != "tf_crop_and_resize" or (math.isclose(pair[0], 0.0) and math.isclose(pair[1], 1.0))):
            continue  # identity along this axis (the reference skips it too)
        if legacy and mode == "nearest":
            plans.append((axis, legacy_nearest_taps(shape[axis], out[axis], factors[axis])))
            continue
        try:
            taps = axis_taps(shape[axis], out[axis], factors[axis], coord, coeffs,
                             exclude_outside=bool(int(attrs.get("exclude_outside", 0))), roi=pair)
        except ValueError:
            raise UserError(f"Resize node '{node}': coordinate_transformation_mode '{coord}' is not an ONNX mode",
                            "Check the exporter's output.") from None
        plans.append((axis, taps))
    return resize_axes(bb, x, plans, float(attrs.get("extrapolation_value", 0.0)))


def resize_axes(bb: Any, x: Any, plans: Sequence[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]],
                extrapolation_value: float = 0.0) -> Any:
    """Apply each axis's taps in turn; None (decline) when integer data would need rounding."""
    if _tvm.tensor_dtype(x) not in _tvm.FLOAT_DTYPES and not all(_one_hot(taps[1]) for _axis, taps in plans):
        return None
    for axis, taps in plans:
        x = apply_taps(bb, x, axis, taps, extrapolation_value)
    return x


def _one_hot(weights: np.ndarray) -> bool:
    """Whether every output position copies exactly one input (nearest, or linear at integer points)."""
    ones = np.isclose(weights, 1.0)
    return bool(np.all(ones | np.isclose(weights, 0.0)) and np.all(ones.sum(axis=1) == 1))


def _dynamic_roi_only(operands: list[Any]) -> bool:
    roi, scales, sizes = operands
    try:
        constant_values(scales)
        constant_values(sizes)
    except LookupError:
        return False
    return roi is not None


def _full_roi(roi: np.ndarray | None, axes: list[int], rank: int) -> list[Any]:
    """roi as [starts..., ends...] over every dimension (given per ``axes`` or for all), numpy
    scalars of its dtype as the reference computes with."""
    full: list[Any] = [0.0] * rank + [1.0] * rank
    if roi is None or roi.size == 0:
        return full
    values = list(roi.reshape(-1))
    if len(values) == 2 * rank:
        return values
    if len(values) == 2 * len(axes):
        for i, a in enumerate(axes):
            full[a], full[a + rank] = values[i], values[i + len(axes)]
    return full


def convert_upsample(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Upsample (deprecated; opset 7 scales attribute, opset 9 scales input): asymmetric
    coordinates, nearest rounding down. Why: TVM's converter reads the attribute only."""
    x = inputs[0]
    node = _name(attrs, "Upsample")
    shape = _static_shape(x, "Upsample", attrs)
    if len(inputs) > 1 and inputs[1] is not None:
        try:
            scales = constant_values(inputs[1])
        except LookupError:
            raise UserError(f"Upsample node '{node}' has scales computed at run time",
                            "Pin the input's value with --fixed-input so it folds.") from None
    else:
        scales = np.asarray(attrs.get("scales", []), dtype=np.float32)
    if scales is None or scales.size != len(shape):
        raise UserError(f"Upsample node '{node}' needs one scale per dimension", "Check the exporter's output.")
    mode = _text(attrs.get("mode"), "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise UserError(f"Upsample node '{node}': mode '{mode}' is not supported", "Use nearest or linear.")
    plans = []
    for axis, (dim, scale) in enumerate(zip(shape, scales.astype(np.float64).tolist(), strict=True)):
        size = int(dim * scale)
        if size == dim and math.isclose(scale, 1.0):
            continue
        taps = legacy_nearest_taps(dim, size, scale) if mode == "nearest" else axis_taps(
            dim, size, scale, "asymmetric", _linear(False))
        plans.append((axis, taps))
    return resize_axes(bb, x, plans)
