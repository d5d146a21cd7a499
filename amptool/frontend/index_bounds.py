"""Indices read at run time kept inside the tensor they index: gathers and scatters never touch memory
outside it.

What (``guard_run_time_values``, on the imported module): a ``take`` (Gather) whose indices are not
constants takes mode ``clip``; the indices of ``gather_elements``, ``gather_nd``, ``scatter_elements``
and ``scatter_nd`` (GatherElements, GatherND, ScatterElements, ScatterND) are clamped to each indexed
axis, after negative ones are counted from its end (TVM's ScatterElements converter did not: -1 wrote
before the tensor). The same pass makes integer divisions safe (``integer_division.py``).

Why: TVM's kernels read and write at whatever index they are given. A token id past the vocabulary, a
box's batch index past the batch, any out-of-range value fed to ``amptool run`` segfaulted the process
(onnxruntime refuses such a run with an error). Clamped, a valid input computes the same and an invalid
one computes a wrong but bounded result; ``diff`` still refuses the run, as onnxruntime does.

When not: constant indices (checked by folding, or they would not have imported), and an indexed axis
whose length is symbolic (left as TVM builds it).

Cost: a min/max per index, fused into the kernel that reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm

#: Relax ops that index a tensor with values from another: along one axis, or by tuples of leading axes.
_ELEMENTWISE_INDEXED = frozenset({"relax.gather_elements", "relax.scatter_elements"})
_TUPLE_INDEXED = frozenset({"relax.gather_nd", "relax.scatter_nd"})
_INDEXING = frozenset({"relax.take"}) | _ELEMENTWISE_INDEXED | _TUPLE_INDEXED


def bounded(bb: Any, result: Any) -> Any:
    """``result`` (a call) with its indices kept in range, helper bindings emitted into ``bb``; itself
    when it is not a gather or scatter with run-time indices, or its indexed axes are not static."""
    from tvm import relax  # noqa: PLC0415

    name = _tvm.op_name(result)
    args = list(_tvm.array_items(result.args))
    if name is None or len(args) < 2 or _tvm.is_constant(args[1]):
        return result
    if name == "relax.take":
        if str(result.attrs.mode) != "fast":
            return result
        axis = result.attrs.axis
        return relax.op.take(args[0], args[1], None if axis is None else int(axis), mode="clip")
    shape = _tvm.static_shape(args[0])
    dtype = _tvm.tensor_dtype(args[1])
    if shape is None or dtype is None:
        return result
    if name in _ELEMENTWISE_INDEXED:
        axis = int(result.attrs.axis) % len(shape)
        extent = np.array(shape[axis], dtype)
    elif name in _TUPLE_INDEXED:
        index_shape = _tvm.static_shape(args[1])
        if index_shape is None:
            return result
        first = int(getattr(result.attrs, "batch_dims", 0) or 0)
        extent = np.array(shape[first:first + index_shape[-1]], dtype)
    else:
        return result
    op = relax.op
    index, zero = args[1], relax.const(0, dtype)
    # Negative indices count from the end (TVM's ScatterElements converter passed them on as they were:
    # -1 wrote before the tensor); then the clamp.
    index = bb.emit(op.where(op.less(index, zero), op.add(index, relax.const(extent, dtype)), index))
    args[1] = bb.emit(op.minimum(op.maximum(index, zero), relax.const(extent - 1, dtype)))
    return relax.Call(result.op, args, result.attrs, result.ty_args)


def guard_run_time_values(mod: Any) -> Any:
    """``mod`` with every gather and scatter bounded (``bounded``) and every integer division made safe
    (``integer_division.safe_division``), in each Relax function — those nested in a converter's result
    (MaxUnpool's scatter inside a reshape) and those it emitted itself among them. Run on the imported
    module, before bindings are attributed to nodes: the helper bindings take the node of the binding
    they precede."""
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    from amptool.frontend.integer_division import GUARDED_DIVISIONS, safe_division  # noqa: PLC0415

    names = _INDEXING | GUARDED_DIVISIONS
    if not _tvm.any_call(mod, lambda call: _tvm.op_name(call) in names):
        return mod

    @mutator
    class _Guard(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call, relax.Call) or _tvm.op_name(call) not in names:
                return call
            return bounded(self.builder_, safe_division(self.builder_, call))

    return _tvm.rewrite_functions(mod, _Guard(mod))
