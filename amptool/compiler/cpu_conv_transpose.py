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

The elementwise chain after a transposed conv — its bias add, a folded BatchNorm's multiply and
add, an activation, the cast of a mixed-precision build — is applied to each phase conv's output,
before the interleave (a per-channel constant repeated for each phase the conv computes): there it
joins the conv's epilogue, and the interleave moves the chain's result — in a bfloat16 build half the
bytes of the float32 sums. (U-Net bfloat16 with the bias add and cast after the interleave: each
ConvTranspose's AMX kernel stored float32, 8 MB at 256², and the interleave read them back.)

When not: groups > 1, dilation > 1, a weight computed at run time, dynamic shapes, a layout
other than NCHW/IOHW (NCW/IOW): the call is left to TVM's legalization. The chain stops at a value
read twice, outside a dataflow block, or at an op that is not elementwise with per-channel or
scalar constants.

Preserves: values up to float rounding (the same products, summed in another order; the
zero-filled taps add exact zeros). The chain's ops take the same operands, elementwise, so moving
them before the interleave and crop changes no value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

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
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    ops = {tvm.ir.Op.get(name): name for name in _TRANSPOSED}
    if not _tvm.any_call(mod, lambda call: call.op in ops):
        return mod
    chains: dict[int, _Chain] = {}
    for _gv, func in _tvm.relax_functions(mod):
        chains.update(_chains(func, ops))
    dropped = frozenset().union(*(chain.drop for chain in chains.values()))

    @mutator
    class _Splitter(PyExprMutator):
        def visit_var_binding_(self, binding: Any) -> None:
            handle = binding.var.__chandle__()
            if handle in dropped:
                return
            chain = chains.get(handle)
            if chain is None:
                super().visit_var_binding_(binding)
                return
            data, weight = chain.conv.args
            call = self.builder_.normalize(relax.Call(chain.conv.op, [self.visit_expr(data), weight], chain.conv.attrs))
            value = self.builder_.normalize(_emit(self.builder_, call, chain.plans, chain.steps))
            self.builder_.emit_normalized(_tvm.var_binding(binding.var, value))

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.op not in ops:
                return call
            plan = _plan(call, ops[call.op])
            return call if plan is None else _emit(self.builder_, call, plan)

    return _tvm.rewrite_functions(mod, _Splitter(mod))


#: Unary elementwise ops a chain takes before the interleave (``astype`` too, any dtype).
_UNARY = frozenset(f"relax.{name}" for name in (
    "nn.relu", "nn.leakyrelu", "nn.silu", "nn.gelu", "nn.gelu_tanh", "sigmoid", "tanh", "clip", "astype"))
#: Binary elementwise ops a chain takes when the other operand is a per-channel or scalar constant.
_BINARY = frozenset(f"relax.{name}" for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum"))


class _Step(NamedTuple):
    """One op of a chain: the call, which argument is the chain's value (-1: a unary op), and a
    binary op's constant as the shape it broadcasts with (``_per_channel``)."""

    call: Any
    operand: int
    constant: np.ndarray | None = None


class _Chain(NamedTuple):
    """A transposed conv (the call), its plan, the ops after it moved before the interleave, and the
    bindings that go (the conv's and every step's but the last, which binds the interleave)."""

    conv: Any
    plans: list[_Plan]
    steps: list[_Step]
    drop: frozenset[int]


def _chains(func: Any, ops: dict[Any, str]) -> dict[int, _Chain]:
    """The chains after the transposed convs (``ops``: op → name) of ``func``'s dataflow blocks, by
    the handle of the variable each chain's last step binds."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    uses = _tvm.var_uses(func)
    found: dict[int, _Chain] = {}
    if not isinstance(func.body, relax.SeqExpr):
        return found
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        readers: dict[int, Any] = {}  # variable handle → the one binding reading it
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call):
                for arg in _tvm.array_items(binding.value.args):
                    if isinstance(arg, relax.DataflowVar) and uses[arg.__chandle__()] == 1:
                        readers[arg.__chandle__()] = binding
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op not in ops:
                continue
            plans = _plan(call, ops[call.op])
            if plans is None:
                continue
            var, steps, drop = binding.var, [], []
            channels = _tvm.static_shape(call)[1]  # type: ignore[index]  # _plan checked
            while var.__chandle__() in readers:
                reader = readers[var.__chandle__()]
                step = _step(reader.value, var, channels)
                if step is None or not isinstance(reader.var, relax.DataflowVar):
                    break
                drop.append(var.__chandle__())
                steps.append(step)
                var = reader.var
            if steps:
                found[var.__chandle__()] = _Chain(call, plans, steps, frozenset(drop))
    return found


def _step(call: Any, value: Any, channels: int) -> _Step | None:
    """``call`` as a chain step on ``value`` (an NC… tensor of ``channels`` channels), or None."""
    name = _tvm.op_name(call)
    args = _tvm.array_items(call.args)
    if name in _UNARY and args[0].same_as(value):
        return _Step(call, -1)
    if name not in _BINARY or len(args) != 2:
        return None
    operand = 0 if args[0].same_as(value) else 1
    other = args[1 - operand]
    constant = None if other.same_as(value) else _per_channel(other, _tvm.static_shape(value), channels)
    return None if constant is None else _Step(call, operand, constant)


def _per_channel(expr: Any, shape: list[int] | None, channels: int) -> np.ndarray | None:
    """A constant that varies at most along axis 1 of a tensor of ``shape``, as the shape it
    broadcasts with (leading 1s added); None for anything else."""
    if shape is None or not _tvm.is_constant(expr):
        return None
    value = _tvm.constant_view(expr)
    if value.ndim > len(shape):
        return None
    full = value.reshape((1,) * (len(shape) - value.ndim) + value.shape)
    if full.shape[0] != 1 or full.shape[1] not in (1, channels) or any(d != 1 for d in full.shape[2:]):
        return None
    return full


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


def _emit(builder: Any, call: Any, plans: list[_Plan], steps: Sequence[_Step] = ()) -> Any:
    """The phase convs, each followed by ``steps``, the interleave and the crop, bound in ``builder``;
    returns the last one."""
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
        out = builder.emit(conv_op(data, relax.const(phase_weights, dtype), strides=1, padding=padding, dilation=1,
                                   groups=1, data_layout=layouts[0], kernel_layout="OI" + layouts[0][2:],
                                   out_dtype=out_dtype))
        return _apply(builder, out, steps, phase_weights.shape[0] // cout)

    out = static_shape(call)
    assert out is not None  # _plan checked
    batch, cout = out[:2]
    phase_weights = [_phase_weight(weights, plans, phase, taps) for phase, taps in _phases(plans)]
    if len({w.shape for w in phase_weights}) == 1:
        phased = conv(np.concatenate(phase_weights))
    else:
        phased = builder.emit(relax.op.concat([conv(w) for w in phase_weights], axis=1))
    conv_rows = [p.conv_rows for p in plans]
    # [N, s_1…s_d·C, R_1…R_d] → [N, s_1…s_d, C, R_1…R_d] → [N, C, R_1, s_1, …] → [N, C, R_1·s_1, …]
    split = builder.emit(relax.op.reshape(phased, [batch, *(p.stride for p in plans), cout, *conv_rows]))
    order = [0, dims + 1, *(n for i in range(dims) for n in (dims + 2 + i, 1 + i))]
    interleaved = builder.emit(relax.op.permute_dims(split, order))
    merged = builder.emit(relax.op.reshape(interleaved, [batch, cout, *(r * p.stride for r, p in
                                                                        zip(conv_rows, plans, strict=True))]))
    axes = list(range(2, 2 + dims))
    return relax.op.strided_slice(merged, axes, [p.crop[0] for p in plans], [p.crop[1] for p in plans])


def _apply(builder: Any, value: Any, steps: Sequence[_Step], phases: int) -> Any:
    """``steps`` on a phase conv's output (``phases`` phases of the channels, phase-major), bound in
    ``builder``: a per-channel constant repeated once per phase."""
    from tvm import relax  # noqa: PLC0415

    for step in steps:
        args = list(_tvm.array_items(step.call.args))
        if step.operand < 0:
            args[0] = value
        else:
            other, constant = args[1 - step.operand], step.constant
            assert constant is not None  # _step keeps a binary op's constant
            if constant.shape[1] > 1:
                other = relax.const(np.tile(constant, (1, phases) + (1,) * (constant.ndim - 2)),
                                    _tvm.tensor_dtype(other))
            args[step.operand], args[1 - step.operand] = value, other
        value = builder.emit(relax.Call(step.call.op, args, step.call.attrs))
    return value
