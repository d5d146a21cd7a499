"""Which convs and matmuls run on AMX tiles: one decision, shared by legalization
(``cpu_kernels``) and the epilogue fusion (``amx_epilogues``), and the call that runs them.

A ``relax.matmul`` or NHWC ``relax.nn.conv2d`` gets an AMX kernel when its data and constant
weight are bfloat16 accumulated in float32, the current target has AMX-BF16, and the shape suits
the kernels (``cpu_amx.fits``, ``cpu_amx_conv.conv_fits``); a 1×1 stride-1 conv is the matmul of
its pixels. Why AMX, and the kernels: ``cpu_amx``. A product of two computed bfloat16 tensors
(attention's) gets :mod:`amptool.compiler.cpu_amx_batched`'s kernel (``plan_batched``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.compiler.cpu_amx import BLOCK, DEPTH, PLAIN, Epilogue, emit_matmul, fits, has_amx_bf16
from amptool.compiler.cpu_amx_batched import emit_batched
from amptool.compiler.cpu_amx_conv import conv_fits, emit_conv


@dataclass(frozen=True)
class Plan:
    """The AMX kernel for one conv2d or matmul call: a matmul of ``data`` (``[*lead, K]``) by a
    ``[K, N]`` weight, or a conv of NHWC ``data`` by an OIHW weight; ``weight_bits`` are the
    bfloat16 bit patterns (uint16)."""

    kind: str
    data: Any
    shape: tuple[int, ...]
    weight_bits: Any
    geometry: tuple[tuple[int, ...], ...] = ()  # a conv's (strides, padding, dilation)
    groups: int = 1

    def emit(self, bb: Any, epilogue: Epilogue = PLAIN, residual: Any = None) -> Any:
        """The kernel's call (its PrimFunc added to ``bb``), each output through ``epilogue``."""
        if self.kind == "matmul":
            return emit_matmul(bb, self.data, self.shape, self.weight_bits, epilogue, residual)
        strides, padding, dilation = (list(values) for values in self.geometry)
        return emit_conv(bb, self.data, self.shape, self.weight_bits, strides, padding, dilation, epilogue, residual,
                         self.groups)


#: Whether a target (by its string) has AMX-BF16: asked per conv and matmul.
_HAS_AMX: dict[str, bool] = {}


def target_has_amx() -> bool:
    """Whether the current target has AMX-BF16 (cached by the target's string)."""
    import tvm  # noqa: PLC0415

    target = tvm.target.Target.current(allow_none=True)
    if target is None:
        return False
    key = str(target)
    if key not in _HAS_AMX:
        _HAS_AMX[key] = has_amx_bf16(target)
    return _HAS_AMX[key]


def plan(call: Any) -> Plan | None:
    """The AMX kernel for a ``relax.matmul`` or NHWC ``relax.nn.conv2d`` call, or None: bfloat16
    data and constant weight accumulated in float32, a shape the kernels take, a target with
    AMX-BF16 (the current one)."""
    name = _tvm.op_name(call)
    shape = operand_shape(call) if name in ("relax.matmul", "relax.nn.conv2d") and len(call.args) == 2 else None
    if shape is None:
        return None
    data, weight = call.args
    bits = np.ascontiguousarray(_tvm.constant_view(weight)).view(np.uint16)
    if name == "relax.matmul":
        if bits.ndim != 2 or len(shape) < 2 or not fits(math.prod(shape[:-1]), shape[-1]):
            return None
        return Plan("matmul", data, tuple(shape[:-1]), bits)
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NHWC", "OIHW", "NHWC") or len(shape) != 4:
        return None
    strides, padding, dilation = ([int(v) for v in values] for values in (attrs.strides, attrs.padding, attrs.dilation))
    groups = int(attrs.groups)
    if groups == 1:
        kind = conv_kind(tuple(shape), tuple(bits.shape), strides, padding, dilation)
    else:  # a 1×1 group's matmul is split by group first (``amx_groups``): only a grouped "conv" here
        kind = grouped_kind(tuple(shape), tuple(bits.shape), groups, strides, padding, dilation)
        kind = kind if kind == "conv" else None
    if kind == "matmul":
        return Plan("matmul", data, tuple(shape[:-1]), np.ascontiguousarray(bits[:, :, 0, 0].T))  # pixels × [IC, OC]
    if kind is None:
        return None
    return Plan("conv", data, tuple(shape), bits, (tuple(strides), tuple(padding), tuple(dilation)), groups)


def operand_shape(call: Any) -> list[int] | None:
    """The data's static shape when a two-operand call's operands suit the AMX kernels — computed
    bfloat16 data, a constant bfloat16 weight, float32 sums, a target with AMX-BF16 — else None.
    (A constant's product is folded at build time, on the build machine, which may have no AMX: a
    cross-compile for another CPU.)"""
    import tvm  # noqa: PLC0415

    data, weight = call.args
    if (_tvm.tensor_dtype(data) != "bfloat16" or _tvm.tensor_dtype(weight) != "bfloat16"
            or _tvm.tensor_dtype(call) != "float32" or not isinstance(weight, tvm.ir.GenericConst)
            or _tvm.is_constant(data) or not target_has_amx()):
        return None
    return _tvm.static_shape(data)


#: Input channels a group needs to go to AMX tiles: one 32-deep tile step (a narrower group's would
#: be mostly zeros; depthwise convs have their own kernel).
MIN_GROUP_CHANNELS = 32


def grouped_kind(data_shape: tuple[int, ...], weight_shape: tuple[int, ...], groups: int, strides: list[int],
                 padding: list[int], dilation: list[int]) -> str | None:
    """``conv_kind`` of one group of a grouped NHWC conv (an OIHW ``weight_shape`` of ``[groups · out,
    in / groups, KH, KW]``), None for groups under ``MIN_GROUP_CHANNELS`` input channels. A "conv" runs
    every group in one call (``cpu_amx_conv``); a "matmul" (1×1 groups) one call a group (``amx_groups``)."""
    per_in = int(weight_shape[1])
    if per_in < MIN_GROUP_CHANNELS or int(weight_shape[0]) % groups or data_shape[-1] != per_in * groups:
        return None
    group_shape = (int(weight_shape[0]) // groups, per_in, *(int(d) for d in weight_shape[2:]))
    return conv_kind((*data_shape[:-1], per_in), group_shape, strides, padding, dilation)


def conv_kind(data_shape: tuple[int, ...], weight_shape: tuple[int, ...], strides: list[int], padding: list[int],
              dilation: list[int]) -> str | None:
    """Which AMX kernel a dense NHWC conv of ``data_shape`` by an OIHW ``weight_shape`` takes:
    "matmul" (a 1×1 stride-1 unpadded conv: the matmul of its pixels), "conv", or None."""
    if (tuple(weight_shape[2:]) == (1, 1) and set(strides) == {1} and not any(padding)
            and fits(math.prod(data_shape[:-1]), data_shape[-1])):
        return "matmul"
    if conv_fits(tuple(data_shape), weight_shape[0], (weight_shape[2], weight_shape[3]), strides, padding, dilation):
        return "conv"
    return None


def plan_batched(bb: Any, call: Any) -> Any | None:
    """The AMX kernel's call for a ``relax.matmul`` of two computed tensors (``[*batch, M, K] ·
    [*batch, K, N]``, the same batch dims), or None: bfloat16 operands accumulated in float32, static
    shapes, at least a block of rows an item and a ``K`` the micro-kernel takes (over 32, any: the batched
    kernel pads its last step), a target with AMX-BF16."""
    if _tvm.op_name(call) != "relax.matmul" or len(call.args) != 2:
        return None
    a, b = call.args
    if _tvm.tensor_dtype(a) != "bfloat16" or _tvm.tensor_dtype(b) != "bfloat16" or _tvm.tensor_dtype(call) != "float32":
        return None
    a_shape, b_shape = _tvm.static_shape(a), _tvm.static_shape(b)
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(a_shape) != len(b_shape):
        return None
    *batch, m, k = a_shape
    if tuple(b_shape[:-2]) != tuple(batch) or b_shape[-2] != k or not batched_fits(m, k):
        return None
    if _tvm.is_constant(a) or _tvm.is_constant(b) or not target_has_amx():
        return None  # (a constant's product is folded on the build machine: see ``plan``)
    return emit_batched(bb, a, b, tuple(batch), m, k, b_shape[-1])


def batched_fits(rows: int, k: int) -> bool:
    """Whether the batched kernel takes an item of ``rows`` × ``k`` (``cpu_amx.fits``, or any ``k``
    over one step: its last step zero-padded)."""
    return fits(rows, k) or (rows >= BLOCK and k > DEPTH)


def takes_attention(q_shape: list[int], keys: int, dtype: str) -> bool:
    """Whether both of an attention's products — ``q·kᵀ`` (``q_shape``'s rows × its head dim) and
    ``p·v`` (rows × ``keys``) — run on AMX tiles for the current target: then they are kept as
    products, not fused into ``cpu_attention``'s float32 kernel (ViT bf16 kernel sum 0.92×, Whisper
    0.73× on a Sapphire Rapids VM)."""
    rows, head = q_shape[-2], q_shape[-1]
    return dtype == "bfloat16" and batched_fits(rows, head) and batched_fits(rows, keys) and target_has_amx()
