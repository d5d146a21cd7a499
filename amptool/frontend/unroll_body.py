"""Copy a loop body N times: renamed tensors, threaded state, stacked scan outputs.

The mechanics behind amptool/frontend/unroll.py, which decides *whether* and *how often*
a `Loop` or `Scan` runs. Copy i of the body reads its inputs from the previous copy (or the
node's initial values), the iteration number, or a `Gather` slice of a scan input; every name
the body defines becomes ``<loop>/<i>/<name>`` (fresh against every name in the model), names
from outer scopes stay. Only the body's live part is copied — the nodes the wanted outputs
depend on (a Loop's ``cond_out`` chain is dead once the trip count is known) — and body
initializers and `Constant` nodes are emitted once per loop, not once per copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amptool.frontend.graph import Names, iter_nodes

#: ``(copy index, previous copy's outputs or None, names the live body reads) → body inputs``.
Feed = Callable[[int, "list[str] | None", "set[str]"], list[str]]


class BodyCopier:
    """Emits the unrolled nodes of one Loop or Scan."""

    def __init__(self, node: onnx.NodeProto, names: Names, opset: int) -> None:
        self.node, self.names, self.opset = node, names, opset
        self.body = attr_graph(node, "body")
        self.tag = node.name or node.op_type
        self.out: list[onnx.NodeProto] = []
        self._consts: dict[tuple[str, bytes], str] = {}

    def const(self, value: np.ndarray, base: str) -> str:
        """A Constant emitted once per loop and value."""
        value = np.asarray(value)
        key = (str(value.dtype) + str(value.shape), value.tobytes())
        if key not in self._consts:
            name = self.names.fresh(f"{self.tag}/{base}")
            tensor = numpy_helper.from_array(value, name)
            self.out.append(helper.make_node("Constant", [], [name], name=self.names.fresh(name), value=tensor))
            self._consts[key] = name
        return self._consts[key]

    def emit(self, op: str, inputs: list[str], base: str, **attrs: Any) -> str:
        name = self.names.fresh(f"{self.tag}/{base}")
        self.out.append(helper.make_node(op, inputs, [name], name=self.names.fresh(name), **attrs))
        return name

    def bind(self, sources: list[str], targets: list[str]) -> None:
        """Give the loop's output names to their values, once every node is emitted.

        A value produced here is renamed, so no `Identity` is needed (Identity takes
        sequence-typed values — a TorchScript loop's list — only from opset 14); an outer
        value, or one bound twice, gets an `Identity`.
        """
        produced = {out for node in self.out for out in node.output}
        renamed: dict[str, str] = {}
        for source, target in zip(sources, targets):
            if not target or not source:
                continue
            if source in produced and source not in renamed:
                renamed[source] = target
                for node in self.out:
                    _rename_reference(node, source, target)
                continue
            name = self.names.fresh(f"{self.tag}/{target}")
            self.out.append(helper.make_node("Identity", [renamed.get(source, source)], [target], name=name))

    def run_body(self, n: int, wanted: list[str], inputs: Feed) -> list[list[str]]:
        """Copy the live part of the body ``n`` times; per copy, the names of the body's outputs.

        ``inputs(i, previous, used)`` names what each body input reads in copy i, given the
        previous copy's outputs (None in copy 0) and the set of names the live nodes read.
        """
        ins = [v.name for v in self.body.input]
        outs = [v.name for v in self.body.output]
        live, used = live_nodes(self.body, wanted) if n else ([], set())
        hoisted: dict[str, str] = {}
        for init in self.body.initializer:
            if init.name in used:
                hoisted[init.name] = self.const(numpy_helper.to_array(init), init.name)
        for body_node in live:
            value = constant_value(body_node) if body_node.op_type == "Constant" else None
            if value is not None:
                hoisted[body_node.output[0]] = self.const(value, body_node.output[0])
        results: list[list[str]] = []
        for i in range(n):
            scope = dict(hoisted)
            fed = inputs(i, results[-1] if results else None, used)
            scope.update({name: value for name, value in zip(ins, fed) if name in used})
            for body_node in live:
                if not (body_node.output and body_node.output[0] in hoisted):
                    self.out.append(copy_node(body_node, scope, self.names, f"{self.tag}/{i}/"))
            results.append([scope.get(name, name) for name in outs])
        return results

    def loop(self, n: int, empties: list[np.ndarray | None]) -> list[onnx.NodeProto]:
        """Body inputs (iteration_num, cond_in, carried…), outputs (cond_out, carried…, scans…).

        ``empties``: for n = 0, each scan output's empty value (None where it is not wanted).
        """
        node, outs = self.node, [v.name for v in self.body.output]
        carried = list(node.input[2:])
        k = len(carried)
        scan_specs = list(self.body.output[1 + k :])

        def inputs(i: int, previous: list[str] | None, used: set[str]) -> list[str]:
            iteration, cond = (self.body.input[j].name for j in (0, 1))
            return [
                self.const(np.array(i, np.int64), f"iteration_{i}") if iteration in used else "",
                self.const(np.array(True), "true") if cond in used else "",
                *(previous[1 : 1 + k] if previous else carried),
            ]

        results = self.run_body(n, outs[1:], inputs)
        outputs = list(node.output) + [""] * (k + len(scan_specs) - len(node.output))
        sources = list(results[-1][1 : 1 + k] if results else carried)
        for j in range(len(scan_specs)):
            empty = empties[j] if j < len(empties) else None
            if not outputs[k + j]:
                sources.append("")
            elif results:
                sources.append(self.stack([r[1 + k + j] for r in results], 0, f"scan_{j}"))
            else:
                sources.append(self.const(empty, f"empty_{j}") if empty is not None else "")
        self.bind(sources, outputs)
        return self.out

    def scan(self, length: int) -> list[onnx.NodeProto]:
        """Body inputs (state…, scan slices…), outputs (state…, scan elements…)."""
        node = self.node
        m = attr_int(node, "num_scan_inputs", 0)
        n_state = len(node.input) - m
        scan_in = list(node.input[n_state:])
        in_axes = attr_ints(node, "scan_input_axes") or [0] * m
        in_dirs = attr_ints(node, "scan_input_directions") or [0] * m
        k = len(self.body.output) - n_state
        out_axes = attr_ints(node, "scan_output_axes") or [0] * k
        out_dirs = attr_ints(node, "scan_output_directions") or [0] * k
        slice_names = [v.name for v in self.body.input[n_state:]]

        def inputs(t: int, previous: list[str] | None, used: set[str]) -> list[str]:
            slices = []
            for j, x in enumerate(scan_in):
                if slice_names[j] not in used:
                    slices.append("")
                    continue
                index = self.const(np.array(length - 1 - t if in_dirs[j] else t, np.int64), f"index_{t}")
                slices.append(self.emit("Gather", [x, index], f"{t}/slice_{j}", axis=in_axes[j]))
            return [*(previous[:n_state] if previous else node.input[:n_state]), *slices]

        results = self.run_body(length, [v.name for v in self.body.output], inputs)
        outputs = list(node.output) + [""] * (len(self.body.output) - len(node.output))
        sources = results[-1][:n_state]
        for j in range(k):
            parts = [r[n_state + j] for r in results]
            if out_dirs[j]:
                parts.reverse()
            sources.append(self.stack(parts, out_axes[j], f"scan_{j}") if outputs[n_state + j] else "")
        self.bind(sources, outputs)
        return self.out

    def scan_batched(self, batch: int, length: int) -> list[onnx.NodeProto]:
        """Opset-8 Scan: inputs (sequence_lens, state…, scan inputs…), each with a leading batch axis
        and scan inputs' time on axis 1; the body sees one batch element. Per element b, the body is
        copied ``length`` times on ``Gather`` slices of element b; results are stacked on axis 0."""
        node = self.node
        n_state = len(node.input) - 1 - attr_int(node, "num_scan_inputs", 0)
        outputs = list(node.output) + [""] * (len(self.body.output) - len(node.output))
        per_batch = [self._scan_element(b, length, n_state, outputs) for b in range(batch)]
        sources = [self.stack([row[j] for row in per_batch], 0, f"batch_out_{j}") if out else ""
                   for j, out in enumerate(outputs)]
        self.bind(sources, outputs)
        return self.out

    def _scan_element(self, b: int, length: int, n_state: int, outputs: list[str]) -> list[str]:
        """Opset-8 Scan on batch element ``b``: its final states and stacked scan outputs."""
        values = list(self.node.input[1:])
        dirs = attr_ints(self.node, "directions") or [0] * (len(values) - n_state)
        row = self.const(np.array(b, np.int64), f"batch_{b}")
        slice_names = [v.name for v in self.body.input[n_state:]]
        read = live_nodes(self.body, [v.name for v in self.body.output])[1]
        needed = [j < n_state or slice_names[j - n_state] in read for j in range(len(values))]
        element = [self.emit("Gather", [x, row], f"{b}/input_{j}", axis=0) if x and needed[j] else ""
                   for j, x in enumerate(values)]

        def inputs(t: int, previous: list[str] | None, used: set[str]) -> list[str]:
            slices = []
            for j, x in enumerate(element[n_state:]):
                if slice_names[j] not in used:
                    slices.append("")
                    continue
                index = self.const(np.array(length - 1 - t if dirs[j] else t, np.int64), f"index_{t}")
                slices.append(self.emit("Gather", [x, index], f"{b}/{t}/slice_{j}", axis=0))
            return [*(previous[:n_state] if previous else element[:n_state]), *slices]

        results = self.run_body(length, [v.name for v in self.body.output], inputs)
        scans = [self.stack([r[j] for r in results], 0, f"{b}/scan_{j}") if outputs[j] else ""
                 for j in range(n_state, len(outputs))]
        return [*results[-1][:n_state], *scans]

    def stack(self, parts: list[str], axis: int, base: str) -> str:
        """Unsqueeze each part on ``axis`` and concatenate along it."""
        if self.opset >= 13:
            axes = self.const(np.array([axis], np.int64), f"axes_{axis}")
            expanded = [self.emit("Unsqueeze", [p, axes], f"{base}/unsqueeze") for p in parts]
        else:
            expanded = [self.emit("Unsqueeze", [p], f"{base}/unsqueeze", axes=[axis]) for p in parts]
        return self.emit("Concat", expanded, f"{base}/concat", axis=axis)


def _rename_reference(node: onnx.NodeProto, old: str, new: str) -> None:
    """Rename value ``old`` to ``new`` wherever ``node`` (or a subgraph in it) reads or writes it."""
    node.input[:] = [new if name == old else name for name in node.input]
    node.output[:] = [new if name == old else name for name in node.output]
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in sub.node:
                _rename_reference(inner, old, new)
            for value in sub.output:
                if value.name == old:
                    value.name = new


def copy_node(node: onnx.NodeProto, scope: dict[str, str], names: Names, prefix: str) -> onnx.NodeProto:
    """A copy of ``node`` reading renamed inputs; its outputs get fresh names added to ``scope``."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = [scope.get(name, name) if name else name for name in node.input]
    for attr in copy.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            attr.g.CopyFrom(copy_graph(attr.g, scope, names, prefix))
        for sub in attr.graphs:
            sub.CopyFrom(copy_graph(sub, scope, names, prefix))
    for index, name in enumerate(node.output):
        if name:
            scope[name] = copy.output[index] = names.fresh(prefix + name)
    copy.name = names.fresh(prefix + (node.name or node.op_type))
    return copy


def copy_graph(graph: onnx.GraphProto, outer: dict[str, str], names: Names, prefix: str) -> onnx.GraphProto:
    """A subgraph with every name it defines renamed; references to outer names follow ``outer``."""
    scope = dict(outer)
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    for value in list(copy.input) + list(copy.initializer):
        scope[value.name] = value.name = names.fresh(prefix + value.name)
    del copy.node[:]
    copy.node.extend(copy_node(n, scope, names, prefix) for n in graph.node)
    for value in list(copy.output) + list(copy.value_info):
        value.name = scope.get(value.name, value.name)
    return copy


def live_nodes(body: onnx.GraphProto, wanted: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The body nodes the wanted outputs depend on (in order), and every name they read."""
    used = set(wanted)
    live = []
    for node in reversed(body.node):
        if any(out in used for out in node.output if out):
            live.append(node)
            used.update(name for name in node.input if name)
            used.update(outer_references(node))
    live.reverse()
    return live, used


def outer_references(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read (an over-approximation: inner names included)."""
    names: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in iter_nodes(sub):
                names.update(name for name in inner.input if name)
            names.update(v.name for v in sub.output)
    return names


def attr_graph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == name)


def attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def attr_ints(node: onnx.NodeProto, name: str) -> list[int]:
    return next(([int(v) for v in a.ints] for a in node.attribute if a.name == name), [])


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
            dtype = np.float32 if attr.name.startswith("value_float") else np.int64
            return np.array(helper.get_attribute_value(attr), dtype=dtype)
    return None  # sparse or string constants


