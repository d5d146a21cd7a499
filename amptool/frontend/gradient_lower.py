"""Relax side of ONNX ``Gradient``: the forward sub-model through Relax's AD, inlined into ``main``.

``gradient.py`` decides what a Gradient node differentiates (ONNX only); this module makes it
code. The cone ``xs, zs → ReduceSum(y)`` is imported with amptool's own importer (every
converter applies), ``relax.transform.Gradient`` derives ``main_adjoint`` (it needs a scalar
target and a single dataflow block), and the adjoint's bindings are emitted into the caller's
block builder with fresh names and the node's inputs in place of its parameters — so the
backward graph is ordinary bindings of ``main`` that every later pass sees. Forward values
``main`` already holds are reused when the node is fed the tensors it names (else recomputed,
keeping their ONNX node as provenance); backward bindings belong to the Gradient node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

from amptool import _tvm
from amptool.dtypes import numpy_dtype
from amptool.errors import UserError, error_summary
from amptool.frontend.gradient import GradientSpec, forward_model
from amptool.frontend.graph import identifier

_HINT = "See README 'Training graphs (Gradient)' for what amptool differentiates."


@dataclass
class Lowered:
    """What one Gradient node became in ``main``: its outputs, and var name → (node, op)."""

    outputs: list[Any]
    named: dict[str, tuple[str, str]]


def lower_gradient(bb: Any, model: onnx.ModelProto, spec: GradientSpec, args: Sequence[Any],
                   fresh: Callable[[str], str], import_fn: Callable[..., Any],
                   known: Mapping[str, Any] | None = None) -> Lowered:
    """Emit dy/dxs into ``bb`` (inside the caller's function) at the values ``args``.

    ``known`` (ONNX tensor → the caller's value) lets the backward graph reuse the forward
    values ``main`` already computed instead of recomputing them — exact only when the node is
    fed the very tensors it names in xs and zs (the ONNX spec's own optimisation note)."""
    from tvm import relax  # noqa: PLC0415

    from amptool.frontend.signature import TensorSpec  # noqa: PLC0415

    where = f"Gradient '{spec.node}'"
    flow = [model.graph.node[i] for i in spec.cone if model.graph.node[i].op_type in ("If", "Loop", "Scan")]
    if flow:  # checked here, after prepare, which may have inlined or unrolled them
        raise UserError(f"{where}: the graph from xs to y contains {flow[0].op_type} '{flow[0].name}'; Relax's AD "
                        "differentiates straight-line code only",
                        "Pin what the condition or trip count reads with --fixed-input or --input-shape, so "
                        "prepare inlines or unrolls it.")
    specs, types = [], []
    for name, arg in zip([*spec.xs, *spec.zs], args, strict=True):
        shape, dtype = _static_type(arg, where, name)
        if name in spec.xs and not dtype.startswith(("float", "bfloat")):
            raise UserError(f"{where}: x '{name}' is {dtype}; only floating-point tensors have gradients",
                            "Move integer tensors from xs to zs.")
        specs.append(TensorSpec(name, dtype, shape))
        types.append((helper.np_dtype_to_tensor_dtype(numpy_dtype(dtype)), shape))
    imported = import_fn(forward_model(model, spec, types), specs)
    mod = imported.mod
    y_dtype = _tvm.tensor_dtype(mod["main"].body) or "not a tensor"
    if not y_dtype.startswith(("float", "bfloat")):
        raise UserError(f"{where}: y '{spec.y}' is {y_dtype}; only a floating-point y has a gradient", _HINT)
    params = list(mod["main"].params)
    _register_missing_rules()
    try:
        mod = relax.transform.Gradient("main", require_grads=params[: len(spec.xs)])(mod)
    except Exception as err:
        reason = _no_gradient_rule(mod, imported.provenance, spec.node) or error_summary(err, last=True)
        raise UserError(f"Relax cannot differentiate {where}: {reason}",
                        "The graph between xs and y must be If/Loop-free and use ops Relax's AD knows.") from err
    forward = {str(b.var.name) for block in mod["main"].body.blocks for b in block.bindings}
    reuse: dict[str, Any] = {}
    if known is not None and spec.inputs == (*spec.xs, *spec.zs):
        reuse = {str(var.name): known[tensor] for tensor, var in imported.tensors.items()
                 if isinstance(var, relax.Var) and str(var.name) in forward and _same_type(var, known.get(tensor))}
    return _inline(bb, mod["main_adjoint"], args, spec, forward, imported.provenance, fresh, reuse)


def _register_missing_rules() -> None:
    """Gradient rules TVM 0.27 lacks, registered once and only where none exists (never
    overriding TVM's). ``erf``: PyTorch exports GELU as x·(1 + erf(x/√2))/2, so without it no
    transformer loss differentiates."""
    import tvm  # noqa: PLC0415
    from tvm.relax.op.base import register_gradient  # noqa: PLC0415

    if tvm.ir.Op.get("relax.erf").get_attr("FPrimalGradient") is None:
        register_gradient("relax.erf", _erf_gradient)


def _erf_gradient(orig_var: Any, orig_call: Any, output_grad: Any, ctx: Any) -> list[Any]:
    """d erf(x) = 2/√π · exp(−x²)."""
    import math  # noqa: PLC0415

    from tvm import relax  # noqa: PLC0415

    x = orig_call.args[0]
    coefficient = relax.const(2.0 / math.sqrt(math.pi), _tvm.tensor_dtype(x) or "float32")
    return [relax.op.multiply(output_grad, relax.op.multiply(coefficient, relax.op.exp(relax.op.negative(
        relax.op.multiply(x, x)))))]


def _no_gradient_rule(mod: Any, provenance: dict[str, Any], gradient_node: str) -> str | None:
    """'no gradient rule for relax.erf (ONNX node 'f', Erf)' for the first such binding, if any."""
    from tvm import relax  # noqa: PLC0415

    body = mod["main"].body
    for block in getattr(body, "blocks", []):
        for binding in block.bindings:
            op = _tvm.op_name(binding.value) if isinstance(binding.value, relax.Call) else None
            if op and binding.value.op.get_attr("FPrimalGradient") is None:
                origin = provenance.get(str(binding.var.name))
                where = ""
                if origin is not None and origin.node != gradient_node:  # not the ReduceSum we add
                    where = f" (ONNX node '{origin.node}', {origin.op_type})"
                return f"no gradient rule for {op}{where}"
    return None


def _inline(bb: Any, adjoint: Any, args: Sequence[Any], spec: GradientSpec, forward: set[str],
            provenance: dict[str, Any], fresh: Callable[[str], str], reuse: Mapping[str, Any]) -> Lowered:
    """Emit ``adjoint``'s bindings into ``bb`` with params replaced by ``args`` and forward
    bindings named in ``reuse`` replaced by the caller's values; bindings nothing needs any
    more (helpers of reused forward values) are dropped. Returns the grads."""
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    @mutator
    class _Substitute(PyExprMutator):
        def __init__(self, mapping: dict[Any, Any]) -> None:
            super().__init__()
            self.mapping = mapping

        def visit_var_(self, var: Any) -> Any:
            return self.mapping.get(var, var)

        def visit_dataflow_var_(self, var: Any) -> Any:
            return self.mapping.get(var, var)

    mapping: dict[Any, Any] = dict(zip(adjoint.params, args, strict=True))
    substitute = _Substitute(mapping)
    named: dict[str, tuple[str, str]] = {}
    bindings = [b for block in adjoint.body.blocks for b in block.bindings]
    body = adjoint.body.body  # (y, (grads…)): only the grads are wanted, y is main's already
    wanted = body.fields[1] if isinstance(body, relax.Tuple) else body
    needed = set(relax.analysis.free_vars(wanted))
    for binding in reversed(bindings):  # liveness: what the gradients read; reused values cut it
        if binding.var in needed and str(binding.var.name) not in reuse:
            needed.update(relax.analysis.free_vars(binding.value))
    for binding in bindings:
        if not isinstance(binding, relax.VarBinding):
            raise UserError(f"Gradient '{spec.node}': the adjoint has a shape match Relax cannot inline", _HINT)
        inner = str(binding.var.name)
        if inner in reuse:
            mapping[binding.var] = reuse[inner]
            continue
        if binding.var not in needed:
            continue
        value = substitute.visit_expr(binding.value)
        if isinstance(value, relax.Var) or _tvm.is_constant(value):  # an alias (the adjoint's *_out vars)
            mapping[binding.var] = value
            continue
        var = bb.emit(value, name_hint=fresh(f"{identifier(spec.node)}_{inner}"))
        mapping[binding.var] = var
        origin = provenance.get(inner)
        if inner in forward and origin is not None and origin.node != spec.node:
            named[str(var.name)] = (origin.node, origin.op_type)
        else:
            named[str(var.name)] = (spec.node, "Gradient")
    grads = substitute.visit_expr(wanted)
    if not isinstance(body, relax.Tuple):
        grads = bb.emit(relax.TupleGetItem(grads, 1))
    outputs = [grads.fields[i] if isinstance(grads, relax.Tuple) else bb.emit(relax.TupleGetItem(grads, i))
               for i in range(len(spec.xs))]
    return Lowered(outputs=outputs, named=named)


def _same_type(var: Any, other: Any) -> bool:
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    return isinstance(other, relax.Var) and bool(tvm_ffi.structural_equal(var.ty, other.ty))


def _static_type(arg: Any, where: str, name: str) -> tuple[tuple[int, ...], str]:
    ty = getattr(arg, "ty", None)
    shape = getattr(ty, "shape", None)
    dims = getattr(shape, "values", None)
    try:
        static = tuple(int(d) for d in dims) if dims is not None else None
    except Exception:  # noqa: BLE001 - a symbolic dim
        static = None
    if ty is None or static is None:
        raise UserError(f"{where}: '{name}' has no static shape", "Pin input shapes with --input-shape.")
    return static, str(ty.dtype)
