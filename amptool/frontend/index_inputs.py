"""Graph inputs that index a table: how many rows each may address, so a run can refuse a value past them.

What: ``index_limits`` finds each integer graph input that is — itself, or through a Cast — the indices
of a Gather, GatherElements or ScatterElements over a constant table (a word embedding read with
``input_ids``), and returns the number of rows along the indexed axis (the smallest, when it indexes
several); the manifest keeps them (``index_inputs``) and the runtime's ``check_index_inputs`` refuses a
feed holding a value outside ``[-rows, rows)``.

Why: the kernels clamp such an index (``index_bounds.py``: no crash), which gives a wrong answer
silently; onnxruntime refuses the run. A token id past the vocabulary is the common case, and an
input's values are all that is needed to say so — one line naming the input, the value and the table.
"""

from __future__ import annotations

import onnx

from amptool.frontend.graph import STANDARD_DOMAINS

#: op type → (index operand, table operand): the ops whose indices address a table's axis ``axis``.
_INDEXING = {"Gather": (1, 0), "GatherElements": (1, 0), "ScatterElements": (1, 0)}
_INTEGER = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                      onnx.TensorProto.INT8, onnx.TensorProto.UINT64, onnx.TensorProto.UINT32,
                      onnx.TensorProto.UINT16, onnx.TensorProto.UINT8})


def index_limits(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph input → rows of the smallest constant table it indexes (see the module docstring)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name for v in graph.input if v.name not in initializers
              and v.type.tensor_type.elem_type in _INTEGER}
    tables = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = list(value.dims)
    source = {n.output[0]: n.input[0] for n in graph.node
              if n.op_type in ("Cast", "Identity") and n.domain in STANDARD_DOMAINS and n.input and n.output}
    limits: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in _INDEXING or node.domain not in STANDARD_DOMAINS:
            continue
        at, table = _INDEXING[node.op_type]
        if len(node.input) <= at or node.input[table] not in tables:
            continue
        name = node.input[at]
        name = source.get(name, name)
        dims = tables[node.input[table]]
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
        if name not in inputs or not dims or not -len(dims) <= axis < len(dims):
            continue
        rows = int(dims[axis])
        limits[name] = min(rows, limits.get(name, rows))
    return limits
