"""Calibration for the range guards: how large, how small and how cancelling is each node's data?

Weights can be checked by reading them; activations only by running the model. amptool runs
the prepared fp32 model once in onnxruntime with every main-graph tensor exposed as an
output and records max |x| per ONNX node over its outputs and its non-constant inputs — so a
Conv fed by a 1e20 activation is flagged even if its own output were small. The pass then
keeps every op whose node's peak exceeds the policy's ``activation_max`` in float32
(NVIDIA ModelOpt AutoCast's ``data_max`` rule). Tensors inside If/Loop bodies cannot be
exposed and are not calibrated.

The same run gives the cancellation guard its evidence: for every Add/Sub, how far below its
operands' magnitude the result lands (``cancellation_ratio``). Pixel-coordinate grids of ~500
subtracted into flows of ~1 (RAFT's ``flow = coords1 - coords0``) keep a handful of the low
dtype's significand bits; the values are small, so the activation guard cannot see it. Such an
op must run in float32 *and* read float32 operands, so the nodes that produce its operands
(through reshapes and other data movement) are recorded with it. And it records how small each
node's non-zero outputs get (``Floor``), for ``inspect --headroom``'s underflow margins.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool.dtypes import DTYPE_NORMAL, DTYPE_TINY
from amptool.errors import error_summary
from amptool.runtime.onnxruntime_runner import every_tensor

log = logging.getLogger(__name__)


#: Ops whose result can cancel: the cancellation guard measures these (Sum when it adds two).
CANCELLING_OPS = frozenset({"Add", "Sub", "Sum"})
#: Ops that move values without arithmetic: the guard walks through them to the op that made
#: a cancelling op's operand (a reshaped coordinate grid is as exact as the grid).
_DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice",
                            "Gather", "Concat", "Expand", "Tile", "Split", "Pad", "Cast"})
#: The percentile of the per-element ratios a node reports: robust to a few zero crossings.
CANCELLATION_PERCENTILE = 99.0


@dataclass(frozen=True)
class Floor:
    """How small a node's non-zero outputs get, against each low dtype's smallest values."""

    nonzero: int = 0
    min_nonzero: float = float("inf")
    subnormal: dict[str, int] = field(default_factory=dict)  # dtype → count below its smallest normal
    flushed: dict[str, int] = field(default_factory=dict)  # dtype → count below half its smallest subnormal

    def merged(self, other: Floor) -> Floor:
        return Floor(self.nonzero + other.nonzero, min(self.min_nonzero, other.min_nonzero),
                     {d: self.subnormal.get(d, 0) + other.subnormal.get(d, 0) for d in DTYPE_NORMAL},
                     {d: self.flushed.get(d, 0) + other.flushed.get(d, 0) for d in DTYPE_TINY})


@dataclass(frozen=True)
class Cancellation:
    """An Add/Sub's measured cancellation and the nodes that make its operands."""

    ratio: float  # CANCELLATION_PERCENTILE of max(|a|,|b|) / max(|result|, rms(result)) over elements
    feeds: tuple[str, ...] = ()  # nodes producing its non-constant operands (through data movement)


@dataclass
class Calibration:
    """Per-node activation peaks, floors and cancellation ratios, or why there are none."""

    peaks: dict[str, float] = field(default_factory=dict)  # ONNX node name → max |x|
    source: str = "generated"  # "generated" (seeded) or the --calibration path
    skipped: str | None = None
    floors: dict[str, Floor] = field(default_factory=dict)  # ONNX node name → its outputs' smallest values
    cancellation: dict[str, Cancellation] = field(default_factory=dict)  # Add/Sub node name → ratio

    def cancellation_json(self, limit: float) -> dict[str, object]:
        """The cancellation guard's summary (manifest, inspect): what was measured, what tripped."""
        over = sorted(name for name, c in self.cancellation.items() if c.ratio > limit)
        return {
            "source": self.source,
            "limit": limit,
            "nodes_measured": len(self.cancellation),
            "nodes_over_limit": len(over),
            "max_ratio": max((c.ratio for c in self.cancellation.values()), default=None),
            "skipped": self.skipped,
        }

    def as_json(self, limit: float) -> dict[str, object]:
        over = sum(1 for v in self.peaks.values() if v > limit)
        return {
            "source": self.source,
            "limit": limit,
            "nodes_calibrated": len(self.peaks),
            "nodes_over_limit": over,
            "skipped": self.skipped,
        }


def activation_peaks(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], source: str,
                     values: Mapping[str, Any] | None = None) -> Calibration:
    """Run ``model`` with all main-graph tensors exposed; max |x| per node (finite or not).
    ``values``: those tensors from a run on ``feeds`` already made (prepare's check-numerics)."""
    from amptool.frontend.gradient import forward_only, has_gradients  # noqa: PLC0415

    # onnxruntime cannot run Gradient nodes: calibrate the forward graph. Recomputed forward
    # bindings carry their forward node's name, so they are guarded; backward ones are not.
    # Read only: no copy (BERT-base's was 0.28 s of a convert).
    probe = forward_only(model) if has_gradients(model) else model
    constants = {init.name for init in probe.graph.initializer}
    constants |= {o for n in probe.graph.node if n.op_type == "Constant" for o in n.output}
    try:
        if values is None:
            values = every_tensor(probe, feeds)
    except Exception as err:  # noqa: BLE001 - calibration is a guard, not a requirement: say why it is off
        reason = error_summary(err, limit=200)
        log.info("activation calibration skipped: %s", reason)
        return Calibration(source=source, skipped=reason)
    tensor_peak = {name: _peak(value) for name, value in values.items()}
    tensor_peak.update({k: _peak(v) for k, v in feeds.items()})
    peaks: dict[str, float] = {}
    floors: dict[str, Floor] = {}
    for node in probe.graph.node:
        seen = [tensor_peak[t] for t in [*node.input, *node.output] if t in tensor_peak and t not in constants]
        if seen and node.name:
            peaks[node.name] = max(seen)
        outputs = [_floor(values[t]) for t in node.output if t in values]
        if outputs and node.name:
            floors[node.name] = functools.reduce(Floor.merged, outputs)
    cancellation = _cancellations(probe.graph, {**values, **feeds}, constants)
    return Calibration(peaks=peaks, source=source, floors=floors, cancellation=cancellation)


def cancellation_ratio(a: np.ndarray, b: np.ndarray, result: np.ndarray) -> float | None:
    """How many times smaller than its operands ``result`` (= a ± b) is, robustly; None if unmeasurable.

    Rounding the operands to the low dtype costs each element an error of about eps·max(|a|,|b|);
    that error matters against the result's magnitude, floored at the result's RMS over the tensor
    so that the few elements crossing zero in a sum of mixed signs (a residual add) count as
    typical results. The CANCELLATION_PERCENTILE of the ratio over elements with a non-zero
    operand is the node's ratio. A result that is 0 everywhere has no scale: unmeasured.
    """
    arrays = [np.asarray(v) for v in (a, b, result)]
    if any(x.dtype.kind != "f" for x in arrays):
        return None
    try:
        operand = np.broadcast_to(np.maximum(np.abs(arrays[0]), np.abs(arrays[1])), arrays[2].shape)
    except ValueError:  # a shape onnxruntime broadcast differently: nothing to compare element-wise
        return None
    magnitude = np.abs(arrays[2])
    keep = np.isfinite(operand) & np.isfinite(magnitude) & (operand > 0)
    operand, magnitude = operand[keep].astype(np.float64), magnitude[keep].astype(np.float64)
    if operand.size == 0:
        return None
    rms = float(np.sqrt(np.mean(np.square(magnitude))))
    if not rms > 0:
        return None
    return float(np.percentile(operand / np.maximum(magnitude, rms), CANCELLATION_PERCENTILE))


def _cancellations(graph: onnx.GraphProto, values: Mapping[str, Any], constants: set[str]) -> dict[str, Cancellation]:
    """Each named Add/Sub's cancellation ratio, with the nodes that make its operands."""
    from onnx import numpy_helper  # noqa: PLC0415

    producer = {out: node for node in graph.node for out in node.output if out}
    # Only the constant operands of Add/Sub: every weight as an array was 0.11 s of a ResNet-50 convert.
    wanted = {t for node in graph.node if node.op_type in CANCELLING_OPS for t in node.input if t in constants}
    constant_values: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if init.name in wanted:
            constant_values[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if (node.op_type == "Constant" and node.output and node.output[0] in wanted and node.attribute
                and node.attribute[0].name == "value"):
            constant_values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    found: dict[str, Cancellation] = {}
    for node in graph.node:
        if node.op_type not in CANCELLING_OPS or not node.name or len(node.input) != 2:
            continue
        operands = [values.get(t, constant_values.get(t)) for t in node.input]
        result = values.get(node.output[0])
        if result is None or any(v is None for v in operands):
            continue
        ratio = cancellation_ratio(operands[0], operands[1], result)
        if ratio is not None:
            moving = [t for t in node.input if t not in constants]
            found[node.name] = Cancellation(ratio, _producers(moving, producer, constants))
    return found


def _producers(tensors: list[str], producer: Mapping[str, onnx.NodeProto], constants: set[str]) -> tuple[str, ...]:
    """The nodes that compute ``tensors``, walking through data movement to the arithmetic behind it."""
    found: list[str] = []
    stack = list(tensors)
    while stack:
        node = producer.get(stack.pop())
        if node is None or not node.name or node.name in found:
            continue
        found.append(node.name)
        if node.op_type in _DATA_MOVEMENT:
            data = node.input if node.op_type == "Concat" else node.input[:1]
            stack.extend(t for t in data if t and t not in constants)
    return tuple(found)


def _floor(value: object) -> Floor:
    """Non-zero count, smallest non-zero |x| and the counts below each low dtype's smallest values."""
    if isinstance(value, (list, tuple)):  # sequence outputs
        return functools.reduce(Floor.merged, (_floor(v) for v in value), Floor())
    array = np.asarray(value)
    if array.dtype.kind != "f" or array.size == 0:
        return Floor()
    magnitude = np.abs(array[np.isfinite(array)])
    nonzero = magnitude[magnitude > 0]
    if nonzero.size == 0:
        return Floor()
    return Floor(int(nonzero.size), float(nonzero.min()),
                 {d: int(np.count_nonzero(nonzero < v)) for d, v in DTYPE_NORMAL.items()},
                 {d: int(np.count_nonzero(nonzero < v / 2)) for d, v in DTYPE_TINY.items()})


def _peak(value: object) -> float:
    if isinstance(value, (list, tuple)):  # sequence outputs
        return max((_peak(v) for v in value), default=0.0)
    array = np.asarray(value)
    if array.dtype.kind != "f" or array.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        finite = np.abs(array[~np.isnan(array)])
    return float(finite.max()) if finite.size else 0.0
