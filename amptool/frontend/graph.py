"""Facts about an ONNX graph every frontend stage shares: walking nested subgraphs, the default
opset, fresh names, and the Relax identifier each ONNX node's bindings are named after.

Its own module because load, prepare, the unrollers, the importer and the Gradient lowering all
need them, and none of those should import another only for a helper (that made import cycles).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import onnx

STANDARD_DOMAINS = ("", "ai.onnx")
TRAINING_DOMAIN = "ai.onnx.preview.training"


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """All nodes, including those inside If/Loop/Scan subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            for sub in attr.graphs:
                yield from iter_nodes(sub)


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every name ``graph`` uses — values, initializers, nodes and node outputs, nested subgraphs
    included: what a fresh name (``Names``) must avoid."""
    names = {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names.update(init.name for init in graph.initializer)
    for node in graph.node:
        names.add(node.name)
        names.update(node.output)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names |= all_names(sub)
    return names


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in STANDARD_DOMAINS:
            return int(imp.version)
    return 1


def declared_dims(graph: onnx.GraphProto, name: str) -> list[int | None] | None:
    """The dims ``graph`` declares for ``name`` (an input, output or value_info: what shape inference
    wrote), None for a dim without a value; None for an unknown rank."""
    for value in [*graph.value_info, *graph.output, *graph.input]:
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
    return None


@dataclass(frozen=True)
class Names:
    """Names already used anywhere in the model, and fresh ones derived from a base."""

    taken: set[str]

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def identifier(name: str) -> str:
    """A Relax-friendly identifier for an ONNX name ('/layer1/0/Conv' → 'layer1_0_Conv')."""
    text = re.sub(r"\W+", "_", name).strip("_") or "node"
    return text if (text[0].isalpha() or text[0] == "_") else f"n_{text}"
