"""1-D convolutions as 2-D ones of height 1, so they take the NHWC conv kernels.

What: ``relax.nn.conv1d`` (NCW/OIW, a constant weight, static shapes) becomes ``expand_dims`` →
``conv2d`` (NCHW/OIHW, the kernel ``[O, I/groups, 1, K]``, stride/padding/dilation along W only) →
``squeeze``. The layout stage that runs next turns the conv2d into NHWC like any other.

Why: TVM legalizes conv1d into a direct loop nest that only the generic reduction rule schedules:
in float32 about onnxruntime's speed, in bfloat16 1.6× slower than float32 (every operand
converted as it is read, no ``vdpbf16ps``) — a speech model's feature extractor (wav2vec2's
seven conv1d layers, Whisper's two) in bf16 lost what bf16 gains elsewhere. As conv2d it gets
packed weights, the bf16 dot product and the epilogue fusion of the 2-D kernels.

When not: a weight computed at run time, symbolic shapes, other layouts: TVM's legalization.

Preserves: values (the same products over the same taps; a unit axis added and removed).
"""

from __future__ import annotations

from typing import Any

from amptool import _tvm
from amptool._tvm import static_shape


def conv1d_as_conv2d(mod: Any) -> Any:
    """``mod`` with every conv1d it can take rewritten (see the module docstring)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    conv1d = tvm.ir.Op.get("relax.nn.conv1d")
    if not _tvm.any_call(mod, lambda call: _tvm.calls_op(call, conv1d)):
        return mod

    @mutator
    class _Widen(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not _tvm.calls_op(call, conv1d) or not _takes(call):
                return call
            data, weight = call.args
            attrs = call.attrs
            kernel = _tvm.constant_numpy(weight)
            tall = relax.const(kernel.reshape(kernel.shape[0], kernel.shape[1], 1, kernel.shape[2]),
                               str(weight.ty.dtype))
            rows = self.builder_.emit(relax.op.expand_dims(data, axis=2))
            front, back = (int(p) for p in attrs.padding)
            conv = self.builder_.emit(relax.op.nn.conv2d(
                rows, tall, strides=(1, int(attrs.strides[0])), padding=(0, front, 0, back),
                dilation=(1, int(attrs.dilation[0])), groups=int(attrs.groups), data_layout="NCHW",
                kernel_layout="OIHW", out_layout="NCHW", out_dtype=str(call.ty.dtype)))
            return relax.op.squeeze(conv, axis=[2])

    return _tvm.rewrite_functions(mod, _Widen(mod))


def _takes(call: Any) -> bool:
    import tvm  # noqa: PLC0415

    attrs = call.attrs
    data, weight = call.args
    return ((str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) == ("NCW", "OIW", "NCW")
            and isinstance(weight, tvm.ir.GenericConst)
            and static_shape(data) is not None and static_shape(weight) is not None)
