"""Integer ops of already-quantized models: ConvInteger, QLinearConv, QLinearMatMul.

Why: TVM's ONNX frontend has none of them, and a quantized model is still one a user may want
compiled as it is (``--dtype float32``: nothing to narrow, the integer parts kept). Accumulation is
in int32 — exact, as onnxruntime's — never float32, whose 24-bit mantissa loses sums of int8
products beyond ~2^24 (a 3x3x256 int8 conv reaches 3.7e7). Requantization follows the ONNX
reference: ``saturate(round_half_even(acc * (scale_a * scale_b / scale_y)) + zero_point_y)``.
"""

from __future__ import annotations

from typing import Any

from amptool.errors import UserError


def _shifted(bb: Any, x: Any, zero_point: Any | None, axis: int | None = None) -> Any:
    """``x - zero_point`` in int32; a per-channel zero point broadcast along ``axis``."""
    from tvm import relax  # noqa: PLC0415

    x32 = bb.emit(relax.op.astype(x, "int32"))
    if zero_point is None:
        return x32
    zp = bb.emit(relax.op.astype(zero_point, "int32"))
    return bb.emit(relax.op.subtract(x32, along(zp, axis, len(x.ty.shape)) if axis is not None else zp))


def along(value: Any, axis: int, rank: int) -> Any:
    """A scalar or 1-D ``value`` shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    from tvm import relax  # noqa: PLC0415

    if value.ty.shape is None or len(value.ty.shape) == 0 or int(value.ty.shape[0]) == 1:
        return value
    shape = [1] * rank
    shape[axis] = -1
    return relax.op.reshape(value, shape)


def _requantize(bb: Any, acc: Any, multiplier: Any, zero_point: Any | None, out_dtype: str) -> Any:
    from tvm import relax  # noqa: PLC0415

    scaled = bb.emit(relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), multiplier)))
    if zero_point is not None:
        scaled = bb.emit(relax.op.add(scaled, relax.op.astype(zero_point, "float32")))
    low, high = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}[out_dtype]
    return relax.op.astype(relax.op.clip(scaled, low, high), out_dtype)


def _scale(bb: Any, value: Any) -> Any:
    from tvm import relax  # noqa: PLC0415

    return bb.emit(relax.op.astype(value, "float32"))


def _conv(bb: Any, x: Any, w: Any, attrs: dict[str, Any]) -> Any:
    """Integer convolution with the frontend's Conv attribute handling (pads, auto_pad, groups)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # noqa: PLC0415

    conv_attrs = {k: v for k, v in attrs.items() if k != "tvm_custom"}
    return bb.normalize(_get_convert_map()["Conv"]._impl_v11(bb, [x, w, None], conv_attrs, None))


def _out_dtype(zero_point: Any | None, node: str) -> str:
    dtype = "uint8" if zero_point is None else str(zero_point.ty.dtype)
    if dtype not in ("int8", "uint8", "int16", "uint16"):
        raise UserError(f"Node '{node}': quantized output type {dtype} is not supported", "Use int8 or uint8.")
    return dtype


def _node(attrs: dict[str, Any], op: str) -> str:
    return str(attrs.get("tvm_custom", {}).get("name", "") or op)


def convert_conv_integer(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ConvInteger: int32 convolution of the zero-point-shifted input and weight (per output channel)."""
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    return _conv(bb, _shifted(bb, x, x_zp), _shifted(bb, w, w_zp, axis=0), attrs)


def convert_qlinear_conv(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """QLinearConv: int32 convolution + int32 bias, requantized with per-channel weight scales."""
    from tvm import relax  # noqa: PLC0415

    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = (list(inputs) + [None] * 9)[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    out_dtype = _out_dtype(y_zp, _node(attrs, "QLinearConv"))
    acc = bb.emit(_conv(bb, _shifted(bb, x, x_zp), _shifted(bb, w, w_zp, axis=0), attrs))
    rank = len(x.ty.shape)
    if bias is not None:
        bias32 = bb.emit(relax.op.astype(bias, "int32"))
        acc = bb.emit(relax.op.add(acc, relax.op.reshape(bias32, [1, -1] + [1] * (rank - 2))))
    per_channel = bb.emit(along(_scale(bb, w_scale), 1, rank))
    multiplier = bb.emit(relax.op.divide(relax.op.multiply(_scale(bb, x_scale), per_channel), _scale(bb, y_scale)))
    return _requantize(bb, acc, multiplier, y_zp, out_dtype)


def convert_qlinear_matmul(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """QLinearMatMul: int32 matmul, requantized; scales/zero points per row of a and per column of b."""
    from tvm import relax  # noqa: PLC0415

    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (list(inputs) + [None] * 8)[:8]
    out_dtype = _out_dtype(y_zp, _node(attrs, "QLinearMatMul"))
    a_rank, b_rank = len(a.ty.shape), len(b.ty.shape)
    a_axis = a_rank - 2 if a_rank >= 2 else None
    b_axis = b_rank - 1 if b_rank >= 2 else None
    acc = bb.emit(relax.op.matmul(_shifted(bb, a, a_zp, a_axis), _shifted(bb, b, b_zp, b_axis), out_dtype="int32"))
    scale_a = along(_scale(bb, a_scale), a_rank - 2, a_rank) if a_axis is not None else _scale(bb, a_scale)
    scale_b = along(_scale(bb, b_scale), b_rank - 1, b_rank) if b_axis is not None else _scale(bb, b_scale)
    multiplier = bb.emit(relax.op.divide(relax.op.multiply(scale_a, scale_b), _scale(bb, y_scale)))
    return _requantize(bb, acc, multiplier, y_zp, out_dtype)


QUANTIZED_CONVERTERS: dict[str, Any] = {
    "ConvInteger": convert_conv_integer,
    "QLinearConv": convert_qlinear_conv,
    "QLinearMatMul": convert_qlinear_matmul,
}
