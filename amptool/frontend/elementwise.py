"""Element-wise ops TVM 0.27's frontend lacks or gets wrong (each tested against onnxruntime)."""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError


def convert_isinf(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """IsInf honouring ``detect_positive`` / ``detect_negative``; TVM's ignores both (flags every inf)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x = inputs[0]
    positive, negative = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    if positive and negative:
        return None
    dtype = str(x.ty.dtype)
    if not (positive or negative):
        return op.logical_and(op.isinf(x), op.isnan(x))  # never true: nothing is detected
    sign = op.greater(x, relax.const(0, dtype)) if positive else op.less(x, relax.const(0, dtype))
    return op.logical_and(op.isinf(x), sign)


def convert_bitcast(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BitCast (opset 26): reinterpret the bits as ``to``, same element width. No TVM converter."""
    from onnx import helper  # noqa: PLC0415
    from tvm import topi  # noqa: PLC0415

    x = inputs[0]
    try:
        target = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs["to"]))))
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"BitCast to element type {attrs.get('to')!r}: amptool cannot express it") from err
    source = str(x.ty.dtype)
    width = {"bool": 8, "bfloat16": 16}
    bits = width.get(source) or np.dtype(source).itemsize * 8
    if bits != (width.get(target) or np.dtype(target).itemsize * 8):
        raise UserError(f"BitCast from {source} to {target}: the element widths differ")
    if target == source:
        return x
    if "bool" in (source, target):  # TVM's bool is one bit wide: reinterpreting it fails LLVM's verifier
        from tvm import relax  # noqa: PLC0415

        return relax.op.astype(x, target)  # bool's byte is 0 or 1: the same bits as that integer
    return bb.emit_te(topi.reinterpret, x, target)


def convert_bitshift(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """BitShift with every shift amount defined: by the element width or more (or, for signed
    types since opset 28, by a negative amount) a left shift gives 0 and a right shift the sign
    fill — an arithmetic shift for signed types, 0 for unsigned.

    Why: TVM's converter emits a plain shift, which LLVM leaves undefined from the width on: the
    int8 cases of ONNX's opset-28 conformance suite got ``x >> (s mod 8)`` on an AVX2 build
    (``-8 >> 8`` gave -8, not -1) where an AVX-512 build had happened to match.
    """
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x, amount = inputs[0], inputs[1]
    dtype = str(x.ty.dtype)
    direction = attrs.get("direction", b"LEFT")
    direction = direction.decode("ascii") if isinstance(direction, bytes) else str(direction)
    if direction not in ("LEFT", "RIGHT"):
        raise UserError(f"BitShift direction {direction!r}: ONNX defines LEFT and RIGHT only")
    width = np.iinfo(np.dtype(dtype)).bits
    signed = np.issubdtype(np.dtype(dtype), np.signedinteger)
    too_far = op.greater_equal(amount, relax.const(width, dtype))
    if signed:
        too_far = op.logical_or(too_far, op.less(amount, relax.const(0, dtype)))
    zero = relax.const(0, dtype)
    if direction == "RIGHT" and signed:
        return op.right_shift(x, op.where(too_far, relax.const(width - 1, dtype), amount))
    shift = op.left_shift if direction == "LEFT" else op.right_shift
    return op.where(too_far, zero, shift(x, op.where(too_far, zero, amount)))


def convert_constant(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Constant given as ``value_float``/``value_floats``/``value_int``/``value_ints``: TVM's converter
    reads ``value`` only ("no value in Constant"), and onnxruntime's folding, which turns the others
    into initializers, does not run on every model (a bfloat16 model it cannot load, ``--no-prepare``)."""
    from tvm import relax  # noqa: PLC0415

    for key, dtype in (("value_float", "float32"), ("value_floats", "float32"), ("value_int", "int64"),
                       ("value_ints", "int64")):
        if key in attrs:
            return relax.const(np.asarray(attrs[key], dtype=dtype), dtype)
    return None


def _activation(formula: Any) -> Any:
    """A converter for an activation TVM's converter builds with float32 constants, which fails on a
    float16/bfloat16/float64 input ("Binary operators must have the same datatype"): a model that is
    half precision itself. ``formula(op, x, const, attrs)`` builds it with constants of x's dtype;
    float32 inputs decline to TVM's converter."""

    def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        from tvm import relax  # noqa: PLC0415

        x = inputs[0]
        dtype = _tvm.tensor_dtype(x)
        if dtype in (None, "float32"):
            return None

        def const(value: float) -> Any:
            return relax.const(value, dtype)

        return formula(relax.op, x, const, attrs)

    return convert


def _elu(op: Any, x: Any, const: Any, attrs: dict[str, Any]) -> Any:
    alpha = float(attrs.get("alpha", 1.0))
    return op.where(op.less(x, const(0.0)), op.multiply(const(alpha), op.subtract(op.exp(x), const(1.0))), x)


def _selu(op: Any, x: Any, const: Any, attrs: dict[str, Any]) -> Any:
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    negative = op.subtract(op.multiply(const(alpha), op.exp(x)), const(alpha))
    return op.multiply(const(gamma), op.where(op.less_equal(x, const(0.0)), negative, x))


def _thresholded_relu(op: Any, x: Any, const: Any, attrs: dict[str, Any]) -> Any:
    return op.where(op.greater(x, const(float(attrs.get("alpha", 1.0)))), x, const(0.0))


convert_elu = _activation(_elu)
convert_selu = _activation(_selu)
convert_thresholded_relu = _activation(_thresholded_relu)


def convert_swish(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Swish (opset 24): ``x * sigmoid(alpha * x)``. No TVM converter."""
    return _swish(inputs[0], float(attrs.get("alpha", 1.0)))


def convert_swiglu(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """SwiGLU (opset 28): ``Swish_alpha(gate) * value``, an LLM MLP's gate. No TVM converter."""
    from tvm import relax  # noqa: PLC0415

    return relax.op.multiply(_swish(inputs[0], float(attrs.get("alpha", 1.0))), inputs[1])


def _swish(x: Any, alpha: float) -> Any:
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    scaled = x if alpha == 1.0 else op.multiply(x, relax.const(alpha, _tvm.tensor_dtype(x) or "float32"))
    return op.multiply(x, op.sigmoid(scaled))
