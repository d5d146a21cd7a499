"""Casts to and from the narrow types TVM cannot compute with: float8, int4/uint4, int2/uint2,
and the rounding of a cast to bfloat16.

Why: on LLVM, TVM 0.27 gets every one of them wrong, measured against onnxruntime:

* float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ): a cast to float8 and back inside one fused
  kernel is dropped (no rounding at all); a float8 store flushes subnormals, turns ±inf/NaN
  into finite numbers, reads the FNUZ formats with the wrong bias, and fails to compile once
  vectorized (``if_then_else can only take scalar condition``);
* int4/uint4: the packed storage is garbage, and the conversion truncates where onnxruntime
  rounds half away from zero and wraps modulo 16 (int2/uint2 alike, modulo 4: the onnx
  reference's rule, onnxruntime has no such cast);
* bfloat16: a cast to bfloat16 and back inside one kernel is dropped, like float8; a cast
  from bfloat16 to an integer does not compile ("not supported for finiteness").

What: ``Cast``/``CastLike`` to those types become one TE kernel that computes exactly what
onnxruntime computes, from the float32 bits: float8 rounds to nearest even and saturates to
the format's largest finite value (``saturate=1``, the default) or overflows to NaN (to ±inf
for E5M2 from 65536 on, NaN just below; E4M3FN's [480, 496) gives 448: onnxruntime's
behaviour, quirks included, since it is the reference); the result is encoded into
the float8 bits, which TVM only moves and reinterprets, never converts. A cast *from* float8
reads a 256-entry float32 table indexed by the bits. int4/uint4 and int2/uint2 are carried in
int8/uint8 tensors that hold exactly their values (TVM cannot hold 4-bit or 2-bit tensors);
bfloat16 is rounded to nearest even on the bits, so the ``astype`` to bfloat16 that follows is
exact whatever TVM does with it.
Every source goes through float32 first, as onnxruntime's casts do (a float64 1.0625 + 1e-12
becomes 1.0 in E4M3, not 1.125).

When not: casts between the ordinary types stay TVM's. Types TVM can neither compute nor
store (float4, float6, float8 E8M0) are refused at import, naming the node:
:func:`check_narrow_types` (initializers and Constant nodes too). The CUDA code generator has
no FNUZ float8 types: a model with one builds for LLVM only.

Preserves: the graph's types, except that int4/uint4/int2/uint2 tensors (a graph input or output
included) are int8/uint8 holding the same values: the runner hands an ml_dtypes int4 feed over as
int8 (:func:`small_int_rewrites` keeps CastLike and QuantizeLinear reading such an input exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from amptool import _tvm
from amptool.dtypes import SMALL_INT_CONTAINERS
from amptool.errors import UserError
from amptool.frontend.graph import STANDARD_DOMAINS
from amptool.frontend.quantized import along


@dataclass(frozen=True)
class Float8:
    """A float8 format: sign bit, then ``8 - 1 - mantissa`` exponent bits and ``mantissa`` bits."""

    dtype: str
    mantissa: int
    bias: int
    largest: float  # largest finite value
    has_inf: bool  # E5M2 only
    fnuz: bool  # no negative zero, one NaN (0x80), no inf
    #: |x| in [low, high) gives the largest finite value with saturate=0 where rounding gives NaN:
    #: onnxruntime truncates E4M3FN's NaN pattern S.1111.111 to S.1111.110 before it rounds.
    truncated_band: tuple[float, float] | None = None

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias


FLOAT8: dict[int, Float8] = {
    onnx.TensorProto.FLOAT8E4M3FN: Float8("float8_e4m3fn", 3, 7, 448.0, has_inf=False, fnuz=False,
                                                     truncated_band=(480.0, 496.0)),
    onnx.TensorProto.FLOAT8E4M3FNUZ: Float8("float8_e4m3fnuz", 3, 8, 240.0, has_inf=False, fnuz=True),
    onnx.TensorProto.FLOAT8E5M2: Float8("float8_e5m2", 2, 15, 57344.0, has_inf=True, fnuz=False),
    onnx.TensorProto.FLOAT8E5M2FNUZ: Float8("float8_e5m2fnuz", 2, 16, 57344.0, has_inf=False, fnuz=True),
}
_FLOAT8_BY_NAME = {f.dtype: f for f in FLOAT8.values()}

@dataclass(frozen=True)
class SmallInt:
    """An ONNX integer narrower than a byte, carried in an 8-bit ``container`` holding its values."""

    container: str
    bits: int
    signed: bool

    @property
    def bounds(self) -> tuple[int, int]:
        """The smallest and largest value."""
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1


#: ONNX 4-bit and 2-bit integers: casts to them round half away from zero and wrap modulo 2**bits.
SMALL_INTS: dict[int, SmallInt] = {
    getattr(onnx.TensorProto, name.upper()): SmallInt(container, int(name[-1]), signed=not name.startswith("u"))
    for name, container in SMALL_INT_CONTAINERS.items()
}

#: Types refused outright, with what to do instead.
UNSUPPORTED: dict[int, str] = {
    onnx.TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    onnx.TensorProto.FLOAT8E8M0: "float8_e8m0fnu",
    **({onnx.TensorProto.FLOAT6E2M3: "float6_e2m3fn", onnx.TensorProto.FLOAT6E3M2: "float6_e3m2fn"}
       if hasattr(onnx.TensorProto, "FLOAT6E2M3") else {}),
}
_UNSUPPORTED_HINT = ("TVM can neither compute nor store this type; cast to float8 (FLOAT8E4M3FN), float16 or "
                     "float32 in the exporter instead.")

_T = onnx.TensorProto
_INTEGERS = frozenset({_T.BOOL, _T.INT8, _T.UINT8, _T.INT16, _T.UINT16, _T.INT32, _T.UINT32, _T.INT64, _T.UINT64})
_WRAP_LIMIT = 2.0**27  # float32 values at or above this are multiples of 16: 0 modulo 16 (and 4)


def convert_cast(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Cast to or from float8, to int4/uint4/int2/uint2, or to bfloat16; None (TVM's Cast) otherwise."""
    return _cast(bb, inputs[0], int(attrs.get("to", 0)), attrs)


def convert_cast_like(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """CastLike to a float8 or bfloat16 tensor's type (int4 arrives as int8: TVM's CastLike)."""
    target = _tvm.tensor_dtype(inputs[1])
    to = next((code for code, f in FLOAT8.items() if f.dtype == target), None)
    if to is None and target == "bfloat16":
        to = onnx.TensorProto.BFLOAT16
    return None if to is None else _cast(bb, inputs[0], to, attrs)


def _cast(bb: Any, x: Any, to: int, attrs: dict[str, Any]) -> Any:
    node = _node_name(attrs, "Cast")
    if to in UNSUPPORTED:
        raise UserError(f"Cast '{node}' converts to {UNSUPPORTED[to]}, which amptool cannot convert", _UNSUPPORTED_HINT)
    source = _tvm.tensor_dtype(x)
    if source is None or not _is_tensor(x):
        return None
    bfloat16_to_int = source == "bfloat16" and to in _INTEGERS  # TVM's cast does not compile
    if (to not in FLOAT8 and to not in SMALL_INTS and to != onnx.TensorProto.BFLOAT16 and source not in _FLOAT8_BY_NAME
            and not bfloat16_to_int):
        return None  # ordinary types: TVM's Cast
    if to == onnx.TensorProto.BFLOAT16 and source == "bfloat16":
        return None  # nothing to round
    target = _target_dtype(to)
    if _tvm.is_constant(x):
        return _constant_cast(x, to, attrs)
    saturate = bool(int(attrs.get("saturate", 1)))
    fmt = _FLOAT8_BY_NAME.get(source)
    if fmt is None:
        return bb.emit_te(lambda t: _cast_compute(t, None, to, target, saturate), x,
                          primfunc_name_hint="amp_narrow_cast")
    from tvm import relax  # noqa: PLC0415

    table = relax.const(float8_table(fmt), "float32")
    return bb.emit_te(lambda t, lut: _cast_compute(t, lut, to, target, saturate), x, table,
                      primfunc_name_hint="amp_narrow_cast")


def _node_name(attrs: dict[str, Any], default: str) -> str:
    return str(attrs.get("tvm_custom", {}).get("name", "") or default)


def _is_tensor(x: Any) -> bool:
    return getattr(getattr(x, "ty", None), "shape", None) is not None


def _target_dtype(to: int) -> str:
    if to in FLOAT8:
        return FLOAT8[to].dtype
    if to in SMALL_INTS:
        return SMALL_INTS[to].container
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)))


def _constant_cast(x: Any, to: int, attrs: dict[str, Any]) -> Any:
    """Constants cast in numpy with the same rules (ml_dtypes decodes float8 exactly)."""
    from tvm import relax  # noqa: PLC0415

    value = np.asarray(_tvm.constant_numpy(x))
    if _tvm.tensor_dtype(x) in _FLOAT8_BY_NAME:
        value = value.astype(np.float32)
    result = cast_numpy(value, to, saturate=bool(int(attrs.get("saturate", 1))))
    return relax.const(result, _target_dtype(to))


# --------------------------------------------------------------------------- numpy (constants)


def cast_numpy(value: np.ndarray, to: int, *, saturate: bool = True) -> np.ndarray:
    """onnxruntime's cast of ``value`` (decoded float8 given as float32) to ``to``; int4/uint4/int2/uint2
    come back in their int8/uint8 container, bfloat16/float8 as ml_dtypes arrays."""
    import ml_dtypes  # noqa: PLC0415

    if to in SMALL_INTS:
        return _small_int_numpy(value, SMALL_INTS[to])
    with np.errstate(over="ignore", invalid="ignore"):
        x = value.astype(np.float32)
        if to == onnx.TensorProto.BFLOAT16:
            return x.astype(ml_dtypes.bfloat16)  # ml_dtypes rounds to nearest even, as onnxruntime
        fmt = FLOAT8.get(to)
        if fmt is None:
            return value.astype(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)))
        rounded = x.astype(getattr(ml_dtypes, fmt.dtype)).astype(np.float32)
        over = ~np.isnan(x) & (np.isnan(rounded) | (np.abs(rounded) > fmt.largest))
        if saturate:
            replacement = np.copysign(np.float32(fmt.largest), x)
        elif fmt.has_inf:
            replacement = np.where(np.abs(x) >= 65536.0, np.copysign(np.float32(np.inf), x), np.float32(np.nan))
        else:
            replacement = np.full_like(x, np.nan)
        rounded = np.where(over, replacement, rounded).astype(np.float32)
        if not saturate and fmt.truncated_band is not None:
            low, high = fmt.truncated_band
            band = (np.abs(x) >= low) & (np.abs(x) < high)
            rounded = np.where(band, np.copysign(np.float32(fmt.largest), x), rounded).astype(np.float32)
    return rounded.astype(getattr(ml_dtypes, fmt.dtype))


def _small_int_numpy(value: np.ndarray, kind: SmallInt) -> np.ndarray:
    mask, span = (1 << kind.bits) - 1, 1 << kind.bits
    if value.dtype.kind in "iub":
        wrapped = value.astype(np.int64) & mask
    else:
        x = value.astype(np.float32)
        with np.errstate(invalid="ignore"):
            rounded = np.where(np.abs(x - np.trunc(x)) >= 0.5, np.trunc(x) + np.sign(x), np.trunc(x))
            inside = np.abs(rounded) < _WRAP_LIMIT
            wrapped = np.where(inside, np.where(inside, rounded, 0).astype(np.int64) & mask, 0)
    if kind.signed:
        wrapped = np.where(wrapped >= span // 2, wrapped - span, wrapped)
    return wrapped.astype(kind.container)


# --------------------------------------------------------------------------- TE kernels


def _cast_compute(x: Any, table: Any, to: int, target: str, saturate: bool) -> Any:
    """``x`` cast to ``to``; ``table`` (float8 sources) holds the float32 value of each code."""
    from tvm import te, tirx  # noqa: PLC0415

    source = str(x.dtype)

    def body(*i: Any) -> Any:
        value, dtype = x(*i), source
        if table is not None:  # one gather: a bit decoder read by the re-encode below nests too deep to compile
            value, dtype = table[tirx.reinterpret("uint8", value).astype("int32")], "float32"
        elif source == "bfloat16":  # TVM's bfloat16 → integer cast does not compile: via float32 (exact)
            value, dtype = value.astype("float32"), "float32"
        if to in SMALL_INTS:
            return _small_int(value, dtype, SMALL_INTS[to])
        if to not in FLOAT8 and to != onnx.TensorProto.BFLOAT16:
            return value.astype(target)
        if dtype != "float32":  # float16/float64/integers: through float32, as onnxruntime does
            value = value.astype("float32")
        if to in FLOAT8:
            return _encode_float8(_round_float8(value, FLOAT8[to], saturate), FLOAT8[to])
        return _round_bfloat16(value).astype("bfloat16")

    return te.compute(x.shape, body, name="amp_narrow_cast")


def float8_table(fmt: Float8) -> np.ndarray:
    """The float32 value of each of the 256 codes of ``fmt`` (ml_dtypes decodes them exactly,
    as onnxruntime does: NaN codes, ±inf, subnormals, FNUZ's single NaN)."""
    import ml_dtypes  # noqa: PLC0415

    return np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, fmt.dtype)).astype(np.float32)


def _f32(value: float) -> Any:
    from tvm import tirx  # noqa: PLC0415

    return tirx.const(value, "float32")


def _i32(value: int) -> Any:
    from tvm import tirx  # noqa: PLC0415

    return tirx.const(value, "int32")


def _power_of_two(exponent: Any) -> Any:
    """2**exponent as float32, built from its bits (exponent within the normal range)."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", (exponent + _i32(127)) << _i32(23))


def _exponent(value: Any) -> Any:
    """Unbiased exponent field of a float32 (-127 for zero/subnormals, 128 for inf/NaN)."""
    from tvm import tirx  # noqa: PLC0415

    return ((tirx.reinterpret("int32", value) >> _i32(23)) & _i32(255)) - _i32(127)


def _round_float8(x: Any, fmt: Float8, saturate: bool) -> Any:
    """``x`` (float32) rounded to nearest even on the format's grid, with onnxruntime's overflow."""
    from tvm import tirx  # noqa: PLC0415

    magnitude = tirx.abs(x)
    grid = _i32(fmt.mantissa) - tirx.max(_exponent(x), _i32(fmt.min_exponent))
    rounded = tirx.nearbyint(magnitude * _power_of_two(grid)) * _power_of_two(_i32(0) - grid)  # exact
    if saturate:
        overflow = _f32(fmt.largest)
    elif fmt.has_inf:
        overflow = tirx.Select(magnitude >= _f32(65536.0), _f32(float("inf")), _f32(float("nan")))
    else:
        overflow = _f32(float("nan"))
    value = tirx.Select(rounded > _f32(fmt.largest), overflow, rounded)  # NaN compares false: stays NaN
    if not saturate and fmt.truncated_band is not None:
        low, high = fmt.truncated_band
        value = tirx.Select(tirx.all(magnitude >= _f32(low), magnitude < _f32(high)), _f32(fmt.largest), value)
    negative = tirx.reinterpret("int32", x) < _i32(0)
    if fmt.fnuz:
        negative = tirx.all(negative, value != _f32(0.0))  # no negative zero
    return tirx.Select(negative, _f32(0.0) - value, value)


def _encode_float8(value: Any, fmt: Float8) -> Any:
    """The float8 bits of ``value``, exactly representable (or NaN/±inf), as a float8 value."""
    from tvm import tirx  # noqa: PLC0415

    bits = tirx.reinterpret("int32", value)
    sign = (bits >> _i32(31)) & _i32(1)
    magnitude = tirx.abs(value)
    mantissa_mask = (1 << fmt.mantissa) - 1
    normal = (((_exponent(value) + _i32(fmt.bias)) << _i32(fmt.mantissa))
              | ((bits >> _i32(23 - fmt.mantissa)) & _i32(mantissa_mask)))
    subnormal = (magnitude * _f32(2.0 ** (fmt.mantissa - fmt.min_exponent))).astype("int32")
    code = (sign << _i32(7)) | tirx.Select(magnitude >= _f32(2.0**fmt.min_exponent), normal, subnormal)
    if fmt.fnuz:
        nan_code, inf_code = _i32(0x80), _i32(0x80)
    else:
        nan_code, inf_code = _i32(0x7F), (sign << _i32(7)) | _i32(0x7C)  # inf only exists in E5M2
    code = tirx.Select(_tvm.is_inf(value), inf_code, code)
    code = tirx.Select(_tvm.is_nan(value), nan_code, code)
    return tirx.reinterpret(fmt.dtype, code.astype("uint8"))


def _round_bfloat16(x: Any) -> Any:
    """``x`` (float32) rounded to the nearest bfloat16, ties to even, NaN kept."""
    from tvm import tirx  # noqa: PLC0415

    bits = tirx.reinterpret("uint32", x)
    lsb = (bits >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")
    kept = (bits + tirx.const(0x7FFF, "uint32") + lsb) & tirx.const(0xFFFF0000, "uint32")
    return tirx.Select(_tvm.is_nan(x), x, tirx.reinterpret("float32", kept))


def _small_int(value: Any, dtype: str, kind: SmallInt) -> Any:
    """onnxruntime's cast of ``value`` (of ``dtype``) to int4/uint4 (int2/uint2 alike): round half
    away from zero, wrap modulo 2**bits."""
    from tvm import tirx  # noqa: PLC0415

    mask, span = (1 << kind.bits) - 1, 1 << kind.bits
    if dtype.startswith(("int", "uint", "bool")):
        wrapped = (value.astype("int64") & tirx.const(mask, "int64")).astype("int32")
    else:
        x = value.astype("float32")
        whole = tirx.trunc(x)
        step = tirx.Select(x < _f32(0.0), _f32(-1.0), _f32(1.0))
        rounded = tirx.Select(tirx.abs(x - whole) >= _f32(0.5), whole + step, whole)
        inside = tirx.abs(rounded) < _f32(_WRAP_LIMIT)  # NaN: false
        wrapped = tirx.Select(inside, tirx.Select(inside, rounded, _f32(0.0)).astype("int32") & _i32(mask), _i32(0))
    if kind.signed:
        wrapped = tirx.Select(wrapped >= _i32(span // 2), wrapped - _i32(span), wrapped)
    return wrapped.astype(kind.container)


# --------------------------------------------------------------------------- up-front refusal


def check_narrow_types(model: onnx.ModelProto) -> None:
    """Refuse tensors of a type TVM cannot store (4-bit floats, E8M0, 2-bit and 4-bit integer
    constants: a quantized model), naming the first such tensor."""
    from amptool.frontend.graph import iter_nodes  # noqa: PLC0415

    small = {code: onnx.TensorProto.DataType.Name(code).lower() for code in SMALL_INTS}
    stored: dict[int, str] = {**UNSUPPORTED, **small}
    graphs = [model.graph] + [a.g for n in iter_nodes(model.graph) for a in n.attribute if a.HasField("g")]
    for graph in graphs:
        for init in graph.initializer:
            if init.data_type in stored:
                raise UserError(f"Initializer '{init.name}' is {stored[init.data_type]}, which amptool cannot convert",
                                "4-bit and 2-bit weights mean an already-quantized model; amptool converts float "
                                "models (export it unquantized).")
    for node in iter_nodes(model.graph):
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.HasField("t") and attr.t.data_type in stored:
                    raise UserError(f"Constant '{node.name}' is {stored[attr.t.data_type]}, which amptool cannot "
                                    "convert", _UNSUPPORTED_HINT)
        if node.op_type == "Cast" and node.domain in STANDARD_DOMAINS:
            to = next((int(a.i) for a in node.attribute if a.name == "to"), None)
            if to in UNSUPPORTED:
                raise UserError(f"Cast '{node.name}' converts to {UNSUPPORTED[to]}, which amptool cannot convert",
                                _UNSUPPORTED_HINT)


def small_int_rewrites(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` ready for graph inputs of a small integer type, which the module carries in their
    8-bit container (so ops reading them see int8/uint8): a CastLike whose ``like`` is such an input
    becomes a Cast to its type (CastLike would neither round nor wrap), and a QuantizeLinear whose
    zero point is one saturates to the type's range, not to int8's. ``model`` itself when nothing
    changes, else a copy."""
    small = {v.name: v.type.tensor_type.elem_type for v in model.graph.input
             if v.type.tensor_type.elem_type in SMALL_INTS}
    if not small or not any(_reads_small(node, small) for node in model.graph.node):
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if not _reads_small(node, small):
            nodes.append(node)
        elif node.op_type == "CastLike":
            cast = onnx.helper.make_node("Cast", [node.input[0]], list(node.output), name=node.name,
                                         to=small[node.input[1]])
            cast.attribute.extend(a for a in node.attribute if a.name == "saturate")
            nodes.append(cast)
        else:  # QuantizeLinear: TVM's saturates to the container's range; then to the type's
            kind = SMALL_INTS[small[node.input[2]]]
            low, high = kind.bounds
            wide = f"{node.output[0]}__container"
            bounds = [onnx.numpy_helper.from_array(np.array(v, kind.container), f"{node.output[0]}__{name}")
                      for v, name in ((low, "low"), (high, "high"))]
            graph.initializer.extend(bounds)
            quantize = onnx.NodeProto()
            quantize.CopyFrom(node)
            quantize.output[0] = wide
            nodes += [quantize, onnx.helper.make_node("Clip", [wide, bounds[0].name, bounds[1].name],
                                                      [node.output[0]], name=f"{node.name}/saturate")]
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def _reads_small(node: onnx.NodeProto, small: dict[str, int]) -> bool:
    """A CastLike whose ``like``, or a QuantizeLinear whose zero point, is a small-integer graph input."""
    if node.domain not in STANDARD_DOMAINS:
        return False
    position = {"CastLike": 1, "QuantizeLinear": 2}.get(node.op_type)
    return position is not None and len(node.input) > position and node.input[position] in small


# --------------------------------------------------------------------------- float8 (de)quantization


def convert_dequantize_linear(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """DequantizeLinear of float8 data: ``(x - zero_point) * scale`` on float32 decodes of both.
    TVM's converter refuses a float8 zero point and misreads float8 ``x``; other types are its."""
    from tvm import relax  # noqa: PLC0415

    x = inputs[0]
    if _tvm.tensor_dtype(x) not in _FLOAT8_BY_NAME or int(attrs.get("block_size", 0)):
        return None
    scale, zero_point = inputs[1], _optional(inputs, 2)
    value = _cast(bb, x, onnx.TensorProto.FLOAT, {})
    if zero_point is not None:
        value = bb.emit(relax.op.subtract(value, _broadcast(bb, _cast_value(bb, zero_point), x, attrs)))
    out = _tvm.tensor_dtype(scale) or "float32"
    result = relax.op.multiply(value, _broadcast(bb, _float32(bb, scale), x, attrs))
    return result if out == "float32" else relax.op.astype(bb.emit(result), out)


def convert_quantize_linear(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """QuantizeLinear to float8: ``x / scale + zero_point`` in float32, then the float8 cast above
    (round to nearest even; ``saturate`` as the node says). TVM's converter refuses a float8 zero
    point; other types are its."""
    from tvm import relax  # noqa: PLC0415

    x, scale, zero_point = inputs[0], inputs[1], _optional(inputs, 2)
    target = _tvm.tensor_dtype(zero_point) if zero_point is not None else None
    to = next((code for code, f in FLOAT8.items() if f.dtype == target), None)
    if to is None:
        to = int(attrs.get("output_dtype", 0)) if int(attrs.get("output_dtype", 0)) in FLOAT8 else None
    if to is None or int(attrs.get("block_size", 0)):
        return None
    value = bb.emit(relax.op.divide(_float32(bb, x), _broadcast(bb, _float32(bb, scale), x, attrs)))
    if zero_point is not None:
        value = bb.emit(relax.op.add(value, _broadcast(bb, _cast_value(bb, zero_point), x, attrs)))
    return _cast(bb, value, to, attrs)


def _optional(inputs: list[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index and inputs[index] is not None else None


def _float32(bb: Any, value: Any) -> Any:
    from tvm import relax  # noqa: PLC0415

    return value if _tvm.tensor_dtype(value) == "float32" else bb.emit(relax.op.astype(value, "float32"))


def _cast_value(bb: Any, value: Any) -> Any:
    """A float8 (or any) tensor's float32 value: float8 through the exact decode table."""
    if _tvm.tensor_dtype(value) in _FLOAT8_BY_NAME:
        return bb.emit(_cast(bb, value, onnx.TensorProto.FLOAT, {}))
    return _float32(bb, value)


def _broadcast(bb: Any, value: Any, x: Any, attrs: dict[str, Any]) -> Any:
    """A scalar or per-axis (1-D) scale or zero point shaped to broadcast along ``axis`` of ``x``."""
    rank = len(x.ty.shape)
    return bb.emit(along(value, int(attrs.get("axis", 1)) % max(rank, 1), rank))
