"""Lists appended to in a Loop and stacked after it, as the Loop's scan outputs.

Why: ``outs.append(t)`` in a scripted torch loop, then ``torch.stack(outs)`` or ``torch.cat(outs)``,
exports as a loop-carried *sequence* — ``SequenceEmpty`` before the Loop, ``SequenceInsert`` in each
iteration, ``ConcatFromSequence`` after — and TVM has no sequences a loop can carry (a greedy
decoder collecting its logits was refused). A Loop's scan output is that same list, stacked on a
new axis 0, and both unrolling and run-time loops take scan outputs.

What: a carried value that starts as a ``SequenceEmpty`` read by nothing else, whose body does only
``SequenceInsert(seq, t)`` at the end (no position) and passes that on, and whose final value feeds
only ``ConcatFromSequence`` nodes, becomes a scan output of ``t``; each ``ConcatFromSequence(axis,
new_axis)`` becomes the stacked tensor moved into place: ``new_axis=1`` a ``Transpose`` putting the
list's axis at ``axis``, ``new_axis=0`` that and a ``Reshape`` joining it with the axis after.

When not: anything else about the sequence (read inside the body, inserted at a position, its final
value used by other ops), a ``t`` of unknown rank where a ``Transpose`` needs it, or unknown dims
beside a joined axis: the Loop stays, and the importer's refusal names the sequence.

Preserves: every output's value (prepare's check-numerics compares onnxruntime before and after).
"""

from __future__ import annotations

import onnx
from onnx import helper

from amptool.frontend.graph import Names, all_names, declared_dims
from amptool.frontend.unroll_body import outer_references


def appends_as_scans(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every such appended list a scan output, and how many were."""
    if not any(node.op_type == "SequenceEmpty" for node in model.graph.node):
        return model, 0
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(rewritten)
    except Exception:  # noqa: BLE001 - ranks are only needed for a Transpose; without them, fewer rewrites
        inferred = rewritten
    names = Names(all_names(rewritten.graph))
    count = 0
    for index, node in enumerate(rewritten.graph.node):
        if node.op_type != "Loop":
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        inferred_body = next(a.g for a in inferred.graph.node[index].attribute if a.name == "body")
        for k in reversed(range(len(node.input) - 2)):
            count += _rewrite(rewritten.graph, node, body, inferred_body, k, names)
    return (rewritten, count) if count else (model, 0)


def _rewrite(graph: onnx.GraphProto, loop: onnx.NodeProto, body: onnx.GraphProto, inferred_body: onnx.GraphProto,
             k: int, names: Names) -> int:
    """Carried value ``k`` of ``loop`` as a scan output, if it is an appended list; 1 if it was."""
    start, carried_in, carried_out = loop.input[2 + k], body.input[2 + k].name, body.output[1 + k].name
    producer = next((n for n in graph.node if start in n.output), None)
    if producer is None or producer.op_type != "SequenceEmpty" or _uses(graph, start) != [loop]:
        return 0
    readers = _uses(body, carried_in)
    if len(readers) != 1 or readers[0].op_type != "SequenceInsert" or len([i for i in readers[0].input if i]) != 2:
        return 0
    insert = readers[0]
    if insert.input[0] != carried_in or insert.output[0] != carried_out or _uses(body, carried_out):
        return 0
    if len(loop.output) != len(body.output) - 1 or [o.name for o in graph.output].count(loop.output[k]):
        return 0
    final = loop.output[k]
    concats = _uses(graph, final)
    if any(c.op_type != "ConcatFromSequence" for c in concats):
        return 0
    element = insert.input[1]
    dims = declared_dims(inferred_body, element)
    if dims is None and any(_axis(c) != 0 or _new_axis(c) == 0 for c in concats):
        return 0
    if any(not _joinable(dims, _axis(c)) for c in concats if _new_axis(c) == 0):
        return 0
    stacked = names.fresh(f"{final}_stacked")
    names.taken.add(stacked)
    body.node.remove(insert)
    del body.input[2 + k]
    del body.output[1 + k]
    dtype = next((a.i for a in _producer_attrs(graph, start) if a.name == "dtype"), onnx.TensorProto.FLOAT)
    body.output.append(helper.make_tensor_value_info(element, dtype, None))
    del loop.input[2 + k]
    del loop.output[k]
    loop.output.append(stacked)
    graph.node.remove(producer)
    for concat in concats:
        position = list(graph.node).index(concat)
        graph.node.remove(concat)
        for offset, replacement in enumerate(_placed(concat, stacked, dims, names)):
            graph.node.insert(position + offset, replacement)
    return 1


def _placed(concat: onnx.NodeProto, stacked: str, dims: list[int | None] | None, names: Names) -> list[onnx.NodeProto]:
    """Nodes computing ``concat``'s output from ``stacked`` (the list on a new axis 0); ``dims``: an
    element's dims (None where unknown; None for an unknown rank)."""
    out, axis, new_axis = concat.output[0], _axis(concat), _new_axis(concat)
    if new_axis:
        if dims is not None:
            axis = axis % (len(dims) + 1)
        if axis == 0:
            return [helper.make_node("Identity", [stacked], [out], name=concat.name)]
        assert dims is not None
        perm = [*range(1, axis + 1), 0, *range(axis + 1, len(dims) + 1)]
        return [helper.make_node("Transpose", [stacked], [out], name=concat.name, perm=perm)]
    assert dims is not None
    axis %= len(dims)
    moved, shape = (names.fresh(f"{out}_{part}") for part in ("moved", "shape"))
    names.taken.update({moved, shape})
    # [..., T, d_axis, ...] → [..., T·d_axis, ...]: the other dims as shape inference knows them.
    target = [-1 if k == axis else int(d or 0) for k, d in enumerate(dims)]  # (_joinable: all known but axis)
    return [
        helper.make_node("Transpose", [stacked], [moved], name=f"{concat.name}/move",
                         perm=[*range(1, axis + 1), 0, *range(axis + 1, len(dims) + 1)]),
        helper.make_node("Constant", [], [shape], name=f"{concat.name}/shape",
                         value=helper.make_tensor(shape, onnx.TensorProto.INT64, [len(target)], target)),
        helper.make_node("Reshape", [moved, shape], [out], name=concat.name),
    ]


def _uses(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` reading ``name``, directly or from a subgraph."""
    return [n for n in graph.node if name in n.input or name in outer_references(n)]


def _producer_attrs(graph: onnx.GraphProto, name: str) -> list[onnx.AttributeProto]:
    return [a for n in graph.node if name in n.output for a in n.attribute]


def _axis(concat: onnx.NodeProto) -> int:
    return next((a.i for a in concat.attribute if a.name == "axis"), 0)


def _new_axis(concat: onnx.NodeProto) -> int:
    return next((a.i for a in concat.attribute if a.name == "new_axis"), 0)


def _joinable(dims: list[int | None] | None, axis: int) -> bool:
    """A concatenation along ``axis`` can be a Reshape: the element's other dims are all known."""
    if dims is None or not -len(dims) <= axis < len(dims):
        return False
    return all(d is not None for k, d in enumerate(dims) if k != axis % len(dims))
