"""The resolved colour policy the mixed-precision pass consults: one place for each decision.

Precedence for a binding (first that applies wins):
  1. a ``nodes:`` rule matching the ONNX node the binding came from;
  2. the colour of that node's ONNX op type (``Conv``, ``Softmax``);
  3. the colour of the Relax op (``relax.nn.conv2d``);
  4. unknown → NEVER (and reported, per ``unknown_ops``).
Range guards (in the pass) override all of these unless disabled.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

#: Default ``cancellation_limit``: an Add/Sub whose result is more than 16× below its operands
#: (calibrated, amptool.app.calibrate.cancellation_ratio) stays float32 — in float16 it keeps
#: fewer than 7 of 11 significand bits against the result's scale. Measured: the residual and
#: LayerNorm Adds/Subs of the model zoo's ResNet and transformer reach at most 2.1; a RAFT-class
#: coordinate-grid subtraction 1.7e3.
DEFAULT_CANCELLATION_LIMIT = 16.0


class Color(str, enum.Enum):
    ALWAYS = "always"
    FOLLOW = "follow"
    NEVER = "never"


@dataclass(frozen=True)
class NodeRule:
    """A per-node override: a glob, or a regex written as ``/…/``, on ONNX node names."""

    match: str
    color: Color

    def matches(self, node_name: str) -> bool:
        if len(self.match) >= 2 and self.match.startswith("/") and self.match.endswith("/"):
            return re.search(self.match[1:-1], node_name) is not None
        return fnmatch.fnmatchcase(node_name, self.match)


def literal_pattern(name: str) -> str:
    """A ``nodes:`` pattern matching exactly ``name``: glob metacharacters bracketed, and a
    name that would read as ``/regex/`` has its last slash bracketed."""
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in name)
    if len(escaped) >= 2 and escaped.startswith("/") and escaped.endswith("/"):
        escaped = escaped[:-1] + "[/]"
    return escaped


@dataclass(frozen=True)
class ColorPolicy:
    relax_colors: dict[str, Color]
    onnx_colors: dict[str, Color]
    accumulation: dict[str, str]
    node_rules: tuple[NodeRule, ...] = ()
    unknown_ops: str = "warn"
    sources: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    #: Activation range guard bound (|x| seen in calibration); None = the dtype's default.
    activation_max: float | None = None
    #: Cancellation guard bound (operand / result magnitude seen in calibration); None = the default.
    cancellation_limit: float | None = None

    def activation_limit(self, dtype: str) -> float:
        """The |activation| above which an op stays float32 in ``dtype``.

        Default: 1/16 of the dtype's max (4094 for float16) — the margin leaves room for
        inputs that swing wider than the calibration set and for ops whose internals
        (sums of squares, exp) grow past their outputs.
        """
        if self.activation_max is not None:
            return self.activation_max
        return {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(dtype, float("inf")) / 16

    def cancellation_bound(self) -> float:
        """The cancellation ratio above which an Add/Sub (and what makes its operands) stays float32."""
        return DEFAULT_CANCELLATION_LIMIT if self.cancellation_limit is None else self.cancellation_limit

    def color_of(self, relax_op: str, onnx_node: str | None, onnx_op: str | None) -> Color | None:
        """The colour by the lists alone; None when the op is unknown."""
        if onnx_node is not None:
            for rule in self.node_rules:
                if rule.matches(onnx_node):
                    return rule.color
        if onnx_op is not None and onnx_op in self.onnx_colors:
            return self.onnx_colors[onnx_op]
        return self.relax_colors.get(relax_op)

    def accumulation_of(self, relax_op: str, onnx_op: str | None) -> str | None:
        if onnx_op is not None and onnx_op in self.accumulation:
            return self.accumulation[onnx_op]
        return self.accumulation.get(relax_op)

    def as_json(self) -> dict[str, Any]:
        def by_color(table: dict[str, Color]) -> dict[str, list[str]]:
            return {c.value: sorted(k for k, v in table.items() if v is c) for c in Color}

        return {
            "sources": list(self.sources),
            "relax_ops": by_color(self.relax_colors),
            "onnx_ops": by_color(self.onnx_colors),
            "accumulation": dict(sorted(self.accumulation.items())),
            "nodes": [{"match": r.match, "color": r.color.value} for r in self.node_rules],
            "unknown_ops": self.unknown_ops,
            "activation_max": self.activation_max,
            "cancellation_limit": self.cancellation_limit,
        }
