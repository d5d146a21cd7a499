"""Read-only statistics over a Relax module: ops per dtype, casts, constant bytes."""

from __future__ import annotations

import collections
from typing import Any

from amptool import _tvm


def _visit(mod: Any, on_binding: Any = None, on_constant: Any = None) -> None:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprVisitor, visitor  # noqa: PLC0415

    @visitor
    class _Walker(PyExprVisitor):
        def visit_var_binding_(self, binding: Any) -> None:
            if on_binding is not None:
                on_binding(binding)
            super().visit_var_binding_(binding)

        def visit_generic_const_(self, const: Any) -> None:
            if on_constant is not None:
                on_constant(const)

    walker = _Walker()
    for _gv, func in _tvm.relax_functions(mod):
        walker.visit_expr(func)
    del relax


def compute_dtype(call: Any) -> str:
    """The dtype an op computes in: its first floating tensor input, else its output's."""
    for arg in call.args:
        dtype = _tvm.tensor_dtype(arg)
        if dtype in _tvm.FLOAT_DTYPES:
            return dtype
        for item in getattr(arg, "fields", []) or []:
            dtype = _tvm.tensor_dtype(item)
            if dtype in _tvm.FLOAT_DTYPES:
                return dtype
    return _tvm.tensor_dtype(call) or "other"


def ops_by_dtype(mod: Any) -> dict[str, dict[str, int]]:
    """Relax op name → {compute dtype: count}; casts are counted as ``relax.astype``."""
    from tvm import relax  # noqa: PLC0415

    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def on_binding(binding: Any) -> None:
        value = binding.value
        if isinstance(value, relax.Call):
            name = _tvm.op_name(value)
            if name is not None:
                table[name][compute_dtype(value)] += 1

    _visit(mod, on_binding=on_binding)
    return {op: dict(sorted(c.items())) for op, c in sorted(table.items())}


def activation_casts(mod: Any) -> int:
    """Casts between float dtypes of non-constant values (what runs at inference time)."""
    from tvm import relax  # noqa: PLC0415

    count = 0

    def on_binding(binding: Any) -> None:
        nonlocal count
        value = binding.value
        if isinstance(value, relax.Call) and _tvm.op_name(value) == "relax.astype":
            src, dst = _tvm.tensor_dtype(value.args[0]), _tvm.tensor_dtype(value)
            if src in _tvm.FLOAT_DTYPES and dst in _tvm.FLOAT_DTYPES and src != dst:
                count += 1

    _visit(mod, on_binding=on_binding)
    return count


def constant_bytes(mod: Any) -> int:
    """Bytes held by the module's tensor constants (each distinct constant once)."""
    seen: dict[int, int] = {}

    def on_constant(const: Any) -> None:
        key = hash(const)
        if key not in seen:
            value = const.value
            nbytes = getattr(value, "numpy", None)
            seen[key] = int(nbytes().nbytes) if nbytes is not None else 0

    _visit(mod, on_constant=on_constant)
    return sum(seen.values())
