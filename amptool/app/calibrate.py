"""Calibration for the activation range guard: how large does each node's data get?

Weights can be checked by reading them; activations only by running the model. amptool runs
the prepared fp32 model once in onnxruntime with every main-graph tensor exposed as an
output and records max |x| per ONNX node over its outputs and its non-constant inputs — so a
Conv fed by a 1e20 activation is flagged even if its own output were small. The pass then
keeps every op whose node's peak exceeds the policy's ``activation_max`` in float32
(NVIDIA ModelOpt AutoCast's ``data_max`` rule). Tensors inside If/Loop bodies cannot be
exposed and are not calibrated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from amptool.errors import error_summary
from amptool.runtime.onnxruntime_runner import every_tensor

log = logging.getLogger(__name__)


@dataclass
class Calibration:
    """Per-node activation peaks, or why there are none."""

    peaks: dict[str, float] = field(default_factory=dict)  # ONNX node name → max |x|
    source: str = "generated"  # "generated" (seeded) or the --calibration path
    skipped: str | None = None

    def as_json(self, limit: float) -> dict[str, object]:
        over = sum(1 for v in self.peaks.values() if v > limit)
        return {
            "source": self.source,
            "limit": limit,
            "nodes_calibrated": len(self.peaks),
            "nodes_over_limit": over,
            "skipped": self.skipped,
        }


def activation_peaks(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], source: str) -> Calibration:
    """Run ``model`` with all main-graph tensors exposed; max |x| per node (finite or not)."""
    from amptool.frontend.gradient import forward_only, has_gradients  # noqa: PLC0415

    probe = onnx.ModelProto()
    # onnxruntime cannot run Gradient nodes: calibrate the forward graph. Recomputed forward
    # bindings carry their forward node's name, so they are guarded; backward ones are not.
    probe.CopyFrom(forward_only(model) if has_gradients(model) else model)
    constants = {init.name for init in probe.graph.initializer}
    constants |= {o for n in probe.graph.node if n.op_type == "Constant" for o in n.output}
    try:
        values = every_tensor(probe, feeds)
    except Exception as err:  # noqa: BLE001 - calibration is a guard, not a requirement: say why it is off
        reason = error_summary(err, limit=200)
        log.info("activation calibration skipped: %s", reason)
        return Calibration(source=source, skipped=reason)
    tensor_peak = {name: _peak(value) for name, value in values.items()}
    tensor_peak.update({k: _peak(v) for k, v in feeds.items()})
    peaks: dict[str, float] = {}
    for node in probe.graph.node:
        seen = [tensor_peak[t] for t in [*node.input, *node.output] if t in tensor_peak and t not in constants]
        if seen and node.name:
            peaks[node.name] = max(seen)
    return Calibration(peaks=peaks, source=source)


def _peak(value: object) -> float:
    if isinstance(value, (list, tuple)):  # sequence outputs
        return max((_peak(v) for v in value), default=0.0)
    array = np.asarray(value)
    if array.dtype.kind != "f" or array.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        finite = np.abs(array[~np.isnan(array)])
    return float(finite.max()) if finite.size else 0.0
