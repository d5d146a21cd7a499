"""Division by one constant value, legalized for every target: a product with its reciprocal;
and products by a constant zero, kept where TVM's simplifier cannot turn them into a zero divisor.

``stages.relax_stages`` puts :func:`legalize_divide` and :func:`legalize_multiply` under each
pipeline's own legalizations (the CPU's ``cpu_kernels.legalize_map``, the GPU's none).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool._tvm import static_shape
from amptool.compiler.legalize_once import tvms_legalization
from amptool.dtypes import DTYPES

FLOATS = (*DTYPES, "float64")


def legalize_divide(bb: Any, call: Any) -> Any:
    """A float tensor divided by one constant value (GELU's ``x / √2``, attention's ``/ √d``) as a
    product with its reciprocal, in float32 (float64 for float64); any other division TVM's.

    Why: a vector division issues once every several cycles where a multiply issues twice a cycle —
    BERT-base's GELU kernel spent most of its time in its two ``vdivps`` a vector (this and
    ``fast_erf``'s). Values: within one float32 rounding of the quotient (the reciprocal's and the
    product's), as onnxruntime's own GELU computes ``x · (1/√2)``; below float32 the result's
    rounding is the quotient's. A zero divisor too: TVM's division folded ``x / 0`` into a compile
    error ("Divide by zero"), where ``x · ±inf`` gives the IEEE quotient."""
    from tvm import te, tirx  # noqa: PLC0415

    x, divisor = call.args
    dtype = str(call.ty.dtype)
    if dtype not in FLOATS or str(x.ty.dtype) != dtype or not _tvm.is_constant(divisor):
        return tvms_legalization(bb, call)
    value = _tvm.constant_view(divisor)
    if value.size != 1 or value.ndim > len(static_shape(x) or ()):
        return tvms_legalization(bb, call)  # (a divisor of more dims than x broadcasts x: TVM's shape rules)
    wide = "float64" if dtype == "float64" else "float32"  # the product's precision: float32 at least
    c = np.float64(value.reshape(()).astype(np.float64))
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.dtype(wide).type(1.0 / c)  # 1/±0 = ±inf: x · ±inf is x / ±0 (NaN for 0, ±inf else)
    if np.isnan(c) or (c != 0 and (not np.isfinite(reciprocal) or abs(reciprocal) < np.finfo(wide).tiny)):
        return tvms_legalization(bb, call)  # (a reciprocal that overflows or is subnormal: TVM's division)

    def compute(data: Any) -> Any:
        scale = tirx.const(float(reciprocal), wide)
        return te.compute(data.shape, lambda *i: (data(*i).astype(wide) * scale).astype(dtype), name="scaled")

    return bb.call_te(compute, x, primfunc_name_hint="divide")


def legalize_multiply(bb: Any, call: Any) -> Any:
    """A float product with a constant scalar zero reads the zero from memory; any other product TVM's.

    Why: TVM compiles a scalar constant into the kernel, and its simplifier rewrites ``t · 0`` to 0 —
    so ``Reciprocal(Mul(t, 0))``, fused into one kernel, became ``1 / 0``, which TVM's constant folding
    stops on ("Divide by zero", a compile error where onnxruntime gives ±inf). A zero read from a
    0-d buffer is a value the simplifier cannot see, and the product keeps IEEE's sign and NaN."""
    from tvm import topi  # noqa: PLC0415

    a, b = call.args
    dtype = str(call.ty.dtype)
    if dtype in FLOATS and (_zero_scalar(a) or _zero_scalar(b)):
        return bb.call_te(topi.multiply, a, b, primfunc_name_hint="multiply")
    return tvms_legalization(bb, call)


def _zero_scalar(expr: Any) -> bool:
    """``expr`` is a 0-d constant equal to zero (either sign): one TVM would compile in."""
    if not _tvm.is_constant(expr) or len(expr.ty.shape) != 0:
        return False
    return bool(_tvm.constant_view(expr).astype(np.float64) == 0)
