"""Unroll `Loop` and `Scan` nodes whose number of iterations is known before run time.

Why: TVM 0.27's Relax ONNX frontend has no converter for `Loop` or `Scan`, yet trained models
carry them: tf2onnx turns TF while-loops (Keras RNNs, post-processing) into `Loop`, scripted
TorchScript loops become `Loop`, older exports use `Scan`. Once input shapes are pinned, most
of these loops run a fixed number of times, and the loop is then just its body repeated.

What: a `Loop` runs ``for i in range(M) while cond``. Its trip count N is known when M is a
constant (or absent) and the continuation condition can be decided here: ``cond`` absent or
constant, and the body's ``cond_out`` constant, passing ``cond_in`` through, or computed only
from constants, ``iteration_num`` and loop-carried values that start constant (tf2onnx's
``time < T`` counter) — that part of the body is evaluated with onnx's reference evaluator
for each iteration. The Loop is then replaced by N copies of the live part of its body,
tensors renamed ``<loop>/<i>/<name>``: ``iteration_num`` is a `Constant` i in copy i (so
folding can specialise index and shape arithmetic), loop-carried values thread from one copy
to the next, scan outputs are stacked on a new axis 0 (`Unsqueeze` + `Concat`), outer-scope
references stay, subgraphs in the body are copied with renamed inner names, and body
initializers and `Constant` nodes are emitted once per loop (the copying itself lives in
amptool/frontend/unroll_body.py). N = 0 gives the initial values and empty scan outputs.
A `Scan` (opset ≥ 9) with a static sequence length L becomes L copies of its body fed by
`Gather` slices, honouring the input/output axes and directions. An opset-8 `Scan` (a leading
batch axis B, time on axis 1) becomes B × L copies, per batch element, stacked on axis 0.

When not: a data-dependent trip count or condition, more than ``MAX_TRIP_COUNT`` iterations
or ``MAX_UNROLLED_NODES`` nodes, a Scan with a symbolic or zero length, or an opset-8 Scan whose
``sequence_lens`` are not all its full length. The node is left alone: a Loop then runs as a
recursive function (loop_function.py), a Scan is made a Loop first (scan_loops.py); for an opset-8
Scan, ``refusals`` says why, for the importer's "No converter" message.

Preserves: every output's name and value (prepare checks the numerics with onnxruntime).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amptool.errors import error_summary
from amptool.frontend.graph import STANDARD_DOMAINS, Names, all_names, iter_nodes
from amptool.frontend.loop_function import MAX_ITERATIONS
from amptool.frontend.unroll_body import (
    BodyCopier,
    attr_graph,
    attr_int,
    attr_ints,
    constant_value,
    outer_references,
)

log = logging.getLogger(__name__)

#: Longest loop unrolled: past this, the unrolled graph's import and compile time dominate.
MAX_TRIP_COUNT = 1024
#: Most nodes one unrolled loop may add (live body nodes, nested ones included, × N).
MAX_UNROLLED_NODES = 100_000
#: Longest spent counting a loop's iterations past the unroll limit, to learn whether it ends within
#: the run-time bound (onnx's reference evaluator: ~50 µs an iteration).
_COUNTING_SECONDS = 5.0
#: What a user can do when a loop depends on input values: pinned shapes and fixed inputs fold.
_PIN = "pin it with --fixed-input or --input-shape"


class Refusal(Exception):
    """Why a loop cannot be unrolled, as a short clause for a user-facing message."""


class TooLong(Refusal):
    """The loop is known to run past the run-time bound (``loop_function.MAX_ITERATIONS``), or for
    ever: onnxruntime, which prepare runs the model with, would take as long (a constant 10**12 trips
    hung convert), so it is refused up front."""


def unroll_loops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every unrollable Loop/Scan unrolled, and how many were."""
    if not any(n.op_type in ("Loop", "Scan") for n in iter_nodes(model.graph)):
        return model, 0
    unrolled = onnx.ModelProto()
    unrolled.CopyFrom(model)
    walker = _Walker(unrolled, rewrite=True)
    walker.graph(unrolled.graph, {})
    return unrolled, walker.unrolled


def refusals(model: onnx.ModelProto) -> dict[str, str]:
    """``{node name: reason}`` for every Loop/Scan that ``unroll_loops`` leaves in place."""
    return _survey(model).refused


def too_long(model: onnx.ModelProto) -> dict[str, str]:
    """``{node name: reason}`` for the Loops known, before run time, to run past the unroll limit
    (their iterations are counted up to it, no further)."""
    if not any(n.op_type == "Loop" for n in iter_nodes(model.graph)):
        return {}
    return _survey(model).too_long


def _survey(model: onnx.ModelProto) -> _Walker:
    """Every loop of ``model`` judged, none rewritten."""
    walker = _Walker(model, rewrite=False)
    walker.graph(model.graph, {})
    return walker


class _Walker:
    """Visits every graph with the constants in scope; unrolls (or explains) each loop."""

    def __init__(self, model: onnx.ModelProto, rewrite: bool) -> None:
        self.model, self.rewrite = model, rewrite
        self.opset = next((int(o.version) for o in model.opset_import if o.domain in STANDARD_DOMAINS), 1)
        self.names = Names(all_names(model.graph))
        self.unrolled = 0
        self.refused: dict[str, str] = {}
        self.too_long: dict[str, str] = {}
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Static shapes from onnx shape inference, computed on first use (Scan, N = 0)."""
        if self._shapes is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, data_prop=True)
            except Exception as err:  # noqa: BLE001 - shapes are a bonus
                log.debug("shape inference for unrolling failed: %s", err)
                inferred = self.model
            self._shapes = _static_shapes(inferred.graph)
        return self._shapes

    def graph(self, graph: onnx.GraphProto, outer: dict[str, np.ndarray]) -> None:
        known = dict(outer)
        known.update({init.name: numpy_helper.to_array(init) for init in graph.initializer})
        new_nodes: list[onnx.NodeProto] = []
        pending = list(graph.node)
        pending.reverse()
        while pending:
            node = pending.pop()
            if node.op_type == "Constant" and not node.input:
                value = constant_value(node)
                if value is not None:
                    known[node.output[0]] = value
            replacement = self._try_unroll(node, known) if node.op_type in ("Loop", "Scan") else None
            if replacement is not None:
                pending.extend(reversed(replacement))  # nested loops may unroll now
                continue
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    self.graph(sub, known)
            new_nodes.append(node)
        if self.rewrite:
            del graph.node[:]
            graph.node.extend(new_nodes)

    def _try_unroll(self, node: onnx.NodeProto, known: dict[str, np.ndarray]) -> list[onnx.NodeProto] | None:
        try:
            if node.op_type == "Loop":
                trips = _loop_trip_count(node, known, self.model)
                body_nodes = _count_nodes(attr_graph(node, "body"))
            elif self.opset < 9:  # batch × length copies, each element's inputs one Gather more
                batch, length = self._scan8_extent(node, known)
                trips, body_nodes = batch * length, _count_nodes(attr_graph(node, "body")) + 2
            else:
                trips = self._scan_length(node, known)
                body_nodes = _count_nodes(attr_graph(node, "body")) + 1
            if trips * body_nodes > MAX_UNROLLED_NODES:
                raise Refusal(f"unrolling {trips} iterations would add {trips * body_nodes} nodes "
                              f"(limit {MAX_UNROLLED_NODES})")
            if not self.rewrite:
                raise Refusal("it could be unrolled, but prepare's folding was skipped (--no-prepare) or reverted")
            copier = BodyCopier(node, self.names, self.opset)
            if node.op_type == "Scan" and self.opset < 9:
                nodes = copier.scan_batched(batch, length)
            elif node.op_type == "Scan":
                nodes = copier.scan(trips)
            else:
                nodes = copier.loop(trips, self._empty_scans(node) if trips == 0 else [])
        except Refusal as why:
            self.refused[node.name] = str(why)
            if isinstance(why, TooLong):
                self.too_long[node.name] = str(why)
            log.info("%s '%s' not unrolled: %s", node.op_type, node.name, why)
            return None
        self.unrolled += 1
        return nodes

    def _empty_scans(self, node: onnx.NodeProto) -> list[np.ndarray | None]:
        """For a Loop that runs 0 times: each wanted scan output's empty value [0, *element]."""
        body = attr_graph(node, "body")
        carried = len(node.input) - 2
        empties: list[np.ndarray | None] = []
        for j, spec in enumerate(body.output[1 + carried :]):
            wanted = carried + j < len(node.output) and node.output[carried + j]
            empties.append(_empty_scan(spec, self.shapes()) if wanted else None)
        return empties

    def _scan_length(self, node: onnx.NodeProto, known: dict[str, np.ndarray]) -> int:
        axis = (attr_ints(node, "scan_input_axes") or [0])[0]
        return self._checked_length(int(self._first_scan_shape(node, known)[axis]))

    def _scan8_extent(self, node: onnx.NodeProto, known: dict[str, np.ndarray]) -> tuple[int, int]:
        """Opset-8 Scan: (batch, sequence length) — axes 0 and 1 of its scan inputs. Per-element
        ``sequence_lens`` are accepted only when known and all the full length."""
        shape = self._first_scan_shape(node, known)
        batch, length = int(shape[0]), self._checked_length(int(shape[1]))
        if batch == 0:
            raise Refusal("its batch size is 0")
        lens = node.input[0]
        if lens and (lens not in known or np.any(np.asarray(known[lens]) != length)):
            raise Refusal("its sequence_lens are not all the full sequence length (or depend on input values)")
        if batch * length > MAX_TRIP_COUNT:
            raise Refusal(f"batch × sequence length {batch * length} exceeds the unroll limit of {MAX_TRIP_COUNT}")
        return batch, length

    def _first_scan_shape(self, node: onnx.NodeProto, known: dict[str, np.ndarray]) -> tuple[int, ...]:
        m = attr_int(node, "num_scan_inputs", 0)
        first = node.input[len(node.input) - m]
        shape = known[first].shape if first in known else self.shapes().get(first)
        if shape is None:
            raise Refusal("its sequence length is not static; pin input shapes with --input-shape")
        return tuple(shape)

    def _checked_length(self, length: int) -> int:
        if length == 0:
            raise Refusal("its sequence length is 0")
        if length > MAX_TRIP_COUNT:
            raise Refusal(f"its sequence length {length} exceeds the unroll limit of {MAX_TRIP_COUNT}")
        return length


def _loop_trip_count(node: onnx.NodeProto, known: dict[str, np.ndarray], model: onnx.ModelProto) -> int:
    """How many times the Loop runs, decided before run time, or a Refusal saying why not."""
    max_trips = _optional_input(node, 0)
    limit: int | None = None
    if max_trips:
        if max_trips not in known:
            raise Refusal(f"its trip count depends on input values; {_PIN}")
        limit = int(np.asarray(known[max_trips]).reshape(-1)[0])
    cond_name = _optional_input(node, 1)
    cond = True
    if cond_name:
        if cond_name not in known:
            raise Refusal(f"its initial condition depends on input values; {_PIN}")
        cond = bool(np.asarray(known[cond_name]).reshape(-1)[0])
    evaluate = _ConditionEvaluator(node, known, model)
    too_many = Refusal(f"it runs more than the unroll limit of {MAX_TRIP_COUNT} iterations")  # run time runs it
    trips, start = 0, time.monotonic()
    while cond and (limit is None or trips < limit):
        if trips >= MAX_TRIP_COUNT:
            if limit is not None and limit <= MAX_ITERATIONS:
                raise too_many
            if evaluate.unchanging:
                raise TooLong("it has no trip count and a condition that never turns false" if limit is None
                              else f"it runs {limit} iterations, past amptool's bound of {MAX_ITERATIONS}")
            if trips >= MAX_ITERATIONS:
                raise TooLong(f"its condition still holds after amptool's bound of {MAX_ITERATIONS} iterations")
            if time.monotonic() - start > _COUNTING_SECONDS:
                raise too_many  # (undecided: the run-time bound stops it)
        cond = evaluate(trips, cond)
        trips += 1
    if trips > MAX_TRIP_COUNT:
        raise too_many
    return trips


def _passed_through(name: str, source: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """``name`` is ``source`` through Identity nodes only (a condition that never changes)."""
    while name in producers and producers[name].op_type == "Identity":
        name = producers[name].input[0]
    return name == source


class _ConditionEvaluator:
    """Evaluates the body's ``cond_out`` for iteration i from what is known before run time.

    Only the cone of ``cond_out`` is run: the body nodes it depends on, and through
    loop-carried values, the nodes computing those; every leaf must be a constant.
    """

    def __init__(self, node: onnx.NodeProto, known: dict[str, np.ndarray], model: onnx.ModelProto) -> None:
        body = attr_graph(node, "body")
        ins, outs = [v.name for v in body.input], [v.name for v in body.output]
        self.iter_name, self.cond_name, carried_in = ins[0], ins[1], ins[2:]
        self.cond_out = outs[0]
        carried_out = outs[1 : 1 + len(carried_in)]
        producers = {out: n for n in body.node for out in n.output if out}
        inits = {init.name: numpy_helper.to_array(init) for init in body.initializer}
        cone: dict[int, onnx.NodeProto] = {}
        leaves: dict[str, np.ndarray] = {}
        self.carried: dict[str, np.ndarray] = {}  # loop-carried inputs the condition reads → value now
        self.next: dict[str, str] = {}  # ... → the body output that becomes its next value
        seen: set[str] = set()
        stack = [self.cond_out]
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            if name in producers:
                producer = producers[name]
                cone[id(producer)] = producer
                stack.extend(producer.input)
                stack.extend(outer_references(producer))
            elif name in carried_in:
                k = carried_in.index(name)
                initial = node.input[2 + k]
                if initial not in known:
                    raise Refusal(f"its continuation condition depends on input values; {_PIN}")
                self.carried[name] = known[initial]
                self.next[name] = carried_out[k]
                stack.append(carried_out[k])
            elif name in inits:
                leaves[name] = inits[name]
            elif name in known:
                leaves[name] = known[name]
            elif name not in (self.iter_name, self.cond_name):
                raise Refusal(f"its continuation condition depends on input values; {_PIN}")
        self.constant = not cone and self.cond_out not in (self.iter_name, *carried_in)
        self.unchanging = self.constant or _passed_through(self.cond_out, self.cond_name, producers)
        self.wanted = list(dict.fromkeys([self.cond_out, *self.next.values()]))
        self.session = None
        if cone:
            from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

            feeds = [self.iter_name, self.cond_name, *self.carried]
            graph = helper.make_graph(
                [n for n in body.node if id(n) in cone],
                "condition",
                [helper.make_empty_tensor_value_info(n) for n in feeds],
                [helper.make_empty_tensor_value_info(n) for n in self.wanted],
                [numpy_helper.from_array(np.asarray(v), n) for n, v in leaves.items()],
            )
            condition = helper.make_model(graph, opset_imports=list(model.opset_import))
            condition.ir_version = model.ir_version
            self.session = ReferenceEvaluator(condition)
        self.leaves = leaves

    def __call__(self, i: int, cond: bool) -> bool:
        values = {self.iter_name: np.array(i, np.int64), self.cond_name: np.array(cond), **self.carried}
        if self.session is not None:
            try:
                results = self.session.run(None, values)
            except Exception as err:
                reason = error_summary(err, limit=120)
                raise Refusal(f"its continuation condition could not be evaluated ({reason})") from err
            values.update(zip(self.wanted, (np.asarray(r) for r in results)))
        else:
            values.update(self.leaves)
        self.carried = {name: values[out] for name, out in self.next.items()}
        return bool(np.asarray(values[self.cond_out]).reshape(-1)[0])


def _optional_input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _count_nodes(graph: onnx.GraphProto) -> int:
    return sum(1 for _ in iter_nodes(graph))


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            if all(d >= 0 for d in dims):
                shapes[value.name] = tuple(dims)
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                shapes.update(_static_shapes(sub))
    return shapes

def _empty_scan(spec: onnx.ValueInfoProto, shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
    tensor = spec.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    shape = tuple(dims) if tensor.HasField("shape") and all(d >= 0 for d in dims) else shapes.get(spec.name)
    if shape is None or not tensor.elem_type:
        raise Refusal(f"it runs 0 times and scan output '{spec.name}' has no static shape")
    return np.zeros((0, *shape), dtype=helper.tensor_dtype_to_np_dtype(tensor.elem_type))


