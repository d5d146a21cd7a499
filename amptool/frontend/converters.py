"""amptool's own ONNX → Relax converters: one table, consulted before TVM's frontend.

Add a converter here (never by editing TVM) when the stock frontend lacks an op or gets it
wrong on real exports. Each entry says why it exists and is tested against onnxruntime.
A converter is ``fn(bb, inputs, attrs) -> relax.Expr``; ``inputs`` are Relax expressions
(None for omitted optional inputs), ``attrs`` the parsed ONNX attributes. Returning None
declines the node, which then goes to TVM's converter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError
from amptool.frontend.attention import convert_attention, convert_rotary_embedding
from amptool.frontend.clip_pad import convert_clip, convert_pad
from amptool.frontend.detection import DETECTION_CONVERTERS
from amptool.frontend.einsum import convert_einsum
from amptool.frontend.elementwise import (
    convert_bitcast,
    convert_bitshift,
    convert_constant,
    convert_elu,
    convert_isinf,
    convert_selu,
    convert_swiglu,
    convert_swish,
    convert_thresholded_relu,
)
from amptool.frontend.layout_ops import LAYOUT_CONVERTERS
from amptool.frontend.narrow_casts import (
    convert_cast,
    convert_cast_like,
    convert_dequantize_linear,
    convert_quantize_linear,
)
from amptool.frontend.norms import convert_cumprod, convert_cumsum, convert_layer_norm, convert_lp_normalization
from amptool.frontend.quantized import QUANTIZED_CONVERTERS
from amptool.frontend.rms_norm import RMS_NORM_CONVERTERS
from amptool.frontend.rnn import convert_gru, convert_lstm, convert_rnn
from amptool.frontend.signal_ops import SIGNAL_CONVERTERS
from amptool.frontend.small_ops import SMALL_OP_CONVERTERS
from amptool.frontend.tree_ensemble import TREE_CONVERTERS

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


def _reverse_sequence(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ReverseSequence as one ``gather_elements`` along the time axis.

    Why: TVM's Relax frontend has no converter, and tf2onnx emits it for every bidirectional
    Keras RNN. Source index along time, per (t, b): ``len[b]-1-t`` inside the sequence, ``t``
    after it — a [time, batch] table, computed in numpy when the lengths are constants (they
    are once shapes are pinned) and with Relax ops otherwise, broadcast to the input's shape.
    """
    from tvm import relax  # noqa: PLC0415

    x, lens = inputs[0], inputs[1]
    node = str(attrs.get("tvm_custom", {}).get("name", "") or "ReverseSequence")
    try:
        shape = [int(d) for d in x.ty.shape]
    except TypeError as err:
        raise UserError(
            f"ReverseSequence node '{node}' needs a static input shape.",
            "Pin the input shapes with --input-shape.",
        ) from err
    rank = len(shape)
    time_axis, batch_axis = int(attrs.get("time_axis", 0)) % rank, int(attrs.get("batch_axis", 1)) % rank
    steps, batch = shape[time_axis], shape[batch_axis]
    table_shape = [1] * rank
    table_shape[time_axis], table_shape[batch_axis] = steps, batch
    t = np.arange(steps, dtype=np.int64).reshape(steps, 1)
    order = [0, 1] if time_axis < batch_axis else [1, 0]  # [time, batch] in the input's axis order
    lens_value = _tvm.constant_numpy(lens) if _tvm.is_constant(lens) else None
    if lens_value is not None:
        length = lens_value.astype(np.int64).reshape(1, batch)
        table = relax.const(np.where(t < length, length - 1 - t, t).transpose(order).reshape(table_shape))
    else:
        op, times = relax.op, relax.const(t, "int64")
        length = bb.emit(op.reshape(op.astype(lens, "int64"), [1, batch]))
        last = bb.emit(op.subtract(length, relax.const(1, "int64")))
        source = bb.emit(op.where(op.less(times, length), op.subtract(last, times), times))
        table = bb.emit(op.reshape(op.permute_dims(source, order), table_shape))
    index = bb.emit(relax.op.broadcast_to(table, shape))
    return relax.op.gather_elements(x, index, axis=time_axis)


CONVERTERS: dict[str, Converter] = {
    "PRelu": _prelu,
    # Clip / Pad: TVM lowers them to fixed-dtype call_tir, which pins mobile CNNs to fp32.
    "Clip": convert_clip,
    "Pad": convert_pad,
    # LSTM / GRU: TVM's Relax frontend has no converter for either (amptool/frontend/rnn.py
    # unrolls them over the pinned sequence length, input projection as one matmul).
    "LSTM": convert_lstm,
    "GRU": convert_gru,
    "RNN": convert_rnn,
    # ReverseSequence: no converter in TVM's frontend; tf2onnx's bidirectional RNNs use it.
    "ReverseSequence": _reverse_sequence,
    # Cast / CastLike to float8, int4/uint4 or bfloat16, and from float8: TVM computes those
    # wrong on LLVM (narrow_casts.py says how); all other casts decline to TVM's converter.
    "Cast": convert_cast,
    "CastLike": convert_cast_like,
    # (De)QuantizeLinear with float8 data or zero point: TVM's refuses the zero point, misreads the data.
    "DequantizeLinear": convert_dequantize_linear,
    "QuantizeLinear": convert_quantize_linear,
    # Attention / RotaryEmbedding (opset 23+): TVM has no converter for the standard-domain ops.
    "Attention": convert_attention,
    "RotaryEmbedding": convert_rotary_embedding,
    # LayerNormalization with Mean/InvStdDev outputs: TVM gives them the input's shape (norms.py).
    "LayerNormalization": convert_layer_norm,
    # LpNormalization, CumProd: no TVM converter; CumSum: TVM refuses a run-time axis.
    "LpNormalization": convert_lp_normalization,
    "CumSum": convert_cumsum,
    "CumProd": convert_cumprod,
    # Einsum with two operands: a matmul between transposes (einsum.py; TVM's is a generic reduction).
    "Einsum": convert_einsum,
    # IsInf: TVM ignores detect_positive/detect_negative. BitCast: no TVM converter. BitShift: TVM's shifts
    # by the width or more are undefined.
    "IsInf": convert_isinf,
    "BitCast": convert_bitcast,
    "BitShift": convert_bitshift,
    # Constant: TVM's reads `value` only; value_float/value_ints … arrive when onnxruntime's folding did not run.
    "Constant": convert_constant,
    # Elu / Selu / ThresholdedRelu: TVM's builds them with float32 constants; a float16/bfloat16/float64 model failed.
    "Elu": convert_elu,
    "Selu": convert_selu,
    "ThresholdedRelu": convert_thresholded_relu,
    # Swish (opset 24), SwiGLU (opset 28): no TVM converter.
    "Swish": convert_swish,
    "SwiGLU": convert_swiglu,
}
# One module per family; each says why its converters exist. No op appears in two tables.
_TABLES = (SMALL_OP_CONVERTERS, TREE_CONVERTERS, LAYOUT_CONVERTERS, SIGNAL_CONVERTERS, DETECTION_CONVERTERS,
           QUANTIZED_CONVERTERS, RMS_NORM_CONVERTERS)
for _table in _TABLES:
    assert not set(_table) & set(CONVERTERS), f"op registered twice: {set(_table) & set(CONVERTERS)}"
    CONVERTERS.update(_table)
