"""Transposed convolutions as one ordinary convolution per output phase, interleaved.

What: ``relax.nn.conv2d_transpose`` / ``conv1d_transpose`` (one group, no dilation, a constant
weight, static shapes) becomes a stride-1 ``conv2d`` / ``conv1d`` whose output channels are the
``s_h·s_w`` output phases of each channel, then a reshape/transpose that interleaves the phases
(depth-to-space) and a slice that drops the transposed conv's padding. With stride ``s`` and
kernel ``k``, output row ``q·s + r`` (before cropping) only ever meets taps ``r, r+s, r+2s, …``:

    y[m·s + r - pad] = Σ_j x[m - j] · w[r + s·j]      j < K = ceil(k / s)

— a correlation of ``x`` (padded ``K-1`` in front) with those taps reversed. Each phase's taps are
zero-filled to ``K``, so all phases are one conv of ``K×K`` taps and ``s²·C_out`` channels; its
weights are rearranged once, here, in numpy.

Why: TVM legalizes a transposed conv as a dilated input (``s-1`` zeros between pixels, built
serially), a padded copy and a direct conv over it — ``s²`` times the multiplications, all but
1/s² of them by zero, under a generic schedule, with the kernel flipped on every call: a
ConvTranspose 128→64, 3×3, stride 2 on 28×28 ran 6.5× onnxruntime's time. As a conv it takes the
NHWC conv kernels (packed weights, vectorized epilogues) like any other layer.

When not: groups > 1, dilation > 1, a weight computed at run time, dynamic shapes, a layout
other than NCHW/IOHW (NCW/IOW): the call is left to TVM's legalization.

Preserves: values up to float rounding (the same products, summed in another order; the
zero-filled taps add exact zeros).
"""

from __future__ import annotations

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
    """Per spatial dim: stride ``s``, taps per phase ``K``, rows computed per phase ``M``, the
    conv's padding (front ``K-1``, back ``M - L`` when positive) and the crop (from ``pad``)."""

    def __init__(self, length: int, kernel: int, stride: int, pad_front: int, out: int) -> None:
        self.stride = stride
        self.taps = math.ceil(kernel / stride)
        self.rows = math.ceil((pad_front + out) / stride)
        self.pad = (self.taps - 1, max(0, self.rows - length))
        self.conv_rows = length + self.pad[1]  # ≥ rows
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


def _phase_weights(weight: np.ndarray, plans: list[_Plan]) -> np.ndarray:
    """IO(spatial) transposed-conv weights → OI(spatial) conv weights of ``s…·C_out`` channels,
    phase-major: channel ``(r_1, …, r_d, c)``, tap ``u`` of phase ``r`` = ``w[r + s·(K-1-u)]``."""
    cin, cout, *kernel = weight.shape
    dims = len(plans)
    padded = np.zeros((cin, cout, *(p.taps * p.stride for p in plans)), weight.dtype)
    padded[(slice(None), slice(None), *(slice(0, k) for k in kernel))] = weight
    # [ci, co, K_1, s_1, …] — tap a·s + r at [a, r]; reverse each a (u = K-1-a)
    split = padded.reshape(cin, cout, *(n for p in plans for n in (p.taps, p.stride)))
    split = np.flip(split, axis=tuple(2 + 2 * i for i in range(dims)))
    order = (*(3 + 2 * i for i in range(dims)), 1, 0, *(2 + 2 * i for i in range(dims)))
    phases = math.prod(p.stride for p in plans)
    return np.ascontiguousarray(split.transpose(order)).reshape(phases * cout, cin, *(p.taps for p in plans))


def _emit(builder: Any, call: Any, plans: list[_Plan]) -> Any:
    """The conv, the interleave and the crop, bound in ``builder``; returns the last one."""
    from tvm import relax  # noqa: PLC0415

    data, weight = call.args
    dims = len(plans)
    dtype = str(weight.ty.dtype)
    phased = relax.const(_phase_weights(_tvm.constant_numpy(weight), plans), dtype)
    out_dtype = str(call.ty.dtype)  # the attribute may be unset (None): the call's type says
    layouts = _TRANSPOSED[str(call.op.name)]
    conv_op = relax.op.nn.conv2d if dims == 2 else relax.op.nn.conv1d
    padding = [p.pad[0] for p in plans] + [p.pad[1] for p in plans]
    conv = builder.emit(conv_op(data, phased, strides=1, padding=padding, dilation=1, groups=1,
                                data_layout=layouts[0], kernel_layout="OI" + layouts[0][2:], out_dtype=out_dtype))
    out = static_shape(call)
    assert out is not None  # _plan checked
    batch, cout = out[:2]
    conv_rows = [p.conv_rows for p in plans]
    # [N, s_1…s_d·C, R_1…R_d] → [N, s_1…s_d, C, R_1…R_d] → [N, C, R_1, s_1, …] → [N, C, R_1·s_1, …]
    split = builder.emit(relax.op.reshape(conv, [batch, *(p.stride for p in plans), cout, *conv_rows]))
    order = [0, dims + 1, *(n for i in range(dims) for n in (dims + 2 + i, 1 + i))]
    interleaved = builder.emit(relax.op.permute_dims(split, order))
    merged = builder.emit(relax.op.reshape(interleaved, [batch, cout, *(r * p.stride for r, p in
                                                                        zip(conv_rows, plans, strict=True))]))
    axes = list(range(2, 2 + dims))
    return relax.op.strided_slice(merged, axes, [p.crop[0] for p in plans], [p.crop[1] for p in plans])

