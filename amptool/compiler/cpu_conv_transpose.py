"""Transposed convolutions as one ordinary convolution per output phase, interleaved.

What: ``relax.nn.conv2d_transpose`` / ``conv1d_transpose`` (one group, no dilation, a constant
weight, static shapes) becomes a stride-1 ``conv2d`` / ``conv1d`` whose output channels are the
``s_h·s_w`` output phases of each channel, then a reshape/transpose that interleaves the phases
(depth-to-space) and a slice that drops the transposed conv's padding. With stride ``s`` and
kernel ``k``, output row ``q·s + r`` (before cropping) only ever meets taps ``r, r+s, r+2s, …``:

    y[m·s + r - pad] = Σ_j x[m - j] · w[r + s·j]      j < K = ceil(k / s)

— a correlation of ``x`` (padded ``K-1`` in front) with those taps reversed. Phase ``r`` has
``K_r = ceil((k - r) / s)`` real taps. When every phase has as many (``s`` divides ``k``: 4×4 and
2×2 with stride 2), all phases are one conv of ``K×K`` taps and ``s²·C_out`` channels; otherwise
each phase is a conv of its own ``K_r`` taps (padded ``K_r-1`` in front, so every phase yields the
same rows), concatenated on channels. The weights are rearranged once, here, in numpy.

Why: TVM legalizes a transposed conv as a dilated input (``s-1`` zeros between pixels, built
serially), a padded copy and a direct conv over it — ``s²`` times the multiplications, all but
1/s² of them by zero, under a generic schedule, with the kernel flipped on every call: a
ConvTranspose 128→64, 3×3, stride 2 on 28×28 ran 6.5× onnxruntime's time. As a conv it takes the
NHWC conv kernels (packed weights, vectorized epilogues) like any other layer. A 3×3 stride-2 kernel
as one phase conv zero-fills 16 taps for 9 real ones; as four (2×2, 2×1, 1×2, 1×1 taps) it does
9/16 of the multiplications.

When not: groups > 1, dilation > 1, a weight computed at run time, dynamic shapes, a layout
other than NCHW/IOHW (NCW/IOW): the call is left to TVM's legalization.

Preserves: values up to float rounding (the same products, summed in another order; the
zero-filled taps add exact zeros).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from amptool import _tvm
from amptool._tvm import static_shape

#: op name → (data layout, kernel layout) it must have; its conv (conv2d or conv1d) keeps the data layout.
_TRANSPOSED = {
    "relax.nn.conv2d_transpose": ("NCHW", "IOHW"),
    "relax.nn.conv1d_transpose": ("NCW", "IOW"),
}


def split_conv_transpose(mod: Any) -> Any:
    """``mod`` with every transposed conv it can take rewritten (see the module docstring)."""
    import tvm  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    ops = {tvm.ir.Op.get(name): name for name in _TRANSPOSED}
    if not _tvm.any_call(mod, lambda call: call.op in ops):
        return mod

    @mutator
    class _Splitter(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.op not in ops:
                return call
            plan = _plan(call, ops[call.op])
            return call if plan is None else _emit(self.builder_, call, plan)

    return _tvm.rewrite_functions(mod, _Splitter(mod))


class _Plan:
    """Per spatial dim: stride ``s``, taps per phase ``K`` (a phase conv pads ``taps - 1`` in
    front), rows computed per phase ``M``, the back padding every phase conv takes (``M - L`` when
    positive) and the crop (from ``pad``)."""

    def __init__(self, length: int, kernel: int, stride: int, pad_front: int, out: int) -> None:
        self.stride = stride
        self.kernel = kernel
        self.taps = math.ceil(kernel / stride)
        self.rows = math.ceil((pad_front + out) / stride)
        self.pad_back = max(0, self.rows - length)
        self.conv_rows = length + self.pad_back  # ≥ rows
        self.crop = (pad_front, pad_front + out)


def _plan(call: Any, name: str) -> list[_Plan] | None:
    import tvm  # noqa: PLC0415

    data_layout, kernel_layout = _TRANSPOSED[name]
    attrs = call.attrs
    data, weight = call.args
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != (
            data_layout, kernel_layout, data_layout):
        return None
    if int(attrs.groups) != 1 or any(int(d) != 1 for d in attrs.dilation):
        return None
    if not isinstance(weight, tvm.ir.GenericConst):
        return None
    shape, wshape, out = static_shape(data), static_shape(weight), static_shape(call)
    if shape is None or wshape is None or out is None:
        return None
    dims = len(shape) - 2
    pads = [int(p) for p in attrs.padding]
    return [_Plan(shape[2 + i], wshape[2 + i], int(attrs.strides[i]), pads[i], out[2 + i]) for i in range(dims)]


def _phases(plans: list[_Plan]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each output phase ``r`` (row-major over the dims) with the taps its conv takes per dim: its real
    taps ``ceil((k - r) / s)`` (at least one: a phase no tap reaches is one zero tap), or ``K`` for
    every phase when all phases have as many real taps (then one conv serves them all)."""
    phases = list(itertools.product(*(range(p.stride) for p in plans)))
    real = [tuple(max(1, math.ceil((p.kernel - r) / p.stride)) for r, p in zip(phase, plans, strict=True))
            for phase in phases]
    if len(set(real)) == 1:
        return [(phase, tuple(p.taps for p in plans)) for phase in phases]
    return list(zip(phases, real, strict=True))


def _phase_weight(weight: np.ndarray, plans: list[_Plan], phase: tuple[int, ...], taps: tuple[int, ...]) -> np.ndarray:
    """IO(spatial) transposed-conv weights → the OI(spatial) weights of one phase's conv: tap ``u``
    of dim ``i`` is ``w[r_i + s_i·(taps_i - 1 - u)]``, zero where that lies past the kernel."""
    cin, cout, *kernel = weight.shape
    out = np.zeros((cout, cin, *taps), weight.dtype)
    source = tuple(slice(r, k, p.stride) for r, k, p in zip(phase, kernel, plans, strict=True))
    picked = weight[(slice(None), slice(None), *source)]  # taps r, r+s, … of each dim, in kernel order
    reversed_taps = np.flip(picked, axis=tuple(range(2, 2 + len(plans))))
    # reversed, tap j sits at u = taps-1-j: the real taps fill the last positions of each dim
    out[(slice(None), slice(None), *(slice(t - n, t) for t, n in zip(taps, picked.shape[2:], strict=True)))] = (
        reversed_taps.transpose(1, 0, *range(2, 2 + len(plans))))
    return out


def _emit(builder: Any, call: Any, plans: list[_Plan]) -> Any:
    """The phase convs, the interleave and the crop, bound in ``builder``; returns the last one."""
    from tvm import relax  # noqa: PLC0415

    data, weight = call.args
    dims = len(plans)
    dtype = str(weight.ty.dtype)
    weights = _tvm.constant_numpy(weight)
    out_dtype = str(call.ty.dtype)  # the attribute may be unset (None): the call's type says
    layouts = _TRANSPOSED[str(call.op.name)]
    conv_op = relax.op.nn.conv2d if dims == 2 else relax.op.nn.conv1d

    def conv(phase_weights: np.ndarray) -> Any:
        taps = phase_weights.shape[2:]
        padding = [t - 1 for t in taps] + [p.pad_back for p in plans]
        return builder.emit(conv_op(data, relax.const(phase_weights, dtype), strides=1, padding=padding, dilation=1,
                                    groups=1, data_layout=layouts[0], kernel_layout="OI" + layouts[0][2:],
                                    out_dtype=out_dtype))

    phase_weights = [_phase_weight(weights, plans, phase, taps) for phase, taps in _phases(plans)]
    if len({w.shape for w in phase_weights}) == 1:
        phased = conv(np.concatenate(phase_weights))
    else:
        phased = builder.emit(relax.op.concat([conv(w) for w in phase_weights], axis=1))
    out = static_shape(call)
    assert out is not None  # _plan checked
    batch, cout = out[:2]
    conv_rows = [p.conv_rows for p in plans]
    # [N, s_1…s_d·C, R_1…R_d] → [N, s_1…s_d, C, R_1…R_d] → [N, C, R_1, s_1, …] → [N, C, R_1·s_1, …]
    split = builder.emit(relax.op.reshape(phased, [batch, *(p.stride for p in plans), cout, *conv_rows]))
    order = [0, dims + 1, *(n for i in range(dims) for n in (dims + 2 + i, 1 + i))]
    interleaved = builder.emit(relax.op.permute_dims(split, order))
    merged = builder.emit(relax.op.reshape(interleaved, [batch, cout, *(r * p.stride for r, p in
                                                                        zip(conv_rows, plans, strict=True))]))
    axes = list(range(2, 2 + dims))
    return relax.op.strided_slice(merged, axes, [p.crop[0] for p in plans], [p.crop[1] for p in plans])
