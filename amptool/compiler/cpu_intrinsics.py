"""AVX512-BF16 dot product (``vdpbf16ps``) as a TensorIR tensor intrinsic.

What: ``DOT_BF16`` computes ``C[16] += A · B[16, 2]`` — sixteen float32 accumulators, each
adding the dot product of one pair of bfloat16 inputs (``A``: both in one uint32, broadcast) with
its own pair of bfloat16 weights (``B``, uint16 bit patterns) — in one ``vdpbf16ps`` instruction:
32 multiply-adds where an fp32 FMA does 16.

Why this detour: TVM 0.27's TIR lowering rewrites every bfloat16 value to float32
(``BF16ComputeLegalize``) and its LLVM code generator crashes on bfloat16 vectors without that
pass, so ``llvm.x86.avx512bf16.dpbf16ps.512`` — whose operands are ``<32 x bfloat>`` — cannot be
called from TIR. A five-line LLVM function that bitcasts ``<16 x i32>`` to ``<32 x bfloat>`` is
imported into the generated module with the ``pragma_import_llvm`` loop annotation and inlined.

When not: CPUs without AVX512-BF16 (checked from the target's ``mcpu``); the kernels then keep
the float32-compute path. Numerics: ``vdpbf16ps`` adds the pair's odd product, then the even one,
and flushes denormals to zero — rounding-level differences from a sequential float32 sum.
"""

# TVMScript buffer annotations (T.Buffer((16,), "float32")) are calls, which mypy rejects.
# mypy: disable-error-code="valid-type"
from __future__ import annotations

from typing import Any

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from amptool import _tvm

DOT_BF16 = "amptool_dot_16x2_bf16"
_FUNCTION = "amptool_dpbf16"

#: Imported into every module that uses DOT_BF16 (TVM marks imported functions always-inline).
#: The broadcast input pair goes in the instruction's last source, the one that may be a memory
#: operand: LLVM then folds its load into ``vdpbf16ps mem{1to16}`` instead of a separate
#: ``vbroadcastss`` per instruction, which halved the issue rate (ResNet-50's bfloat16 kernels
#: 33.0 → 21.2 ms summed, measured). The dot product of a pair is symmetric in its operands.
LLVM_IR = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define <16 x float> @{_FUNCTION}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %aa = bitcast <16 x i32> %a to <32 x bfloat>
  %bb = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %bb, <32 x bfloat> %aa)
  ret <16 x float> %r
}}
"""


def low_bf16(pair: Any) -> Any:
    """The float32 value of the bfloat16 in the low half of a uint32 (exact)."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", tirx.shift_left(pair, tirx.const(16, "uint32")))


def high_bf16(pair: Any) -> Any:
    """The float32 value of the bfloat16 in the high half of a uint32 (exact)."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", tirx.bitwise_and(pair, tirx.const(0xFFFF0000, "uint32")))


def bf16_bits(value: Any) -> Any:
    """The bfloat16 bit pattern of ``value`` zero-extended to uint32, rounded to nearest even
    (NaN stays a quiet NaN of its sign).

    Why round here, when ``value`` is already bfloat16: TVM's bfloat16 legalization computes a
    kernel's intermediate buffers in float32 and drops the rounding of a ``Cast`` into them, so a
    cast fused before the packing (every BERT projection's input, a network's first conv) arrived
    as the float32 value and its low bits were truncated — measured on a bf16 matmul: 99.95% of
    outputs equal to truncated inputs', 34% to rounded ones'. For a value that is bfloat16 already
    the rounding changes nothing."""
    from tvm import tirx  # noqa: PLC0415

    def u32(number: int) -> Any:
        return tirx.const(number, "uint32")

    wide = tirx.reinterpret("uint32", value.astype("float32"))
    odd = tirx.bitwise_and(tirx.shift_right(wide, u32(16)), u32(1))
    rounded = tirx.shift_right(wide + u32(0x7FFF) + odd, u32(16))
    quiet_nan = tirx.bitwise_or(tirx.shift_right(wide, u32(16)), u32(0x0040))
    return tirx.if_then_else(_tvm.is_nan(value.astype("float32")), quiet_nan, rounded)


def pack_pair(low: Any, high: Any | None) -> Any:
    """Two bfloat16 values as one uint32 (``high`` None: zero), the operand order of vdpbf16ps."""
    from tvm import tirx  # noqa: PLC0415

    if high is None:
        return bf16_bits(low)
    return tirx.bitwise_or(bf16_bits(low), tirx.shift_left(bf16_bits(high), tirx.const(16, "uint32")))


def weight_float(bits: Any) -> Any:
    """The float32 value of bfloat16 bits held in a uint16 (exact)."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", tirx.shift_left(bits.astype("uint32"), tirx.const(16, "uint32")))


@T.prim_func(s_tir=True)
def _dot_desc(
    A: T.Buffer((1,), "uint32", offset_factor=1),
    B: T.Buffer((16, 2), "uint16", offset_factor=1),
    C: T.Buffer((16,), "float32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:1], B[0:16, 0:2])
        T.writes(C[0:16])
        for i in T.serial(16):
            with T.sblock("update"):
                vi = T.axis.remap("S", [i])
                C[vi] = C[vi] + (
                    T.reinterpret("float32", T.shift_left(A[0], T.uint32(16)))
                    * T.reinterpret("float32", T.shift_left(T.Cast("uint32", B[vi, 0]), T.uint32(16)))
                    + T.reinterpret("float32", T.bitwise_and(A[0], T.uint32(0xFFFF0000)))
                    * T.reinterpret("float32", T.shift_left(T.Cast("uint32", B[vi, 1]), T.uint32(16)))
                )


@T.prim_func(s_tir=True)
def _dot_impl(
    A: T.Buffer((1,), "uint32", offset_factor=1),
    B: T.Buffer((16, 2), "uint16", offset_factor=1),
    C: T.Buffer((16,), "float32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:1], B[0:16, 0:2])
        T.writes(C[0:16])
        # The operands are written inline: named (``pair = …``), each would be a variable bound once per
        # tensorized tile, which TIR lowering turns into a workspace buffer allocated and freed per
        # parallel iteration (two TVMBackendAllocWorkspace calls each; ResNet-50 bf16 had 58 such sites).
        C[T.ramp(0, 1, 16)] = T.call_pure_extern(
            "float32x16", _FUNCTION, C.vload([0], "float32x16"), T.broadcast(T.reinterpret("int32", A[0]), 16),
            T.reinterpret("int32x16", B.vload([0, 0], "uint16x32")),
        )


TensorIntrin.register(DOT_BF16, _dot_desc, _dot_impl, override=True)


def has_bf16_dot(target: Any) -> bool:
    """Whether ``target`` (an LLVM Target) can run ``vdpbf16ps``."""
    from tvm.target.codegen import target_has_features  # noqa: PLC0415

    try:
        return bool(target_has_features("avx512bf16", target))
    except Exception:  # noqa: BLE001 - not an x86 target
        return False
