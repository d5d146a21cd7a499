"""``--low-precision-io``: the model's float32 inputs and outputs become the low dtype.

By default a converted model keeps its signature (float32 in, float32 out), so it drops into
the caller's code unchanged. When the caller already holds half-precision data — a GPU
pipeline, a model chained after another fp16 model — the boundary casts are wasted work
and memory; this pass moves them out of the model. It runs before the mixed-precision pass:
``main``'s float32 parameters are replaced by low-dtype ones cast up on entry, and float32
results are cast down on exit. The mixed-precision pass then cancels each ``cast up → cast
down`` pair (exact: a low value survives the round trip), so ops that compute in the low
dtype read the inputs directly.
"""

from __future__ import annotations

from typing import Any

from amptool import _tvm


def lower_io(mod: Any, low: str) -> Any:
    """A copy of ``mod`` whose ``main`` takes and returns ``low`` where it had float32."""
    from tvm import relax  # noqa: PLC0415

    gv = mod.get_global_var("main")
    func = mod[gv]
    bb = relax.BlockBuilder()
    params, entry = [], []
    for param in func.params:
        if _tvm.tensor_dtype(param) == "float32":
            low_param = relax.Var(_tvm.var_name(param), relax.TensorType(param.ty.shape, low))
            params.append(low_param)
            entry.append(relax.VarBinding(param, bb.normalize(relax.op.astype(low_param, "float32"))))
        else:
            params.append(param)
    exit_bindings: list[Any] = []
    result = _cast_result(bb, func.body.body, low, exit_bindings)
    blocks = [relax.BindingBlock(entry), *func.body.blocks, relax.BindingBlock(exit_bindings)]
    body = relax.SeqExpr([b for b in blocks if len(b.bindings)], result)
    new_func = relax.Function(params, body, result.ty, func.is_pure, func.attrs)
    return _with_function(mod, gv, new_func)


def _cast_result(bb: Any, expr: Any, low: str, bindings: list[Any]) -> Any:
    from tvm import relax  # noqa: PLC0415

    ty = expr.ty
    if isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32":
        value = bb.normalize(relax.op.astype(expr, low))
        var = relax.Var(f"{_tvm.var_name(expr) if isinstance(expr, relax.Var) else 'output'}_{low}", value.ty)
        bindings.append(relax.VarBinding(var, value))
        return var
    if isinstance(ty, relax.TupleType):
        fields = []
        for i in range(len(ty.fields)):
            if isinstance(expr, relax.Tuple):
                item = expr.fields[i]
            else:
                got = bb.normalize(relax.TupleGetItem(expr, i))
                item = relax.Var(f"output{i}", got.ty)
                bindings.append(relax.VarBinding(item, got))
            fields.append(_cast_result(bb, item, low, bindings))
        return bb.normalize(relax.Tuple(fields))
    return expr


def _with_function(mod: Any, gv: Any, func: Any) -> Any:
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    functions = {g: f for g, f in mod.functions_items()}
    functions[gv] = func
    return relax.transform.Normalize()(tvm.IRModule(functions, attrs=mod.attrs))
