"""Seeded model inputs: floats, valid integer indices, booleans — or arrays from a file.

Random integers are not valid token ids, and random floats are not masks. So integer
inputs that feed a ``Gather`` (through casts/reshapes) as indices get ``[0, rows)`` of
the gathered table; integer inputs named like masks get ones; other integers ``[0, 10)``;
bool inputs get random booleans; floats a standard normal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx

from amptool.errors import UserError
from amptool.fileio import atomic_path
from amptool.frontend.signature import TensorSpec

#: Ops an index may pass through on its way to Gather without changing its values.
_TRANSPARENT = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
DEFAULT_INT_HIGH = 10


def index_ranges(model: onnx.ModelProto) -> dict[str, int]:
    """Input name → exclusive upper bound for inputs used as Gather indices."""
    graph = model.graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    bounds: dict[str, int] = {}
    for value in graph.input:
        frontier, seen = [value.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                if node.op_type in _TRANSPARENT:
                    frontier.extend(node.output)
                elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
                    table = shapes.get(node.input[0])
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if table:
                        rows = int(table[axis])
                        bounds[value.name] = min(bounds.get(value.name, rows), rows)
    return bounds


def generate_inputs(
    specs: Sequence[TensorSpec], model: onnx.ModelProto, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    bounds = index_ranges(model)
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(int(d) for d in (spec.shape or ()))
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            arrays[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arrays[spec.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            if spec.name in bounds:
                arrays[spec.name] = rng.integers(0, max(bounds[spec.name], 1), shape).astype(dtype)
            elif "mask" in spec.name.lower():
                arrays[spec.name] = np.ones(shape, dtype=dtype)
            else:
                arrays[spec.name] = rng.integers(0, DEFAULT_INT_HIGH, shape).astype(dtype)
        else:
            raise UserError(f"Input '{spec.name}' has dtype {spec.dtype}, which amptool cannot generate")
    return arrays


def load_inputs(path: str, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Arrays from an .npz; every model input must be there with a matching dtype."""
    if not os.path.isfile(path):
        raise UserError(f"Inputs file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files}
    except Exception as err:
        raise UserError(f"{path} is not a readable .npz file ({type(err).__name__})",
                        "Save inputs with numpy.savez(path, name=array, ...).") from err
    names = [s.name for s in specs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise UserError(
            f"{path} has no array for input(s) {', '.join(missing)}",
            f"Arrays found: {', '.join(arrays) or '(none)'}; model inputs: {', '.join(names)}.",
        )
    for spec in specs:
        want = np.dtype(spec.dtype)
        if arrays[spec.name].dtype != want:
            raise UserError(
                f"{path}: array '{spec.name}' is {arrays[spec.name].dtype}, the model expects {want}",
                f"Save it with .astype('{want}').",
            )
    return {n: arrays[n] for n in names}


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write an .npz atomically (temporary file, then rename)."""
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
