"""``power(x, e)`` for a constant exponent that is a multiple of 1/4: multiplications and square roots.

What: ``x ** e`` with ``e = k + f`` (``k`` a whole number up to ``MAX_WHOLE``, ``f`` in {0, ¼, ½, ¾})
becomes ``x·x·…·x`` (``k`` factors) times ``√x``, ``√√x`` or both; a negative ``e`` its reciprocal.

Why: LLVM turns ``pow(x, 2)`` into ``x·x`` and ``pow(x, 0.5)`` into a square root, but any other
exponent stays a call to libm's ``powf``, once per element, so the loop around it is not
vectorized. Exponent 3 is GELU's tanh form (GPT-2, ``gelu_new``: every element of every FFN) and
0.75 local response normalisation (GoogLeNet: one pow kernel took 2.4 of its 11.8 ms in bfloat16).
``vsqrtps`` and multiplies vectorize.

Preserves: C's ``pow`` on every special value (checked against numpy in the tests): ``-0`` and
``-inf`` raised to a fractional power (``√`` alone would give ``-0`` and NaN); negative bases to
fractional powers are NaN either way. Rounding: each ``√`` and product rounds once, so a result
can differ from a correctly rounded ``pow`` by an ulp or two (onnxruntime itself computes a
scalar exponent 3 as ``x·x·x``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool.dtypes import DTYPES

#: Largest whole part of an exponent computed by multiplication (x**4.75: four products and two roots).
MAX_WHOLE = 4


def quarter_steps(exponent: float) -> int | None:
    """``4 · exponent`` when that is a whole number with ``0 < |exponent| ≤ MAX_WHOLE + ¾`` and
    the exponent is not 1 or 2 (LLVM does those already), else None."""
    steps = exponent * 4
    if not np.isfinite(steps) or steps != int(steps) or steps == 0:
        return None
    if abs(steps) > 4 * MAX_WHOLE + 3 or steps in (4, 8):
        return None
    return int(steps)


def constant_exponent(call: Any) -> float | None:
    """The exponent of ``relax.power(x, e)`` when ``e`` is a constant with one value and the
    result has ``x``'s shape (the exponent broadcasts into it), else None."""
    import tvm  # noqa: PLC0415

    base, exponent = call.args
    if not isinstance(exponent, tvm.ir.GenericConst):
        return None
    value = np.asarray(exponent.value.numpy())
    try:
        same_shape = [int(d) for d in call.ty.shape] == [int(d) for d in base.ty.shape]
    except (TypeError, ValueError, AttributeError):  # symbolic or unknown shapes
        return None
    if value.size != 1 or not same_shape:
        return None
    return float(value.reshape(()))


def power_by_roots(x: Any, steps: int, compute_dtype: str) -> Any:
    """The TIR value of ``x ** (steps / 4)`` (see the module docstring); ``x`` a scalar expression."""
    from tvm import tirx  # noqa: PLC0415

    whole, quarters = divmod(abs(steps), 4)
    x = x.astype(compute_dtype)
    base = x
    if quarters:
        # pow(-0, e) is +0 for a fractional e (√-0 is -0, and -0·√0 too): -0 compares equal to 0
        # and becomes +0 (TIR's simplifier folds x + 0.0, the usual way to drop the sign, to x).
        # Any other negative base gives NaN through the root.
        zero = tirx.const(0.0, compute_dtype)
        base = tirx.Select(x == zero, zero, x)
    result = None
    for _ in range(whole):
        result = base if result is None else result * base
    if quarters:
        root = tirx.sqrt(base)
        fourth = tirx.sqrt(root)
        part = {1: fourth, 2: root, 3: root * fourth}[quarters]
        result = part if result is None else result * part
    assert result is not None
    if steps < 0:
        result = tirx.const(1.0, compute_dtype) / result
    if quarters:
        # pow(-inf, e) for a positive non-integer e is +inf (its reciprocal +0); √-inf is NaN.
        minus_inf = tirx.const(-np.inf, compute_dtype)
        at_minus_inf = tirx.const(np.inf if steps > 0 else 0.0, compute_dtype)
        result = tirx.Select(x == minus_inf, at_minus_inf, result)
    return result


def legalize_power(bb: Any, call: Any, default: Any) -> Any:
    """``relax.power`` → a kernel of ``power_by_roots`` when the exponent allows, else ``default``."""
    from tvm import te  # noqa: PLC0415

    dtype = str(call.ty.dtype)
    exponent = constant_exponent(call) if dtype in (*DTYPES, "float64") else None
    steps = None if exponent is None else quarter_steps(exponent)
    if steps is None:
        return default(bb, call)
    compute_dtype = "float64" if dtype == "float64" else "float32"

    def compute(x: Any) -> Any:
        return te.compute(x.shape, lambda *i: power_by_roots(x(*i), steps, compute_dtype).astype(dtype),
                          name="power_by_roots")

    return bb.call_te(compute, call.args[0], primfunc_name_hint="power")
