"""ONNX ``Gradient`` (domain ai.onnx.preview.training) lowered to Relax reverse-mode AD.

What: ``Gradient(xs, zs, y)`` computes dy/dx for each tensor named in ``xs`` at the values
fed to the node (inputs: one per name in ``xs``, then one per name in ``zs``, which are held
constant). Neither onnxruntime's default build nor TVM's ONNX frontend imports it, so
amptool lowers it itself:

This module is the ONNX side (what a node differentiates, the forward-only model for
onnxruntime, folding that keeps xs); ``gradient_lower`` is the Relax side.

1. ``check_gradients`` (at load): the attributes are well-formed; the forward cone of ``y``
   stops at ``xs ∪ zs`` and initializers (no other graph input may reach ``y``: the node would
   not say at which value to hold it); every ``x`` reaches ``y``; ``xs`` are floats; no
   ``Gradient`` inside the cone (higher order is not supported).
2. ``gradient_lower.lower_gradient`` (at import, from the importer's hook): the cone becomes an
   ONNX sub-model ``xs, zs → ReduceSum(y)`` imported with amptool's own importer (so every
   converter applies), ``relax.transform.Gradient`` derives ``main_adjoint`` from it, and the
   adjoint's bindings are inlined into the caller's ``main`` with fresh names. The backward
   graph is then ordinary bindings of ``main``: ConcretizeLike, mixed precision and
   FoldConstant see it like any other code.

Non-scalar ``y``: Relax's AD needs a scalar target, and the ONNX spec names no output
seed, so the gradient of ``sum(y)`` is returned — the vector-Jacobian product with ones, which
is what onnxruntime-training and ``torch.autograd.backward(ones)`` compute.

Provenance: recomputed forward bindings keep the ONNX node they come from (colour overrides
and activation peaks of that node apply to them too); backward bindings belong to the
``Gradient`` node, so a node rule on its name keeps the whole backward graph in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from amptool.errors import UserError
from amptool.frontend.graph import STANDARD_DOMAINS, TRAINING_DOMAIN, iter_nodes

_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16})
_HINT = "See README 'Training graphs (Gradient)' for what amptool differentiates."


@dataclass(frozen=True)
class GradientSpec:
    """One Gradient node: what it differentiates and the forward nodes between."""

    node: str
    xs: tuple[str, ...]
    zs: tuple[str, ...]
    y: str
    inputs: tuple[str, ...]  # the values at which to differentiate: one per xs, then per zs
    outputs: tuple[str, ...]
    cone: tuple[int, ...]  # indices into graph.node of the forward nodes computing y


def is_gradient(node: onnx.NodeProto) -> bool:
    return node.op_type == "Gradient" and node.domain == TRAINING_DOMAIN


def has_gradients(model: onnx.ModelProto) -> bool:
    return any(is_gradient(n) for n in iter_nodes(model.graph))


def check_gradients(model: onnx.ModelProto) -> dict[str, GradientSpec]:
    """Node name → spec for every Gradient node; one-line UserError on anything unsupported."""
    if not has_gradients(model):
        return {}
    graph = model.graph
    nested = [n.name for n in iter_nodes(graph) if is_gradient(n)]
    top = [n for n in graph.node if is_gradient(n)]
    if len(nested) != len(top):
        inner = sorted(set(nested) - {n.name for n in top})
        raise UserError(f"Gradient node '{inner[0]}' is inside an If/Loop body; only top-level Gradient "
                        "nodes are supported", _HINT)
    dtypes = _elem_types(model)
    return {node.name: _spec(graph, node, dtypes) for node in top}


def _spec(graph: onnx.GraphProto, node: onnx.NodeProto, dtypes: dict[str, int]) -> GradientSpec:
    attrs = {a.name: a for a in node.attribute}
    where = f"Gradient '{node.name}'"
    xs = tuple(s.decode() for s in attrs["xs"].strings) if "xs" in attrs else ()
    zs = tuple(s.decode() for s in attrs["zs"].strings) if "zs" in attrs else ()
    y = attrs["y"].s.decode() if "y" in attrs else ""
    if not xs or not y:
        raise UserError(f"{where} needs the attributes 'xs' and 'y'", _HINT)
    if len(set(xs + zs)) != len(xs + zs):
        raise UserError(f"{where}: a tensor is named twice in xs/zs ({', '.join(xs + zs)})", _HINT)
    if len(node.input) != len(xs) + len(zs) or any(not i for i in node.input):
        raise UserError(f"{where} has {len(node.input)} input(s); it needs one per name in xs and zs "
                        f"({len(xs) + len(zs)})", _HINT)
    if len(node.output) > len(xs):
        raise UserError(f"{where} has {len(node.output)} outputs but xs names {len(xs)} tensor(s)", _HINT)
    if y in xs or y in zs:
        raise UserError(f"{where}: y '{y}' is itself one of xs/zs", _HINT)
    for x in xs:
        if x in dtypes and dtypes[x] not in _FLOAT_TYPES:
            kind = helper.tensor_dtype_to_np_dtype(dtypes[x])
            raise UserError(f"{where}: x '{x}' is {kind}; only floating-point tensors have gradients",
                            "Move integer tensors from xs to zs.")
    cone, reached = _cone(graph, node, xs, zs, y)
    missing = [x for x in xs if x not in reached]
    if missing:
        raise UserError(f"{where}: x '{missing[0]}' does not reach y '{y}' (xs must be tensors y is "
                        "computed from)", "Remove it from xs or differentiate a y that uses it.")
    return GradientSpec(node.name, xs, zs, y, tuple(node.input), tuple(node.output), cone)


def _cone(graph: onnx.GraphProto, grad: onnx.NodeProto, xs: Sequence[str], zs: Sequence[str],
          y: str) -> tuple[tuple[int, ...], set[str]]:
    """Indices of the nodes computing y from xs ∪ zs, and which of xs ∪ zs they read."""
    where = f"Gradient '{grad.name}'"
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    inputs = {v.name for v in graph.input}
    weights = {t.name for t in graph.initializer}
    stops = set(xs) | set(zs)
    cone: set[int] = set()
    reached: set[str] = set()
    stack = [y]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in stops:
            reached.add(name)
        elif name in producer:
            index = producer[name]
            node = graph.node[index]
            if is_gradient(node):
                raise UserError(f"{where}: y '{y}' depends on Gradient '{node.name}'; higher-order "
                                "gradients are not supported", _HINT)
            cone.add(index)
            stack.extend(_reads(node))
        elif name in weights:
            continue
        elif name in inputs:
            raise UserError(f"{where}: y '{y}' depends on graph input '{name}', which is in neither xs "
                            "nor zs", "Add it to zs (held constant) or to xs.")
        elif name == y:
            raise UserError(f"{where}: y '{y}' is not a tensor of the graph", _HINT)
    return tuple(sorted(cone)), reached


def _reads(node: onnx.NodeProto) -> list[str]:
    """A node's inputs plus names its If/Loop bodies capture from outside (a superset)."""
    names = [i for i in node.input if i]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            names.extend(i for n in iter_nodes(sub) for i in n.input if i)
    return names


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can type (best effort)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the checks that need a type are skipped, import re-checks them
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    return {k: v for k, v in types.items() if v}


def fold_protected(model: onnx.ModelProto,
                   fold: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """``fold(model)`` with every tensor named in a Gradient's xs/zs held as a graph input.

    Constant folding would otherwise fold a path from a constant x (a weight) to y into a
    constant — the differentiated graph cut, the gradient silently zero — or fold through a z
    that the node evaluates at another value (a z fed as itself may fold: that is what lets a
    --fixed-input condition inline an If). Initializers and Constant nodes so named become
    graph inputs for the rewrite and initializers again afterwards.
    """
    protected: set[str] = set()
    for node in model.graph.node:
        if is_gradient(node):
            names = {a.name: [s.decode() for s in a.strings] for a in node.attribute}
            xs, zs = names.get("xs", []), names.get("zs", [])
            protected.update(xs)
            protected.update(z for z, fed in zip(zs, node.input[len(xs):]) if z != fed)
    held = onnx.ModelProto()
    held.CopyFrom(model)
    graph = held.graph
    values = {t.name: t for t in graph.initializer if t.name in protected}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS and node.output[0] in protected:
            from amptool.frontend.unroll_body import constant_value  # noqa: PLC0415

            value = constant_value(node)
            if value is not None:
                values[node.output[0]] = onnx.numpy_helper.from_array(value, node.output[0])
    if not values:
        return fold(held)
    kept_nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output and n.output[0] in values)]
    kept_weights = [t for t in graph.initializer if t.name not in values]
    del graph.node[:], graph.initializer[:]
    graph.node.extend(kept_nodes)
    graph.initializer.extend(kept_weights)
    inputs = {v.name for v in graph.input}
    graph.input.extend(helper.make_tensor_value_info(n, t.data_type, list(t.dims))
                       for n, t in values.items() if n not in inputs)
    folded = fold(held)
    real = [v for v in folded.graph.input if v.name not in values or v.name in inputs]
    del folded.graph.input[:]
    folded.graph.input.extend(real)
    folded.graph.initializer.extend(values.values())
    return folded


def forward_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without Gradient nodes, whatever consumes their outputs, and those graph outputs:
    the part onnxruntime can run (calibration, the reference for non-gradient outputs)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    dropped: set[str] = set()
    kept = []
    for node in out.graph.node:
        if is_gradient(node) or dropped & set(_reads(node)):
            dropped.update(o for o in node.output if o)
        else:
            kept.append(node)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    outputs = [v for v in out.graph.output if v.name not in dropped]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    if not any(n.domain == TRAINING_DOMAIN for n in kept):
        opsets = [o for o in out.opset_import if o.domain != TRAINING_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(opsets)
    return out


def forward_model(model: onnx.ModelProto, spec: GradientSpec,
                  types: Sequence[tuple[int, Sequence[int]]]) -> onnx.ModelProto:
    """The sub-model ``xs, zs → sum(y)`` (a scalar named ``<y>__sum``); ``types`` are the
    (elem type, shape) of xs then zs."""
    graph = model.graph
    nodes = [graph.node[i] for i in spec.cone]
    read = {name for n in nodes for name in _reads(n)}
    stops = set(spec.xs) | set(spec.zs)
    weights = [t for t in graph.initializer if t.name in read and t.name not in stops]
    names = [*spec.xs, *spec.zs]
    inputs = [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in zip(names, types, strict=True)]
    total = f"{spec.y}__sum"
    reduce = helper.make_node("ReduceSum", [spec.y], [total], name=spec.node, keepdims=0)
    sub = helper.make_graph([*nodes, reduce], f"{graph.name}_{spec.node}_forward", inputs,
                            [helper.make_tensor_value_info(total, onnx.TensorProto.UNDEFINED, None)],
                            initializer=weights)
    forward = helper.make_model(sub, opset_imports=[o for o in model.opset_import if o.domain != TRAINING_DOMAIN])
    forward.ir_version = model.ir_version
    forward.functions.extend(model.functions)
    return forward
