"""Signal processing and text ops: DFT, STFT, window functions, MelWeightMatrix, TfIdfVectorizer, TensorScatter,
DeformConv.

Why: TVM 0.27's ONNX frontend has no converter for any of them, yet speech front ends export DFT/STFT with
their windows and mel filters, scikit-learn text pipelines TfIdfVectorizer, KV-cache decoders TensorScatter
and detectors DeformConv. Everything whose value decides a shape (window ``size``, ``dft_length``, ``axis``,
``frame_step``/``frame_length``, the mel operands) is pinned (shape_inputs.SHAPE_OPERANDS), so windows and
mel filters are numpy constants and a DFT is one matmul with a constant cos/sin matrix, built in float64 and
rounded once (float32 stays within 1e-4 relative at length 512; a matmul is an op the colouring pass knows).
Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``); the table
at the bottom is merged into CONVERTERS.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError

_PIN_HINT = "Pin the input with --fixed-input NAME=VALUE (amptool diff --inputs FILE.npz pins it from the file)."


def _name(attrs: dict[str, Any], op: str) -> str:
    return str(attrs.get("tvm_custom", {}).get("name", "") or op)


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _shape(x: Any, what: str) -> list[int]:
    try:
        return [int(d) for d in x.ty.shape]
    except TypeError as err:
        raise UserError(f"{what} needs a static input shape", "Pin the input shapes with --input-shape.") from err


def _value(expr: Any, what: str) -> np.ndarray | None:
    """An operand's constant value (None when omitted); a run-time value is refused."""
    if expr is None:
        return None
    if not _tvm.is_constant(expr):
        raise UserError(f"{what} is computed at run time; it decides the output shape", _PIN_HINT)
    return np.asarray(_tvm.constant_numpy(expr))


def _scalar(expr: Any, what: str) -> Any:
    value = _value(expr, what)
    return None if value is None else value.reshape(-1)[0]


def _const(value: np.ndarray) -> Any:
    """A Relax constant of the array's own dtype (``relax.const`` narrows int64 and float64)."""
    from tvm import relax  # noqa: PLC0415

    return relax.const(value, str(value.dtype))


def _f32(value: float) -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax.const(float(value), "float32")


def _np_dtype(onnx_type: int) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype  # noqa: PLC0415 - onnx is imported already by the loader

    return np.dtype(tensor_dtype_to_np_dtype(onnx_type))


# --- DFT / STFT -------------------------------------------------------------------------------------------


def _dft_matrix(n_in: int, c_in: int, length: int, inverse: bool, onesided: bool,
                rows: np.ndarray | None = None) -> tuple[np.ndarray, int, int]:
    """[n_in * c_in, bins * c_out] in float64: the DFT along one axis of interleaved (re, im) pairs.

    Samples past ``length`` are dropped (truncation); missing ones are zeros (padding), so neither
    needs a pad or slice. ``rows`` scales each input sample (STFT's window, folded in)."""
    if inverse and onesided:  # one-sided spectrum in, real signal out (irfft): Hermitian bins count twice
        bins, c_out = length, 1
        k = np.arange(min(n_in, length // 2 + 1))
        weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
        angle = 2 * np.pi * (np.outer(k, np.arange(length)) % length) / length
        w = np.zeros((n_in, 2, bins, 1))
        w[k, 0, :, 0] = weight[:, None] * np.cos(angle)
        w[k, 1, :, 0] = -weight[:, None] * np.sin(angle)
    else:
        bins, c_out = (length // 2 + 1 if onesided and not inverse else length), 2
        n = np.arange(min(n_in, length))
        angle = 2 * np.pi * (np.outer(n, np.arange(bins)) % length) / length  # exact integer phase first
        cos, sin = np.cos(angle), np.sin(angle) * (1.0 if inverse else -1.0)
        scale = 1.0 / length if inverse else 1.0
        w = np.zeros((n_in, 2, bins, 2))
        w[n, 0, :, 0], w[n, 0, :, 1] = cos * scale, sin * scale  # (re + i·im)·(cos + i·sin)
        w[n, 1, :, 0], w[n, 1, :, 1] = -sin * scale, cos * scale
    if rows is not None:
        w *= rows.astype(np.float64).reshape(-1, 1, 1, 1)[:n_in]
    return w[:, :c_in].reshape(n_in * c_in, bins * c_out), bins, c_out


def _dft(bb: Any, x: Any, axis: int, length: int, inverse: bool, onesided: bool,
         rows: np.ndarray | None = None) -> Any:
    """DFT of ``x`` ([..., 1 or 2], the last axis real/imag) along ``axis``: move it next to the last,
    flatten the pair, one matmul, and move it back."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    shape = _shape(x, "DFT")
    rank, c_in = len(shape), shape[-1]
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    w, bins, c_out = _dft_matrix(shape[axis], c_in, length, inverse, onesided, rows)
    dtype = str(x.ty.dtype)
    moved = bb.emit(op.permute_dims(x, perm)) if perm != list(range(rank)) else x
    outer = [shape[i] for i in perm[:-2]]
    flat = bb.emit(op.reshape(moved, [*outer, shape[axis] * c_in]))
    y = bb.emit(op.matmul(flat, _const(w.astype(dtype))))
    y = bb.emit(op.reshape(y, [*outer, bins, c_out]))
    if perm == list(range(rank)):
        return y
    return op.permute_dims(y, [int(i) for i in np.argsort(perm)])


def convert_dft(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """DFT (opset 17 ``axis`` attribute, opset 20 ``axis`` input): forward, inverse, one-sided, irfft."""
    node = _name(attrs, "DFT")
    x = inputs[0]
    shape = _shape(x, f"DFT node '{node}'")
    rank = len(shape)
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    axis_input = _scalar(inputs[2] if len(inputs) > 2 else None, f"DFT node '{node}' axis")
    if axis_input is not None:
        axis = int(axis_input)
    elif "axis" in attrs:
        axis = int(attrs["axis"])
    else:  # the default moved from 1 (opset 17) to -2 (opset 20): the same on the usual [batch, n, 1|2]
        opset = attrs.get("tvm_custom", {}).get("opset")
        if opset is None and rank > 3:
            raise UserError(f"DFT node '{node}' gives no axis, and its default differs between opsets 17 and 20 "
                            f"for a rank-{rank} input", "Set the axis explicitly in the exporter.")
        axis = 1 if opset is not None and int(opset) < 20 else -2
    if not 0 <= axis % rank < rank - 1 or shape[-1] not in (1, 2):
        raise UserError(f"DFT node '{node}': axis {axis} of input shape {shape} is not a signal axis "
                        "(the last axis holds 1 or 2 values: real, imaginary)")
    axis %= rank
    length = _scalar(inputs[1] if len(inputs) > 1 else None, f"DFT node '{node}' dft_length")
    if length is None:
        length = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    if int(length) < 1:
        raise UserError(f"DFT node '{node}': dft_length {int(length)} is not positive")
    return _dft(bb, x, axis, int(length), inverse, onesided)


def convert_stft(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """STFT: frames by strided slices (no index table: a long signal would need a huge one), the window
    (folded into the DFT matrix when constant), one matmul."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    node = _name(attrs, "STFT")
    signal, window = inputs[0], inputs[2] if len(inputs) > 2 else None
    batch, total, pair = _shape(signal, f"STFT node '{node}'")
    step = int(_scalar(inputs[1], f"STFT node '{node}' frame_step"))
    length = _scalar(inputs[3] if len(inputs) > 3 else None, f"STFT node '{node}' frame_length")
    size = None if window is None else _shape(window, f"STFT node '{node}' window")[0]
    frame = int(length) if length is not None else size if size is not None else total
    if (size is not None and size != frame) or step < 1 or not 0 < frame <= total:
        raise UserError(f"STFT node '{node}': frame_length {frame}, window length {size}, frame_step {step} "
                        f"do not fit a signal of {total} samples")
    frames = 1 + (total - frame) // step
    pieces = -(-frame // step)  # each frame: `pieces` consecutive hops, cut to `frame`
    need = (frames + pieces - 1) * step
    if need > total:
        zeros = _const(np.zeros((batch, need - total, pair), str(signal.ty.dtype)))
        signal = bb.emit(op.concat([signal, zeros], axis=1))
    hops = [bb.emit(op.reshape(op.strided_slice(signal, [1], [j * step], [j * step + frames * step]),
                               [batch, frames, step, pair])) for j in range(pieces)]
    framed = hops[0] if pieces == 1 else bb.emit(op.concat(hops, axis=2))
    if pieces * step != frame:
        framed = bb.emit(op.strided_slice(framed, [2], [0], [frame]))
    rows = None
    if window is not None and _tvm.is_constant(window):
        rows = np.asarray(_tvm.constant_numpy(window))
    elif window is not None:
        weights = op.astype(window, str(signal.ty.dtype)) if str(window.ty.dtype) != str(signal.ty.dtype) else window
        framed = bb.emit(op.multiply(framed, op.reshape(weights, [1, 1, frame, 1])))
    return _dft(bb, framed, 2, frame, False, bool(attrs.get("onesided", 1)), rows)


# --- windows and mel filters: constants once their operands are pinned ---------------------------------


def _window(terms: tuple[float, ...]) -> Any:
    """A cosine-sum window Σ (-1)^k a_k cos(2πkn/N'), N' = size (periodic) or size-1 (symmetric)."""

    def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:

        size = int(_scalar(inputs[0], f"window node '{_name(attrs, 'window')}' size"))
        span = size if int(attrs.get("periodic", 1)) else size - 1
        n = np.arange(size, dtype=np.float64)
        value = sum((-1) ** k * a * np.cos(2 * np.pi * k * n / max(span, 1)) for k, a in enumerate(terms))
        return _const(np.asarray(value, np.float64).astype(_np_dtype(int(attrs.get("output_datatype", 1)))))

    return convert


def convert_mel_weight_matrix(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """MelWeightMatrix [dft_length // 2 + 1, num_mel_bins]: triangles on the mel scale, peak 1, computed as
    ONNX's reference does (the bin edges are floor divisions, so its arithmetic is kept, in the operands'
    own dtypes)."""

    node = _name(attrs, "MelWeightMatrix")
    bins, dft_length, rate, low, high = (_scalar(e, f"MelWeightMatrix node '{node}' operand {i}")
                                         for i, e in enumerate(inputs[:5]))
    edges = np.arange(0, int(bins) + 2)
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    edges = edges * ((high_mel - low_mel) / edges.shape[0]) + low_mel
    edges = (((dft_length + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(int)
    out = np.zeros((int(dft_length) // 2 + 1, int(bins)))
    for i in range(int(bins)):
        left, centre, right = (int(e) for e in edges[i:i + 3])
        if centre == left:
            out[centre, i] = 1
        else:
            out[left:centre + 1, i] = (np.arange(left, centre + 1) - left) / (centre - left)
        if right > centre:
            out[centre:right, i] = (right - np.arange(centre, right)) / (right - centre)
    return _const(out.astype(_np_dtype(int(attrs.get("output_datatype", 1)))))


# --- TfIdfVectorizer, TensorScatter -------------------------------------------------------------------------


def convert_tfidf_vectorizer(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """TfIdfVectorizer over integer pools: per n-gram size and skip, strided slices compared with a constant
    pool table; counts land in their output slot through a constant 0/1 matrix (one matmul)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    node = _name(attrs, "TfIdfVectorizer")
    if "pool_int64s" not in attrs:
        raise UserError(f"TfIdfVectorizer node '{node}' has a string pool; only integer pools import",
                        "Tokenise to integer ids before the vectoriser.")
    x = inputs[0]
    shape = _shape(x, f"TfIdfVectorizer node '{node}'")
    if len(shape) not in (1, 2):
        raise UserError(f"TfIdfVectorizer node '{node}': input rank {len(shape)}; ONNX allows [C] or [B, C]")
    rows, width = (1, shape[0]) if len(shape) == 1 else shape
    pool = [int(v) for v in attrs["pool_int64s"]]
    starts, slots = [int(v) for v in attrs["ngram_counts"]], [int(v) for v in attrs["ngram_indexes"]]
    lo, hi, skips = int(attrs["min_gram_length"]), int(attrs["max_gram_length"]), int(attrs["max_skip_count"])
    out_size = max(slots) + 1
    grams: dict[tuple[int, ...], int] = {}  # n-gram → its position in ngram_indexes (a repeat: the last wins)
    position = 0
    for n, start in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        for i in range(start, end - n + 1, n):
            if lo <= n <= hi:
                grams[tuple(pool[i:i + n])] = position
            position += 1
    data = bb.emit(op.reshape(op.astype(x, "int64"), [rows, width]))
    mode, weights = _text(attrs.get("mode"), "TF"), attrs.get("weights")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise UserError(f"TfIdfVectorizer node '{node}': mode '{mode}'", "ONNX defines TF, IDF and TFIDF.")
    counts: list[Any] = []  # per n-gram size: [rows, G] counts
    positions: list[int] = []  # each counted gram's position in the pool
    for n in sorted({len(g) for g in grams}):
        table = np.array([g for g in grams if len(g) == n], np.int64)  # [G, n]
        total = None
        for skip in range(1, (1 if n == 1 else skips + 1) + 1):  # unigrams do not depend on the skip
            span = width - skip * (n - 1)
            if span <= 0:
                break
            hit = None
            for k in range(n):
                part = op.strided_slice(data, [1], [k * skip], [k * skip + span])
                same = op.equal(op.expand_dims(part, 2), _const(table[:, k].reshape(1, 1, -1)))
                hit = same if hit is None else op.logical_and(hit, same)
            found = op.sum(op.astype(hit, "float32"), axis=[1])
            total = bb.emit(found if total is None else op.add(total, found))
        if total is not None:
            counts.append(total)
            positions.extend(grams[tuple(g)] for g in table.tolist())
    if not counts:
        return _const(np.zeros((rows, out_size) if len(shape) == 2 else (out_size,), np.float32))
    joined = counts[0] if len(counts) == 1 else bb.emit(op.concat(counts, axis=1))
    if mode == "IDF":
        joined = bb.emit(op.astype(op.greater(joined, relax.const(0, "float32")), "float32"))
    # Each gram's count goes to its output slot, scaled by its weight (onnxruntime: weights follow the pool)
    scale = np.asarray(weights if weights is not None and mode != "TF" else [1.0] * len(slots), np.float64)
    scatter = np.zeros((len(positions), out_size), np.float32)
    scatter[np.arange(len(positions)), [slots[p] for p in positions]] = scale[positions]
    y = bb.emit(op.matmul(joined, _const(scatter)))
    return op.reshape(y, [out_size]) if len(shape) == 1 else y


def convert_tensor_scatter(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """TensorScatter (KV-cache write): each cache slot along ``axis`` takes update[slot - write_index[b]]
    (mod the cache length when circular) where that falls inside the update — a gather and a select."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    node = _name(attrs, "TensorScatter")
    past, update, where = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    shape = _shape(past, f"TensorScatter node '{node}'")
    rank = len(shape)
    axis = int(attrs.get("axis", -2)) % rank
    if axis == 0:
        raise UserError(f"TensorScatter node '{node}': axis 0 is the batch axis", "ONNX requires axis > 0.")
    steps, cache = _shape(update, f"TensorScatter node '{node}'")[axis], shape[axis]
    pos_shape = [1] * rank
    pos_shape[axis] = cache
    slot = _const(np.arange(cache, dtype=np.int64).reshape(pos_shape))
    start: Any = _const(np.zeros([shape[0]] + [1] * (rank - 1), np.int64))
    if where is not None:
        start = bb.emit(op.reshape(op.astype(where, "int64"), [shape[0]] + [1] * (rank - 1)))
    offset = bb.emit(op.subtract(slot, start))  # [B, 1.., cache, 1..]
    if _text(attrs.get("mode"), "linear") == "circular":
        offset = bb.emit(op.floor_mod(offset, relax.const(cache, "int64")))
    inside = bb.emit(op.logical_and(op.greater_equal(offset, relax.const(0, "int64")),
                                    op.less(offset, relax.const(steps, "int64"))))
    index = op.clip(offset, 0, max(steps - 1, 0))
    index = bb.emit(op.broadcast_to(index, [*shape[:axis], cache, *shape[axis + 1:]]))
    if steps < cache:  # gather_elements reads along the axis of `update`: pad it to the cache length
        pad = [*shape[:axis], cache - steps, *shape[axis + 1:]]
        update = bb.emit(op.concat([update, _const(np.zeros(pad, str(update.ty.dtype)))], axis=axis))
    taken = bb.emit(op.gather_elements(update, index, axis=axis))
    return op.where(inside, taken, past)


def convert_deform_conv(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """DeformConv (2-D): each kernel tap samples the input bilinearly at its offset position (zero outside),
    as four ``gather_elements`` per offset group; then the grouped convolution is one batched matmul."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    node = _name(attrs, "DeformConv")
    x, w, offset = inputs[0], inputs[1], inputs[2]
    bias, mask = (inputs[i] if len(inputs) > i else None for i in (3, 4))
    shape = _shape(x, f"DeformConv node '{node}'")
    if len(shape) != 4:
        raise UserError(f"DeformConv node '{node}': a {len(shape) - 2}-D convolution; only 2-D imports",
                        "Export 1-D or 3-D deformable convolutions as their 2-D form.")
    n, c, h, wd = shape
    oc, cw, kh, kw = _shape(w, f"DeformConv node '{node}'")
    oh, ow = _shape(offset, f"DeformConv node '{node}'")[2:]
    groups, off_groups = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    sh, sw = (int(v) for v in attrs.get("strides", (1, 1)))
    dh, dw = (int(v) for v in attrs.get("dilations", (1, 1)))
    top, left = (int(v) for v in attrs.get("pads", (0, 0, 0, 0))[:2])
    k, length, cg = kh * kw, oh * ow, c // off_groups
    # Tap positions without offsets, [K, L]: output pixel times stride, minus padding, plus the dilated tap
    taps_y, taps_x = np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    rows, cols = np.meshgrid(np.arange(oh) * sh - top, np.arange(ow) * sw - left, indexing="ij")
    base_y = (taps_y.reshape(-1, 1) + rows.reshape(1, -1)).astype(np.float32)
    base_x = (taps_x.reshape(-1, 1) + cols.reshape(1, -1)).astype(np.float32)
    off = bb.emit(op.reshape(op.astype(offset, "float32"), [n, off_groups, k, 2, length]))
    py = bb.emit(op.add(op.squeeze(op.strided_slice(off, [3], [0], [1]), [3]), _const(base_y)))
    px = bb.emit(op.add(op.squeeze(op.strided_slice(off, [3], [1], [2]), [3]), _const(base_x)))
    y0, x0 = bb.emit(op.floor(py)), bb.emit(op.floor(px))
    fy, fx = bb.emit(op.subtract(py, y0)), bb.emit(op.subtract(px, x0))
    one = _f32(1)
    data = bb.emit(op.reshape(x, [n, off_groups, cg, h * wd]))
    sampled = None
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yy = bb.emit(op.add(y0, _f32(dy)))
        xx = bb.emit(op.add(x0, _f32(dx)))
        weight = op.multiply(fy if dy else op.subtract(one, fy), fx if dx else op.subtract(one, fx))
        inside = op.logical_and(
            op.logical_and(op.greater_equal(yy, _f32(0)), op.less_equal(yy, _f32(h - 1))),
            op.logical_and(op.greater_equal(xx, _f32(0)), op.less_equal(xx, _f32(wd - 1))))
        weight = bb.emit(op.multiply(weight, op.astype(inside, "float32")))
        flat = op.add(op.multiply(op.clip(yy, 0, h - 1), _f32(wd)), op.clip(xx, 0, wd - 1))
        index = op.reshape(op.astype(flat, "int64"), [n, off_groups, 1, k * length])
        index = bb.emit(op.broadcast_to(index, [n, off_groups, cg, k * length]))
        value = op.multiply(bb.emit(op.gather_elements(data, index, axis=3)),
                            op.astype(op.reshape(weight, [n, off_groups, 1, k * length]), str(x.ty.dtype)))
        sampled = bb.emit(value if sampled is None else op.add(sampled, value))
    if mask is not None:
        sampled = bb.emit(op.multiply(sampled, op.reshape(mask, [n, off_groups, 1, k * length])))
    columns = bb.emit(op.reshape(sampled, [n, groups, cw * k, length]))
    kernel = op.reshape(w, [groups, oc // groups, cw * k])
    y = bb.emit(op.reshape(op.matmul(kernel, columns), [n, oc, oh, ow]))
    return y if bias is None else op.add(y, op.reshape(bias, [1, oc, 1, 1]))


SIGNAL_CONVERTERS: dict[str, Any] = {
    "DFT": convert_dft,
    "STFT": convert_stft,
    "HannWindow": _window((0.5, 0.5)),
    "HammingWindow": _window((25 / 46, 21 / 46)),
    "BlackmanWindow": _window((0.42, 0.5, 0.08)),
    "MelWeightMatrix": convert_mel_weight_matrix,
    "TfIdfVectorizer": convert_tfidf_vectorizer,
    "TensorScatter": convert_tensor_scatter,
    "DeformConv": convert_deform_conv,
}
