"""Headroom: how close each node's calibrated data comes to the low dtype's limits.

"Which nodes would overflow on my data?" wants a block list, not a guess. From the calibration
run (amptool.app.calibrate) each ONNX node gets:

  * overflow margin = the dtype's max / the node's max |x| (inputs and outputs, the activation
    guard's peak): 16× means a 16× larger input could still fit;
  * the share of its non-zero outputs that are subnormal (below the dtype's smallest normal:
    fewer significand bits) and that flush to zero (below half its smallest subnormal).

A node is *under the margin* when its overflow margin is below ``margin``, or when more than
UNDERFLOW_LIMIT of its non-zero outputs flush to zero (the constant guard's rule).
``colors_yaml`` writes a colour list keeping those nodes float32 that ``--colors`` reads back:
the colours inspect used (``extends``, the --exclude-op/--exclude-node flags) plus one NEVER
rule per node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from amptool.app.calibrate import Calibration, Floor
from amptool.colors.loader import BUILTIN_PREFIX
from amptool.colors.policy import literal_pattern
from amptool.dtypes import DTYPE_MAX
from amptool.errors import UserError
from amptool.fileio import atomic_write
from amptool.passes.range_guards import UNDERFLOW_LIMIT

#: Default --margin: the activation guard's own (it keeps |x| above dtype max / 16).
DEFAULT_MARGIN = 16.0


@dataclass(frozen=True)
class NodeHeadroom:
    name: str
    op_type: str
    max_abs: float
    overflow_margin: float  # inf when the node only saw zeros
    min_nonzero: float | None  # None: no non-zero output
    subnormal_fraction: float
    flushed_fraction: float
    under_margin: bool

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "op_type": self.op_type, "max_abs": self.max_abs,
                "overflow_margin": self.overflow_margin, "min_nonzero": self.min_nonzero,
                "subnormal_fraction": self.subnormal_fraction, "flushed_fraction": self.flushed_fraction,
                "under_margin": self.under_margin}


@dataclass(frozen=True)
class Headroom:
    """Every calibrated node's margins in ``dtype``, tightest first."""

    dtype: str
    margin: float
    nodes: tuple[NodeHeadroom, ...]
    source: str
    skipped: str | None = None

    @property
    def under_margin(self) -> list[str]:
        return [n.name for n in self.nodes if n.under_margin]

    def as_json(self) -> dict[str, object]:
        return {"dtype": self.dtype, "margin": self.margin, "dtype_max": DTYPE_MAX[self.dtype],
                "underflow_limit": UNDERFLOW_LIMIT, "source": self.source, "skipped": self.skipped,
                "under_margin": self.under_margin, "nodes": [n.as_json() for n in self.nodes]}


def check_headroom_request(dtype: str, margin: float) -> None:
    """Refuse a headroom request that cannot be answered (before the pipeline runs)."""
    if dtype not in DTYPE_MAX:
        raise UserError(f"--headroom measures against a low dtype; --dtype is {dtype}",
                        "Use --dtype float16 or --dtype bfloat16.")
    if not margin >= 1:
        raise UserError(f"--margin {margin}: a margin is a factor >= 1 (1: only nodes that overflow)",
                        "e.g. --margin 16 keeps nodes whose max |x| is above dtype max / 16.")


def measure_headroom(calibration: Calibration, op_types: Mapping[str, str], dtype: str, margin: float) -> Headroom:
    """The margins of every node ``calibration`` saw, in ``dtype``; ``op_types``: node name → ONNX op."""
    check_headroom_request(dtype, margin)
    nodes = []
    for name, peak in calibration.peaks.items():
        floor = calibration.floors.get(name, Floor())
        overflow = DTYPE_MAX[dtype] / peak if peak > 0 else float("inf")
        subnormal = floor.subnormal.get(dtype, 0) / floor.nonzero if floor.nonzero else 0.0
        flushed = floor.flushed.get(dtype, 0) / floor.nonzero if floor.nonzero else 0.0
        nodes.append(NodeHeadroom(
            name, op_types.get(name, "?"), peak, overflow, floor.min_nonzero if floor.nonzero else None,
            subnormal, flushed, overflow < margin or flushed > UNDERFLOW_LIMIT))
    nodes.sort(key=lambda n: (not n.under_margin, n.overflow_margin, -n.flushed_fraction))
    return Headroom(dtype, margin, tuple(nodes), calibration.source, calibration.skipped)


def colors_yaml(headroom: Headroom, model: str, colors: str | None, path: str,
                exclude_ops: Sequence[str] = (), exclude_nodes: Sequence[str] = ()) -> str:
    """A colour list (``path`` is where it goes: a file ``colors`` is named relative to it) that
    keeps the nodes under ``headroom``'s margin float32 on top of the colours inspect used."""

    base = colors or f"{BUILTIN_PREFIX}default"
    if not base.startswith(BUILTIN_PREFIX):
        base = os.path.relpath(os.path.abspath(base), os.path.dirname(os.path.abspath(path)))
    tight = [n for n in headroom.nodes if n.under_margin]
    lines = [
        f"# amptool inspect --headroom --margin {headroom.margin:g} --dtype {headroom.dtype} on {model}:",
        f"# {len(tight)} ONNX node(s) kept float32 whose {headroom.dtype} overflow margin (max / max |x|) is below "
        f"{headroom.margin:g}x or more than {UNDERFLOW_LIMIT:.0%} of whose non-zero outputs flush to zero.",
        f"# Calibrated on {headroom.source}. Use: --colors {os.path.basename(path)}",
        "version: 1",
        f"extends: {json.dumps(base)}",
    ]
    if exclude_ops:
        lines.append(f"never: {{add: [{', '.join(json.dumps(op) for op in exclude_ops)}]}}")
    rules = [(literal_pattern(n.name), _why(n)) for n in tight] + [(p, "--exclude-node") for p in exclude_nodes]
    lines.append("nodes:" if rules else "nodes: []")
    lines += [f"  - {{match: {json.dumps(match)}, color: never}}  # {why}" for match, why in rules]
    return "\n".join(lines) + "\n"


def write_colors(path: str, text: str) -> None:
    """Write the colour list atomically (a half-written list must never be read back)."""
    with atomic_write(path, "w", "--write-colors") as handle:
        handle.write(text)


def op_types_of(nodes: Iterable[object]) -> dict[str, str]:
    """Node name → ONNX op type, for the nodes of a graph (``onnx.NodeProto``s)."""
    return {str(getattr(n, "name", "")): str(getattr(n, "op_type", "")) for n in nodes}


def _why(node: NodeHeadroom) -> str:
    if node.flushed_fraction > UNDERFLOW_LIMIT:
        return f"{node.flushed_fraction:.0%} of non-zero outputs flush to zero"
    return f"max |x| {node.max_abs:.3g}: margin {node.overflow_margin:.3g}x"
