"""``exp`` and ``sigmoid`` on the CPU as vectorizable polynomials, accurate over float32's range.

What: ``exp(x) = 2ⁿ · p(r)`` with ``n = round(x / ln 2)``, ``r = x − n·ln 2`` reduced in two steps
(Cody–Waite: ``ln 2`` split so that ``n · C1`` is exact) and ``p`` Cephes' degree-7 polynomial;
``2ⁿ`` applied as two factors ``2^⌊n/2⌋ · 2^⌈n/2⌉``, so results that overflow give ``inf`` and
those below float32's normal range round to subnormals and then to 0, as libm's do. ``sigmoid(x)
= 1 / (1 + exp(−x))`` on it. Computed in float32 (float16/bfloat16 builds cast around it).

Why: TOPI's ``exp`` and ``sigmoid`` are calls to libm's ``expf`` per element, which keeps their
loops scalar. SiLU (``x · sigmoid(x)``) is in every layer of YOLOv5/v8 and EfficientNet.
TOPI's ``fast_exp`` vectorizes but clamps at ±88.4 (``exp(89)`` was 2.4e38, not ``inf``) and
reduces with a one-part ``ln 2`` (errors of a few ulps near the ends of the range).

Preserves: NaN (passed through), ``±inf`` (``exp(+inf) = inf``, ``exp(−inf) = 0``); within ~1
ulp of ``expf`` (tests compare across the whole range).
"""

from __future__ import annotations

from typing import Any

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

    def f32(value: float) -> Any:
        return tirx.const(value, "float32")

    clamped = tirx.max(tirx.min(x, f32(HIGH)), f32(LOW))
    n = tirx.floor(clamped * f32(_LOG2E) + f32(0.5))
    r = (clamped - n * f32(_C1)) - n * f32(_C2)
    poly = f32(_POLY[0])
    for coefficient in _POLY[1:]:
        poly = poly * r + f32(coefficient)
    p = poly * (r * r) + r + f32(1.0)
    whole = n.astype("int32")
    half = whole >> 1  # ⌊n/2⌋; n − ⌊n/2⌋ is the rest: both in [−52, 45], normal powers of two
    value = p * _power_of_two(half) * _power_of_two(whole - half)
    return tirx.Select(tirx.isnan(x), x, value)


def _power_of_two(exponent: Any) -> Any:
    """2**exponent as float32 bits, for an int32 exponent in the normal range."""
    from tvm import tirx  # noqa: PLC0415

    return tirx.reinterpret("float32", (exponent + tirx.const(127, "int32")) << tirx.const(23, "int32"))


def sigmoid_f32(x: Any) -> Any:
    from tvm import tirx  # noqa: PLC0415

    one = tirx.const(1.0, "float32")
    return one / (one + exp_f32(-x))


def legalize_exp(bb: Any, call: Any, default: Any) -> Any:
    return _legalize(bb, call, default, exp_f32, "exp")


def legalize_sigmoid(bb: Any, call: Any, default: Any) -> Any:
    return _legalize(bb, call, default, sigmoid_f32, "sigmoid")


def _legalize(bb: Any, call: Any, default: Any, scalar: Any, name: str) -> Any:
    """An elementwise kernel of ``scalar`` computed in float32 (``default`` for float64 and
    non-float types: the polynomial is float32's)."""
    from tvm import te  # noqa: PLC0415

    dtype = str(call.ty.dtype)
    if dtype not in ("float32", "float16", "bfloat16"):
        return default(bb, call)

    def compute(x: Any) -> Any:
        return te.compute(x.shape, lambda *i: scalar(x(*i).astype("float32")).astype(dtype), name=name)

    return bb.call_te(compute, call.args[0], primfunc_name_hint=name)
