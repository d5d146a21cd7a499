"""A bidirectional LSTM / GRU / RNN with large recurrent weights as two single-direction recurrences.

What: ``apart(convert, …)`` — for a bidirectional node whose recurrent weights ``R`` (all
directions, float32) exceed ``APART_BYTES``, the node's converter runs once per direction on that
direction's slices of ``W``, ``R``, ``B``, ``initial_h``/``initial_c`` and ``P`` (``direction``
forward, then reverse), and the two results are concatenated along the directions axis: ``Y``,
``Y_h``, ``Y_c`` as ONNX lays them out for either ``layout``. Otherwise None: the node converts as
one recurrence whose steps advance both directions together (``rnn_unroll``).

Why: every step reads all of ``R``. Stacked, a 2-layer bidirectional LSTM of 512 units reads 8 MB a
step — more than the L2 of two cores (2 × 2 MB on the Intel AMX VM) — from L3: 33.3 ms against
onnxruntime's 21.1 (kernel sums, 2 threads). One direction's 4 MB, split over the cores' L2, stays
there step after step: the unidirectional LSTM of the same size ran at onnxruntime's speed (9.47 ms
against 9.45). Below the threshold (a CRNN's 48-unit GRU, a 256-unit GRU's 1.5 MB) a step of both
directions halves the kernel calls, which is what costs there.

Preserves: each direction's arithmetic (the same step, on its own slice); the outputs' values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.frontend.rnn_unroll import optional_input

#: Recurrent weight bytes (float32, all directions) above which the directions run one after the other.
APART_BYTES = 4 << 20

#: Inputs sliced per direction, by position: W, R, B, initial_h, initial_c, P (the directions axis
#: first, ``initial_*`` second with layout 1); X (0) and sequence_lens (4) are shared.
_PER_DIRECTION = (1, 2, 3, 5, 6, 7)


def _slice(bb: Any, expr: Any, d: int, axis: int) -> Any:
    """``expr[d:d + 1]`` along ``axis`` (in numpy for a constant)."""
    from tvm import relax  # noqa: PLC0415

    if _tvm.is_constant(expr):
        return relax.const(np.ascontiguousarray(np.take(_tvm.constant_numpy(expr), [d], axis=axis)))
    return bb.emit(relax.op.strided_slice(expr, axes=[axis], begin=[d], end=[d + 1]))


def _weight_bytes(r: Any) -> int | None:
    try:
        return 4 * int(np.prod([int(dim) for dim in r.ty.shape]))
    except (TypeError, AttributeError):  # a symbolic or unknown shape
        return None


def apart(convert: Callable[[Any, list[Any], dict[str, Any]], Any], bb: Any, inputs: list[Any],
          attrs: dict[str, Any], cell: Any, outputs: int) -> Any | None:
    """``convert`` run once per direction of a bidirectional node with large recurrent weights,
    the results (a tuple of ``outputs``: Y, Y_h[, Y_c]) joined (see the module docstring); None for
    any other node. ``cell``: the node as ``rnn_unroll.parse_cell`` checked it (its inputs then have
    the shapes ONNX requires)."""
    from tvm import relax  # noqa: PLC0415

    size = _weight_bytes(inputs[2])
    if len(cell.directions) != 2 or size is None or size <= APART_BYTES:
        return None
    results = []
    for d, name in enumerate(cell.directions):
        sliced = list(inputs)
        for index in _PER_DIRECTION:
            part = optional_input(inputs, index)
            if part is not None:
                sliced[index] = _slice(bb, part, d, 1 if cell.layout and index in (5, 6) else 0)
        results.append(convert(bb, sliced, {**attrs, "direction": name, "activations": list(cell.activations[d])}))
    joined = []
    for i in range(outputs):
        # Y: [seq, dirs, batch, H] / [batch, seq, dirs, H]; Y_h, Y_c: [dirs, batch, H] / [batch, dirs, H]
        axis = (2 if cell.layout else 1) if i == 0 else (1 if cell.layout else 0)
        parts = [bb.emit(relax.TupleGetItem(result, i)) for result in results]
        joined.append(bb.emit(relax.op.concat(parts, axis=axis)))
    return bb.emit(relax.Tuple(joined))
