"""The mutator behind ``to_mixed_precision`` (mixed_precision.py says what it rewrites and why).

One method per decision: the colour of a binding (``_color``), the dtype that colour computes
in (``_target``), the range guards (``_guarded``), the accumulation dtype of conv/matmul
(``_accumulation``), a cast made once and reused (``_cast``), and the cast of a function's or
``If`` branch's result back to its original type (``visit_seq_expr_``). The per-binding path
is ``visit_var_binding_`` → ``_rewrite``; it is hot (tens of µs per op, see
benchmarks/pass_scaling.py), so it calls each helper once, reads TVM arrays once, and builds
nodes through the FFI constructors in ``amptool._tvm``.

Imports TVM at module level: import it lazily (``to_mixed_precision`` does), so that
``amptool --help`` stays instant.
"""

from __future__ import annotations

import logging
from typing import Any

from tvm.ir import GlobalVar
from tvm.relax import Call, DataflowVar, SeqExpr, TensorType, Tuple, TupleGetItem, TupleType, Var
from tvm.relax.expr_functor import PyExprMutator, mutator

from amptool import _tvm
from amptool.colors.policy import Color, ColorPolicy
from amptool.frontend.importer import NodeOrigin
from amptool.passes.kernel_dtypes import WIDENED
from amptool.passes.mixed_precision_types import CREATION_OPS, Decision, MixedPrecisionReport
from amptool.passes.range_guards import DTYPE_MAX, ActivationGuard, CancellationGuard, Guarded, castable

log = logging.getLogger(__name__)

#: Ops TVM 0.27 has no kernel for in a low dtype, by dtype: computed in float32 whatever their colour
#: says (their inputs cast up, which is exact). TOPI's finiteness tests raise on bfloat16 ("not
#: supported for finiteness ops") — a ReduceMax (its ∓inf repair tests isinf) over a bfloat16
#: constant failed FoldConstant, and so the whole convert; an argmax/argmin over bfloat16 fails
#: TVM's BF16StorageLegalize at codegen (its reducer's bfloat16 let bindings) — a TF detector's
#: class of each box; and TopK over bfloat16 builds and runs but returns values from the wrong
#: positions, other rows' among them (a classifier's top-5: cosine 0.37) — its sorts with it.
#: The list is kernel_dtypes.WIDENED's (which widens a bfloat16 model's own operands of them).
NO_LOW_KERNEL = {"bfloat16": frozenset(op for op, (wider, _) in WIDENED.items() if "bfloat16" in wider)}

#: Suffix of a cast value's name, per dtype (``conv_f16``).
SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


@mutator
class MixedPrecisionMutator(PyExprMutator):
    """Rewrites every Relax function of ``mod`` to ``low`` under ``policy``; ``run()`` returns
    the new module and fills ``report``.

    State: ``scopes`` maps (value, dtype) to the cast emitted in each open block (a cast is
    reused, never emitted twice in one scope); ``const_verdict`` memoises the range guard's
    verdict per constant; ``constant_like`` holds the vars bound to castable creation ops.
    """

    def __init__(
        self,
        mod: Any,
        *,
        policy: ColorPolicy,
        low: str,
        report: MixedPrecisionReport,
        activation_guard: ActivationGuard,
        provenance: dict[str, NodeOrigin] | None = None,
        range_guards: bool = True,
        cancellation_guard: CancellationGuard | None = None,
    ) -> None:
        super().__init__(mod)
        self.module = mod
        self.policy = policy
        self.low = low
        self.report = report
        self.activation_guard = activation_guard
        self.provenance = provenance or {}
        self.range_guards = range_guards
        self.cancellation_guard = cancellation_guard or CancellationGuard({})
        self.scopes: list[dict[tuple[int, str], Any]] = []
        self.const_verdict: dict[int, str | None] = {}
        self.constant_like: set[int] = set()  # hash of vars bound to castable creation ops

    def run(self) -> Any:
        for gv, func in _tvm.relax_functions(self.module):
            self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()

    # ------------------------------------------------------------ scopes: a cast per block

    def visit_binding_block_(self, block: Any) -> Any:
        self.scopes.append({})
        try:
            return super().visit_binding_block_(block)
        finally:
            self.scopes.pop()

    def visit_dataflow_block_(self, block: Any) -> Any:
        self.scopes.append({})
        try:
            return super().visit_dataflow_block_(block)
        finally:
            self.scopes.pop()

    def _cached(self, expr: Any, dtype: str) -> Any | None:
        key = (hash(expr), dtype)
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def _remember(self, expr: Any, dtype: str, value: Any) -> None:
        if self.scopes:
            self.scopes[-1][(hash(expr), dtype)] = value

    # ------------------------------------------------------------ casts

    def _cast(self, expr: Any, dtype: str, *, output: bool = False) -> Any:
        """``expr`` as ``dtype``: itself, a cached cast, the value it was widened from, or a new
        cast (``output``: bound to a ``Var``, seen outside its dataflow block)."""
        have = _tvm.tensor_dtype(expr)
        if have == dtype:
            return expr
        hit = self._cached(expr, dtype)  # first: a hit needs no binding lookup
        if hit is not None:
            return hit
        source = self._widened_from(expr, have)
        if source is not None and _tvm.tensor_dtype(source) == dtype:
            return source  # low → float32 → low is the identity: use the low value
        return self._emit_cast(expr, have, dtype, output)

    def _emit_cast(self, expr: Any, have: str | None, dtype: str, output: bool) -> Any:
        """Bind ``astype(expr, dtype)`` and cache it both ways (the cast, and its source as ``have``).

        Constants are bound and cached like any value: the pipeline's fold stage
        (fold_casts.py) turns the binding into one low-precision constant, so a weight shared
        by several ops stays shared."""
        if _tvm.is_constant(expr):
            self.report.weight_casts += 1
            name = ""
        else:
            self.report.casts_inserted += 1
            name = f"{_tvm.var_name(expr)}_{SHORT.get(dtype, dtype)}" if isinstance(expr, Var) else ""
        if output:  # a Var even inside a dataflow block (emit would make a DataflowVar)
            value = self.builder_.normalize(_tvm.astype(expr, dtype))
            casted = self._emit_var(name, value, dataflow=False)
        else:
            casted = self.builder_.emit(_tvm.astype(expr, dtype), name_hint=name)
        self._remember(expr, dtype, casted)
        self._remember(casted, have or dtype, expr)
        return casted

    def _widened_from(self, expr: Any, dtype: str | None) -> Any | None:
        """The low-precision value ``expr`` (of ``dtype``) was cast up from, if it is such a cast."""
        if dtype != "float32" or not isinstance(expr, Var):
            return None
        bound = self.lookup_binding(expr)
        if not isinstance(bound, Call) or _tvm.op_name(bound) != "relax.astype":
            return None
        source = bound.args[0]
        return source if _tvm.tensor_dtype(source) in DTYPE_MAX else None

    def _cast_like(self, expr: Any, ty: Any) -> Any:
        """Cast a (possibly tuple-typed) expression back to the float dtypes of ``ty``."""
        if isinstance(ty, TensorType):
            want = str(ty.dtype)
            have = _tvm.tensor_dtype(expr)
            if have and want and have != want and have in _tvm.FLOAT_DTYPES and want in _tvm.FLOAT_DTYPES:
                return self._cast(expr, want)
            return expr
        if isinstance(ty, TupleType) and _tvm.is_tuple_type(getattr(expr, "ty", None)):
            return expr if _same_dtypes(expr.ty, ty) else self._cast_tuple_like(expr, ty)
        return expr

    def _cast_tuple_like(self, expr: Any, ty: Any) -> Any:
        """A tuple of ``expr``'s fields, each cast like ``ty``'s (read with TupleGetItem unless a literal)."""
        fields = []
        for i, field_ty in enumerate(ty.fields):
            item = expr.fields[i] if isinstance(expr, Tuple) else self.builder_.emit(TupleGetItem(expr, i))
            fields.append(self._cast_like(item, field_ty))
        return Tuple(fields)

    # ------------------------------------------------------------ function and If-branch results

    def visit_seq_expr_(self, seq: Any) -> Any:
        """Visit the blocks (dataflow or not) of a function body or ``If`` branch, then cast its
        result back to the original type if it changed, so signatures and branches agree."""
        blocks = [self.visit_binding_block(block) for block in seq.blocks]
        body = self.visit_expr(seq.body)
        if not _same_dtypes(getattr(body, "ty", None), seq.body.ty):
            body, tail = self._restore_result(body, seq.body.ty)
            blocks.append(tail)
        return SeqExpr([b for b in blocks if len(b.bindings)], body)

    def _restore_result(self, body: Any, ty: Any) -> tuple[Any, Any]:
        """(``body`` cast like ``ty``, the block holding the casts), the block in a scope of its own."""
        self.builder_._begin_binding_block()
        self.scopes.append({})
        body = self._cast_like(body, ty)
        if isinstance(body, Tuple):
            body = self.builder_.emit(body)
        self.scopes.pop()
        return body, self.builder_._end_block()

    # ------------------------------------------------------------ bindings (the hot path)

    def visit_var_binding_(self, binding: Any) -> None:
        value = binding.value
        if isinstance(value, Call) and isinstance(value.op, GlobalVar):
            self._call_function(binding)
            return
        relax_op = _tvm.op_name(value) if isinstance(value, Call) else None
        if relax_op is None or relax_op == "relax.astype":
            super().visit_var_binding_(binding)
            return
        name = _tvm.var_name(binding.var)
        new_value, accumulated = self._rewrite(name, value, relax_op)
        dataflow = isinstance(binding.var, DataflowVar)
        new_var = self._emit_var(name, new_value, dataflow=dataflow)
        if relax_op in CREATION_OPS and self._castable_creation(new_value):
            self.constant_like.add(hash(new_var))
        if accumulated:
            # fp32-accumulated conv/matmul: consumers get the low cast (an output of a dataflow
            # block if the binding was one); the fp32 value stays cached for NEVER consumers.
            new_var = self._cast(new_var, self.low, output=not dataflow)
        self.set_var_remap(binding.var, new_var)

    def _call_function(self, binding: Any) -> None:
        """A call of another Relax function (a run-time loop's): its arguments back in the dtypes its
        signature names — each function is rewritten on its own, its signature kept."""
        call = binding.value
        orig_args = _tvm.array_items(call.args)
        args = [self.visit_expr(arg) for arg in orig_args]
        value = self._restore(call, args, orig_args, [_tvm.tensor_dtype(arg) for arg in orig_args])
        new_var = self._emit_var(_tvm.var_name(binding.var), value, dataflow=isinstance(binding.var, DataflowVar))
        self.set_var_remap(binding.var, new_var)

    def _emit_var(self, name: str, value: Any, *, dataflow: bool) -> Any:
        """Emit ``value`` (normalized) bound to a new ``DataflowVar`` (or ``Var``) named ``name``."""
        new_var = _tvm.new_var(name, value.ty, dataflow=dataflow)
        self.builder_.emit_normalized(_tvm.var_binding(new_var, value))
        return new_var

    def _rewrite(self, name: str, call: Any, relax_op: str) -> tuple[Any, bool]:
        """(the call with its inputs cast for its colour, whether it accumulates wider); records the Decision."""
        origin = self.provenance.get(name)
        # Read call.args once: each pass over a TVM Array costs ~2 µs per element.
        orig_args = _tvm.array_items(call.args)
        args = [self.visit_expr(arg) for arg in orig_args]
        old_dtypes = [_tvm.tensor_dtype(arg) for arg in orig_args]  # None: not a tensor
        leaves = _float32_leaves(orig_args, args, old_dtypes)
        color = self._color(call, relax_op, origin, leaves)
        if not leaves:
            return self._restore(call, args, orig_args, old_dtypes), False
        target = self._target(color, leaves)
        if target == self.low and relax_op in NO_LOW_KERNEL.get(self.low, ()):
            target = "float32"
        if target == self.low and self.range_guards and self._guarded(name, relax_op, origin, leaves):
            target, color = "float32", Color.NEVER
        built = self._build(call, relax_op, args, orig_args, old_dtypes, target, origin)
        if built is None:  # type inference refused the low-precision call
            target = "float32"
            built = (self._restore(call, args, orig_args, old_dtypes), False)
        node, onnx_op = (origin.node, origin.op_type) if origin else (None, None)
        self.report.decisions.append(Decision(name, node, onnx_op, relax_op, color, target))
        return built

    def _color(self, call: Any, relax_op: str, origin: NodeOrigin | None, leaves: list[tuple[Any, Any]]) -> Color:
        """The policy's colour; NEVER for calls with type arguments and for unknown ops (counted)."""
        if len(call.ty_args):
            return Color.NEVER
        color = self.policy.color_of(relax_op, origin.node if origin else None, origin.op_type if origin else None)
        if color is None:
            if leaves:
                label = relax_op + (f" (ONNX {origin.op_type})" if origin else "")
                self.report.unknown_ops[label] += 1
            return Color.NEVER
        return color

    def _target(self, color: Color, leaves: list[tuple[Any, Any]]) -> str:
        """The dtype ``color`` computes in: ALWAYS low; FOLLOW low if every non-constant input is."""
        if color is Color.ALWAYS:
            return self.low
        if color is Color.FOLLOW:
            moving = [new for (_, new) in leaves if not _tvm.is_constant(new) and hash(new) not in self.constant_like]
            if moving and all(_tvm.tensor_dtype(new) == self.low for new in moving):
                return self.low
        return "float32"

    def _guarded(self, name: str, relax_op: str, origin: NodeOrigin | None, leaves: list[tuple[Any, Any]]) -> bool:
        """Whether a range guard keeps this op in float32 (a constant input or its calibrated
        activations do not fit the low dtype, or its calibrated result cancels, or makes an
        operand of one that does); the reason goes to the report."""
        kind = "constant"
        reason = self._constant_guard(leaves)
        if reason is None and origin is not None:
            kind = "activation"
            reason = self.activation_guard.reason(origin.node)
        if reason is None and origin is not None:
            kind = "cancellation"
            reason = self.cancellation_guard.reason(origin.node)
        if reason is None:
            return False
        self.report.guarded.append(Guarded(origin.node if origin else name, relax_op, reason, kind))
        return True

    def _constant_guard(self, leaves: list[tuple[Any, Any]]) -> str | None:
        """Why the first constant input that the low dtype cannot hold cannot; None if all can."""
        for _, new in leaves:
            if not _tvm.is_constant(new):
                continue
            key = hash(new)
            if key not in self.const_verdict:
                self.const_verdict[key] = castable(_tvm.constant_view(new), self.low)
            if self.const_verdict[key] is not None:
                return self.const_verdict[key]
        return None

    def _castable_creation(self, call: Any) -> bool:
        """A float32 creation op whose tensor arguments (a fill value) are castable constants."""
        if _tvm.tensor_dtype(call) != "float32":
            return False
        tensors = [arg for arg in _tvm.array_items(call.args) if _tvm.tensor_dtype(arg) is not None]
        return all(_tvm.is_constant(arg) for arg in tensors) and self._constant_guard(
            [(arg, arg) for arg in tensors]) is None

    def _build(
        self, call: Any, relax_op: str, args: list[Any], orig_args: list[Any], old_dtypes: list[str | None],
        target: str, origin: NodeOrigin | None,
    ) -> tuple[Any, bool] | None:
        """(call with float32 leaves cast to ``target``, accumulated-in-wider-dtype);
        None if type inference refuses it."""
        new_args = [self._retype_arg(*arg, target) for arg in zip(args, orig_args, old_dtypes)]
        try:
            if target == self.low and relax_op in _tvm.OUT_DTYPE_OPS:
                acc = self._accumulation(relax_op, origin)
                return self.builder_.normalize(_tvm.call_with_out_dtype(call, new_args, acc)), acc != self.low
            return self.builder_.normalize(_tvm.call_with_args(call, new_args)), False
        except Exception as err:  # noqa: BLE001 - TVMError from type inference
            log.debug("%s refused %s inputs (%s); keeping float32", relax_op, target, err)
            return None

    def _accumulation(self, relax_op: str, origin: NodeOrigin | None) -> str:
        """The dtype a low-precision conv/matmul accumulates in: the policy's, else the low dtype."""
        return self.policy.accumulation_of(relax_op, origin.op_type if origin else None) or self.low

    def _retype_arg(self, new: Any, old: Any, old_dtype: str | None, target: str) -> Any:
        """A rewritten argument cast for the call: float32 leaves to ``target``, others back to their old dtype."""
        if old_dtype is None and isinstance(new, Tuple) and isinstance(old, Tuple):
            return Tuple([self._retype_arg(n, o, _tvm.tensor_dtype(o), target)
                                for n, o in zip(new.fields, old.fields)])
        if old_dtype is None:
            return self._cast_like(new, old.ty) if hasattr(old, "ty") else new
        if old_dtype == "float32":
            return self._cast(new, target)
        return self._cast(new, old_dtype) if _tvm.tensor_dtype(new) != old_dtype else new

    def _restore(self, call: Any, args: list[Any], orig_args: list[Any], old_dtypes: list[str | None]) -> Any:
        """The call on its inputs restored to their original dtypes (NEVER, or a refused rewrite)."""
        new_args = [self._retype_arg(*arg, "float32") for arg in zip(args, orig_args, old_dtypes)]
        return self.builder_.normalize(_tvm.call_with_args(call, new_args))


def _float32_leaves(orig_args: list[Any], new_args: list[Any], old_dtypes: list[str | None]) -> list[tuple[Any, Any]]:
    """(original, rewritten) pairs of the float32 tensor inputs, tuple fields flattened;
    ``old_dtypes``: the original args' tensor dtypes (None for non-tensors)."""
    leaves = []
    for old, new, old_dtype in zip(orig_args, new_args, old_dtypes):
        if old_dtype == "float32":
            leaves.append((old, new))
        elif old_dtype is None and _tvm.is_tuple_expr(old) and _tvm.is_tuple_expr(new):
            fields = list(old.fields)
            leaves.extend(_float32_leaves(fields, list(new.fields), [_tvm.tensor_dtype(f) for f in fields]))
    return leaves


def _same_dtypes(a: Any, b: Any) -> bool:
    """Whether two types hold the same dtypes (tensors, or tuples field by field); True for anything else."""
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        return str(a.dtype) == str(b.dtype)
    if isinstance(a, TupleType) and isinstance(b, TupleType):
        return len(a.fields) == len(b.fields) and all(_same_dtypes(x, y) for x, y in zip(a.fields, b.fields))
    return True
