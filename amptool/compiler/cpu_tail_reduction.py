"""Reductions over a last axis no vector width divides: a vectorized body and a scalar tail.

What: ``sum``, ``mean``, ``variance``, ``max`` and ``min`` over the last axis of a float tensor
whose length ``n`` no 4-, 8- or 16-lane vector divides (wav2vec2's GroupNorm over 3199 samples)
become two reductions per row — over the first ``n - n % lanes`` values and over the rest —
combined by one add (or max / min). ``cpu_row_reduction`` then factors the first into vector
partial sums and leaves the short tail scalar.

Why: that schedule needs a length a vector divides, and TVM's own reductions are one dependent
scalar chain per row: wav2vec2's first GroupNorm (512 rows of 3199) took 20.5 ms at one thread
in TVM's mean and variance kernels, where onnxruntime's takes 1.7 ms.

When not: another axis (or several), symbolic shapes, non-float dtypes, a length a vector divides
(the row rule takes it as it is) or one under two vectors (nothing to vectorize): TVM's own.

Preserves: values up to float rounding, as ``cpu_row_reduction`` (partial sums in another order);
``variance`` subtracts the mean first, as TVM's does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amptool._tvm import static_shape
from amptool.dtypes import DTYPES

#: Ops this module legalizes, and the reduction each is made of.
REDUCTIONS = ("relax.sum", "relax.mean", "relax.variance", "relax.max", "relax.min")

#: The vector widths ``cpu_row_reduction`` factors a reduction's partial results by, widest first
#: (float32 lanes, those up to the target's); a length one of them divides needs no tail.
ROW_VECTOR_WIDTHS = (16, 8, 4)


def tail_split(length: int, lanes: int) -> int | None:
    """Where a reduction of ``length`` values splits into a vectorized body and a scalar tail
    (the body's length), or None when it needs no split or has too little to vectorize."""
    if any(length % width == 0 for width in ROW_VECTOR_WIDTHS if width <= lanes) or length < 2 * lanes:
        return None
    return length - length % lanes


def legalization(default: Callable[[Any, Any], Any], lanes: Callable[[], int]) -> Callable[[Any, Any], Any]:
    """A legalization for the ops in ``REDUCTIONS``: the split reduction where ``tail_split``
    gives one, else ``default`` (TVM's). ``lanes``: the current target's float32 lanes."""

    def legalize(bb: Any, call: Any) -> Any:
        x = call.args[0]
        shape = static_shape(x)
        if shape is None or not shape or str(x.ty.dtype) not in DTYPES:
            return default(bb, call)
        axes = call.attrs.axis
        last = len(shape) - 1
        if axes is None or [int(a) % len(shape) for a in axes] != [last]:
            return default(bb, call)
        body = tail_split(shape[-1], lanes())
        if body is None:
            return default(bb, call)
        op = str(call.op.name).removeprefix("relax.")
        return bb.call_te(_split_reduction, x, op=op, body=body, keepdims=bool(call.attrs.keepdims),
                          primfunc_name_hint=op)

    return legalize


def _split_reduction(x: Any, op: str, body: int, keepdims: bool) -> Any:
    """``op`` over ``x``'s last axis as a body reduction and a tail reduction per row."""
    from tvm import te, tirx  # noqa: PLC0415

    *rows, length = (int(d) for d in x.shape)

    def split(value: Callable[..., Any], reducer: Callable[..., Any], combine: Callable[[Any, Any], Any],
              name: str) -> Any:
        """Per row: ``reducer`` of ``value(row, k)`` over the body, then the tail, combined."""
        head = te.reduce_axis((0, body), name="k")
        tail = te.reduce_axis((0, length - body), name="t")  # (from 0: TVM's schedule rules expect it)
        main = te.compute(rows, lambda *r: reducer(value(r, head), axis=head), name=f"{name}_body")
        rest = te.compute(rows, lambda *r: reducer(value(r, body + tail), axis=tail), name=f"{name}_tail")
        return te.compute(rows, lambda *r: combine(main(*r), rest(*r)), name=name)

    def element(r: tuple[Any, ...], k: Any) -> Any:
        return x(*r, k)

    scale = tirx.const(1.0 / length, x.dtype)
    if op in ("max", "min"):
        extreme = tirx.max if op == "max" else tirx.min
        reduced = split(element, te.max if op == "max" else te.min, extreme, op)
    elif op == "variance":
        total = split(element, te.sum, lambda a, b: a + b, "mean_sum")
        mean = te.compute(rows, lambda *r: total(*r) * scale, name="mean")

        def square(r: tuple[Any, ...], k: Any) -> Any:
            dev = x(*r, k) - mean(*r)
            return dev * dev

        squares = split(square, te.sum, lambda a, b: a + b, "square_sum")
        reduced = te.compute(rows, lambda *r: squares(*r) * scale, name="variance")
    else:
        total = split(element, te.sum, lambda a, b: a + b, "sum")
        reduced = total if op == "sum" else te.compute(rows, lambda *r: total(*r) * scale, name="mean")
    if not keepdims:
        return reduced
    return te.compute((*rows, 1), lambda *i: reduced(*i[:-1]), name=f"{op}_keepdims")
