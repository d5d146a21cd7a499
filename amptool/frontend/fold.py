"""Fold constant computation everywhere, subgraphs included, and inline decided `If`s.

Why amptool needs its own folder next to onnxruntime's: onnxruntime folds the main graph
only, and TVM's frontend does not fold inside `If` branches — so an exporter's shape
arithmetic in a branch (torch's STFT padding: Constant → ConstantOfShape → Concat → Slice →
Cast) reaches the importer as "dynamic pads" and the import fails. Once input shapes are
pinned, many `If` conditions are constants too (``Equal(Shape(x)[0], 1)``), and the branch
not taken is dead weight that may not even import.

Folding evaluates single nodes whose inputs are all known with onnx's reference evaluator
(exact numpy arithmetic, fp32 stays fp32) and replaces them by `Constant` nodes; `Shape`
folds when shape inference knows the static shape; an `If` whose condition is known is
replaced by its taken branch. Nothing depending on a graph input's *values* is touched.

Each round also unrolls the `Loop`/`Scan` nodes whose trip count has become known
(amptool/frontend/unroll.py). It lives in this fixed-point loop rather than in a prepare step
of its own because the two feed each other: folding makes a trip count constant, and
unrolling turns ``iteration_num`` into constants that the next round folds into the copies'
index and shape arithmetic (and into nested `If` conditions, or nested loops' trip counts).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amptool.frontend.graph import STANDARD_DOMAINS, iter_nodes
from amptool.frontend.scan_loops import scans_as_loops
from amptool.frontend.sequence_loops import appends_as_scans
from amptool.frontend.unroll import unroll_loops
from amptool.frontend.unroll_body import constant_value

log = logging.getLogger(__name__)

#: Ops never folded: random, stateful or with subgraphs of their own (If is handled apart).
_NEVER_FOLD = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Loop", "Scan", "If", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SplitToSequence",
    "SequenceAt", "SequenceLength", "ConcatFromSequence", "Optional", "OptionalGetElement",
})
#: Folding a node whose result is larger than this, and than the constants it reads together, would
#: bloat the model (e.g. a big ConstantOfShape that the runtime creates for free): leave it.
_MAX_FOLDED_ELEMENTS = 1 << 20


@dataclass
class FoldStats:
    folded: int = 0
    shapes: int = 0
    ifs_inlined: int = 0
    loops_unrolled: int = 0
    lists_stacked: int = 0  # lists appended to in a Loop, made its scan outputs (sequence_loops.py)
    scans_looped: int = 0  # Scans unrolling left, made Loops that run at run time (scan_loops.py)

    @property
    def changed(self) -> bool:
        return any(getattr(self, f.name) for f in dataclasses.fields(self))

    def add(self, other: FoldStats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def fold_model(model: onnx.ModelProto, max_rounds: int = 8) -> tuple[onnx.ModelProto, FoldStats]:
    """A copy of ``model`` with constant computation folded in every graph; ``model`` itself when
    nothing in it can fold (stats unchanged).

    Repeated to a fixed point: inlining an `If` gives shape inference the static shapes it
    could not see through the branch, which lets the next round fold more.
    """
    total = FoldStats()
    for round_index in range(max_rounds):
        # The first round folds a copy; later ones fold that copy in place (BERT-base: 0.3 s a copy).
        model, stats = _fold_once(model, copy=round_index == 0)
        model, stats.lists_stacked = appends_as_scans(model)
        model, stats.loops_unrolled = unroll_loops(model)
        model, stats.scans_looped = scans_as_loops(model)  # the Scans unrolling left
        total.add(stats)
        if not stats.changed:
            break
    return model, total


def _fold_once(model: onnx.ModelProto, *, copy: bool = True) -> tuple[onnx.ModelProto, FoldStats]:
    if not _may_fold(model.graph, frozenset()):
        return model, FoldStats()
    if copy:
        folded = onnx.ModelProto()
        folded.CopyFrom(model)
    else:
        folded = model
    try:
        inferred = inferred_shapes(folded, data_prop=True)
    except Exception as err:  # noqa: BLE001 - shapes are a bonus: fold values without them
        log.debug("shape inference before folding failed: %s", err)
        inferred = folded
    shapes = _static_shapes(inferred.graph)
    opsets = list(folded.opset_import)
    stats = FoldStats()
    _fold_graph(folded.graph, None, shapes, opsets, stats, ir_version=folded.ir_version)
    return folded, stats


def _may_fold(graph: onnx.GraphProto, outer: frozenset[str]) -> bool:
    """Whether ``_fold_graph`` could change anything in ``graph`` (subgraphs included): some `Shape`,
    some `If` with a constant condition, or some foldable node whose inputs are all constants.
    Folding starts only at such a node, so without one the copy that folding works on (0.05 s and
    100 MB of fresh memory for a ResNet-50, twice a prepare) is skipped. ``outer``: constants of
    the enclosing scopes."""
    known = set(outer) | {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            known.update(node.output)
            continue
        if node.domain not in STANDARD_DOMAINS:
            continue
        if node.op_type == "Shape" or (node.op_type == "If" and node.input[0] in known):
            return True
        scope = frozenset(known)
        for attr in node.attribute:
            if any(_may_fold(g, scope) for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)):
                return True
        if node.op_type not in _NEVER_FOLD and node.output and all(name in known for name in node.input if name):
            return True
    return False


#: Float initializers this large are hidden from shape inference (see ``infer_shapes``).
_HIDDEN_MIN_ELEMENTS = 4096
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                          onnx.TensorProto.DOUBLE})


def infer_shapes(model: onnx.ModelProto, *, data_prop: bool = False) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes(model, data_prop=…)``, written into ``model`` itself
    (returned) and computed without serialising its weights.

    Why: onnx's inference serialises the whole model for its C++ side and parses the result
    back, and the Python side copies it first — 0.3 s per call for ResNet-50's 100 MB, over 1 s
    for BERT-base; prepare calls it on every folding round and once more at the end. Large
    float initializers go in as external-data stubs (their type and dims, which is all
    inference reads of them: it reads the *values* of integer tensors only, shape-like ones,
    which stay), and what inference adds is copied back around the weights.
    """
    inferred = inferred_shapes(model, data_prop=data_prop)
    if inferred is model:
        return model
    for holder, source, skip in ((model, inferred, "graph"), (model.graph, inferred.graph, "initializer")):
        for name in [fd.name for fd in source.DESCRIPTOR.fields if fd.name != skip]:
            holder.ClearField(name)
        copy_fields(source, holder, skip)
    return model


def inferred_shapes(model: onnx.ModelProto, *, data_prop: bool = False) -> onnx.ModelProto:
    """``model`` after onnx's shape inference, its large float initializers replaced by stubs
    (see ``infer_shapes``): for reading shapes. ``model`` itself when it had nothing to stub."""
    hidden = {t.name for t in model.graph.initializer
              if t.data_type in _FLOAT_TYPES and t.data_location != onnx.TensorProto.EXTERNAL
              and int(np.prod(t.dims, dtype=np.int64)) >= _HIDDEN_MIN_ELEMENTS}
    if not hidden:
        return onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
    light = stubbed_copy(model, hidden, "amptool-shape-inference-stub")
    return onnx.shape_inference.infer_shapes(light, data_prop=data_prop)


def stubbed_copy(model: onnx.ModelProto, stubbed: Collection[str], location: str,
                 dropped: Collection[str] = ()) -> onnx.ModelProto:
    """A copy of ``model`` in which the initializers named in ``stubbed`` keep only their name, type
    and dims, marked as external data at ``location``: for a reader that needs no values of them
    (shape inference; an onnxruntime session given them as arrays). Those in ``dropped`` are left out;
    the rest is copied."""
    graph = model.graph
    light = onnx.ModelProto()
    copy_fields(model, light, skip="graph")
    copy_fields(graph, light.graph, skip="initializer")
    for weight in graph.initializer:
        if weight.name in dropped:
            continue
        if weight.name not in stubbed:
            light.graph.initializer.append(weight)
            continue
        stub = light.graph.initializer.add(name=weight.name, data_type=weight.data_type, dims=weight.dims,
                                           data_location=onnx.TensorProto.EXTERNAL)
        stub.external_data.add(key="location", value=location)
    return light


def copy_fields(source: Any, target: Any, skip: str) -> None:
    """Copy every set field of ``source`` but ``skip`` into ``target`` (a message of its type)."""
    for field_desc, value in source.ListFields():
        if field_desc.name == skip:
            continue
        if field_desc.is_repeated:
            getattr(target, field_desc.name).extend(value)
        elif field_desc.type == field_desc.TYPE_MESSAGE:
            getattr(target, field_desc.name).CopyFrom(value)
        else:
            setattr(target, field_desc.name, value)


class _Known:
    """The values known in one graph's scope while folding: what folding computed, the graph's
    initializers, then the enclosing scope's. An initializer becomes an array when first read.

    Why lazy: folding reads few weights, and converting all of them (``to_array``) cost 0.15 s
    a round on ResNet-50's 100 MB, for nothing (measured)."""

    def __init__(self, initializers: Iterable[onnx.TensorProto] = (), outer: _Known | None = None) -> None:
        self._values: dict[str, np.ndarray] = {}
        self._initializers = {tensor.name: tensor for tensor in initializers}
        self._outer = outer

    def __contains__(self, name: str) -> bool:
        return name in self._values or name in self._initializers or (self._outer is not None and name in self._outer)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._values:
            return self._values[name]
        tensor = self._initializers.pop(name, None)
        if tensor is not None:
            value = self._values[name] = numpy_helper.to_array(tensor)
            return value
        if self._outer is not None:
            return self._outer[name]
        raise KeyError(name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._values[name] = value
        self._initializers.pop(name, None)


def _fold_graph(
    graph: onnx.GraphProto,
    outer: _Known | None,
    shapes: dict[str, tuple[int, ...]],
    opsets: list[onnx.OperatorSetIdProto],
    stats: FoldStats,
    ir_version: int,
) -> None:
    known = _Known(graph.initializer, outer)
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        new_nodes.extend(_fold_node(node, known, shapes, opsets, stats, ir_version))
    del graph.node[:]
    graph.node.extend(new_nodes)
    _drop_unused_initializers(graph)


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Initializers nothing reads any more (their consumers were folded), graph outputs kept."""
    used = {o.name for o in graph.output} | {i.name for i in graph.input}
    for node in iter_nodes(graph):
        used.update(node.input)
    kept = [init for init in graph.initializer if init.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _fold_node(
    node: onnx.NodeProto,
    known: _Known,
    shapes: dict[str, tuple[int, ...]],
    opsets: list[onnx.OperatorSetIdProto],
    stats: FoldStats,
    ir_version: int,
) -> Iterable[onnx.NodeProto]:
    if node.op_type == "Constant":
        value = constant_value(node)
        if value is not None:
            known[node.output[0]] = value
        return [node]
    if node.domain not in STANDARD_DOMAINS:
        return [node]
    if node.op_type == "If" and node.input[0] in known:
        branch = "then_branch" if bool(np.asarray(known[node.input[0]]).reshape(-1)[0]) else "else_branch"
        body = next(a.g for a in node.attribute if a.name == branch)
        stats.ifs_inlined += 1
        inlined = _inline_branch(node, body)
        out: list[onnx.NodeProto] = []
        for n in inlined:
            out.extend(_fold_node(n, known, shapes, opsets, stats, ir_version))
        return out
    for attr in node.attribute:  # fold inside subgraphs, with this scope's constants visible
        if attr.type == onnx.AttributeProto.GRAPH:
            _fold_graph(attr.g, known, shapes, opsets, stats, ir_version)
        for g in attr.graphs:
            _fold_graph(g, known, shapes, opsets, stats, ir_version)
    if node.op_type in _NEVER_FOLD or not node.output:
        return [node]
    if node.op_type == "Shape" and node.input[0] not in known and node.input[0] in shapes:
        value = _shape_value(node, shapes[node.input[0]])
        stats.shapes += 1
        known[node.output[0]] = value
        return [_constant_node(node, node.output[0], value)]
    inputs = [name for name in node.input if name]
    if not all(name in known for name in inputs):
        return [node]
    values = _evaluate(node, known, opsets, ir_version)
    # A result no larger than the constants it reads replaces data the model holds already (a weight
    # normalised by its norm: wav2vec2's positional conv, 4.7 M values; a Concat of weights); only
    # growth is capped.
    limit = max(_MAX_FOLDED_ELEMENTS, sum(np.asarray(known[name]).size for name in inputs))
    if values is None or any(v.size > limit for v in values):
        return [node]
    stats.folded += 1
    replacements = []
    for name, value in zip(node.output, values, strict=False):
        if not name:
            continue
        known[name] = value
        replacements.append(_constant_node(node, name, value))
    return replacements


def _evaluate(
    node: onnx.NodeProto, known: _Known, opsets: list[onnx.OperatorSetIdProto], ir_version: int
) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    inputs = [name for name in node.input if name]
    own = _IN_NUMPY.get(node.op_type)
    if own is not None and node.domain in STANDARD_DOMAINS:
        try:
            return own(node, [np.asarray(known[name]) for name in inputs])
        except Exception as err:  # noqa: BLE001 - malformed: left for the importer to name
            log.debug("not folding %s (%s): %s", node.name, node.op_type, err)
            return None
    initializers = [numpy_helper.from_array(np.asarray(known[name]), name) for name in dict.fromkeys(inputs)]
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = helper.make_graph([node], "fold", [], outputs, initializers)
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    try:
        results = ReferenceEvaluator(model).run(None, {})
    except Exception as err:  # noqa: BLE001 - an op the reference evaluator lacks, or odd attributes
        log.debug("not folding %s (%s): %s", node.name, node.op_type, err)
        return None
    arrays = [np.asarray(r) for r in results]
    if any(a.dtype == object for a in arrays):
        return None
    return arrays


def _gather_elements(node: onnx.NodeProto, values: list[np.ndarray]) -> list[np.ndarray]:
    """GatherElements: the reference evaluator's ``np.choose`` takes at most 64 choices along the axis
    and its fallback then fails (BERT's token types gathered from a 512-long buffer)."""
    data, indices = values
    axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0) % data.ndim
    if indices.ndim != data.ndim or np.any(indices < -data.shape[axis]) or np.any(indices >= data.shape[axis]):
        raise ValueError("indices out of range or of another rank")
    window = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
    return [np.take_along_axis(data[window], np.where(indices < 0, indices + data.shape[axis], indices), axis)]


#: Ops the folder computes with numpy itself, where the reference evaluator fails on real exports.
_IN_NUMPY: dict[str, Callable[[onnx.NodeProto, list[np.ndarray]], list[np.ndarray]]] = {
    "GatherElements": _gather_elements,
}


def _inline_branch(node: onnx.NodeProto, body: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``body`` followed by Identity nodes that bind the If's outputs."""
    nodes: list[onnx.NodeProto] = []
    for init in body.initializer:
        nodes.append(helper.make_node("Constant", [], [init.name], name=f"{node.name}/{init.name}", value=init))
    nodes.extend(body.node)
    for i, (branch_out, if_out) in enumerate(zip(body.output, node.output, strict=False)):
        if if_out:
            nodes.append(helper.make_node("Identity", [branch_out.name], [if_out], name=f"{node.name}/out{i}"))
    return nodes


def _constant_node(origin: onnx.NodeProto, output: str, value: np.ndarray) -> onnx.NodeProto:
    name = origin.name or output
    if len(origin.output) > 1:
        name = f"{name}:{output}"
    return helper.make_node("Constant", [], [output], name=name, value=numpy_helper.from_array(value, output))


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    start, end = 0, len(shape)
    for attr in node.attribute:
        if attr.name == "start":
            start = attr.i
        elif attr.name == "end":
            end = attr.i
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Fully static shapes of every typed tensor, subgraphs included."""
    shapes: dict[str, tuple[int, ...]] = {}

    def visit(g: onnx.GraphProto) -> None:
        for value in list(g.input) + list(g.value_info) + list(g.output):
            tensor = value.type.tensor_type
            if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            if all(d >= 0 for d in dims):
                shapes[value.name] = tuple(dims)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(graph)
    return shapes
