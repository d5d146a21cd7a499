"""Epilogues in float32: ``cast(x, lo) → add bias → relu → …`` becomes
``add bias → relu → … → cast(·, lo)``.

What: inside dataflow blocks, a float32 value cast to a low dtype (a conv's or matmul's
float32 accumulator, after mixed precision) and then put through elementwise ops in that low
dtype — ``add``/``subtract``/``multiply`` with a constant or another low-dtype tensor (bias,
BatchNorm scale, residual), ``maximum``/``minimum`` with a constant (clip after ``cpu_layout``
splits it), ``relu`` — has those ops computed in float32 on the accumulator and is cast once,
where a value of the chain is used by anything else.

 * bfloat16: the chain is computed in float32 and rounded once. bfloat16 has float32's range,
   so this changes roundings (each op rounded before), never which values overflow.
 * float16: every rounding the chain had is kept, as a float32 value rounded through float16
   (``astype(astype(v, float16), float32)``) after the first cast and after each add, subtract
   and multiply — which is how the CPU computed each float16 op anyway (convert, float32 op,
   round) — so the result is bit for bit the same, overflows to inf included; what goes is
   the conversion of every operand in and every result out, and a clip's compare-and-blend of
   float16 lanes. A rounding is emitted where an add, subtract or multiply reads the value, not
   before a ``relu``/``maximum``/``minimum``, which commute with it: a conv's bias + ReLU rounds
   its sum once, at the final cast (``_Widener.settled``).

Why: CPUs without native low-precision arithmetic compute every bfloat16/float16 op as convert →
float32 op → round, so a conv's epilogue paid conversions per op: on MobileNetV2's bfloat16
convs the kernels' sum went 3.98 → 3.31 ms; its float16 1×1 convs of 24 input channels spent
more on a bias + ReLU6 epilogue than on the products (1.42× the float32 kernel), and the float16
model's kernel sum went from 1.18× float32's to 1.06×, outputs bit-identical (ResNet-50, BERT-base,
EfficientNet: level, identical). Inference engines add the bias into the accumulator for the
same reason.

Preserves: relu/maximum/minimum commute exactly with rounding (it is monotonic and the
constants are low-dtype values); a float16 chain is the same values; a bfloat16 add/subtract/
multiply chain is the float32 result rounded once, where each op rounded before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from amptool import _tvm

#: Low dtypes whose chains are widened.
LOW = frozenset({"bfloat16", "float16"})
#: Low dtypes whose chains keep each rounding (module docstring): float16 computed in float32
#: unrounded would hide the overflows (inf) a float16 device produces, which ``diff`` must show.
ROUNDED = frozenset({"float16"})
#: Binary ops whose result from values of the low dtype is a value of it (no rounding to keep;
#: the ``_UNARY`` ops all are).
_EXACT = frozenset({"relax.maximum", "relax.minimum"})
#: Binary ops computed in float32 (either operand a widened value).
_BINARY = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum"})
#: Ops whose float32 result, rounded, equals the op on rounded inputs (no constant needed).
_UNARY = frozenset({"relax.nn.relu"})


class _Wide(NamedTuple):
    """A low-dtype variable not yet bound: its float32 value and its dtype. ``exact``: the value is
    one the low dtype holds; False (a float16 sum or product not yet rounded) until an op that
    needs its rounded value rounds it — ``relu``/``maximum``/``minimum`` take it as it is."""

    value: Any
    dtype: str
    exact: bool = True


def widen_epilogues(mod: Any) -> Any:
    """``mod`` with its low-precision epilogue chains computed in float32 (module docstring)."""
    return _tvm.rewrite_functions(mod, _widener_class()(mod))


def _operand_kind(name: str, arg: Any, wide: _Wide | None, dtype: str) -> str | None:
    """How a binary op's operand enters float32: "wide" (a waiting value), "constant" (converted
    in numpy), "cast" (a low-dtype tensor, for add/subtract/multiply); None: the op stays as is."""
    if wide is not None:
        return "wide" if wide.dtype == dtype else None
    if _tvm.is_constant(arg):
        return "constant" if _tvm.tensor_dtype(arg) == dtype else None
    if name in ("relax.add", "relax.subtract", "relax.multiply") and _tvm.tensor_dtype(arg) == dtype:
        return "cast"
    return None


def _widener_class() -> Any:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import mutator  # noqa: PLC0415

    @mutator
    class _Widener(_tvm.dataflow_scoped_mutator()):  # type: ignore[misc]
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.pending: dict[Any, _Wide] = {}  # low-dtype var (handle) → its float32 value

        def visit_dataflow_var_(self, op: Any) -> Any:
            wide = self.pending.pop(op.__chandle__(), None)
            if wide is not None:  # first use by something that needs the low-dtype value: bind it now
                cast = self.builder_.normalize(_tvm.astype(wide.value, wide.dtype))
                self.builder_.emit_normalized(_tvm.var_binding(op, cast))
            return super().visit_dataflow_var_(op)

        def visit_var_binding_(self, binding: Any) -> None:
            # Only dataflow variables wait: a block's output variable is used outside the block.
            waits = isinstance(binding.var, relax.DataflowVar) and isinstance(binding.value, relax.Call)
            if self.in_dataflow and waits:
                wide = self.widened(binding.value)
                if wide is not None:
                    self.pending[binding.var.__chandle__()] = wide
                    return
            super().visit_var_binding_(binding)

        def widened(self, call: Any) -> _Wide | None:
            """``call``'s float32 form when it starts or continues a chain (emitted), else None."""
            name = _tvm.op_name(call)
            dtype = _tvm.tensor_dtype(call)
            if dtype not in LOW:
                return None
            args = _tvm.array_items(call.args)
            if name == "relax.astype":
                source = args[0]
                if _tvm.tensor_dtype(source) != "float32" or not isinstance(source, relax.Var):
                    return None
                return _Wide(self.visit_expr(source), dtype, exact=dtype not in ROUNDED)
            waiting = [self.pending.get(a.__chandle__()) if isinstance(a, relax.DataflowVar) else None for a in args]
            if name in _UNARY and waiting[0] is not None:
                return _Wide(self.builder_.emit(_tvm.call_with_args(call, [waiting[0].value])), dtype, waiting[0].exact)
            if name not in _BINARY or len(args) != 2 or not any(waiting):
                return None
            kinds = [_operand_kind(name, arg, wide, dtype) for arg, wide in zip(args, waiting, strict=True)]
            if None in kinds:
                return None
            operands, exact = [], True
            for arg, wide, kind in zip(args, waiting, kinds, strict=True):
                if wide is not None and name in _EXACT:
                    operands.append(wide.value)
                    exact = exact and wide.exact
                elif wide is not None:
                    operands.append(self.settled(arg).value)
                elif kind == "constant":
                    operands.append(relax.const(_tvm.constant_numpy(arg).astype(np.float32)))
                else:
                    operands.append(self.builder_.emit(_tvm.astype(self.visit_expr(arg), "float32")))
            result = self.builder_.emit(_tvm.call_with_args(call, operands))
            return _Wide(result, dtype, exact if name in _EXACT else dtype not in ROUNDED)

        def settled(self, var: Any) -> _Wide:
            """The waiting value of ``var`` rounded as the low dtype holds it (once: kept for later uses).

            Why late: ``relu``/``maximum``/``minimum`` with low-dtype constants commute with rounding
            (monotonic; the constants are fixed points), so a float16 ``add → relu → cast`` rounds
            once at the cast where it rounded after the add too — two conversions a vector fewer."""
            wide = self.pending[var.__chandle__()]
            if not wide.exact:
                low = self.builder_.emit(_tvm.astype(wide.value, wide.dtype))
                value = self.builder_.emit(_tvm.astype(low, "float32"))
                wide = self.pending[var.__chandle__()] = _Wide(value, wide.dtype)
            return wide

    return _Widener
