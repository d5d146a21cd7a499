"""Clip and Pad as Relax ops, so the mixed-precision pass can colour them.

Why: TVM's frontend lowers both to ``call_tir`` of TOPI kernels (``emit_te``), whose dtype is
fixed at import — an opaque call the pass must keep float32. On mobile CNNs (ReLU6 and
hard-swish are Clip; padding before strided convs is Pad) that forced a cast down and up
around every such node: measured on PP-OCRv4's recogniser, 28 Clips pinned 63 Muls and 33
Divs to float32. As ``relax.clip`` / ``relax.nn.pad`` they follow their input's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.dtypes import DTYPE_MAX
from amptool.errors import UserError

_FP16_MAX = DTYPE_MAX["float16"]

#: ONNX Pad modes → relax.nn.pad modes.
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


def convert_clip(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Clip (all opsets): ``relax.clip`` with scalar bounds; max/min for tensor bounds.

    A NaN or missing bound means unbounded (onnxruntime's behaviour).
    """
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    if _tvm.tensor_dtype(x) not in _tvm.FLOAT_DTYPES:
        return None  # integer clip: TVM's converter is fine (nothing to colour)
    lo = _scalar_bound(inputs[1] if len(inputs) > 1 else None, attrs.get("min"), -math.inf)
    hi = _scalar_bound(inputs[2] if len(inputs) > 2 else None, attrs.get("max"), math.inf)
    if lo is not None and hi is not None and all(math.isinf(b) or abs(b) <= _FP16_MAX for b in (lo, hi)):
        # Scalar bounds become literals of x's dtype when the op is legalized: float16 rejects
        # finite literals beyond 65504, so such bounds take the tensor path (range-guarded).
        return relax.op.clip(x, lo, hi)
    result = x
    dtype = _tvm.tensor_dtype(x)
    for tensor, scalar, is_min in (
        (inputs[1] if len(inputs) > 1 else None, lo, True),
        (inputs[2] if len(inputs) > 2 else None, hi, False),
    ):
        if scalar is not None:
            if math.isinf(scalar):
                continue  # unbounded side
            bound = relax.const(scalar, dtype)
        else:  # a run-time tensor: NaN means unbounded
            unbounded = relax.const(-np.inf if is_min else np.inf, _tvm.tensor_dtype(tensor))
            bound = bb.emit(relax.op.where(relax.op.isnan(tensor), unbounded, tensor))
        result = bb.emit(relax.op.maximum(result, bound) if is_min else relax.op.minimum(result, bound))
    return result


def _scalar_bound(expr: Any, attr: Any, default: float) -> float | None:
    """The bound as a Python float, or None when it is a run-time tensor."""
    if expr is None:
        return float(attr) if attr is not None else default
    if not _tvm.is_constant(expr):
        return None
    value = np.asarray(_tvm.constant_numpy(expr))
    if value.size != 1:
        return None
    scalar = float(value.reshape(-1)[0])
    return default if math.isnan(scalar) else scalar


def convert_pad(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Pad with constant pads (opset 2 attribute or opset ≥ 11 input, opset 18 axes)."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    rank = len(x.ty.shape)
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in _PAD_MODES:
        raise UserError(f"Pad mode '{mode}' is not supported", f"Supported: {', '.join(_PAD_MODES)}.")
    pads = _constant_ints(inputs[1] if len(inputs) > 1 else None, attrs.get("pads"), "pads")
    axes = list(range(rank))
    if len(inputs) > 3 and inputs[3] is not None:
        axes = [a % rank for a in _constant_ints(inputs[3], None, "axes")]
    if len(pads) != 2 * len(axes):
        raise UserError(f"Pad has {len(pads)} pad amounts for {len(axes)} axes", "Check the exporter's output.")
    width = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        width[2 * axis], width[2 * axis + 1] = pads[i], pads[i + len(axes)]
    if any(w < 0 for w in width):
        return None  # negative pads crop: leave them to TVM's converter
    value = 0.0
    if len(inputs) > 2 and inputs[2] is not None:
        if not _tvm.is_constant(inputs[2]):
            if mode != "constant":
                return relax.op.nn.pad(x, width, _PAD_MODES[mode])  # the value applies to constant mode only
            return _pad_with_tensor(bb, x, width, inputs[2])
        value = float(np.asarray(_tvm.constant_numpy(inputs[2])).reshape(-1)[0])
    elif attrs.get("value") is not None:
        value = float(attrs["value"])
    return relax.op.nn.pad(x, width, _PAD_MODES[mode], value)


def _pad_with_tensor(bb: Any, x: Any, width: list[int], value: Any) -> Any:
    """Constant padding with a run-time ``constant_value`` (``relax.nn.pad`` takes a number only):
    pad with 0, then select the value on the border — the union of each axis's border, a small
    boolean constant per padded axis, broadcast."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    rank = len(width) // 2
    padded = bb.emit(op.nn.pad(x, width))
    shape = [int(d) for d in padded.ty.shape]
    border = None
    for axis in range(rank):
        before, after = width[2 * axis], width[2 * axis + 1]
        if before == 0 and after == 0:
            continue
        line = np.zeros(shape[axis], dtype=bool)
        line[:before] = True
        line[shape[axis] - after:] = True
        view = relax.const(line.reshape([shape[axis] if i == axis else 1 for i in range(rank)]), "bool")
        border = view if border is None else bb.emit(op.logical_or(border, view))
    if border is None:
        return padded
    fill = bb.emit(op.reshape(bb.emit(op.astype(value, _tvm.tensor_dtype(x))), []))
    return op.where(border, fill, padded)


def _constant_ints(expr: Any, attr: Any, what: str) -> list[int]:
    if expr is None:
        if attr is None:
            raise UserError(f"Pad has no {what}", "Check the exporter's output.")
        return [int(v) for v in attr]
    if not _tvm.is_constant(expr):
        raise UserError(
            f"Pad {what} are computed at run time",
            "Pin input shapes with --input-shape (or a value with --fixed-input) so they fold to constants.",
        )
    return [int(v) for v in np.asarray(_tvm.constant_numpy(expr)).reshape(-1)]
