"""Normalisation and scan-like ops TVM 0.27's frontend lacks or gets wrong (each tested against onnxruntime)."""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool.errors import UserError


def _static(x: Any, what: str) -> list[int]:
    try:
        return [int(d) for d in x.ty.shape]
    except TypeError as err:
        raise UserError(f"{what} needs a static input shape", "Pin the input shapes with --input-shape.") from err


def _rank(x: Any, what: str) -> int:
    """``x``'s rank, its dims static or symbolic (a scan over a box count that NMS decides)."""
    rank = int(getattr(x.ty, "ndim", -1))
    if rank < 0:
        raise UserError(f"{what} needs an input of known rank", "Pin the input shapes with --input-shape.")
    return rank


def convert_layer_norm(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """LayerNormalization with its optional Mean / InvStdDev outputs.

    Why: TVM's converter returns those two with the input's shape instead of the input's shape
    with every normalised axis set to 1. With one output, TVM's ``layer_norm`` is kept (declines)."""
    from tvm import relax  # noqa: PLC0415

    if int(attrs.get("tvm_custom", {}).get("num_outputs", 1)) < 2:
        return None
    op = relax.op
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = len(_static(x, "LayerNormalization"))
    axis = int(attrs.get("axis", -1)) % rank
    axes = list(range(axis, rank))
    dtype = str(x.ty.dtype)
    xs = bb.emit(op.astype(x, "float32")) if dtype != "float32" else x  # stash_type: float32
    mean = bb.emit(op.mean(xs, axes, keepdims=True))
    centred = bb.emit(op.subtract(xs, mean))
    var = bb.emit(op.mean(op.multiply(centred, centred), axes, keepdims=True))
    inv = bb.emit(op.rsqrt(op.add(var, relax.const(float(attrs.get("epsilon", 1e-5)), "float32"))))
    y = bb.emit(op.multiply(centred, inv))
    if dtype != "float32":
        y = bb.emit(op.astype(y, dtype))
    y = bb.emit(op.multiply(y, scale))
    if bias is not None:
        y = bb.emit(op.add(y, bias))
    count = int(attrs["tvm_custom"]["num_outputs"])
    return relax.Tuple([y, mean, inv][:count])


def convert_lp_normalization(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """LpNormalization (p 1 or 2 along ``axis``): x / ‖x‖ₚ, 0 where the norm is 0. No TVM converter."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise UserError(f"LpNormalization with p={p}: only p 1 and 2 are defined by ONNX")
    axis = int(attrs.get("axis", -1))
    norm = op.sum(op.abs(x), [axis], keepdims=True) if p == 1 else op.sqrt(
        op.sum(op.multiply(x, x), [axis], keepdims=True))
    norm = bb.emit(norm)
    dtype = str(x.ty.dtype)
    zero = op.equal(norm, relax.const(0, dtype))
    safe = bb.emit(op.where(zero, relax.const(1, dtype), norm))
    return op.where(zero, relax.const(0, dtype), op.divide(x, safe))


def _cumulative(kind: str) -> Any:
    """CumSum / CumProd with ONNX's ``exclusive`` and ``reverse``, the axis a constant or a run-time scalar.

    Why: TVM has no CumProd converter, and its CumSum refuses a run-time axis. The output shape
    does not depend on the axis, so a run-time one is expressible: the scan along every axis,
    then a select on the axis value (rank× the work; ranks are small)."""

    def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        from tvm import relax  # noqa: PLC0415

        from amptool import _tvm  # noqa: PLC0415 - constant reading lives there

        op = relax.op
        x, axis_value = inputs[0], inputs[1]
        rank = _rank(x, kind)
        reverse, exclusive = bool(attrs.get("reverse", 0)), bool(attrs.get("exclusive", 0))

        def along(axis: int) -> Any:
            data = bb.emit(op.flip(x, axis)) if reverse else x
            scan = op.cumsum if kind == "CumSum" else op.cumprod
            out = bb.emit(scan(data, axis=axis, exclusive=exclusive))
            return bb.emit(op.flip(out, axis)) if reverse else out

        if _tvm.is_constant(axis_value):
            return along(int(np.asarray(_tvm.constant_numpy(axis_value)).reshape(-1)[0]) % rank)
        axis = bb.emit(op.reshape(op.astype(axis_value, "int64"), []))
        axis = bb.emit(op.where(op.less(axis, relax.const(0, "int64")), op.add(axis, relax.const(rank, "int64")),
                                axis))
        result = along(rank - 1)
        for k in range(rank - 2, -1, -1):
            result = bb.emit(op.where(op.equal(axis, relax.const(k, "int64")), along(k), result))
        return result

    return convert


convert_cumsum = _cumulative("CumSum")
convert_cumprod = _cumulative("CumProd")
