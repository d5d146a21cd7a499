"""Per-layer error: which ONNX node made the converted model drift from float32?

Both sides are run with their intermediate tensors exposed. onnxruntime runs the *prepared*
model (the one that was imported: same node names, numerics checked equal to the original)
with every main-graph tensor added as a graph output and optimisations off, so no tensor is
fused away. The converted side is the *probe module* (``amptool.app.probe``): the rewritten
Relax module whose ``main`` also returns every binding named after an ONNX node, cast to
float32, compiled like any other. Outputs whose shapes disagree are skipped and counted.

Error and jumps. Each pair is compared in float64 with ``compare.stats``' definitions
(``layer_stats``: only what a layer needs). A node's error is measured relative to its
tensor's magnitude, with a floor so that tiny tensors do not look broken:
``rel_err = max_abs / (max|ref| + atol/rtol)`` (atol/rtol of the dtype's tolerance: 0.1 for
float16), i.e. the tolerance's own notion of "relative, unless small"; ``rms_rel`` is the
same with the RMS of the error and of the reference. Error *jumps* at a node when, with no
such problem on its inputs already,
  * ``nonfinite``: NaN/Inf appear where the reference is finite;
  * ``cosine``: cosine (judged as ``diff`` judges it) falls below ``min_cosine``;
  * ``growth``: ``rel_err`` exceeds 10× the worst ``rel_err`` of its inputs, floored at the
    dtype's unit roundoff (2⁻¹¹ for float16) — one rounding of an exact input is not a jump —
    and ``rms_rel`` grows 10× too. The max-based ratio alone rises whenever an op shrinks its
    tensor's range: errors carried from a wide input are then measured against a narrow
    output (nudenet's first Sigmoids, a correct conversion, reached 13–37× with an RMS growth
    of 0.9–2; PP-OCRv4 rec's Clips 9×). Errors that truly jump grow in bulk.
An input that was not probed carries the worst error of the inputs of the node producing
it. Nodes are listed in the graph's (topological) order; ``first_jump`` is the first node
that jumped. ``amptool.app.fallback`` ranks candidates by ``rms_growth``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool.app.probe import Probe, compile_probed
from amptool.compare.tolerance import Tolerance, default_tolerance
from amptool.errors import UserError, error_summary
from amptool.runtime.onnxruntime_runner import every_tensor

#: A node's relative error must grow by more than this over its inputs' to be a jump.
JUMP_GROWTH = 10.0
#: Unit roundoff (half an ulp of 1.0): the relative error of one rounding.
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
#: Layer keys always present in the JSON.
LAYER_KEYS = ("node", "op_type", "output", "var", "dtype", "shape", "max_abs", "max_ref", "rel_err", "rms_rel",
              "cosine", "nan", "inf", "new_nonfinite", "low_cosine", "growth", "rms_growth", "jump", "jump_reason")


@dataclass
class LayerReport:
    """Per-node errors in topological order; ``skipped`` counts node outputs not compared, by reason."""

    dtype: str
    tolerance: Tolerance
    layers: list[dict[str, Any]]
    skipped: dict[str, int] = field(default_factory=dict)
    floor: float = 0.0  # magnitude floor of rel_err: atol / rtol
    growth_limit: float = JUMP_GROWTH

    @property
    def first_jump(self) -> str | None:
        return next((layer["node"] for layer in self.layers if layer["jump"]), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "first_jump": self.first_jump,
            "compared": len(self.layers),
            "skipped": dict(self.skipped),
            "magnitude_floor": self.floor,
            "jump_growth": self.growth_limit,
            "unit_roundoff": UNIT_ROUNDOFF[self.dtype],
            "layers": self.layers,
        }

# --------------------------------------------------------------------------- the reference


def reference_tensors(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every main-graph tensor of ``model`` (and its inputs) from one onnxruntime fp32 run."""
    try:
        values = every_tensor(model, feeds)
    except Exception as err:
        raise UserError(f"onnxruntime cannot run the model with its intermediate tensors exposed: "
                        f"{error_summary(err)}", "Per-layer comparison needs onnxruntime to run the model.") from err
    tensors = {k: np.asarray(v) for k, v in feeds.items()}
    tensors.update({name: np.asarray(v) for name, v in values.items() if isinstance(v, np.ndarray)})
    return tensors


# --------------------------------------------------------------------------- comparison


def compare_layers(
    model: onnx.ModelProto,
    probes: Sequence[Probe],
    reference: Mapping[str, np.ndarray],
    converted: Mapping[str, np.ndarray],
    dtype: str,
    tol: Tolerance | None = None,
    skipped: Mapping[str, int] | None = None,
) -> LayerReport:
    """Compare each probed tensor with the reference and mark where error first jumps."""
    tol = tol or default_tolerance(dtype)
    floor = tol.atol / (tol.rtol or default_tolerance(dtype).rtol)
    roundoff = UNIT_ROUNDOFF[dtype]
    by_tensor = {p.tensor: p for p in probes}
    skips: collections.Counter[str] = collections.Counter(skipped or {})
    # Per tensor: (rel_err, rms_rel, carries new NaN/Inf, cosine below min_cosine); absent = exact.
    carried: dict[str, tuple[float, float, bool, bool]] = {}
    layers: list[dict[str, Any]] = []
    for node in model.graph.node:
        inputs = [carried.get(t, (0.0, 0.0, False, False)) for t in node.input if t]
        worst_in = max((c[0] for c in inputs), default=0.0), max((c[1] for c in inputs), default=0.0)
        bad_in = any(c[2] for c in inputs), any(c[3] for c in inputs)
        for tensor in (t for t in node.output if t):
            probe = by_tensor.get(tensor)
            ref, out = reference.get(tensor), converted.get(tensor)
            if probe is None or ref is None or out is None:
                if probe is not None:
                    skips["no reference"] += 1
                carried[tensor] = (*worst_in, *bad_in)
                continue
            if tuple(ref.shape) != tuple(out.shape):
                skips["shape mismatch"] += 1
                carried[tensor] = (*worst_in, *bad_in)
                continue
            layer = _layer(probe, ref, out, tol, floor, roundoff, worst_in, bad_in)
            layers.append(layer)
            carried[tensor] = (worst_in[0] if layer["rel_err"] is None else layer["rel_err"],
                               worst_in[1] if layer["rms_rel"] is None else layer["rms_rel"],
                               layer["new_nonfinite"] > 0, layer["low_cosine"])
    return LayerReport(dtype=dtype, tolerance=tol, layers=layers, skipped=dict(skips), floor=floor)


def _layer(probe: Probe, ref: np.ndarray, out: np.ndarray, tol: Tolerance, floor: float, roundoff: float,
           worst_in: tuple[float, float], bad_in: tuple[bool, bool]) -> dict[str, Any]:
    stats = layer_stats(ref, out, tol, floor)
    rel_err, rms_rel = stats["rel_err"], stats["rms_rel"]
    growth = None if rel_err is None else rel_err / max(worst_in[0], roundoff)
    rms_growth = None if rms_rel is None else rms_rel / max(worst_in[1], roundoff)
    reason = None
    if not bad_in[0]:
        if stats["new_nonfinite"]:
            reason = "nonfinite"
        elif stats["low_cosine"] and not bad_in[1]:
            reason = "cosine"
        elif growth is not None and rms_growth is not None and min(growth, rms_growth) > JUMP_GROWTH:
            reason = "growth"
    return {
        "node": probe.node,
        "op_type": probe.op_type,
        "output": probe.tensor,
        "var": probe.var,
        "dtype": probe.dtype,
        "shape": list(ref.shape),
        **stats,
        "growth": growth,
        "rms_growth": rms_growth,
        "jump": reason is not None,
        "jump_reason": reason,
    }


def layer_stats(ref: np.ndarray, out: np.ndarray, tol: Tolerance, floor: float) -> dict[str, Any]:
    """What a layer needs, in float64, with ``compare.stats``' definitions (max_abs over the
    elements finite on both sides; cosine judged only when the reference and the error exceed
    atol somewhere). The full statistics cost ~4× more, which a 400-node model repeats per build."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    o = np.asarray(out, dtype=np.float64).ravel()
    finite_ref, finite_out = np.isfinite(r), np.isfinite(o)
    both = finite_ref & finite_out
    if not both.all():
        r, o = r[both], o[both]
    error = o - r
    max_abs = float(np.max(np.abs(error))) if r.size else None
    max_ref = float(np.max(np.abs(r))) if r.size else 0.0
    scale = max(max_ref, float(np.max(np.abs(o))) if o.size else 0.0) or 1.0
    rs, os_, es = r / scale, o / scale, error / scale  # scale-free: squares of 1e200 stay finite
    norm_r, norm_o, norm_e = float(np.linalg.norm(rs)), float(np.linalg.norm(os_)), float(np.linalg.norm(es))
    if not r.size:
        cosine = None
    elif norm_r == 0.0 or norm_o == 0.0:
        cosine = 1.0 if norm_r == norm_o else 0.0
    else:
        cosine = float(np.clip(np.dot(rs, os_) / (norm_r * norm_o), -1.0, 1.0))
    judged = max_abs is not None and max_ref > tol.atol and max_abs > tol.atol
    return {
        "max_abs": max_abs,
        "max_ref": max_ref,
        "rel_err": None if max_abs is None else max_abs / (max_ref + floor),
        "rms_rel": (norm_e / (norm_r + floor / scale * math.sqrt(r.size))) if r.size else None,
        "cosine": cosine,
        "nan": int(np.count_nonzero(np.isnan(out))),
        "inf": int(np.count_nonzero(np.isinf(out))),
        "new_nonfinite": int(np.count_nonzero(finite_ref & ~finite_out)),
        "low_cosine": bool(judged and cosine is not None and cosine < tol.min_cosine),
    }


# --------------------------------------------------------------------------- one call


def per_layer_report(
    build: Any,
    feeds: Mapping[str, np.ndarray],
    tol: Tolerance | None = None,
    on_stage: Any = None,
) -> LayerReport:
    """Per-layer errors of ``build`` (an ``amptool.app.convert.BuildResult``) on ``feeds``.

    Compiles the probe variant of the build's rewritten module (one more compile)."""
    notify = on_stage or (lambda _name: None)
    dtype = build.config.dtype
    notify("per-layer compile")
    probed = compile_probed(build.passes.mod, build.passes.report.decisions, build.prepared, build.provenance,
                            build.inputs, [s.name for s in build.outputs], dtype, build.target_spec, build.device)
    notify("per-layer reference")
    reference = reference_tensors(build.prepared, feeds)
    notify("per-layer run")
    _outputs, converted = probed.run(feeds)
    return compare_layers(build.prepared, probed.probes, reference, converted, dtype, tol, probed.skipped)
