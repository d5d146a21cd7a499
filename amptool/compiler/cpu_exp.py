"""``exp``, ``sigmoid`` and ``log`` on the CPU as vectorizable polynomials, accurate over float32's range.

What: ``exp(x) = 2ⁿ · p(r)`` with ``n = round(x / ln 2)``, ``r = x − n·ln 2`` reduced in two steps
(Cody–Waite: ``ln 2`` split so that ``n · C1`` is exact) and ``p`` Cephes' degree-7 polynomial;
``2ⁿ`` applied as two factors ``2^⌊n/2⌋ · 2^⌈n/2⌉``, so results that overflow give ``inf`` and
those below float32's normal range round to subnormals and then to 0, as libm's do. ``sigmoid(x)
= 1 / (1 + exp(−x))`` on it. Computed in float32 (float16/bfloat16 builds cast around it).

Why: TOPI's ``exp`` and ``sigmoid`` are calls to libm's ``expf`` per element, which keeps their
loops scalar. SiLU (``x · sigmoid(x)``) is in every layer of YOLOv5/v8 and EfficientNet.
TOPI's ``fast_exp`` vectorizes but clamps at ±88.4 (``exp(89)`` was 2.4e38, not ``inf``) and
reduces with a one-part ``ln 2`` (errors of a few ulps near the ends of the range).

``log(x) = e · ln 2 + log1p(m − 1)`` with ``x = m · 2ᵉ``, ``m`` in [√½, √2) read from the bits
(subnormal inputs scaled by 2²⁵ first) and Cephes' degree-9 polynomial for ``log1p``.

Why ``log``: Softplus and Mish (YOLOv4's activation, every layer) and LogSoftmax are built on it,
and TOPI's is libm's ``logf`` per element.

Each reads its operand many times (exp 29, log 188) as one expression tree. Not through
``tirx.Let``: TVM's loop unrolling and predicated vectorization copy a Let's body without renaming
its variable, and lowering then refuses the kernel ("Let cannot bind the same var to two different
values"); ``cpu_schedules.try_inline`` keeps such trees from compounding instead (Mish, inlined
whole, took 190 s to compile).

Preserves: NaN (passed through), ``±inf`` (``exp(+inf) = inf``, ``exp(−inf) = 0``; ``log(0) =
−inf``, ``log(+inf) = inf``, ``log(x < 0)`` NaN); within ~1 ulp of the exact values (tests compare
across the whole range).
"""

from __future__ import annotations

from typing import Any

from amptool import _tvm
from amptool.dtypes import DTYPES

#: Inputs are clamped to this range first: below it every exp rounds to 0, above it to inf.
LOW, HIGH = -104.0, 89.0
_LOG2E = 1.44269504088896341
#: ln 2 in two parts: C1 has few enough bits that n · C1 is exact for |n| < 2⁹.
_C1, _C2 = 0.693359375, -2.12194440e-4
#: Cephes' expf polynomial, highest degree first: e^r ≈ 1 + r + r²·(p0 r⁵ + … + p5).
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def exp_f32(x: Any) -> Any:
    """The TIR value of ``exp(x)`` for a float32 scalar expression ``x`` (see the module docstring)."""
    from tvm import tirx  # noqa: PLC0415

    p, whole = _reduced(tirx.max(tirx.min(x, _f32(HIGH)), _f32(LOW)))
    half = whole >> 1  # ⌊n/2⌋; n − ⌊n/2⌋ is the rest: n in [−150, 128], both halves normal powers of two
    value = p * _power_of_two(half) * _power_of_two(whole - half)
    return tirx.Select(_tvm.is_nan(x), x, value)


#: Below this, exp's result is subnormal (2ⁿ for n < −126): ``exp_nonpositive_f32`` returns 0 there.
LOWEST_NORMAL = -87.33654475


def exp_nonpositive_f32(x: Any) -> Any:
    """``exp(x)`` for a softmax's shifted scores (``x ≤ 0``, ``-inf`` for a masked one): ``exp_f32``'s
    polynomial with one power of two, not two (no result can overflow), and 0 where the result
    would be subnormal (below ``LOWEST_NORMAL``; ``exp_f32`` gives < 1.2e-38 there, nothing beside a
    row's sum, which holds e^0 = 1; a masked score's exactly 0 either way). Equal to ``exp_f32``
    from ``LOWEST_NORMAL`` to 0; NaN passed through. Five vector operations fewer than ``exp_f32``."""
    from tvm import tirx  # noqa: PLC0415

    p, whole = _reduced(tirx.max(x, _f32(LOWEST_NORMAL)))
    value = tirx.Select(x < _f32(LOWEST_NORMAL), _f32(0.0), p * _power_of_two(whole))
    return tirx.Select(_tvm.is_nan(x), x, value)


def _reduced(clamped: Any) -> tuple[Any, Any]:
    """``(p, n)`` with ``exp(clamped) = p · 2ⁿ``: ``n = round(clamped / ln 2)`` as int32, ``p`` Cephes'
    polynomial at ``clamped − n · ln 2`` (Cody–Waite, in two steps) — both exps' shared part."""
    from tvm import tirx  # noqa: PLC0415

    n = tirx.floor(clamped * _f32(_LOG2E) + _f32(0.5))
    r = (clamped - n * _f32(_C1)) - n * _f32(_C2)
    poly = _f32(_POLY[0])
    for coefficient in _POLY[1:]:
        poly = poly * r + _f32(coefficient)
    return poly * (r * r) + r + _f32(1.0), n.astype("int32")


def _f32(value: float) -> Any:
    from tvm import tirx  # noqa: PLC0415

    return tirx.const(value, "float32")


def _i32(value: int) -> Any:
    from tvm import tirx  # noqa: PLC0415

    return tirx.const(value, "int32")


def _power_of_two(exponent: Any) -> Any:
    """2**exponent as float32 bits, for an int32 exponent in the normal range."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", (exponent + _i32(127)) << _i32(23))


#: Cephes' logf polynomial, highest degree first, for log1p on [√½ − 1, √2 − 1).
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524
_SMALLEST_NORMAL = 1.1754943508222875e-38


def log_f32(x: Any) -> Any:
    """The TIR value of ``log(x)`` for a float32 scalar expression ``x`` (see the module docstring)."""
    from tvm import tirx  # noqa: PLC0415

    subnormal = x < _f32(_SMALLEST_NORMAL)
    bits = tirx.reinterpret("int32", tirx.Select(subnormal, x * _f32(2.0 ** 25), x))
    exponent = ((bits >> _i32(23)) & _i32(0xFF)) - tirx.Select(subnormal, _i32(126 + 25), _i32(126))
    mantissa = tirx.reinterpret("float32", (bits & _i32(0x007FFFFF)) | _i32(0x3F000000))  # in [0.5, 1)
    low = mantissa < _f32(_SQRT_HALF)
    e = (exponent - tirx.Select(low, _i32(1), _i32(0))).astype("float32")
    m = tirx.Select(low, mantissa + mantissa, mantissa) - _f32(1.0)
    z = m * m
    poly = _f32(_LOG_POLY[0])
    for coefficient in _LOG_POLY[1:]:
        poly = poly * m + _f32(coefficient)
    value = m + (poly * m * z + e * _f32(_C2) - _f32(0.5) * z) + e * _f32(_C1)
    value = tirx.Select(x == _f32(0.0), _f32(-float("inf")), value)
    value = tirx.Select(x < _f32(0.0), _f32(float("nan")), value)
    return tirx.Select(x == _f32(float("inf")), x, tirx.Select(_tvm.is_nan(x), x, value))


def sigmoid_f32(x: Any) -> Any:
    from tvm import tirx  # noqa: PLC0415

    one = tirx.const(1.0, "float32")
    return one / (one + exp_f32(-x))


def legalize_exp(bb: Any, call: Any, default: Any) -> Any:
    return _legalize(bb, call, default, exp_f32, "exp")


def legalize_sigmoid(bb: Any, call: Any, default: Any) -> Any:
    return _legalize(bb, call, default, sigmoid_f32, "sigmoid")


def legalize_log(bb: Any, call: Any, default: Any) -> Any:
    return _legalize(bb, call, default, log_f32, "log")


def _legalize(bb: Any, call: Any, default: Any, scalar: Any, name: str) -> Any:
    """An elementwise kernel of ``scalar`` computed in float32 (``default`` for float64 and
    non-float types: the polynomial is float32's)."""
    from tvm import te  # noqa: PLC0415

    dtype = str(call.ty.dtype)
    if dtype not in DTYPES:
        return default(bb, call)

    def compute(x: Any) -> Any:
        return te.compute(x.shape, lambda *i: scalar(x(*i).astype("float32")).astype(dtype), name=name)

    return bb.call_te(compute, call.args[0], primfunc_name_hint=name)
