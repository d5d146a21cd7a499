"""Grouped bfloat16 1×1 convs as one matmul per group, so each runs on AMX tiles.

What: on a target with AMX-BF16, an NHWC ``relax.nn.conv2d`` with ``groups`` > 1 of bfloat16 data
and constant weight, float32 sums, whose groups are 1×1 stride-1 unpadded convs (the matmul of
their pixels), becomes per group ``conv2d(data[..., group's channels], weight[group's filters])``
and a concat of the results along channels — each a dense conv that ``amx_plan.plan`` takes as a
matmul. Grouped convs with taps (RegNet's 3×3, 64-channel groups) stay one conv: the AMX conv
kernel runs every group in one call (``cpu_amx_conv``, ``amx_plan.grouped_kind``).

Why: the AMX kernels take dense products only; a grouped one ran on float32 FMAs over converted
weights (``cpu_kernels._grouped_conv2d_nhwc``).

When not: depthwise convs and groups under ``amx_plan.MIN_GROUP_CHANNELS`` (a tile step is 32
channels deep: narrower groups would be mostly zeros), other dtypes, targets without AMX, shapes
the AMX kernels do not take. Preserves: each group's products and sums (the same taps, one group's
channels each).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm


def split_amx_groups(mod: Any) -> Any:
    """``mod`` with every grouped 1×1 conv whose groups AMX tiles take split by group (module docstring)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    from amptool.compiler import amx_plan  # noqa: PLC0415

    conv2d = tvm.ir.Op.get("relax.nn.conv2d")
    if not _tvm.any_call(mod, lambda call: _tvm.calls_op(call, conv2d) and int(call.attrs.groups) > 1):
        return mod

    @mutator
    class _Split(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            shape = _grouped_shape(call) if _tvm.calls_op(call, conv2d) else None
            if shape is None:
                return call
            data, weight = call.args
            attrs = call.attrs
            groups = int(attrs.groups)
            kernel = _tvm.constant_numpy(weight)
            per_in, per_out = int(kernel.shape[1]), kernel.shape[0] // groups
            batch, height, width, _ = shape
            geometry = [[int(v) for v in values] for values in (attrs.strides, attrs.padding, attrs.dilation)]
            if amx_plan.grouped_kind(tuple(shape), kernel.shape, groups, *geometry) != "matmul":
                return call  # one grouped AMX conv (``amx_plan.plan``), or not on tiles: the conv stays grouped
            # Each group's channels by an index tensor, not a slice's constant begin: one kernel for
            # every group (as the kernel's argument), not one kernel each to compile (RegNet: 13 s).
            split = self.builder_.emit(relax.op.reshape(data, [batch, height, width, groups, per_in]))
            convs = []
            for group in range(groups):
                index = relax.const(np.array([group], "int64"))
                part = self.builder_.emit(relax.op.reshape(self.builder_.emit(relax.op.take(split, index, axis=3)),
                                                           [batch, height, width, per_in]))
                filters = relax.const(kernel[group * per_out:(group + 1) * per_out].copy(), str(weight.ty.dtype))
                convs.append(self.builder_.emit(relax.op.nn.conv2d(
                    part, filters, strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation, groups=1,
                    data_layout="NHWC", kernel_layout="OIHW", out_layout="NHWC", out_dtype=str(call.ty.dtype))))
            return relax.op.concat(convs, axis=3)

    return _tvm.rewrite_functions(mod, _Split(mod))


def _grouped_shape(call: Any) -> list[int] | None:
    """The data's shape of a grouped NHWC conv whose operands the AMX kernels take
    (``amx_plan.operand_shape``); None for any other conv."""
    from amptool.compiler.amx_plan import operand_shape  # noqa: PLC0415

    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NHWC", "OIHW", "NHWC") or int(attrs.groups) < 2:
        return None
    shape = operand_shape(call)  # the weight a constant: its shape static
    return shape if shape is not None and len(shape) == 4 else None
