"""Range guards: which constants and activations a low dtype cannot hold.

A constant whose values overflow the low dtype, or whose non-zeros mostly flush to zero, is
never cast (``castable``); an op whose ONNX node saw activations above the limit in
calibration stays float32 (``ActivationGuard``); an Add/Sub whose result cancelled far below
its operands in calibration stays float32, with the ops that make its operands
(``CancellationGuard``). The mixed-precision pass applies them and reports each op kept as a
``Guarded``; they win over colour lists unless --no-range-guards (the cancellation guard alone:
--no-cancellation-guard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from amptool.dtypes import DTYPE_MAX, DTYPE_TINY

#: A constant is refused when more than this fraction of its non-zeros would flush to zero.
UNDERFLOW_LIMIT = 0.5
_MAX, _MIN = np.maximum.reduce, np.minimum.reduce


@dataclass(frozen=True)
class Guarded:
    """An op a range guard kept in float32, and why (``kind``: constant, activation or cancellation)."""

    node: str
    op: str
    reason: str
    kind: str = "constant"

    def as_json(self) -> dict[str, str]:
        return {"node": self.node, "op": self.op, "reason": self.reason, "kind": self.kind}


def castable(value: np.ndarray, dtype: str) -> str | None:
    """None if ``value`` survives a cast to ``dtype``; otherwise the reason it does not."""
    data = np.asarray(value)
    if data.dtype.kind != "f" or data.size == 0:
        return None
    magnitude = np.abs(data)
    # Fast path (3 array passes, the usual verdict): every value finite (NaN fails both
    # comparisons), none above the max, none that flushes to zero (nor any zero: slow path).
    # The ufunc reductions, not ndarray.max/min: ~1 µs less each on a small weight.
    if _MAX(magnitude, axis=None) <= DTYPE_MAX[dtype] and _MIN(magnitude, axis=None) >= DTYPE_TINY[dtype] / 2:
        return None
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return None
    peak = float(np.max(np.abs(finite)))
    if peak > DTYPE_MAX[dtype]:
        return f"constant max |x| = {peak:.3g} exceeds {dtype} max {DTYPE_MAX[dtype]:.6g}"
    nonzero = np.abs(finite[finite != 0])
    if nonzero.size:
        flushed = np.count_nonzero(nonzero < DTYPE_TINY[dtype] / 2)
        if flushed / nonzero.size > UNDERFLOW_LIMIT:
            return f"{flushed}/{nonzero.size} non-zero constant values underflow in {dtype}"
    return None


@dataclass(frozen=True)
class ActivationGuard:
    peaks: dict[str, float]
    limit: float
    dtype: str

    def reason(self, node: str) -> str | None:
        peak = self.peaks.get(node)
        if peak is None or peak <= self.limit:
            return None
        return f"activations reach |x| = {peak:.3g} > activation_max {self.limit:.6g} ({self.dtype})"


@dataclass(frozen=True)
class CancellationGuard:
    """Add/Sub nodes whose calibrated cancellation ratio exceeds ``limit`` (amptool.app.calibrate's
    ``cancellation_ratio``), and the nodes that make their operands: a subtraction in float32 of
    operands already rounded to the low dtype has lost the same bits."""

    reasons: Mapping[str, str]  # ONNX node name → why it stays float32

    @classmethod
    def from_ratios(cls, ratios: Mapping[str, tuple[float, tuple[str, ...]]], limit: float) -> CancellationGuard:
        """``ratios``: node → (ratio, nodes making its operands). Each node over ``limit`` and its feeds."""
        reasons: dict[str, str] = {}
        for node, (ratio, feeds) in ratios.items():
            if not ratio > limit:
                continue
            reasons[node] = f"result is 1/{ratio:.3g} of its operands > cancellation_limit {limit:.6g}"
            for feed in feeds:
                reasons.setdefault(feed, f"makes an operand of {node}, which cancels (1/{ratio:.3g})")
        return cls(reasons)

    def reason(self, node: str) -> str | None:
        return self.reasons.get(node)
