"""Small ops TVM's ONNX frontend lacks or gets wrong (elementwise, reductions, linear algebra, ai.onnx.ml).

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS. Where TVM's own converter is right for an
instance, the converter here declines it (returns None), so only the broken cases change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError

#: dtypes computed in float32 and cast back (their own arithmetic loses too much for exp/LU)
_NARROW_FLOATS = ("float16", "bfloat16")


def _node(attrs: dict[str, Any], op_type: str) -> str:
    return str(attrs.get("tvm_custom", {}).get("name", "") or op_type)


def _shape(x: Any) -> list[int] | None:
    """The static shape of a tensor expression, or None (unknown rank or a symbolic dimension)."""
    try:
        return [int(d) for d in x.ty.shape]
    except (AttributeError, TypeError):
        return None


def _static(x: Any, attrs: dict[str, Any], op_type: str) -> list[int]:
    shape = _shape(x)
    if shape is None:
        raise UserError(f"{op_type} node '{_node(attrs, op_type)}' needs a static input shape",
                        "Pin the input shapes with --input-shape.")
    return shape


def _constant(expr: Any) -> np.ndarray | None:
    return np.asarray(_tvm.constant_numpy(expr)) if expr is not None and _tvm.is_constant(expr) else None


def _onnx_dtype(code: int) -> str:
    from onnx import helper  # noqa: PLC0415

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(int(code))))


def _is_float(dtype: str | None) -> bool:
    return dtype in _tvm.FLOAT_DTYPES


def _array(value: np.ndarray, dtype: str | None = None) -> Any:
    """A Relax constant of ``value`` in its own dtype (or ``dtype``): relax.const alone narrows
    int64 to int32 and float64 to float32."""
    from tvm import relax  # noqa: PLC0415

    return relax.const(value, dtype or str(value.dtype))


def convert_celu(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Celu: max(0, x) + min(0, α·(exp(x/α) − 1)). No TVM converter; float16 is computed in float32."""
    from tvm import relax  # noqa: PLC0415

    op, x = relax.op, inputs[0]
    dtype = _tvm.tensor_dtype(x) or "float32"
    xs = bb.emit(op.astype(x, "float32")) if dtype in _NARROW_FLOATS else x
    work = "float32" if dtype in _NARROW_FLOATS else dtype
    alpha = relax.const(float(attrs.get("alpha", 1.0)), work)
    zero = relax.const(0.0, work)
    negative = op.multiply(alpha, op.subtract(op.exp(op.divide(op.minimum(xs, zero), alpha)), relax.const(1.0, work)))
    y = bb.emit(op.add(op.maximum(xs, zero), negative))
    return op.astype(y, dtype) if work != dtype else y


def convert_eye_like(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """EyeLike whose ``dtype`` differs from the input's: TVM refuses it, yet only the shape is read."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    if "dtype" not in attrs:
        return None
    return relax.op.eye_like(x, int(attrs.get("k", 0)), _onnx_dtype(attrs["dtype"]))


def convert_pow(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Pow with mixed or integer types: the result has the base's type (TVM wants one float type).

    A float base takes the exponent cast to its type. An integer base is raised in float64 (exact
    below 2⁵³) and cast back: rounded for integer exponents ≥ 0 (the result is an integer, which
    pow may miss by an ulp), truncated otherwise (onnxruntime's static_cast of std::pow)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    base, exponent = inputs[0], inputs[1]
    bt, et = _tvm.tensor_dtype(base), _tvm.tensor_dtype(exponent)
    if bt is None or et is None or (bt == et and _is_float(bt)):
        return None
    if _is_float(bt):
        return op.power(base, bb.emit(op.astype(exponent, bt)))
    result = bb.emit(op.power(op.astype(base, "float64"), op.astype(exponent, "float64")))
    if _is_float(et):
        result = bb.emit(op.trunc(result))
    else:
        nonnegative = op.greater_equal(exponent, relax.const(0, et))
        result = bb.emit(op.where(nonnegative, op.round(result), op.trunc(result)))
    return op.astype(result, bt)


def convert_mod(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Float Mod with ``fmod=0``: numpy's ``mod`` (the sign of the divisor), built on ``fmod``.

    Why: TVM's floor_mod computes x − floor(x/y)·y, which is NaN for an infinite divisor where
    numpy gives x (same signs) or y (opposite signs). As numpy does: r = fmod(x, y); r + y where r
    is non-zero and its sign differs from y's; a zero result takes y's sign. Other instances decline."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x, y = inputs[0], inputs[1]
    dtype = _tvm.tensor_dtype(x)
    if int(attrs.get("fmod", 0)) != 0 or not _is_float(dtype) or _tvm.tensor_dtype(y) != dtype:
        return None
    zero = relax.const(0.0, dtype)
    r = bb.emit(op.mod(x, y))
    flip = op.logical_and(op.not_equal(r, zero), op.logical_xor(op.less(r, zero), op.less(y, zero)))
    r = bb.emit(op.where(flip, op.add(r, y), r))
    signed_zero = op.where(op.less(y, zero), relax.const(-0.0, dtype), zero)
    return op.where(op.equal(r, zero), signed_zero, r)


def _reduce_extreme(kind: str) -> Any:
    """ReduceMax / ReduceMin over floats (∓inf rows), bools or an empty set; integers decline to TVM.

    Why: TVM's max/min have no identity for bool (FoldConstant refuses), so bool reduces as uint8.
    Over an empty set ONNX gives the identity — ∓inf for floats, the type's min/max for integers,
    False/True for bool — where TVM returned its finite init value."""

    def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        from tvm import relax  # noqa: PLC0415

        x = inputs[0]
        dtype, shape = _tvm.tensor_dtype(x), _shape(x)
        if dtype is None or shape is None:
            return None
        axes_value = attrs.get("axes")
        if len(inputs) > 1 and inputs[1] is not None:
            value = _constant(inputs[1])
            if value is None:
                return None  # TVM's converter names the problem
            axes_value = value.reshape(-1).tolist()
        if not axes_value and int(attrs.get("noop_with_empty_axes", 0)):
            return None  # the input unchanged
        axes = sorted({int(a) % len(shape) for a in axes_value}) if axes_value else list(range(len(shape)))
        keepdims = bool(int(attrs.get("keepdims", 1)))
        out_shape = [1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes]
        empty_set = any(shape[a] == 0 for a in axes)
        if empty_set and 0 not in out_shape:
            return _array(np.full(out_shape, _identity(kind, dtype)), dtype)
        reduce = relax.op.max if kind == "ReduceMax" else relax.op.min
        if _is_float(dtype):
            return _with_infinite_identity(bb, x, axes, keepdims, kind)
        if dtype != "bool":
            return None
        return relax.op.astype(bb.emit(reduce(relax.op.astype(x, "uint8"), axes, keepdims)), "bool")

    return convert


def _arg_extreme(kind: str) -> Any:
    """ArgMax / ArgMin over floats with onnxruntime's answers where TVM's differ: rows of ∓inf and NaNs.

    Why: TVM's reducer starts from the type's lowest (highest) finite value with index -1 and keeps
    it on a tie, so a row of only -inf (a fully masked row) gave ArgMax -1, which a Gather after it
    reads as the last element. onnxruntime scans from the first element with a strict comparison
    (``>=`` with ``select_last_index``): a NaN first element wins, later NaNs are skipped. Here NaNs
    become ∓inf before TVM's reduction, an index -1 (nothing beat the start: the row is all ∓inf)
    becomes the row's first (or, reversed, last) index, and a NaN first element gives 0. Integer
    inputs decline to TVM's converter."""

    def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        from tvm import relax  # noqa: PLC0415

        x = inputs[0]
        dtype, rank = _tvm.tensor_dtype(x), int(getattr(x.ty, "ndim", -1))
        if not _is_float(dtype) or rank < 1:
            return None
        op = relax.op
        axis = int(attrs.get("axis", 0)) % rank
        keepdims, last = bool(int(attrs.get("keepdims", 1))), bool(int(attrs.get("select_last_index", 0)))
        worst = -np.inf if kind == "ArgMax" else np.inf
        clean = bb.emit(op.where(op.isnan(x), relax.const(worst, dtype), x))
        scan = bb.emit(op.flip(clean, axis)) if last else clean
        reduce = op.argmax if kind == "ArgMax" else op.argmin
        index = bb.emit(reduce(scan, axis, keepdims=True))
        zero = relax.const(0, "int64")
        index = bb.emit(op.where(op.less(index, zero), zero, index))
        if last:  # back from the reversed axis: N - 1 - i
            length = op.reshape(_tvm.dims(x, axis, axis + 1), [])
            index = bb.emit(op.subtract(op.subtract(length, relax.const(1, "int64")), index))
        first = op.strided_slice(x, axes=[axis], begin=[0], end=[1])
        index = bb.emit(op.where(op.isnan(first), zero, index))
        return index if keepdims else op.squeeze(index, [axis])

    return convert


def convert_slice(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """A Slice (opset 10+) that selects nothing along some axis (starts 5, ends 2; ends INT64_MIN with
    a positive step): an empty tensor of its shape. TVM's strided_slice refused such bounds at compile
    time (exit 70); every other Slice is TVM's."""
    from tvm import te, tirx  # noqa: PLC0415

    shape = _shape(inputs[0])
    operands = [inputs[i] if len(inputs) > i else None for i in range(1, 5)]
    values = [_constant(o) for o in operands]
    first, last = values[:2]
    if shape is None or first is None or last is None or any(
            v is None and o is not None for v, o in zip(values, operands, strict=True)):
        return None  # a run-time operand or no static shape: TVM's converter
    starts, ends = first.reshape(-1).astype(np.int64), last.reshape(-1).astype(np.int64)
    axes = values[2].reshape(-1) if values[2] is not None else np.arange(len(starts))
    steps = values[3].reshape(-1) if values[3] is not None else np.ones_like(starts)
    out = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        if step == 0 or not -len(shape) <= axis < len(shape):
            return None  # invalid: TVM's converter says so
        out[int(axis)] = _slice_length(int(start), int(end), int(step), shape[int(axis)])
    if all(out):
        return None
    dtype = _tvm.tensor_dtype(inputs[0])
    # A kernel over nothing that takes x (never read): a folded empty constant would be written into
    # the library, whose loader rejects a zero-size tensor ("Invalid DLTensor file format").
    return bb.emit_te(lambda t: te.compute(out, lambda *_: tirx.const(0, dtype), name="empty"), inputs[0],
                      primfunc_name_hint="empty_slice")


def _slice_length(start: int, end: int, step: int, dim: int) -> int:
    """How many elements ``x[start:end:step]`` takes from an axis of ``dim`` (ONNX's clamping)."""
    start, end = (start + dim if start < 0 else start), (end + dim if end < 0 else end)
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return max(0, -(-(end - start) // step))
    start, end = min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -(-(start - end) // -step))


def convert_compress(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Compress without an axis whose condition has several dims: both flattened, then the selection.

    Why: paddle2onnx exports ``paddle.masked_select`` so (a mask of the input's shape); onnxruntime and
    onnx's checker take it, TVM's converter refused any condition that is not 1-D. A 1-D condition,
    or an axis, declines to TVM's converter."""
    from tvm import relax, tirx  # noqa: PLC0415

    x, condition = inputs[0], inputs[1]
    if attrs.get("axis") is not None or int(getattr(condition.ty, "ndim", 1)) == 1:
        return None
    op = relax.op
    flat = bb.emit(op.reshape(bb.emit(op.astype(condition, "bool")), [-1]))
    picked = tirx.Var("compress_kept", "int64")
    indices = bb.match_cast(bb.emit(op.nonzero(flat)), relax.TensorType([1, picked], "int64"))
    return op.take(bb.emit(op.reshape(x, [-1])), bb.emit(op.reshape(indices, [-1])), axis=0)


def _with_infinite_identity(bb: Any, x: Any, axes: list[int], keepdims: bool, kind: str) -> Any:
    """max/min whose result is ∓inf when every element is ∓inf.

    Why: TVM starts max/min at the type's finite lowest/highest value, so a row of -inf (a fully
    masked attention row) reduced to -3.4e38 and ``Equal(ReduceMax(bias), -inf)`` — the expanded
    Attention's fully-masked-row test — never held: its NaN guard failed. The repair is exact
    (the extreme is ∓inf iff every element is) and keeps relax max/min, which follow the colours."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    high = kind == "ReduceMin"
    dtype = str(x.ty.dtype)
    reduce = op.min if high else op.max
    infinite = op.logical_and(op.isinf(x), op.greater(x, relax.const(0, dtype)) if high
                              else op.less(x, relax.const(0, dtype)))
    every = bb.emit(op.min(op.astype(infinite, "uint8"), axes, keepdims))
    extreme = bb.emit(reduce(x, axes, keepdims))
    return op.where(op.astype(every, "bool"), relax.const(np.inf if high else -np.inf, dtype), extreme)


def _identity(kind: str, dtype: str) -> Any:
    """The value of ``kind`` over an empty set (ONNX: ∓inf if the type has it, else its min/max)."""
    high = kind == "ReduceMin"
    if dtype == "bool":
        return high
    if _is_float(dtype):
        return np.inf if high else -np.inf
    info = np.iinfo(np.dtype(dtype))
    return info.max if high else info.min


def convert_split(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Split with zero-size pieces, as one strided_slice per output.

    Why: relax.split takes cut indices that must strictly increase; a piece of size 0 repeats
    one, and FoldConstant refuses the model. Splits without a zero-size piece decline to TVM.
    A piece that spans the whole axis is the input itself."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    sizes = attrs.get("split")
    if len(inputs) > 1 and inputs[1] is not None:
        value = _constant(inputs[1])
        sizes = value.reshape(-1).tolist() if value is not None else None
    if not sizes or all(int(s) > 0 for s in sizes):
        return None
    shape = _static(x, attrs, "Split")
    axis = int(attrs.get("axis", 0)) % len(shape)
    if sum(int(s) for s in sizes) != shape[axis]:
        raise UserError(f"Split node '{_node(attrs, 'Split')}': sizes {sizes} do not add up to {shape[axis]}",
                        "Check the exporter's output.")
    pieces, start = [], 0
    for size in (int(s) for s in sizes):
        # A piece spanning the axis is x itself (every piece of an empty x): no kernel of extent 0
        whole = size == shape[axis]
        pieces.append(x if whole else bb.emit(relax.op.strided_slice(x, [axis], [start], [start + size])))
        start += size
    return relax.Tuple(pieces)


def convert_trilu(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Trilu with a run-time ``k`` or a zero-size input; a constant ``k`` declines to TVM's triu/tril.

    Why: TVM's run-time-k path builds its mask from un-normalised calls, which fails on a
    zero-size input. An empty input is its own result; otherwise the mask col − row ≥ k (upper)
    or ≤ k (lower) is built here."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    k = inputs[1] if len(inputs) > 1 else None
    shape = _static(x, attrs, "Trilu")
    if 0 in shape:
        return x
    if k is None or _tvm.is_constant(k):
        return None
    m, n = shape[-2], shape[-1]
    diff = _array(np.arange(n, dtype=np.int64)[None, :] - np.arange(m, dtype=np.int64)[:, None])
    k64 = bb.emit(op.reshape(bb.emit(op.astype(k, "int64")), []))
    upper = bool(int(attrs.get("upper", 1)))
    mask = op.greater_equal(diff, k64) if upper else op.less_equal(diff, k64)
    return op.where(bb.emit(mask), x, relax.const(0, _tvm.tensor_dtype(x) or "float32"))


def convert_one_hot(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """OneHot with run-time ``values`` (and indices of any numeric type) as a compare and a select.

    Why: TVM's converter wants ``values`` as a constant. ``depth`` decides the output shape, so
    it must be a constant (amptool pins it). Negative indices count from ``depth``; indices out
    of [-depth, depth) select nothing (every entry off), as the spec says."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    indices, depth_expr, values = inputs[0], inputs[1], inputs[2]
    depth_value = _constant(depth_expr)
    if depth_value is None:
        raise UserError(f"OneHot node '{_node(attrs, 'OneHot')}': depth (the output's size) is computed at run time",
                        "Fix the depth input's value with --fixed-input NAME=VALUE.")
    depth = int(depth_value.reshape(-1)[0])
    rank = len(_static(indices, attrs, "OneHot"))
    axis = int(attrs.get("axis", -1)) % (rank + 1)
    index = bb.emit(op.astype(indices, "int64"))
    index = bb.emit(op.where(op.less(index, relax.const(0, "int64")), op.add(index, relax.const(depth, "int64")),
                             index))
    classes = np.arange(depth, dtype=np.int64).reshape([depth if i == axis else 1 for i in range(rank + 1)])
    hit = bb.emit(op.equal(op.expand_dims(index, axis), _array(classes)))
    off = bb.emit(op.take(values, relax.const(0, "int64"), axis=0))
    on = bb.emit(op.take(values, relax.const(1, "int64"), axis=0))
    return op.where(hit, on, off)


def convert_det(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Det of [..., n, n] by LU with partial pivoting, unrolled over the static n. No TVM converter.

    Each step swaps the row with the largest |pivot| into place (a gather per batch element),
    eliminates below it and multiplies the pivot into the determinant; a swap flips the sign.
    A zero pivot (the column is zero from there down) leaves the determinant 0. float16 inputs
    are computed in float32."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    shape = _static(x, attrs, "Det")
    dtype = _tvm.tensor_dtype(x) or "float32"
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise UserError(f"Det node '{_node(attrs, 'Det')}': input shape {shape} is not [..., n, n]",
                        "Check the exporter's output.")
    work = "float32" if dtype in _NARROW_FLOATS else dtype
    rank, n, batch = len(shape), shape[-1], shape[:-2]
    a = bb.emit(op.astype(x, work)) if work != dtype else x
    rows = _array(np.arange(n, dtype=np.int64).reshape(n, 1))
    one, zero = relax.const(1.0, work), relax.const(0.0, work)
    det = _array(np.ones([*batch, 1, 1]), work)
    for k in range(n):
        column = op.strided_slice(a, [rank - 2, rank - 1], [k, k], [n, k + 1])
        pivot_at = bb.emit(op.add(op.argmax(op.abs(column), axis=rank - 2, keepdims=True),
                                  relax.const(k, "int64")))  # [..., 1, 1]
        pivot_row = bb.emit(op.gather_elements(a, op.broadcast_to(pivot_at, [*batch, 1, n]), axis=rank - 2))
        row_k = bb.emit(op.strided_slice(a, [rank - 2], [k], [k + 1]))
        k_const = relax.const(k, "int64")
        a = bb.emit(op.where(op.equal(rows, k_const), pivot_row, op.where(op.equal(rows, pivot_at), row_k, a)))
        det = bb.emit(op.where(op.equal(pivot_at, k_const), det, op.negative(det)))
        pivot = bb.emit(op.strided_slice(pivot_row, [rank - 1], [k], [k + 1]))  # [..., 1, 1]
        det = bb.emit(op.multiply(det, pivot))
        if k == n - 1:
            break
        safe = op.where(op.equal(pivot, zero), one, pivot)
        factors = op.divide(op.strided_slice(a, [rank - 1], [k], [k + 1]), safe)  # [..., n, 1]
        factors = bb.emit(op.where(op.greater(rows, k_const), factors, zero))
        a = bb.emit(op.subtract(a, op.multiply(factors, pivot_row)))
    det = bb.emit(op.reshape(det, batch))
    return op.astype(det, dtype) if work != dtype else det


def convert_binarizer(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ai.onnx.ml Binarizer: 1 where x > threshold, else 0, in x's type. No TVM converter."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    dtype = _tvm.tensor_dtype(x) or "float32"
    above = relax.op.greater(x, relax.const(float(attrs.get("threshold", 0.0)), dtype))
    return relax.op.where(above, relax.const(1, dtype), relax.const(0, dtype))


def convert_array_feature_extractor(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ai.onnx.ml ArrayFeatureExtractor: the indexed columns of the last axis. No TVM converter.

    As onnxruntime: the indices are flattened; a 1-D input gives [1, count]."""
    from tvm import relax  # noqa: PLC0415

    x, indices = inputs[0], inputs[1]
    shape = _static(x, attrs, "ArrayFeatureExtractor")
    flat = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(indices, "int64")), [-1]))
    result = bb.emit(relax.op.take(x, flat, axis=len(shape) - 1))
    return relax.op.expand_dims(result, 0) if len(shape) == 1 else result


def convert_dropout(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Dropout at inference: the input, and its optional mask all true (bool), as onnxruntime's.

    Why: TVM's converter emits ``relax.nn.dropout``, whose mask has the input's dtype (float 1.0
    where ONNX says bool), whose legalization copies the input, and whose (output, mask) tuple
    TVM's ConvertLayout refuses — SqueezeNet and Inception-v1 from the model zoo stayed NCHW
    throughout (SqueezeNet's kernels 10.2 → 6.1 ms in NHWC). A ``training_mode`` that is not a
    constant false declines to TVM's converter (random masks cannot match anyway), as does a mask
    asked of a symbolic shape."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    training = _constant(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else np.array(False)
    if training is None or bool(training):
        return None
    if int(attrs.get("tvm_custom", {}).get("num_outputs", 1)) < 2:
        return x
    shape = _shape(x)
    if shape is None:
        return None  # a symbolic shape: TVM's converter, whose mask follows it
    return relax.Tuple([x, relax.const(np.ones(shape, np.bool_), "bool")])


SMALL_OP_CONVERTERS: dict[str, Any] = {
    "Dropout": convert_dropout,
    "Celu": convert_celu,
    "EyeLike": convert_eye_like,
    "Pow": convert_pow,
    "Mod": convert_mod,
    "ReduceMax": _reduce_extreme("ReduceMax"),
    "ReduceMin": _reduce_extreme("ReduceMin"),
    "ArgMax": _arg_extreme("ArgMax"),
    "ArgMin": _arg_extreme("ArgMin"),
    "Compress": convert_compress,
    "Slice": convert_slice,
    "Split": convert_split,
    "Trilu": convert_trilu,
    "OneHot": convert_one_hot,
    "Det": convert_det,
    "Binarizer": convert_binarizer,
    "ArrayFeatureExtractor": convert_array_feature_extractor,
}
