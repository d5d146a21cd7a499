"""Element-wise ops TVM 0.27's frontend lacks or gets wrong (each tested against onnxruntime)."""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool.errors import UserError


def convert_isinf(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """IsInf honouring ``detect_positive`` / ``detect_negative``; TVM's ignores both (flags every inf)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    positive, negative = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    if positive and negative:
        return None
    dtype = str(x.ty.dtype)
    if not (positive or negative):
        return op.logical_and(op.isinf(x), op.isnan(x))  # never true: nothing is detected
    sign = op.greater(x, relax.const(0, dtype)) if positive else op.less(x, relax.const(0, dtype))
    return op.logical_and(op.isinf(x), sign)


def convert_bitcast(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BitCast (opset 26): reinterpret the bits as ``to``, same element width. No TVM converter."""
    from onnx import helper  # noqa: PLC0415
    from tvm import topi  # noqa: PLC0415

    x = inputs[0]
    try:
        target = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs["to"]))))
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"BitCast to element type {attrs.get('to')!r}: amptool cannot express it") from err
    source = str(x.ty.dtype)
    width = {"bool": 8, "bfloat16": 16}
    bits = width.get(source) or np.dtype(source).itemsize * 8
    if bits != (width.get(target) or np.dtype(target).itemsize * 8):
        raise UserError(f"BitCast from {source} to {target}: the element widths differ")
    if target == source:
        return x
    return bb.emit_te(topi.reinterpret, x, target)
