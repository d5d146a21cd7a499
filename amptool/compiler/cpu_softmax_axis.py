"""Softmax and LogSoftmax over an axis with elements after it, computed over the last axis.

What: ``relax.nn.softmax`` / ``log_softmax`` along axis ``a`` of a static-rank tensor whose axes
after ``a`` hold more than one element becomes ``permute_dims`` (``a`` moved last), the same op
along the last axis, and the inverse ``permute_dims``.

Why: TVM's kernel for a middle axis reduces along a strided axis, and no CPU rule schedules it
well: a YOLOv8 box decode (softmax over 16 bins of [1, 16, 4, 2100]) ran as scalar loops that
recomputed each row's max and sum once per output bin, 2.7 ms of a 24 ms detector. Moved last,
the rows are contiguous (``cpu_row_reduction``) and the two transposes are tiled copies.

When not: the last axis already, nothing after the axis (``[N, C, 1, 1]``), a symbolic rank.

Preserves: values (the same reductions over the same elements, in row order).
"""

from __future__ import annotations

import math
from typing import Any

from amptool import _tvm
from amptool._tvm import static_shape

_OPS = ("relax.nn.softmax", "relax.nn.log_softmax")


def softmax_to_last_axis(mod: Any) -> Any:
    """``mod`` with every softmax/log-softmax ``_moved_axis`` accepts computed along the last axis."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    ops = {tvm.ir.Op.get(name) for name in _OPS}
    if not _tvm.any_call(mod, lambda call: call.op in ops and _moved_axis(call) is not None):
        return mod

    @mutator
    class _Mover(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            axis = _moved_axis(call) if isinstance(call.op, tvm.ir.Op) and call.op in ops else None
            if axis is None:
                return call
            rank = len(call.args[0].ty.shape)
            order = [*(i for i in range(rank) if i != axis), axis]
            inverse = [order.index(i) for i in range(rank)]
            moved = self.builder_.emit(relax.op.permute_dims(call.args[0], order))
            op = relax.op.nn.softmax if call.op.name == "relax.nn.softmax" else relax.op.nn.log_softmax
            return relax.op.permute_dims(self.builder_.emit(op(moved, axis=-1)), inverse)

    return _tvm.rewrite_functions(mod, _Mover(mod))


def _moved_axis(call: Any) -> int | None:
    """The (non-negative) axis of a softmax call worth moving last, or None."""
    shape = static_shape(call.args[0])
    if shape is None or len(shape) < 2:
        return None
    axis = int(call.attrs.axis) % len(shape)
    return axis if math.prod(shape[axis + 1:]) > 1 else None
