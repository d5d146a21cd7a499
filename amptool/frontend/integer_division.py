"""Integer division and remainder that cannot trap: ``x / 0`` and ``x % 0`` give 0, ``MIN / -1`` wraps.

What: an imported ``divide``, ``floor_divide``, ``mod`` or ``floor_mod`` of integers (ONNX Div and Mod)
whose divisor may be 0 — or -1, for signed types — divides by 1 where it is, and selects the result
there: 0 for a zero divisor (numpy's answer), ``-x`` (wrapping) or 0 for -1.

Why: the CPU's integer division traps on a zero divisor and on the most negative value divided by -1:
``amptool run`` died of SIGFPE (onnxruntime refuses the run with "Integer division by zero"), and so
would convert, folding a constant division by zero.

When not: floats (IEEE division does not trap), and a constant divisor with neither 0 nor -1 (index
arithmetic such as ``x // 2`` keeps its one instruction).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm

_DIVIDES = frozenset({"relax.divide", "relax.floor_divide"})
_REMAINDERS = frozenset({"relax.mod", "relax.floor_mod"})
GUARDED_DIVISIONS = _DIVIDES | _REMAINDERS


def safe_division(bb: Any, result: Any) -> Any:
    """``result`` (a call) made safe when it is an integer division or remainder whose divisor may
    trap, helper bindings emitted into ``bb``; itself otherwise. Applied by
    ``index_bounds.guard_run_time_values`` on the imported module."""
    from tvm import relax  # noqa: PLC0415

    name = _tvm.op_name(result)
    if name not in _DIVIDES and name not in _REMAINDERS:
        return result
    x, divisor = list(_tvm.array_items(result.args))[:2]
    dtype = _tvm.tensor_dtype(divisor)
    if dtype is None or np.dtype(dtype).kind not in "iu" or _tvm.tensor_dtype(x) != dtype:
        return result
    signed = np.dtype(dtype).kind == "i"
    if _tvm.is_constant(divisor):
        values = _tvm.constant_view(divisor)
        if not np.any(values == 0) and not (signed and np.any(values == -1)):
            return result
    op = relax.op
    quotient = bb.emit(relax.Call(result.op, [x, _never_trapping(bb, divisor, signed)], result.attrs,
                                  result.ty_args))
    if signed:  # x / -1 = -x (MIN wraps to MIN); x % -1 = 0
        answer = op.negative(x) if name in _DIVIDES else op.zeros_like(x)
        quotient = bb.emit(op.where(op.equal(divisor, relax.const(-1, dtype)), answer, quotient))
    zero = relax.const(0, dtype)
    return op.where(op.equal(divisor, zero), zero, quotient)


#: TVM's op pattern "opaque": FuseOps leaves such a kernel alone.
_OPAQUE = 8


def _never_trapping(bb: Any, divisor: Any, signed: bool) -> Any:
    """``divisor`` with 1 where it is 0 (or -1, when signed), computed in a kernel of its own.

    Why its own: fused into the division, TVM's simplifier turned ``x / select(c, 1, d)`` into
    ``select(c, x, x / d)``, dividing by ``d`` everywhere (a uint8 division trapped), and its vectoriser
    failed on the remainder of an arithmetic form ("mismatched types int64x4 vs. int64"). Read from
    memory, the safe divisor is a value neither can look through."""
    from tvm import te, tirx  # noqa: PLC0415

    def compute(d: Any) -> Any:
        def pick(*i: Any) -> Any:
            traps = d(*i) == tirx.const(0, d.dtype)
            if signed:
                traps = tirx.any(traps, d(*i) == tirx.const(-1, d.dtype))
            return tirx.Select(traps, tirx.const(1, d.dtype), d(*i))

        return te.compute(d.shape, pick, name="safe_divisor")

    return bb.emit_te(compute, divisor, primfunc_name_hint="safe_divisor", primfunc_attrs={"op_pattern": _OPAQUE})
