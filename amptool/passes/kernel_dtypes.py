"""Ops TVM has no working kernel for in some dtypes, computed on wider copies of their operands.

Why: TVM 0.27 cannot lower ``isnan``/``isinf``/``isfinite`` on bfloat16 ("not supported for
finiteness ops": the build fails), reads bfloat16 wrongly in ``topk``/``sort``/``argsort``/
``argmax``/``argmin``, and has no sort for int16, uint16, uint32 or uint64 ("Unsupported input
dtype": a TopK over uint32 ids failed with exit 70). The mixed-precision pass never gives those ops a
bfloat16 operand (``mixed_precision_mutator.NO_LOW_KERNEL``), but a model that is bfloat16
itself does — an LLM exported in bfloat16 masking with IsNaN, ONNX's ``*_bf16`` Attention cases.

What: each such call reads ``astype(x, wider)`` instead — bfloat16 → float32, the small integers
→ int64, both exact and order-preserving — and what it returns as values (``sort``, ``topk``'s
values) goes back to the operand's dtype, so every type downstream is unchanged. uint64, which
no type holds, sorts by its bits with the top one flipped, read as int64 (the same order), and a
TopK's values are gathered from ``x`` at the indices found; its ``sort`` stays TVM's. Runs right
after import, before anything folds constants.
"""

from __future__ import annotations

from typing import Any

from amptool import _tvm

_BFLOAT16 = {"bfloat16": "float32"}
_SORTABLE = {**_BFLOAT16, "int16": "int64", "uint16": "int64", "uint32": "int64"}
_UINT64 = {**_SORTABLE, "uint64": "int64"}  # argsort and topk only: keyed by _uint64_key, values gathered
#: op → (operand dtype → the dtype it is computed in, whether the result holds values to cast back)
WIDENED: dict[str, tuple[dict[str, str], bool]] = {
    "relax.isnan": (_BFLOAT16, False), "relax.isinf": (_BFLOAT16, False), "relax.isfinite": (_BFLOAT16, False),
    "relax.argmax": (_BFLOAT16, False), "relax.argmin": (_BFLOAT16, False),
    "relax.argsort": (_UINT64, False), "relax.sort": (_SORTABLE, True), "relax.topk": (_UINT64, True),
}


def _wider(call: Any) -> str | None:
    """The dtype ``call``'s first operand is computed in, or None where TVM's kernel serves."""
    rule = WIDENED.get(_tvm.op_name(call) or "")
    if rule is None or not call.args:
        return None
    return rule[0].get(_tvm.tensor_dtype(call.args[0]) or "")


def widen_operands(mod: Any) -> Any:
    """``mod`` itself when no call in it takes an operand TVM cannot compute in its dtype; else a
    copy with those operands widened."""
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    if not _has_narrow_call(mod):
        return mod

    @mutator
    class _Widen(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            wider = _wider(call)
            if wider is None:
                return call
            x, source = call.args[0], _tvm.tensor_dtype(call.args[0]) or ""
            if source == "uint64":
                if _tvm.op_name(call) == "relax.topk" and str(call.attrs.ret_type) != "both":
                    return call  # values alone: nothing to gather them at; TVM's (it fails to build)
                wide = self.builder_.emit_te(_uint64_key, x, primfunc_name_hint="amp_uint64_key")
            else:
                wide = self.builder_.normalize(relax.op.astype(x, wider))
            new = self.builder_.normalize(relax.Call(call.op, [wide, *call.args[1:]], call.attrs, call.ty_args))
            if not WIDENED[_tvm.op_name(call) or ""][1]:
                return new
            if source == "uint64":  # topk: the values at the indices found, exactly
                indices = self.builder_.emit(relax.TupleGetItem(new, 1))
                values = relax.op.gather_elements(x, relax.op.astype(indices, "int64"), int(call.attrs.axis))
                return relax.Tuple([self.builder_.emit(values), indices])
            return _values_back(self.builder_, new, call, source)

    return _tvm.rewrite_functions(mod, _Widen(mod))


def _values_back(bb: Any, new: Any, original: Any, dtype: str) -> Any:
    """``new`` (a widened sort/topk) with its value tensors cast back to ``dtype``, as ``original``
    returned them."""
    from tvm import relax  # noqa: PLC0415

    if isinstance(original.ty, relax.TupleType):
        fields = []
        for i, field in enumerate(original.ty.fields):
            item = bb.emit(relax.TupleGetItem(new, i))
            fields.append(bb.emit(relax.op.astype(item, dtype)) if str(field.dtype) == dtype else item)
        return relax.Tuple(fields)
    if str(original.ty.dtype) == dtype:
        return relax.op.astype(bb.emit(new), dtype)
    return new


def _uint64_key(x: Any) -> Any:
    """uint64 bits with the top one flipped, read as int64: ordered as the uint64 values are."""
    from tvm import te, tirx  # noqa: PLC0415

    return te.compute(x.shape, lambda *i: tirx.reinterpret("int64", x(*i) ^ tirx.const(1 << 63, "uint64")),
                      name="amp_uint64_key")


def _has_narrow_call(mod: Any) -> bool:
    """Whether any Relax function calls a WIDENED op on an operand to widen (most modules: none)."""
    from tvm import relax  # noqa: PLC0415

    found = False

    def visit(expr: Any) -> None:
        nonlocal found
        if not found and isinstance(expr, relax.Call) and _wider(expr) is not None:
            found = True

    for _gv, func in _tvm.relax_functions(mod):
        relax.analysis.post_order_visit(func, visit)
    return found
