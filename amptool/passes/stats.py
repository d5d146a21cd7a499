"""Read-only statistics over a Relax module: ops per dtype, casts, constant bytes, and the
share of the compute that runs in the low dtype (auto-fallback reports it)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from amptool import _tvm

if TYPE_CHECKING:
    from amptool.passes.mixed_precision import Decision


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


_CONV_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv1d_transpose",
             "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose")


def compute_fraction(mod: Any, decisions: Sequence[Decision], dtype: str) -> float:
    """Share of the compute (multiply-adds for conv/matmul, output elements otherwise) of the
    ops the pass decided on that runs in ``dtype``."""
    weights = _op_weights(mod)
    total = low = 0.0
    for d in decisions:
        weight = weights.get(d.var, 1.0)
        total += weight
        if d.dtype == dtype:
            low += weight
    return low / total if total else 0.0


def fraction_ops(decisions: Sequence[Decision], dtype: str) -> float:
    """Share of the ops the pass decided on that run in ``dtype``."""
    return sum(1 for d in decisions if d.dtype == dtype) / len(decisions) if decisions else 0.0


def _op_weights(mod: Any) -> dict[str, float]:
    from tvm import relax  # noqa: PLC0415

    weights: dict[str, float] = {}

    def visit(seq: Any) -> None:
        for block in seq.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.If):
                    visit(value.true_branch)
                    visit(value.false_branch)
                elif isinstance(value, relax.Call):
                    weights[_tvm.var_name(binding.var)] = _weight(value, binding.var)

    for _gv, func in _tvm.relax_functions(mod):
        if isinstance(func.body, relax.SeqExpr):
            visit(func.body)
    return weights


def _weight(call: Any, var: Any) -> float:
    elements = _numel(var)
    name = _tvm.op_name(call)
    if name in _CONV_OPS and len(call.args) > 1:
        kernel = _shape(call.args[1])
        return elements * float(np.prod(kernel[1:])) if kernel else elements
    if name == "relax.matmul":
        lhs = _shape(call.args[0])
        return elements * float(lhs[-1]) if lhs else elements
    return elements


def _shape(expr: Any) -> list[int] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return [int(d) for d in shape] if shape is not None else None
    except (TypeError, ValueError):
        return None


def _numel(expr: Any) -> float:
    shape = _shape(expr)
    return float(np.prod(shape)) if shape else 1.0
