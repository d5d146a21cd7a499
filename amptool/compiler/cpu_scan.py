"""CumSum along an axis with elements after it: rows of the scan added as vectors.

What: ``relax.cumsum`` over an axis of length L with A elements after it (a [1, 4096, 64] tensor
summed along its 4096 rows: A = 64) runs per outer index and per chunk of those A elements
(in parallel), walking the L rows in order and adding each row's chunk to the previous sum as
one vectorized step.

Why: TOPI's scan gives every one of the A columns its own scalar walk down the L rows, each
step a cache line away from the last: [1, 4096, 64] along the rows took 0.67–1.2 ms, now 0.11 ms
(onnxruntime 0.25 with its copies; 2 threads, an Ice Lake core).

When not: a scan over the flattened tensor (no axis), over the last axis (nothing to vectorize:
TOPI's walk is already contiguous), or a symbolic shape: TVM's legalization.

Where: ``rewrite_scans``, a pass of the CPU build's layout stage — before TVM's library dispatch,
which turns every ``cumsum`` into TOPI's kernel before legalization would see it.

Preserves: each output's sum order (row after row), ``exclusive`` and the accumulation dtype.
"""

from __future__ import annotations

import math
from typing import Any

from amptool._tvm import static_shape

#: Elements of the trailing axes one parallel task scans at once (four float32 AVX-512 vectors).
CHUNK = 64
#: Tasks below which a chunk is halved (down to one 16-lane vector) so that threads share the scan.
MIN_TASKS = 8


def rewrite_scans(mod: Any) -> Any:
    """``mod`` with each ``relax.cumsum`` that ``_scanned_axis`` accepts computed by the row scan."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    from amptool import _tvm  # noqa: PLC0415

    cumsum = tvm.ir.Op.get("relax.cumsum")

    def applies(call: Any) -> bool:
        return _tvm.calls_op(call, cumsum) and (_scanned_axis(call) is not None or _empty(call))

    if not _tvm.any_call(mod, applies):
        return mod

    @mutator
    class _Scans(PyExprMutator):
        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            if isinstance(value, relax.Call) and applies(value):
                # An empty scan is its (empty) input: TOPI's kernel divided by zero building it, and
                # zeros would be folded to an empty constant, which TVM's export does not load back.
                scan = (relax.op.astype(value.args[0], value.ty.dtype) if _empty(value)
                        else legalize_cumsum(self.builder_, value))
                self.set_var_remap(binding.var, self.builder_.emit(scan, name_hint=_tvm.var_name(binding.var)))
                return
            super().visit_var_binding_(binding)

    return _tvm.rewrite_functions(mod, _Scans(mod))


def _empty(call: Any) -> bool:
    """Whether a ``cumsum``'s input has a static shape with a zero extent."""
    return 0 in (static_shape(call.args[0]) or [])


def _scanned_axis(call: Any) -> int | None:
    """The axis of a ``cumsum`` the row scan takes: static shape, an axis, elements after it."""
    shape = static_shape(call.args[0])
    if shape is None or call.attrs.axis is None or not shape or 0 in shape:
        return None  # (an empty tensor: ``_empty``; the first row's store would write past it)
    axis = int(call.attrs.axis) % len(shape)
    return axis if math.prod(shape[axis + 1:]) > 1 else None


def legalize_cumsum(bb: Any, call: Any) -> Any:
    """The row-vector scan (module docstring) of a ``cumsum`` that ``_scanned_axis`` accepts."""
    axis = _scanned_axis(call)
    assert axis is not None
    dtype = str(call.ty.dtype)
    exclusive = bool(call.attrs.exclusive) if call.attrs.exclusive is not None else False
    return bb.call_te(lambda data: _row_scan(data, axis, dtype, exclusive), call.args[0],
                      primfunc_name_hint="cumsum")


def _row_scan(data: Any, axis: int, dtype: str, exclusive: bool) -> Any:
    from tvm import te, tirx  # noqa: PLC0415
    from tvm.script.ir_builder import IRBuilder  # noqa: PLC0415
    from tvm.script.ir_builder import tirx as T  # noqa: PLC0415 - TVM's own alias

    shape = [int(d) for d in data.shape]
    before, length, after = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    chunk = math.gcd(after, CHUNK)
    while before * (after // chunk) < MIN_TASKS and chunk % 32 == 0:
        chunk //= 2  # a few more tasks for the thread pool, each still whole vectors
    chunks = after // chunk

    def cast(value: Any) -> Any:
        return value if str(data.dtype) == dtype else tirx.Cast(dtype, value)

    def body(data_buf: Any, out_buf: Any) -> Any:
        with IRBuilder() as ib:
            src = T.buffer_proxy(data_buf)
            out = T.buffer_proxy(out_buf)
            with T.parallel(0, before * chunks) as task:
                base = task // chunks * length * after + task % chunks * chunk
                with T.vectorized(0, chunk) as lane:
                    out[base + lane] = tirx.const(0, dtype) if exclusive else cast(src[base + lane])
                with T.serial(1, length) as row, T.vectorized(0, chunk) as lane:
                    here = base + row * after + lane
                    previous = here - after
                    added = src[previous] if exclusive else src[here]
                    out[here] = out[previous] + cast(added)
            return ib.get()

    out_buf = tirx.decl_buffer(shape, dtype, "out_buf")
    return te.extern([shape], [data], lambda ins, outs: body(ins[0], outs[0]), dtype=dtype,
                     out_buffers=[out_buf], name="cumsum_rows", tag="cumsum_rows")
