"""Spatial ops: Resize, pooling with indices, ConvTranspose output_shape, Col2Im, CenterCropPad, …

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS. Where an op's index arithmetic depends only on
static shapes (MaxPool's windows, Col2Im's scatter), it is done once in
numpy and reaches Relax as a constant index table for ``take`` — exact, and plain gathers and
elementwise ops that the mixed-precision pass colours like any other.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from amptool.errors import UserError
from amptool.frontend.resize import _name, _static_shape, _text, constant_values, convert_resize, convert_upsample
from amptool.frontend.small_ops import _shape


def _ints(attrs: dict[str, Any], key: str, default: list[int]) -> list[int]:
    value = attrs.get(key)
    return [int(v) for v in value] if value is not None else default


def _operand_ints(expr: Any, op: str, what: str, attrs: dict[str, Any]) -> list[int]:
    """A shape-deciding operand's value; a one-line refusal when it is computed at run time."""
    try:
        value = constant_values(expr)
    except LookupError:
        value = None
    if value is None:
        raise UserError(f"{op} node '{_name(attrs, op)}': its {what} is computed at run time",
                        "Pin the input's value with --fixed-input (or shapes with --input-shape) so it folds.")
    return [int(v) for v in value.reshape(-1)]


def _space_to_depth(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """SpaceToDepth ``mode="CRD"`` (opset 28): TVM's converter ignores the mode (always DCR)."""
    from tvm import relax  # noqa: PLC0415

    if _text(attrs.get("mode"), "DCR") != "CRD":
        return None
    b, c, h, w = _static_shape(inputs[0], "SpaceToDepth", attrs)
    k = int(attrs["blocksize"])
    x = bb.emit(relax.op.reshape(inputs[0], [b, c, h // k, k, w // k, k]))
    x = bb.emit(relax.op.permute_dims(x, [0, 1, 3, 5, 2, 4]))
    return relax.op.reshape(x, [b, c * k * k, h // k, w // k])


def _conv_transpose(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ConvTranspose with ``output_shape``: pads derived per the spec, which may be negative.

    Why: TVM's converter ignores ``output_shape``. The spec's total padding can be negative (an
    output larger than the natural one: zeros past the last contribution), which no conv padding
    expresses. So the convolution runs with the begin pads only, on an input with enough zero rows
    added to reach ``output_shape``, and the end is cropped to it (ONNX's col2im drops or leaves
    empty exactly those positions). Padding the output instead would put a pad after the
    convolution, whose end amptool's CPU schedule leaves unwritten (seen on Conv → Pad as well).
    """
    from tvm import relax  # noqa: PLC0415

    if attrs.get("output_shape") is None:
        return None
    op = relax.op
    x, w = inputs[0], inputs[1]
    shape = _static_shape(x, "ConvTranspose", attrs)
    nd = len(shape) - 2
    if nd not in (1, 2, 3):
        return None
    kernel = _ints(attrs, "kernel_shape", _static_shape(w, "ConvTranspose", attrs)[2:])
    strides, dilations = _ints(attrs, "strides", [1] * nd), _ints(attrs, "dilations", [1] * nd)
    extra = _ints(attrs, "output_padding", [0] * nd)
    target = _ints(attrs, "output_shape", [])[-nd:]
    auto_pad = _text(attrs.get("auto_pad"), "NOTSET")
    if attrs.get("pads") is not None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        begins = _ints(attrs, "pads", [])[:nd]
    else:
        total = [s * (i - 1) + e + (k - 1) * d + 1 - t
                 for s, i, e, k, d, t in zip(strides, shape[2:], extra, kernel, dilations, target, strict=True)]
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    # Zero input rows at either end move the output's extent by whole strides; the begin pad
    # absorbs the shift, and a slice crops the end to the target.
    before = [-(-max(-b, 0) // s) for b, s in zip(begins, strides, strict=True)]
    begins = [b + m * s for b, m, s in zip(begins, before, strides, strict=True)]
    reach = [s * (i + m - 1) + (k - 1) * d + 1 - b
             for s, i, m, k, d, b in zip(strides, shape[2:], before, kernel, dilations, begins, strict=True)]
    after = [max(-(-(t - r) // s), 0) for t, r, s in zip(target, reach, strides, strict=True)]
    if any(before) or any(after):
        x = bb.emit(op.nn.pad(x, [0, 0, 0, 0] + [v for pair in zip(before, after, strict=True) for v in pair]))
    conv = {1: op.nn.conv1d_transpose, 2: op.nn.conv2d_transpose, 3: op.nn.conv3d_transpose}[nd]
    layout = "NC" + "DHW"[3 - nd:]
    y = bb.emit(conv(x, w, strides=strides, padding=begins + [0] * nd, output_padding=[0] * nd, dilation=dilations,
                     groups=int(attrs.get("group", 1)), data_layout=layout, kernel_layout="IO" + layout[2:]))
    if any(r + a * s != t for r, a, s, t in zip(reach, after, strides, target, strict=True)):
        y = bb.emit(op.strided_slice(y, list(range(2, nd + 2)), [0] * nd, target))
    if len(inputs) > 2 and inputs[2] is not None:
        y = bb.emit(op.add(y, bb.emit(op.reshape(inputs[2], [1, -1] + [1] * nd))))
    return y


Geometry = tuple[list[int], list[int], list[int], list[int], list[int]]


def _pool_geometry(shape: list[int], attrs: dict[str, Any]) -> Geometry:
    """Kernel, strides, dilations, begin pads and output sizes of a pool, as onnx's reference."""
    nd = len(shape)
    kernel = _ints(attrs, "kernel_shape", [])
    strides, dilations = _ints(attrs, "strides", [1] * nd), _ints(attrs, "dilations", [1] * nd)
    pads = _ints(attrs, "pads", [0] * 2 * nd)
    auto_pad = _text(attrs.get("auto_pad"), "NOTSET")
    begins, out = pads[:nd], []
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):  # the spec: the odd pad goes last for UPPER, first for LOWER
            size = math.ceil(shape[i] / strides[i])
            total = max((size - 1) * strides[i] + span - shape[i], 0)
            begins[i] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            size, begins[i] = math.ceil((shape[i] - span + 1) / strides[i]), 0
        else:
            room = (shape[i] + pads[i] + pads[i + nd] - span) / strides[i] + 1
            size = math.ceil(room) if int(attrs.get("ceil_mode", 0)) else math.floor(room)
            if int(attrs.get("ceil_mode", 0)) and (size - 1) * strides[i] >= shape[i] + pads[i]:
                size -= 1
        out.append(size)
    return kernel, strides, dilations, begins, out


def _max_pool_with_indices(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """MaxPool with its Indices output (flattened over N, C and space; ``storage_order`` 1: column-major).

    Why: TVM's converter returns the values only. The windows are a constant [positions, taps]
    index table into the flattened input: one ``take``, then ``max`` and ``argmax`` over the taps.
    A tap in the padding repeats the window's first real element, so no sentinel value is needed
    (fast-math folds comparisons with -inf) and ties still go to the first element, as in ONNX.
    """
    from tvm import relax  # noqa: PLC0415

    if int(attrs.get("tvm_custom", {}).get("num_outputs", 1)) < 2:
        return None
    op = relax.op
    x = inputs[0]
    shape = _static_shape(x, "MaxPool", attrs)
    batch, channels, space = shape[0], shape[1], shape[2:]
    kernel, strides, dilations, begins, out = _pool_geometry(space, attrs)
    nd = len(space)
    # per dim: source coordinate of (output position, kernel tap), broadcast over all dims
    coords, valid = [], np.ones([*out, *kernel], dtype=bool)
    for i in range(nd):
        pos = (np.arange(out[i])[:, None] * strides[i] - begins[i] + np.arange(kernel[i])[None, :] * dilations[i])
        view = [1] * (2 * nd)
        view[i], view[nd + i] = out[i], kernel[i]
        pos = pos.reshape(view)
        coords.append(pos)
        valid = valid & (pos >= 0) & (pos < space[i])
    clipped = [np.clip(c, 0, s - 1) for c, s in zip(coords, space, strict=True)]
    row = sum(c * int(np.prod(space[i + 1:])) for i, c in enumerate(clipped))  # row-major flat index
    col = sum(c * int(np.prod(space[:i])) for i, c in enumerate(clipped))  # storage_order 1: column-major
    positions, taps = int(np.prod(out)), int(np.prod(kernel))
    row, col = (np.broadcast_to(a, valid.shape).reshape(positions, taps) for a in (row, col))
    valid = valid.reshape(positions, taps)
    first = np.argmax(valid, axis=1)[:, None]
    gather = np.where(valid, row, np.take_along_axis(row, first, axis=1))
    stored = col if int(attrs.get("storage_order", 0)) else row
    stored = np.where(valid, stored, np.take_along_axis(stored, first, axis=1))
    size = int(np.prod(space))
    flat = bb.emit(op.reshape(x, [batch, channels, size]))
    windows = bb.emit(op.take(flat, relax.const(gather, "int64"), axis=2))  # [N, C, P, K]
    values = bb.emit(op.reshape(bb.emit(op.max(windows, axis=[3])), shape[:2] + out))
    tap = bb.emit(op.argmax(windows, axis=3))  # [N, C, P]
    at = bb.emit(op.add(op.astype(tap, "int64"), relax.const(np.arange(positions) * taps, "int64")))
    local = bb.emit(op.take(relax.const(stored.reshape(-1), "int64"), at, axis=0))
    base = (np.arange(batch * channels, dtype=np.int64) * size).reshape(batch, channels, 1)
    indices = bb.emit(op.reshape(bb.emit(op.add(local, relax.const(base, "int64"))), shape[:2] + out))
    return relax.Tuple([values, indices])


def _batch_norm(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BatchNormalization: batch statistics in training mode, running ones otherwise (each says why)."""
    if int(attrs.get("training_mode", 0)):
        return _batch_norm_training(bb, inputs, attrs)
    return _batch_norm_inference(bb, inputs, attrs)


def _batch_norm_training(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BatchNormalization ``training_mode=1``: normalise with the batch's statistics and return the
    updated running mean/var (``running·momentum + batch·(1 − momentum)``, population variance).

    Why: TVM's converter returns wrong running statistics. float16/bfloat16 data is computed in float32."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x, scale, bias, mean, var = inputs[:5]
    rank = len(_static_shape(x, "BatchNormalization", attrs))
    dtype, stat_dtype = str(x.ty.dtype), str(mean.ty.dtype)
    compute = "float32" if dtype in ("float16", "bfloat16") else dtype
    xs, scale, bias, mean, var = (e if str(e.ty.dtype) == compute else bb.emit(op.astype(e, compute))
                                  for e in (x, scale, bias, mean, var))
    axes = [0, *range(2, rank)]
    batch_mean = bb.emit(op.mean(xs, axes))
    batch_var = bb.emit(op.variance(xs, axes))
    per_channel = [-1] + [1] * (rank - 2)
    inv = op.rsqrt(op.add(batch_var, relax.const(float(attrs.get("epsilon", 1e-5)), compute)))
    factor = bb.emit(op.reshape(bb.emit(op.multiply(scale, inv)), per_channel))
    y = bb.emit(op.add(op.multiply(op.subtract(xs, op.reshape(batch_mean, per_channel)), factor),
                       op.reshape(bias, per_channel)))
    momentum = float(attrs.get("momentum", 0.9))
    keep, take = relax.const(momentum, compute), relax.const(1.0 - momentum, compute)
    running = [bb.emit(op.add(op.multiply(old, keep), op.multiply(new, take)))
               for old, new in ((mean, batch_mean), (var, batch_var))]
    y = y if dtype == compute else bb.emit(op.astype(y, dtype))
    running = [r if stat_dtype == compute else bb.emit(op.astype(r, stat_dtype)) for r in running]
    count = int(attrs.get("tvm_custom", {}).get("num_outputs", 1))
    return relax.Tuple([y, *running][:count]) if count > 1 else y


def _batch_norm_inference(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BatchNormalization with running statistics as one multiply-add per element,
    ``x·factor + shift`` (``factor = scale/√(var+ε)``, ``shift = bias − mean·factor``, per channel;
    constants fold), as onnxruntime computes a BatchNorm it fuses into a Conv.

    Why: TVM's ``batch_norm`` legalizes into a subtract, a divide by a square root, a multiply and
    an add over the whole tensor, one kernel that no rule schedules as elementwise (it also writes
    the running statistics): a BatchNorm left standalone (DenseNet's and pre-activation ResNets'
    BN before each conv, a BN after a concat) took 12× onnxruntime's time. As two broadcast
    elementwise ops it fuses into the kernels around it. None (TVM's converter) when the node
    also returns statistics."""
    from tvm import relax  # noqa: PLC0415

    if int(attrs.get("tvm_custom", {}).get("num_outputs", 1)) > 1 or not int(attrs.get("spatial", 1)):
        return None  # (opset < 9 ``spatial=0``: statistics per element, not per channel)
    op = relax.op
    x, scale, bias, mean, var = inputs[:5]
    shape = _shape(x)  # (dynamic shapes: TVM's converter, which takes them)
    if shape is None or len(shape) < 2 or any(_shape(e) != [shape[1]] for e in (scale, bias, mean, var)):
        return None
    rank = len(shape)
    dtype = str(x.ty.dtype)
    compute = "float32" if dtype in ("float16", "bfloat16") else dtype  # ε (1e-5) is subnormal in float16
    scale, bias, mean, var = (e if str(e.ty.dtype) == compute else bb.emit(op.astype(e, compute))
                              for e in (scale, bias, mean, var))
    epsilon = relax.const(float(attrs.get("epsilon", 1e-5)), compute)
    factor = bb.emit(op.multiply(scale, op.rsqrt(op.add(var, epsilon))))
    shift = bb.emit(op.subtract(bias, op.multiply(mean, factor)))
    per_channel = [-1] + [1] * (rank - 2)
    factor, shift = (bb.emit(op.reshape(e if compute == dtype else op.astype(e, dtype), per_channel))
                     for e in (factor, shift))
    return op.add(op.multiply(x, factor), shift)


def _center_crop_pad(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """CenterCropPad (no TVM converter): a slice where the target is smaller, a zero pad where it is
    larger, the odd element at the end either way (as onnx's reference)."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    shape = _static_shape(x, "CenterCropPad", attrs)
    rank = len(shape)
    target = _operand_ints(inputs[1], "CenterCropPad", "shape", attrs)
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    begin, end, width = [0] * rank, list(shape), [0] * (2 * rank)
    for axis, size in zip(axes, target, strict=True):
        if size < shape[axis]:
            begin[axis] = (shape[axis] - size) // 2
            end[axis] = begin[axis] + size
        elif size > shape[axis]:
            width[2 * axis] = (size - shape[axis]) // 2
            width[2 * axis + 1] = size - shape[axis] - width[2 * axis]
    if begin != [0] * rank or end != shape:
        x = bb.emit(relax.op.strided_slice(x, list(range(rank)), begin, end))
    return relax.op.nn.pad(x, width) if any(width) else x


def _col2im(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Col2Im (no TVM converter): each image pixel sums the columns that cover it — at most one per
    kernel offset — so a constant [pixels, kernel] table of column indices gathers them (a
    pointer to an appended zero where an offset misses the pixel), summed over the kernel."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    batch, rows, length = _static_shape(x, "Col2Im", attrs)
    image = _operand_ints(inputs[1], "Col2Im", "image_shape", attrs)
    block = _operand_ints(inputs[2], "Col2Im", "block_shape", attrs)
    nd = len(image)
    strides, dilations = _ints(attrs, "strides", [1] * nd), _ints(attrs, "dilations", [1] * nd)
    pads = _ints(attrs, "pads", [0] * 2 * nd)
    blocks = [(image[i] + pads[i] + pads[i + nd] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(nd)]
    taps, pixels = int(np.prod(block)), int(np.prod(image))
    if length != int(np.prod(blocks)) or rows % taps:
        raise UserError(f"Col2Im node '{_name(attrs, 'Col2Im')}': input shape {[batch, rows, length]} does not match "
                        f"image_shape {image} and block_shape {block}", "Check the exporter's output.")
    table = np.full((pixels, taps), taps * length, dtype=np.int64)  # the appended zero
    for p, pixel in enumerate(itertools.product(*(range(n) for n in image))):
        for k, offset in enumerate(itertools.product(*(range(n) for n in block))):
            col = 0
            for i in range(nd):
                shifted = pixel[i] + pads[i] - offset[i] * dilations[i]
                if shifted % strides[i] or not 0 <= shifted // strides[i] < blocks[i]:
                    break
                col = col * blocks[i] + shifted // strides[i]
            else:
                table[p, k] = k * length + col
    channels = rows // taps
    flat = bb.emit(op.nn.pad(bb.emit(op.reshape(x, [batch, channels, taps * length])), [0, 0, 0, 0, 0, 1]))
    summed = bb.emit(op.sum(bb.emit(op.take(flat, relax.const(table, "int64"), axis=2)), axis=[3]))
    return op.reshape(summed, [batch, channels, *image])


LAYOUT_CONVERTERS: dict[str, Any] = {
    # Resize / Upsample: per-axis constant taps (resize.py says why TVM's converters are not enough).
    "Resize": convert_resize,
    "Upsample": convert_upsample,
    # SpaceToDepth CRD, ConvTranspose output_shape, MaxPool Indices, BatchNormalization training:
    # TVM's converters ignore these (each declines the instances TVM gets right). BatchNormalization
    # with running statistics: a multiply-add, where TVM's kernel was 12x onnxruntime's time.
    "SpaceToDepth": _space_to_depth,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool_with_indices,
    "BatchNormalization": _batch_norm,
    # CenterCropPad, Col2Im: no TVM converter (onnxruntime's folding expands CenterCropPad into
    # Shape arithmetic, but only when it runs; the node itself is a slice and a pad).
    "CenterCropPad": _center_crop_pad,
    "Col2Im": _col2im,
}
