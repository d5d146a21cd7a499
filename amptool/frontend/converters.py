"""amptool's own ONNX → Relax converters: one table, consulted before TVM's frontend.

Add a converter here (never by editing TVM) when the stock frontend lacks an op or gets it
wrong on real exports. Each entry says why it exists and is tested against onnxruntime.
A converter is ``fn(bb, inputs, attrs) -> relax.Expr``; ``inputs`` are Relax expressions
(None for omitted optional inputs), ``attrs`` the parsed ONNX attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amptool.frontend.rnn import convert_gru, convert_lstm

Converter = Callable[[Any, list[Any], dict[str, Any]], Any]


def _prelu(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """PRelu with ONNX (numpy) broadcasting of the slope.

    Why: TVM's converter hands the slope to topi.nn.prelu, which asserts a 1-D slope along
    axis 1 and crashes on PyTorch's per-channel exports whose slope is [C, 1, 1].
    """
    from tvm import relax  # noqa: PLC0415

    x, slope = inputs[0], inputs[1]
    dtype = str(x.ty.dtype)
    x_shape = [int(d) for d in x.ty.shape] if x.ty.shape is not None else []
    slope_shape = [int(d) for d in slope.ty.shape] if slope.ty.shape is not None else []
    if (
        len(slope_shape) == 1
        and len(x_shape) > 2
        and slope_shape[0] not in (1, x_shape[-1])
        and slope_shape[0] == x_shape[1]
    ):
        # Pre-opset-7 exports give a per-channel slope as [C]; it applies along axis 1.
        slope = bb.emit(relax.op.reshape(slope, [slope_shape[0]] + [1] * (len(x_shape) - 2)))
    negative = relax.op.less(x, relax.const(0, dtype))
    return relax.op.where(negative, relax.op.multiply(x, slope), x)


CONVERTERS: dict[str, Converter] = {
    "PRelu": _prelu,
    # LSTM / GRU: TVM's Relax frontend has no converter for either (amptool/frontend/rnn.py
    # unrolls them over the pinned sequence length, input projection as one matmul).
    "LSTM": convert_lstm,
    "GRU": convert_gru,
}
