"""Detection ops with data-dependent results: NonMaxSuppression and what feeds on it.

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS.

How a run-time length is carried: the kernel writes into a buffer of the upper bound and
returns the count; ``tensor_to_shape`` + ``match_cast`` bind the count to a fresh symbolic
dim, and a ``strided_slice`` to that dim gives the result its true type (``[n, 3]``), so the
ops after it are typed, legalized and allocated with ``n``, not with the bound.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.frontend.graph import iter_nodes

#: ONNX ops TVM 0.27's importer lets take a shape value (a ``relax.ShapeExpr``: what its Shape,
#: Concat, Gather … return for dims known only symbolically); its ``shape_compatible_ops``.
_SHAPE_VALUE_OPS = frozenset({"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand",
                              "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze"})


def shape_value_producers(model: Any) -> frozenset[str]:
    """Names of the nodes whose output feeds an op that refuses a shape value.

    Why: on a run-time length (the boxes left after a score threshold) TVM's importer keeps
    ``Shape → Gather → Unsqueeze → Concat`` as a ``ShapeExpr`` and then refuses it as the input
    of anything else ("cannot handle ShapeExpr inputs"): torchvision's ``min(k, boxes)`` is a
    ReduceMin of such a Concat. The importer turns these nodes' shape values into int64 tensors.
    """
    producer = {out: node.name for node in iter_nodes(model.graph) for out in node.output if out}
    return frozenset(producer[name] for node in iter_nodes(model.graph) if node.op_type not in _SHAPE_VALUE_OPS
                     for name in node.input if name in producer)


def name_unknown_dims(bb: Any, inputs: Any, nodes: dict[str, Any]) -> Any:
    """``inputs`` with each tensor of known rank but unknown shape matched to fresh symbolic dims.

    Why: torchvision's ``batched_nms`` is ``If(no boxes, empty, nms(...))``; the branches'
    lengths differ (0 and the boxes kept), so Relax types the result ``ndim=1`` with no shape.
    The frontend's converters then fail on it (``shape_of expects a tensor``) and no op reading
    it can be legalized ("CodeGenVM cannot emit this Relax operator"). A ``match_cast`` gives
    each dim a name, and ``nodes`` (the importer's ONNX tensor → value table) is pointed at
    it, so every later reader shares the names.
    """
    from tvm import relax, tirx  # noqa: PLC0415

    items, changed = list(inputs), False
    for i, value in enumerate(items):
        ty = getattr(value, "ty", None)
        if not isinstance(ty, relax.TensorType) or ty.shape is not None or ty.ndim < 0:
            continue
        dims = [tirx.Var(f"dim{axis}", "int64") for axis in range(ty.ndim)]
        items[i] = bb.match_cast(value, relax.TensorType(dims, ty.dtype))
        changed = True
        for name, known in list(nodes.items()):
            if isinstance(known, relax.Expr) and known.same_as(value):
                nodes[name] = items[i]
    return type(inputs)(items) if changed else inputs  # the frontend's onnx_input: None past the end


def run_time_length(bb: Any, count: Any, name: str) -> Any:
    """A fresh symbolic int64 dim bound to the value of ``count`` (a 1-element int64 tensor)."""
    from tvm import relax, tirx  # noqa: PLC0415

    shape = bb.emit(relax.op.tensor_to_shape(relax.op.reshape(count, [1])))
    dim = tirx.Var(name, "int64")
    bb.match_cast(shape, relax.ShapeType([dim]))
    return dim


def _leading(bb: Any, x: Any, length: Any) -> Any:
    """The first ``length`` rows of ``x`` (``length`` a symbolic dim no larger than x's first)."""
    from tvm import relax  # noqa: PLC0415

    return bb.emit(relax.op.strided_slice(x, axes=[0], begin=[0], end=[length], assume_inbound=True))


def convert_nms(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """NonMaxSuppression as onnxruntime computes it, with a ``[selected, 3]`` result.

    Why: TVM's converter types the result as its upper bound (``[max boxes, 3]``) while its
    kernel returns fewer rows, reads a run-time ``max_output_boxes_per_class`` as 0 (no rows),
    suppresses at IoU == threshold (onnxruntime: only above it) and selects nothing when the
    IoU threshold is 0. Here: a stable descending sort of the scores (ties: lower box index
    first, as onnxruntime's queue), then one greedy pass per batch and class in float32 that
    tests each candidate against the boxes kept so far with onnxruntime's IoU arithmetic.
    Thresholds and the per-class limit may be run-time tensors.
    """
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    boxes, scores = (_float32(bb, x) for x in inputs[:2])
    batch, boxes_n = boxes.ty.shape[0], boxes.ty.shape[1]
    classes = scores.ty.shape[1]
    corners = bb.emit(_corners(boxes, int(attrs.get("center_point_box", 0))))
    order = bb.emit(op.argsort(scores, axis=-1, descending=True, dtype="int64"))
    limit = _optional(inputs, 2)
    limit = relax.const(np.zeros(1, np.int64)) if limit is None else bb.emit(
        op.reshape(op.astype(limit, "int64"), [1]))
    iou, score = _optional(inputs, 3), _optional(inputs, 4)
    params = _thresholds(bb, iou, score)
    rows = batch * classes * boxes_n
    result = bb.emit(relax.call_tir(
        bb.add_func(_nms_kernel(), "amptool_nms"), [corners, scores, order, params, limit],
        [relax.TensorType([rows, 3], "int64"), relax.TensorType([1], "int64")]))
    selected = run_time_length(bb, bb.emit(relax.TupleGetItem(result, 1)), "nms_selected")
    return _leading(bb, bb.emit(relax.TupleGetItem(result, 0)), selected)


def convert_topk(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """TopK (opset 10+) whose ``K`` is known only at run time: a ``[.., k, ..]`` result.

    Why: TVM's converter refuses a K that is not a constant, and detectors compute it
    (torchvision keeps ``min(candidates, boxes left after the score threshold)``). A stable
    sort of the whole axis, its first ``k`` indices (ties: lower index first, as onnxruntime),
    and the values gathered at them. A constant K declines to TVM's converter.
    """
    from tvm import relax  # noqa: PLC0415

    if len(inputs) < 2 or inputs[1] is None or _tvm.is_constant(inputs[1]):
        return None
    op = relax.op
    x = inputs[0]
    axis = int(attrs.get("axis", -1)) % len(x.ty.shape)
    if not int(attrs.get("sorted", 1)):
        return None  # TVM's converter refuses unsorted TopK with one line
    k = op.reshape(op.astype(inputs[1], "int64"), [1])
    length = _tvm.dims(x, axis, axis + 1)
    k = run_time_length(bb, bb.emit(op.minimum(k, length)), "topk_k")
    order = bb.emit(op.argsort(x, axis=axis, descending=bool(int(attrs.get("largest", 1))), dtype="int64"))
    indices = bb.emit(op.strided_slice(order, axes=[axis], begin=[0], end=[k], assume_inbound=True))
    return relax.Tuple([bb.emit(op.gather_elements(x, indices, axis=axis)), indices])


def convert_scatter_nd(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ScatterND whose ``updates`` and ``indices`` have run-time lengths TVM cannot prove equal.

    Why: tf2onnx's CombinedNonMaxSuppression scatters the kept boxes' values with ``indices`` of
    ``[nms_selected, 2]`` and ``updates`` of ``[range_len]`` — one count reached through NMS, the
    other through ``Range(0, Shape(..)[0])``: equal at run time, two symbols at import, and TVM's
    type check refused the node. Here ``updates`` is matched to ONNX's required shape
    (``indices.shape[:-1] + data.shape[k:]``; the VM checks it when the model runs), negative
    indices are wrapped as ONNX says, and the scatter is ``relax.scatter_nd`` with the node's
    reduction. Where the shapes already agree, TVM's converter takes the node.
    """
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax, tirx  # noqa: PLC0415

    data, indices, updates = inputs[:3]
    types: list[Any] = [getattr(x, "ty", None) for x in (data, indices, updates)]
    if not all(isinstance(t, relax.TensorType) and t.shape is not None for t in types):
        return None
    data_ty, index_ty, update_ty = types
    index_shape, data_shape = list(index_ty.shape), list(data_ty.shape)
    if not isinstance(index_shape[-1], tirx.IntImm):
        return None
    depth = int(index_shape[-1])
    wanted = [*index_shape[:-1], *data_shape[depth:]]
    if len(wanted) != len(update_ty.shape) or tvm_ffi.structural_equal(list(update_ty.shape), wanted):
        return None
    op = relax.op
    updates = bb.match_cast(updates, relax.TensorType(wanted, update_ty.dtype))
    extents = bb.emit(_tvm.dims(data, 0, depth))
    indices = bb.emit(op.astype(indices, "int64"))
    wrapped = bb.emit(op.where(op.less(indices, relax.const(0, "int64")), op.add(indices, extents), indices))
    reduction = attrs.get("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    return op.scatter_nd(data, wrapped, updates, "update" if reduction == "none" else reduction)


def _optional(inputs: list[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _float32(bb: Any, x: Any) -> Any:
    from tvm import relax  # noqa: PLC0415

    return x if _tvm.tensor_dtype(x) == "float32" else bb.emit(relax.op.astype(x, "float32"))


def _corners(boxes: Any, center_point_box: int) -> Any:
    """``[x_min, y_min, x_max, y_max]`` per box, as onnxruntime derives them (corner boxes come
    as ``[y1, x1, y2, x2]`` in either order; centre boxes as ``[xc, yc, w, h]``)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    cols = [op.strided_slice(boxes, axes=[2], begin=[i], end=[i + 1]) for i in range(4)]
    if center_point_box:
        half_w, half_h = (op.divide(c, relax.const(2.0, "float32")) for c in cols[2:])
        parts = [op.subtract(cols[0], half_w), op.subtract(cols[1], half_h),
                 op.add(cols[0], half_w), op.add(cols[1], half_h)]
    else:
        parts = [op.minimum(cols[1], cols[3]), op.minimum(cols[0], cols[2]),
                 op.maximum(cols[1], cols[3]), op.maximum(cols[0], cols[2])]
    return op.concat(parts, axis=2)


def _thresholds(bb: Any, iou: Any, score: Any) -> Any:
    """``[iou_threshold, score_threshold, has a score threshold]`` as one float32 tensor."""
    from tvm import relax  # noqa: PLC0415

    if all(x is None or _tvm.is_constant(x) for x in (iou, score)):
        values = [float(np.asarray(_tvm.constant_numpy(x)).reshape(-1)[0]) if x is not None else 0.0
                  for x in (iou, score)]
        return relax.const(np.array([*values, float(score is not None)], np.float32))
    op = relax.op
    parts = [op.reshape(op.astype(x, "float32"), [1]) if x is not None else relax.const(np.zeros(1, np.float32))
             for x in (iou, score)]
    parts.append(relax.const(np.full(1, float(score is not None), np.float32)))
    return bb.emit(op.concat(parts, axis=0))


@functools.cache
def _nms_kernel() -> Any:
    """``_parse_nms_kernel``, parsed once per process (without TVMScript's module lookup per frame)."""
    from amptool._tvm.script import cheap_frame_stack  # noqa: PLC0415

    with cheap_frame_stack():
        return _parse_nms_kernel()


def _parse_nms_kernel() -> Any:
    """The greedy pass (TVMScript, symbolic batch/classes/boxes): ``out[:count]`` are the kept
    ``[batch, class, box]`` rows, by batch, class, then score."""
    from tvm.script import tirx as T  # noqa: PLC0415

    @T.prim_func(private=True)
    def nms(var_corners: T.handle, var_scores: T.handle, var_order: T.handle, var_params: T.handle,
            var_limit: T.handle, var_out: T.handle, var_count: T.handle) -> None:
        T.func_attr({"tirx.noalias": True})
        b, n, c = T.int64(), T.int64(), T.int64()
        corners = T.match_buffer(var_corners, (b, n, 4), "float32")
        scores = T.match_buffer(var_scores, (b, c, n), "float32")
        order = T.match_buffer(var_order, (b, c, n), "int64")
        params = T.match_buffer(var_params, (3,), "float32")
        limit = T.match_buffer(var_limit, (1,), "int64")
        out = T.match_buffer(var_out, (b * c * n, 3), "int64")
        count = T.match_buffer(var_count, (1,), "int64")
        start = T.alloc_buffer((1,), "int64", scope="local")
        keep = T.alloc_buffer((1,), "int32", scope="local")
        count[0] = T.int64(0)
        for bi, ci in T.grid(b, c):
            start[0] = count[0]
            for j in range(n):
                box = order[bi, ci, j]
                if count[0] - start[0] < limit[0] and (
                        params[2] == T.float32(0) or scores[bi, ci, box] > params[1]):
                    keep[0] = 1
                    for k in range(count[0] - start[0]):
                        kept = out[start[0] + k, 2]
                        x0 = T.max(corners[bi, box, 0], corners[bi, kept, 0])
                        y0 = T.max(corners[bi, box, 1], corners[bi, kept, 1])
                        x1 = T.min(corners[bi, box, 2], corners[bi, kept, 2])
                        y1 = T.min(corners[bi, box, 3], corners[bi, kept, 3])
                        if keep[0] == 1 and x1 > x0 and y1 > y0:
                            inter = (x1 - x0) * (y1 - y0)
                            area = (corners[bi, box, 2] - corners[bi, box, 0]) * (
                                corners[bi, box, 3] - corners[bi, box, 1])
                            area_kept = (corners[bi, kept, 2] - corners[bi, kept, 0]) * (
                                corners[bi, kept, 3] - corners[bi, kept, 1])
                            union = area + area_kept - inter
                            if (inter > T.float32(0) and area > T.float32(0) and area_kept > T.float32(0)
                                    and union > T.float32(0) and inter / union > params[0]):
                                keep[0] = 0
                    if keep[0] == 1:
                        out[count[0], 0] = bi
                        out[count[0], 1] = ci
                        out[count[0], 2] = box
                        count[0] = count[0] + T.int64(1)

    return nms


def convert_roi_align(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """RoiAlign as ONNX defines it (and onnxruntime computes it). ``avg``: a bin is the mean of its
    samples' bilinear values. ``max``: each sample is the largest of its four *weighted* corners
    ``w_i·v_i``, not the bilinear value, and a bin the largest of its samples, 0 when it has none. A box's
    batch index is clamped to the batch.

    Why: TVM's converter takes the largest bilinear sample in ``max`` mode, which differs wherever a
    sample falls between pixels (71 of the conformance case's 75 values), and reads at any batch index
    it is given (one past the batch segfaulted ``amptool run``; onnxruntime refuses it).
    """
    from tvm import te, tirx  # noqa: PLC0415

    mode = attrs.get("mode", b"avg")
    largest = (mode.decode() if isinstance(mode, bytes) else str(mode)) == "max"
    data, rois, batch_indices = inputs[:3]
    opset = int(attrs.get("tvm_custom", {}).get("opset", 16))
    transform = attrs.get("coordinate_transformation_mode", b"half_pixel" if opset >= 16 else b"output_half_pixel")
    half_pixel = (transform.decode() if isinstance(transform, bytes) else str(transform)) == "half_pixel"
    out_h, out_w = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio, scale = int(attrs.get("sampling_ratio", 0)), float(attrs.get("spatial_scale", 1.0))

    def kernel(x: Any, boxes: Any, index: Any) -> Any:
        coord = boxes.dtype
        acc = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype
        one, zero = tirx.const(1.0, coord), tirx.const(0.0, coord)

        def bins(i: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
            """Box ``i``'s start (h, w), bin size (h, w) and samples per bin (h, w), as ONNX derives them."""
            offset = tirx.const(0.5 if half_pixel else 0.0, coord)
            start_w, start_h, end_w, end_h = (boxes[i, k] * tirx.const(scale, coord) - offset for k in range(4))
            roi_h, roi_w = end_h - start_h, end_w - start_w
            if not half_pixel:  # malformed boxes are forced to 1×1
                roi_h, roi_w = te.max(roi_h, one), te.max(roi_w, one)
            bin_h, bin_w = roi_h / tirx.const(out_h, coord), roi_w / tirx.const(out_w, coord)
            grid = ((tirx.const(ratio, "int64"),) * 2 if ratio > 0 else
                    (te.ceil(bin_h).astype("int64"), te.ceil(bin_w).astype("int64")))
            return start_h, start_w, bin_h, bin_w, grid[0], grid[1]

        def sample(i: Any, c: Any, y: Any, x_: Any) -> Any:
            """The sample at (y, x_): its bilinear value (``avg``) or largest weighted corner (``max``);
            0 outside [-1, size]."""
            limits = [(y, x.shape[2]), (x_, x.shape[3])]
            outside = tirx.any(*(tirx.any(pos < -1.0, pos > tirx.Cast(coord, size)) for pos, size in limits))
            corners = []  # per dim: (low, weight), (high, weight)
            for pos, size in limits:
                pos = te.max(pos, zero)
                low, last = pos.astype("int64"), tirx.Cast("int64", size) - 1
                at_edge = low >= last
                frac = tirx.Select(at_edge, zero, pos - low.astype(coord))
                corners.append(((tirx.Select(at_edge, last, low), one - frac),
                                (tirx.Select(at_edge, last, low + 1), frac)))
            batch = te.min(te.max(index[i], tirx.const(0, index.dtype)), tirx.Cast(index.dtype, x.shape[0]) - 1)
            terms = [(wy * wx).astype(acc) * x[batch, c, row, col].astype(acc)
                     for row, wy in corners[0] for col, wx in corners[1]]
            value = (te.max(te.max(terms[0], terms[1]), te.max(terms[2], terms[3])) if largest
                     else terms[0] + terms[1] + terms[2] + terms[3])
            return tirx.Select(outside, tirx.const(0.0, acc), value)

        def pooled(i: Any, c: Any, ph: Any, pw: Any) -> Any:
            start_h, start_w, bin_h, bin_w, grid_h, grid_w = bins(i)
            rh, rw = te.reduce_axis((0, grid_h), name="rh"), te.reduce_axis((0, grid_w), name="rw")
            y = start_h + ph.astype(coord) * bin_h + (rh.var.astype(coord) + 0.5) * bin_h / grid_h.astype(coord)
            x_ = start_w + pw.astype(coord) * bin_w + (rw.var.astype(coord) + 0.5) * bin_w / grid_w.astype(coord)
            reduce = te.max if largest else te.sum
            return reduce(sample(i, c, y, x_), axis=[rh, rw])

        shape = (boxes.shape[0], x.shape[1], out_h, out_w)
        pooled_bins = te.compute(shape, pooled, name="roi_align_bins")

        def settled(i: Any, c: Any, ph: Any, pw: Any) -> Any:
            grid_h, grid_w = bins(i)[4:]
            empty = tirx.any(grid_h <= 0, grid_w <= 0)  # no samples: 0, not the reduction's -inf
            if largest:
                value = pooled_bins[i, c, ph, pw]
            else:  # the mean over max(grid_h · grid_w, 1) samples
                value = pooled_bins[i, c, ph, pw] / te.max(grid_h * grid_w, tirx.const(1, "int64")).astype(acc)
            return tirx.Select(empty, tirx.const(0.0, acc), value).astype(x.dtype)

        return te.compute(shape, settled, name="roi_align")

    return bb.emit_te(kernel, data, rois, batch_indices, primfunc_name_hint="roi_align")


DETECTION_CONVERTERS: dict[str, Any] = {
    # NonMaxSuppression: TVM's result is typed as its upper bound and its IoU test is off by one
    # comparison; this one is onnxruntime's algorithm with a run-time number of rows.
    "NonMaxSuppression": convert_nms,
    # TopK with a run-time K: TVM's converter needs a constant.
    "TopK": convert_topk,
    # ScatterND whose updates' run-time length TVM cannot prove to be the indices' (tf2onnx's NMS).
    "ScatterND": convert_scatter_nd,
    # RoiAlign: TVM's max mode takes the largest bilinear sample (ONNX: the largest weighted corner), and
    # both its modes read at any batch index given.
    "RoiAlign": convert_roi_align,
}
