"""Graph inputs whose *values* decide output shapes: Reduce* ``axes``, Resize ``sizes``/``scales``,
Pad ``pads``, Reshape/Expand ``shape``, Split ``split``, Slice ``starts``/``ends``, TopK ``K``, ….

Relax types every tensor with a shape known at import, so an operand like these must be a constant;
fed by a graph input, the import (or TVM's constant folding) refuses. When the value is known at
build time — ``diff --inputs FILE.npz``, or ``--fixed-input NAME=VALUE`` — the input can be fixed
to it and folds away. This module finds such inputs, once, for every caller: the diff path pins them
from its arrays (:func:`pins_from_arrays`); the importer names them in a refusal's hint
(:func:`inputs_deciding_node`).

An input *reaches* a shape operand directly or through value-preserving ops (Cast, Identity,
Unsqueeze, Squeeze, Concat, Reshape's data operand) and elementwise arithmetic (Add, Sub, Max,
Div, Ceil, …, Gather/Slice of a vector). Integer and bool inputs that reach one are pinned; a float
input only when every use leads to such an operand (Resize scales), never data that also feeds
anything else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from amptool.dtypes import numpy_dtype
from amptool.frontend.graph import STANDARD_DOMAINS, iter_nodes
from amptool.frontend.signature import TensorSpec

_REDUCE = ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceProd",
           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
#: op type → {operand index: operand name} for operands whose value decides an output shape
#: (or that TVM's ONNX frontend needs as a constant to import the op at all)
SHAPE_OPERANDS: dict[str, dict[int, str]] = {
    **{op: {1: "axes"} for op in _REDUCE},
    "Resize": {1: "roi", 2: "scales", 3: "sizes"},
    "Upsample": {1: "scales"},
    "Pad": {1: "pads", 3: "axes"},
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Split": {1: "split"},
    "SplitToSequence": {1: "split"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "TopK": {1: "K"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
    "ConstantOfShape": {0: "shape"},
    "OneHot": {1: "depth"},
    "Range": {0: "start", 1: "limit", 2: "delta"},
    "CenterCropPad": {1: "shape"},
    "Loop": {0: "M", 1: "cond"},  # a trip count known at build time lets prepare unroll the loop
    "Col2Im": {1: "image_shape", 2: "block_shape"},
    "AffineGrid": {1: "size"},
    "DFT": {1: "dft_length", 2: "axis"},
    "STFT": {1: "frame_step", 3: "frame_length"},
    **{op: {0: "size"} for op in ("HannWindow", "HammingWindow", "BlackmanWindow")},
    "MelWeightMatrix": {0: "num_mel_bins", 1: "dft_length", 2: "sample_rate", 3: "lower_edge", 4: "upper_edge"},
}
#: op type → operand indices whose value reaches the output (None: every operand): value-preserving
#: ops, and the integer arithmetic exporters wrap around sizes (CenterCropPad's ``(shape - crop) / 2``,
#: Range's ``ceil((limit - start) / delta)``), so the input behind such arithmetic is the one pinned
_PASS_THROUGH: dict[str, tuple[int, ...] | None] = {
    "Cast": None, "CastLike": (0,), "Identity": None, "Unsqueeze": (0,), "Squeeze": (0,), "Concat": None,
    "Reshape": (0,),
    **{op: None for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mod", "Neg", "Abs", "Ceil", "Floor",
                           "Round", "Relu")},
    "Gather": (0,), "Slice": (0,), "Clip": (0,), "Split": (0,),
}


@dataclass
class ShapeUse:
    """Where one graph input's value decides shapes: ``labels`` like "ReduceSum axes", the deciding
    nodes' names, and whether it also feeds anything else (arithmetic, a graph output)."""

    labels: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    other_uses: bool = False


def shape_uses(model: onnx.ModelProto) -> dict[str, ShapeUse]:
    """Per graph input (initializers excluded) that reaches a shape operand: how it does."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    # An If branch's output is the If's: a value its branches compute from an outer tensor (AffineGrid's
    # function splits ``size`` into N, C, H, W in both branches) reaches on through the If.
    branch_results: dict[str, list[str]] = {}
    for node in iter_nodes(model.graph):
        for index, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, index))
        if node.op_type == "If" and node.domain in STANDARD_DOMAINS:
            for branch in (a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH):
                for inner, outer in zip(branch.output, node.output, strict=False):
                    if outer:
                        branch_results.setdefault(inner.name, []).append(outer)
    outputs = {o.name for o in model.graph.output}
    weights = {init.name for init in model.graph.initializer}
    found: dict[str, ShapeUse] = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        use = ShapeUse()
        frontier, seen = [value.name], {value.name}
        while frontier:
            tensor = frontier.pop()
            use.other_uses |= tensor in outputs
            fresh_results = [out for out in branch_results.get(tensor, ()) if out not in seen]
            seen.update(fresh_results)
            frontier.extend(fresh_results)
            for node, index in consumers.get(tensor, []):
                standard = node.domain in STANDARD_DOMAINS
                operand = SHAPE_OPERANDS.get(node.op_type, {}).get(index) if standard else None
                passes = _PASS_THROUGH.get(node.op_type, ()) if standard else ()
                if operand is not None:
                    label = f"{node.op_type} {operand}"
                    if label not in use.labels:
                        use.labels.append(label)
                    if node.name not in use.nodes:
                        use.nodes.append(node.name)
                elif passes is None or index in (passes or ()):
                    fresh = [out for out in node.output if out and out not in seen]
                    seen.update(fresh)
                    frontier.extend(fresh)
                else:
                    use.other_uses = True
        if use.labels:
            found[value.name] = use
    return found


def pinnable(spec: TensorSpec, use: ShapeUse) -> bool:
    """Integer and bool inputs that reach a shape operand (or a Loop's trip count / condition); float
    ones only when that is all they feed."""
    try:
        kind = numpy_dtype(spec.dtype).kind
    except Exception:  # noqa: BLE001 - a dtype numpy cannot name (string, bfloat16 …) is never pinned
        return False
    return kind in "iub" or (kind == "f" and not use.other_uses)


def pins_from_arrays(model: onnx.ModelProto, specs: Sequence[TensorSpec], arrays: Mapping[str, np.ndarray],
                     already: Collection[str] = ()) -> dict[str, tuple[np.ndarray, ShapeUse]]:
    """The inputs to fix from ``arrays`` (those of ``specs`` that decide shapes, not in ``already``),
    each with its value and how it decides shapes."""
    uses = shape_uses(model)
    pins: dict[str, tuple[np.ndarray, ShapeUse]] = {}
    for spec in specs:
        use = uses.get(spec.name)
        if use is None or spec.name in already or spec.name not in arrays or not pinnable(spec, use):
            continue
        pins[spec.name] = (np.asarray(arrays[spec.name]), use)
    return pins


def inputs_deciding_node(model: onnx.ModelProto, node_name: str) -> list[str]:
    """The graph inputs whose values reach a shape operand of node ``node_name``."""
    return [name for name, use in shape_uses(model).items() if node_name in use.nodes]


def fixed_input_hint(names: Sequence[str]) -> str:
    """The hint of a refusal that a known value of ``names`` would avoid."""
    flags = " ".join(f"--fixed-input {name}=VALUE" for name in names)
    return (f"Input(s) {', '.join(repr(n) for n in names)} decide output shapes: pin them with {flags} "
            "(amptool diff --inputs FILE.npz pins them from the file).")


def value_preview(value: np.ndarray, limit: int = 8) -> str:
    """``[1]``, ``[0, 0, 1, 1]``, ``[1.0, 2.0, …]`` (first ``limit`` values) for a log line."""
    flat = np.asarray(value).ravel().tolist()
    text = ", ".join(str(v) for v in flat[:limit])
    return f"[{text}{', …' if len(flat) > limit else ''}]"
