"""Fold casts of constants in numpy: ``astype(Constant)`` becomes a constant of the new dtype.

Why: the mixed-precision pass casts every weight with ``astype`` and leaves the folding to
TVM's FoldConstant, which evaluates each cast by compiling and running a kernel — 6.2 s for
the weight casts of PP-OCRv4's text recogniser, on every convert, diff and auto-fallback
candidate. Here: 0.05 s, and the FoldConstant that still runs afterwards (for whatever else
folds) takes 0.3 s. Scalar casts fold too (FoldConstant leaves those).

Same values: numpy and TVM both round to nearest even (bfloat16 through ml_dtypes).

When it does not fire: casts of non-constants, and casts to or from anything but a float
dtype (float → int conversion of out-of-range values differs between runtimes).

Preserves: binding names, well-formedness (checked by the pipeline).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool.dtypes import numpy_dtype


def fold_constant_casts(mod: Any) -> Any:
    """``mod`` with every float ``astype`` of a constant replaced by the cast constant."""
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    @mutator
    class _FoldCasts(PyExprMutator):
        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            if isinstance(value, relax.Call) and _tvm.op_name(value) == "relax.astype":
                source = value.args[0]
                target = _tvm.tensor_dtype(value)
                if _tvm.is_constant(source) and _is_float(_tvm.tensor_dtype(source)) and _is_float(target):
                    folded = relax.const(_cast(_tvm.constant_numpy(source), str(target)), str(target))
                    self.set_var_remap(binding.var, self.builder_.emit(folded, name_hint=_tvm.var_name(binding.var)))
                    return
            super().visit_var_binding_(binding)

    return _tvm.rewrite_functions(mod, _FoldCasts(mod))


def _is_float(dtype: str | None) -> bool:
    return dtype in _tvm.FLOAT_DTYPES


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
    """Overflow gives inf, as TVM's cast does (only reached with --no-range-guards)."""
    with np.errstate(over="ignore"):
        return array.astype(numpy_dtype(dtype))
