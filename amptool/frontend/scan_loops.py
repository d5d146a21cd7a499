"""Scans prepare cannot unroll, as Loops: the run-time loop converter takes those.

Why: unroll.py unrolls a ``Scan`` (opset ≥ 9) whose sequence length is known and at most its
unroll limit; the rest — a length known only at run time, or a speech model's thousands of frames
— had no converter. A ``Loop`` over the same body runs at run time (loop_function.py).

What: ``Scan(states…, xs…)`` becomes

    L = Shape(xs_0)[axis_0]
    Loop(L, "", states…) with body (i, cond, states_in…):
        x_j = Gather(xs_j, i or L − 1 − i (reversed), axis_j)     # the Scan body's own input names
        … the Scan body …
        → (cond, states_out…, ys…)
    ys_k = the Loop's stacked ys_k, reversed where its direction is, its new axis moved to axis_k

When not: an opset-8 Scan (a batch axis and ``sequence_lens``), or a negative axis or an output
axis other than 0 where the rank it needs is unknown: the Scan stays, and the importer names it.

Preserves: every output's value (prepare's check-numerics compares onnxruntime before and after).
"""

from __future__ import annotations

import onnx
from onnx import helper

from amptool.frontend.graph import Names, all_names, declared_dims, default_opset
from amptool.frontend.unroll_body import attr_graph, attr_int, attr_ints

_INT64_MIN = -(2**63)


def scans_as_loops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every Scan of its main graph a Loop, and how many were (call it on
    the Scans unrolling left: it rewrites every one it can)."""
    if default_opset(model) < 9 or not any(node.op_type == "Scan" for node in model.graph.node):
        return model, 0
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(rewritten)
    except Exception:  # noqa: BLE001 - ranks only decide the rewrites that need one
        inferred = rewritten
    names = Names(all_names(rewritten.graph))
    count = 0
    for index in reversed(range(len(rewritten.graph.node))):
        node = rewritten.graph.node[index]
        if node.op_type != "Scan":
            continue
        replacement = _as_loop(node, inferred.graph, attr_graph(inferred.graph.node[index], "body"), names,
                               default_opset(rewritten))
        if replacement is not None:
            del rewritten.graph.node[index]
            for offset, new in enumerate(replacement):
                rewritten.graph.node.insert(index + offset, new)
            count += 1
    return (rewritten, count) if count else (model, 0)


def _as_loop(scan: onnx.NodeProto, graph: onnx.GraphProto, body_types: onnx.GraphProto, names: Names,
             opset: int) -> list[onnx.NodeProto] | None:
    """The nodes computing ``scan``'s outputs with a Loop; None where a rank it needs is unknown (or
    a reversed output needs Slice's steps, opset 10). ``graph``, ``body_types``: the graph and the
    Scan's body as shape inference typed them (the ranks)."""
    body = attr_graph(scan, "body")
    m = attr_int(scan, "num_scan_inputs", 0)
    n = len(scan.input) - m
    states, xs = list(scan.input[:n]), list(scan.input[n:])
    k = len(body.output) - n
    in_axes = attr_ints(scan, "scan_input_axes") or [0] * m
    in_dirs = attr_ints(scan, "scan_input_directions") or [0] * m
    out_axes = attr_ints(scan, "scan_output_axes") or [0] * k
    out_dirs = attr_ints(scan, "scan_output_directions") or [0] * k
    if opset < 10 and any(out_dirs):
        return None
    input_ranks = [_rank(graph, x) for x in xs]
    if any(a < 0 and r is None for a, r in zip(in_axes, input_ranks)):
        return None
    in_axes = [a % r if a < 0 and r is not None else a for a, r in zip(in_axes, input_ranks)]
    element_ranks = [_rank(body_types, out.name) for out in body.output[n:]]
    if any(a != 0 and r is None for a, r in zip(out_axes, element_ranks)):
        return None
    out_axes = [a % (r + 1) if a < 0 and r is not None else a for a, r in zip(out_axes, element_ranks)]

    def fresh(base: str) -> str:
        name = names.fresh(f"{scan.name}/{base}")
        names.taken.add(name)
        return name

    nodes: list[onnx.NodeProto] = []
    shape, trips = fresh("shape"), fresh("trips")
    first_axis = _constant(nodes, fresh("axis"), in_axes[0])
    nodes.append(helper.make_node("Shape", [xs[0]], [shape], name=shape))
    nodes.append(helper.make_node("Gather", [shape, first_axis], [trips], name=trips, axis=0))
    iteration, cond = fresh("i"), fresh("cond")
    loop_body = onnx.GraphProto()
    loop_body.CopyFrom(body)
    del loop_body.input[:]
    loop_body.input.extend([helper.make_tensor_value_info(iteration, onnx.TensorProto.INT64, []),
                            helper.make_tensor_value_info(cond, onnx.TensorProto.BOOL, []), *body.input[:n]])
    reads: list[onnx.NodeProto] = []
    last = None
    for j, (x, axis, reverse) in enumerate(zip(xs, in_axes, in_dirs)):
        index = iteration
        if reverse:
            if last is None:
                one = _constant(reads, fresh("one"), 1)
                last = fresh("last")
                reads.append(helper.make_node("Sub", [trips, one], [last], name=last))
            index = fresh(f"reversed_{j}")
            reads.append(helper.make_node("Sub", [last, iteration], [index], name=index))
        reads.append(helper.make_node("Gather", [x, index], [body.input[n + j].name], name=fresh(f"read_{j}"),
                                      axis=axis))
    del loop_body.node[:]
    loop_body.node.extend([*reads, *body.node])
    cond_out = fresh("cond_out")
    loop_body.node.append(helper.make_node("Identity", [cond], [cond_out], name=cond_out))
    del loop_body.output[:]
    loop_body.output.extend([helper.make_tensor_value_info(cond_out, onnx.TensorProto.BOOL, []), *body.output])

    stacked = [fresh(f"stacked_{j}") for j in range(k)]
    outputs = list(scan.output) + [""] * (n + k - len(scan.output))
    loop_outputs = outputs[:n] + stacked
    nodes.append(helper.make_node("Loop", [trips, "", *states], loop_outputs, name=scan.name, body=loop_body))
    for j, (out, axis, reverse, rank) in enumerate(zip(outputs[n:], out_axes, out_dirs, element_ranks)):
        if not out:
            continue
        value = stacked[j]
        if reverse:
            flipped = fresh(f"flipped_{j}")
            starts, ends = _constant(nodes, fresh("start"), [-1]), _constant(nodes, fresh("end"), [_INT64_MIN])
            axes, steps = _constant(nodes, fresh("axes"), [0]), _constant(nodes, fresh("step"), [-1])
            nodes.append(helper.make_node("Slice", [value, starts, ends, axes, steps], [flipped], name=flipped))
            value = flipped
        if axis:
            assert rank is not None
            perm = [*range(1, axis + 1), 0, *range(axis + 1, rank + 1)]
            nodes.append(helper.make_node("Transpose", [value], [out], name=fresh(f"place_{j}"), perm=perm))
        else:
            nodes.append(helper.make_node("Identity", [value], [out], name=fresh(f"output_{j}")))
    return nodes


def _constant(nodes: list[onnx.NodeProto], name: str, value: int | list[int]) -> str:
    """``name``, made by a Constant appended to ``nodes``: an int64 scalar or 1-D tensor."""
    dims = [] if isinstance(value, int) else [len(value)]
    values = [value] if isinstance(value, int) else value
    nodes.append(helper.make_node("Constant", [], [name], name=name,
                                  value=helper.make_tensor(name, onnx.TensorProto.INT64, dims, values)))
    return name


def _rank(graph: onnx.GraphProto, name: str) -> int | None:
    dims = declared_dims(graph, name)
    return None if dims is None else len(dims)
