"""``inspect``: what the mixed-precision rewrite would do to a model — without compiling.

Per ONNX node: its colour and the dtype it computes in; per op type: how many nodes went
where; plus the casts the rewrite inserts, the ops the range guards kept float32 and why,
and the ops no colour list names. The same pipeline as ``convert`` up to compilation, so
what inspect says is what convert builds.

A node's colour summarises its Relax bindings (a Gemm is a matmul plus a bias add): ALWAYS
if any binding is ALWAYS, else FOLLOW if any is, else NEVER; its dtype is the one all its
bindings compute in, or "mixed" (a Softmax whose reshapes follow into float16 around a
float32 softmax). Nodes that bind no floating-point op (shape arithmetic, integer
indexing) have no colour and are not listed. ``guard`` says why a range guard overruled the
colour lists for that node. ``concretize_like`` says which like-ops ConcretizeLike rewrote
and why it left the others alone. With ``headroom_margin``, ``headroom`` gives each calibrated
node's margin to the low dtype's limits (amptool.app.headroom).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool.app.convert import ConvertConfig, Rewritten, cancellation_summary, rewrite_model, timings_json
from amptool.app.headroom import (
    Headroom,
    check_headroom_request,
    colors_yaml,
    measure_headroom,
    op_types_of,
    write_colors,
)
from amptool.colors.policy import Color
from amptool.errors import UserError
from amptool.passes import stats
from amptool.passes.mixed_precision import Decision

_RANK = {Color.ALWAYS: 2, Color.FOLLOW: 1, Color.NEVER: 0}


@dataclass(frozen=True)
class NodeSummary:
    name: str
    op_type: str
    color: str
    dtype: str
    guard: str | None = None  # why a range guard kept it float32

    def as_json(self) -> dict[str, str | None]:
        return {"name": self.name, "op_type": self.op_type, "color": self.color, "dtype": self.dtype,
                "guard": self.guard}


@dataclass
class InspectReport:
    dtype: str
    nodes: list[NodeSummary]
    rewritten: Rewritten
    config: ConvertConfig | None = None
    headroom: Headroom | None = None  # with inspect --headroom

    def by_op_type(self) -> list[tuple[str, str, str, int]]:
        """(ONNX op type, colour, dtype, count), most frequent first."""
        counts = collections.Counter((n.op_type, n.color, n.dtype) for n in self.nodes)
        return sorted(((*key, c) for key, c in counts.items()), key=lambda row: (-row[3], row[0]))

    def to_json(self) -> dict[str, Any]:
        """What ``--json`` writes."""
        return self.as_json()

    def as_json(self) -> dict[str, Any]:
        passes = self.rewritten.passes
        report = passes.report
        calibration = self.rewritten.calibration
        limit = self.rewritten.policy.activation_limit(self.dtype)
        guards_on = self.config is None or self.config.range_guards
        return {
            "dtype": self.dtype,
            "nodes": [n.as_json() for n in self.nodes],
            "by_op_type": [{"op_type": o, "color": c, "dtype": d, "count": k} for o, c, d, k in self.by_op_type()],
            "unknown_ops": dict(report.unknown_ops),
            "guarded_constants": [g.as_json() for g in report.guarded if g.kind == "constant"],
            "guarded_activations": [g.as_json() for g in report.guarded if g.kind == "activation"],
            "guarded_cancellations": [g.as_json() for g in report.guarded if g.kind == "cancellation"],
            "activation_guard": calibration.as_json(limit) if calibration is not None and guards_on else None,
            "cancellation_guard": (cancellation_summary(self.config, self.rewritten.policy, calibration)
                                   if self.config is not None else None),
            "headroom": self.headroom.as_json() if self.headroom is not None else None,
            "casts_inserted": stats.activation_casts(passes.mod),
            "ops_by_dtype": stats.ops_by_dtype(passes.mod),
            "ops_converted": report.converted,
            "ops_considered": len(report.decisions),
            "weight_bytes": dict(passes.weight_bytes),
            "concretize_like": passes.concretize.as_json() if passes.concretize else None,
            "prepare": self.rewritten.prepare_steps,
            "colors": self.rewritten.policy.as_json(),
            "unmatched_node_rules": list(self.rewritten.unmatched_node_rules),
            "timings_s": timings_json(self.rewritten.timings_s),
        }


def inspect_model(
    config: ConvertConfig, arrays: Mapping[str, np.ndarray] | None = None, on_stage: Any = None,
    *, headroom_margin: float | None = None,
) -> InspectReport:
    """The rewrite's decisions; with ``headroom_margin``, also every node's margin to the dtype's limits."""
    if headroom_margin is not None:
        check_headroom_request(config.dtype, headroom_margin)
    rewritten = rewrite_model(config, arrays, on_stage, calibrate=headroom_margin is not None)
    report = rewritten.passes.report
    guards = {g.node: g.reason for g in report.guarded}
    headroom = None
    if headroom_margin is not None and rewritten.calibration is not None:
        graph = rewritten.prepared.graph if rewritten.prepared is not None else None
        op_types = op_types_of(graph.node) if graph is not None else {}
        headroom = measure_headroom(rewritten.calibration, op_types, config.dtype, headroom_margin)
    return InspectReport(config.dtype, summarize_nodes(report.decisions, config.dtype, guards), rewritten,
                         config, headroom)


def summarize_nodes(
    decisions: list[Decision], low: str, guards: Mapping[str, str] | None = None
) -> list[NodeSummary]:
    """One summary per ONNX node, in the order the rewrite met them."""
    grouped: dict[str, list[Decision]] = {}
    for decision in decisions:
        key = decision.node or decision.var
        grouped.setdefault(key, []).append(decision)
    summaries = []
    for name, group in grouped.items():
        color = max((d.color for d in group), key=lambda c: _RANK[c])
        dtypes = {d.dtype for d in group}
        dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"
        op_type = next((d.onnx_op for d in group if d.onnx_op), None) or group[-1].relax_op
        summaries.append(NodeSummary(name, op_type, color.value, dtype, (guards or {}).get(name)))
    return summaries


def write_headroom_colors(report: InspectReport, path: str) -> list[str]:
    """Write the colour list keeping ``report``'s nodes under the headroom margin float32 to ``path``
    (atomically); returns those nodes. Without calibration data there is nothing to list: refused."""
    headroom, config = report.headroom, report.config
    if headroom is None or config is None:
        raise UserError("--write-colors needs the headroom calibration, which did not run",
                        "Use --dtype float16 or bfloat16.")
    if headroom.skipped:
        raise UserError(f"--write-colors: calibration was skipped, so no node can be listed: {headroom.skipped}",
                        "Pass --calibration X.npz with inputs onnxruntime can run.")
    write_colors(path, colors_yaml(headroom, config.model, config.colors, path,
                                   config.exclude_ops, config.exclude_nodes))
    return headroom.under_margin
