"""ConcretizeLike: ``*_like`` ops and ``shape_of`` patterns → static-shape creation/shape ops.

What it rewrites. A ``*_like`` op reads its tensor argument only for the shape (and dtype), yet
ties the two values together: the tensor stays alive, fusion sees a false dependency, and in
Relax ``zeros_like``/``ones_like``/``eye_like`` carry no mixed-precision policy (their result
follows the argument's dtype). When the shape is static, each binding below is replaced by an
op that names the shape outright; ``FoldConstant`` (prefold, next) then turns the creations
into plain constants, which the mixed-precision pass casts like any weight.

    zeros_like(x) / ones_like(x)     → zeros(S) / ones(S)           S = x's static shape
    full_like(x, v)                  → full(S, v)
    eye_like(x, k)                   → eye(S[0], S[1], k)
    collapse_sum_like(d, t)          → collapse_sum_to(d, T)         T = t's static shape
    broadcast_to(v, shape_of(y))     → broadcast_to(v, Y)            (ONNX Expand(v, Shape(y)),
    reshape(v, shape_of(y))          → reshape(v, Y)                  ConstantOfShape(Shape(y)),
                                                                      Reshape(v, Shape(y)))

The dtype is the one the original call produced. Each rule lives in ``RULES`` (one table, keyed
by Relax op) and decides for itself when it does not apply: a ``broadcast_to`` whose shape is
not a ``shape_of`` is no like-pattern and is not counted; a like-pattern whose shape is symbolic
or unknown is left alone, counted in the report with the reason, and logged at debug level.
TVM's ONNX frontend resolves ``Shape`` of a statically shaped tensor at import, so the
``shape_of`` rules fire on modules built in Relax (reverse-mode AD, hand-written IR); the
``*_like`` rules fire on imports (``EyeLike`` → ``eye_like``, ``Shrink`` → ``zeros_like``).
Inside dataflow blocks FoldConstant folds static-shape like-ops into constants by itself; outside
them (a model with an ``If``, private functions) only this pass removes them.

Afterwards, when anything fired: ``DeadCodeElimination`` drops values that were computed only
for their shape (and the ``shape_of`` bindings), then ``RemoveUnusedParameters`` drops
parameters of internal (private) functions that are no longer used, call sites updated. Public
functions — the entry ``main`` — keep their signature.

When it does not fire: symbolic or unknown shapes, unknown dtypes, ``eye_like`` of a tensor
that is not 2-D; and, in a float16/bfloat16 build, ``full_like`` with a run-time fill value:
``full(S, f)`` carries float32 as an attribute and its fill is not a constant, so the
mixed-precision pass would keep it — and its consumers — float32 where ``full_like`` of a
float16 value was float16. ``zeros``/``ones``/``eye`` (and ``full`` of a constant) are fine at
any size, folded or not: the mixed-precision pass treats them as castable constants
(``mixed_precision.CREATION_OPS``). Nothing fired → the module is returned as it was (same object).

Preserves: binding names (ONNX provenance), numerics bit for bit, public signatures,
well-formedness (checked by the pipeline).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amptool import _tvm

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Skip:
    """A like-pattern a rule recognised but could not concretize, and why."""

    reason: str


#: What a rule returns: the replacement expression, a ``Skip``, or None (not a like-pattern).
Outcome = Any


@dataclass
class ConcretizeReport:
    """Like-patterns concretized per op, the ones left alone with their reasons, and the
    internal-function parameters dropped afterwards."""

    concretized: collections.Counter[str] = field(default_factory=collections.Counter)
    skipped: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    params_removed: dict[str, list[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "concretized": dict(sorted(self.concretized.items())),
            "skipped": [{"op": op, "reason": reason, "count": n}
                        for (op, reason), n in sorted(self.skipped.items())],
            "params_removed": {k: list(v) for k, v in sorted(self.params_removed.items())},
        }


class _Context:
    """What rules may ask about the module being rewritten."""

    def __init__(self, lookup_binding: Callable[[Any], Any], dtype: str) -> None:
        self._lookup = lookup_binding
        self.dtype = dtype  # the build's dtype: creation ops must fold when it is not float32

    def static_shape(self, expr: Any) -> tuple[int, ...] | Skip:
        """The static shape of a tensor (or shape) valued expression, else why there is none."""
        from tvm import relax, tirx  # noqa: PLC0415

        ty = getattr(expr, "ty", None)
        name = f"'{_tvm.var_name(expr)}'" if isinstance(expr, relax.Var) else "the argument"
        if isinstance(ty, relax.ShapeType):
            dims = ty.values
        elif isinstance(ty, relax.TensorType):
            shape = ty.shape
            dims = shape.values if isinstance(shape, relax.ShapeExpr) else None
            if shape is not None and dims is None:
                return Skip(f"shape of {name} is the run-time value {shape}")
        else:
            return Skip(f"{name} is not a tensor")
        if dims is None:
            return Skip(f"shape of {name} is unknown (rank {getattr(ty, 'ndim', -1)})")
        if not all(isinstance(d, tirx.IntImm) for d in dims):
            text = ", ".join(str(d.value) if isinstance(d, tirx.IntImm) else str(d) for d in dims)
            return Skip(f"shape of {name} is symbolic ({text})")
        return tuple(int(d.value) for d in dims)

    def shape_of_source(self, expr: Any) -> Any | None:
        """``y`` when ``expr`` is a variable bound to ``shape_of(y)``; None otherwise."""
        from tvm import relax  # noqa: PLC0415

        if not isinstance(expr, relax.Var):
            return None
        bound = self._lookup(expr)
        if isinstance(bound, relax.Call) and _tvm.op_name(bound) == "relax.shape_of":
            return bound.args[0]
        return None


# --------------------------------------------------------------------------- rules


def _creation(
    make: Callable[[Any, Any, str], Any], *, constant_fill: bool = False
) -> Callable[[_Context, Any], Outcome]:
    """A rule for ``op_like(x, ...)`` → ``make(shape_expr, call, dtype)``. ``constant_fill``: the
    replacement is ``full``, which FoldConstant folds at any size when its fill is a constant."""

    def rule(ctx: _Context, call: Any) -> Outcome:
        from tvm import relax  # noqa: PLC0415

        shape = ctx.static_shape(call.args[0])
        if isinstance(shape, Skip):
            return shape
        dtype = _tvm.tensor_dtype(call)
        if dtype is None:
            return Skip("result dtype unknown")
        unfolded = _unfolded_fill(ctx, call) if constant_fill else None
        return unfolded or make(relax.ShapeExpr(list(shape)), call, dtype)

    return rule


def _unfolded_fill(ctx: _Context, call: Any) -> Skip | None:
    """Refuse ``full`` with a run-time fill value in a low-precision build (see the module doc)."""
    if ctx.dtype == "float32" or _tvm.is_constant(call.args[1]):
        return None
    return Skip(f"fill value is not a constant: full would not fold, would pull its consumers out of {ctx.dtype}")


def _eye_like(ctx: _Context, call: Any) -> Outcome:
    from tvm import relax  # noqa: PLC0415

    shape = ctx.static_shape(call.args[0])
    if isinstance(shape, Skip):
        return shape
    dtype = _tvm.tensor_dtype(call)
    if len(shape) != 2 or dtype is None:
        return Skip(f"not a 2-D tensor of known dtype (shape {shape}, dtype {dtype})")
    return relax.op.eye(shape[0], shape[1], call.args[1].value, dtype)


def _collapse_sum_like(ctx: _Context, call: Any) -> Outcome:
    from tvm import relax  # noqa: PLC0415

    shape = ctx.static_shape(call.args[1])
    if isinstance(shape, Skip):
        return shape
    return relax.op.collapse_sum_to(call.args[0], relax.ShapeExpr(list(shape)))


def _shape_of_arg(rebuild: Callable[[Any, Any], Any]) -> Callable[[_Context, Any], Outcome]:
    """A rule for ``op(v, s)`` with ``s = shape_of(y)`` → ``rebuild(v, Y)``; other shapes: no pattern."""

    def rule(ctx: _Context, call: Any) -> Outcome:
        from tvm import relax  # noqa: PLC0415

        source = ctx.shape_of_source(call.args[1])
        if source is None:
            return None
        shape = ctx.static_shape(source)
        if isinstance(shape, Skip):
            return shape
        return rebuild(call.args[0], relax.ShapeExpr(list(shape)))

    return rule


@dataclass(frozen=True)
class Rule:
    """One like-pattern: the label reports use, and the rewrite (see module docstring)."""

    label: str
    apply: Callable[[_Context, Any], Outcome]


def _rules() -> Mapping[str, Rule]:
    from tvm.relax import op  # noqa: PLC0415

    return {
        "relax.zeros_like": Rule("zeros_like", _creation(lambda s, _c, d: op.zeros(s, d))),
        "relax.ones_like": Rule("ones_like", _creation(lambda s, _c, d: op.ones(s, d))),
        "relax.full_like": Rule("full_like", _creation(lambda s, c, d: op.full(s, c.args[1], d), constant_fill=True)),
        "relax.eye_like": Rule("eye_like", _eye_like),
        "relax.collapse_sum_like": Rule("collapse_sum_like", _collapse_sum_like),
        "relax.broadcast_to": Rule("broadcast_to(shape_of)", _shape_of_arg(op.broadcast_to)),
        "relax.reshape": Rule("reshape(shape_of)", _shape_of_arg(op.reshape)),
    }


#: Relax op → its rule; built on first use (TVM is imported lazily).
RULES: dict[str, Rule] = {}


def rules() -> Mapping[str, Rule]:
    if not RULES:
        RULES.update(_rules())
    return RULES


# --------------------------------------------------------------------------- pass


def concretize_like(mod: Any, dtype: str = "float32") -> tuple[Any, ConcretizeReport]:
    """Rewrite every like-pattern with a static shape; then DCE and drop unused parameters of
    internal functions. ``dtype``: what the build converts to (see ``_unfolded_fill``).
    Returns the new module (``mod`` itself if nothing fired) and a report."""
    from tvm import relax  # noqa: PLC0415

    report = ConcretizeReport()
    rewritten = _make_mutator(mod, report, dtype).run()
    if not report.concretized:
        return mod, report
    before = _params(rewritten)
    rewritten = relax.transform.DeadCodeElimination()(rewritten)
    rewritten = relax.transform.RemoveUnusedParameters()(rewritten)
    after = _params(rewritten)
    report.params_removed = {name: [p for p in params if p not in after.get(name, params)]
                             for name, params in before.items() if after.get(name, params) != params}
    return rewritten, report


def _params(mod: Any) -> dict[str, list[str]]:
    return {str(gv.name_hint): [_tvm.var_name(p) for p in func.params] for gv, func in _tvm.relax_functions(mod)}


def _make_mutator(mod: Any, report: ConcretizeReport, dtype: str) -> Any:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    table = rules()

    @mutator
    class _ConcretizeLike(PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.module = module
            self.ctx = _Context(self.lookup_binding, dtype)

        def run(self) -> Any:
            for gv, func in _tvm.relax_functions(self.module):
                self.builder_.update_func(gv, self.visit_expr(func))
            return self.builder_.get()

        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            rule = table.get(_tvm.op_name(value) or "") if isinstance(value, relax.Call) else None
            if rule is None:
                super().visit_var_binding_(binding)
                return
            outcome = rule.apply(self.ctx, self.builder_.normalize(self.visit_expr(value)))
            name = _tvm.var_name(binding.var)
            if not isinstance(outcome, relax.Expr):
                if isinstance(outcome, Skip):
                    report.skipped[(rule.label, outcome.reason)] += 1
                    log.debug("ConcretizeLike: %s at '%s' left alone: %s", rule.label, name, outcome.reason)
                super().visit_var_binding_(binding)
                return
            report.concretized[rule.label] += 1
            new_value = self.builder_.normalize(outcome)
            new_var = _tvm.new_var(name, new_value.ty, dataflow=isinstance(binding.var, relax.DataflowVar))
            self.builder_.emit_normalized(relax.VarBinding(new_var, new_value))
            self.set_var_remap(binding.var, new_var)

    return _ConcretizeLike(mod)
