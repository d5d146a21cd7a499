"""MixedPrecision: rewrite a Relax module to float16/bfloat16 under ALWAYS/FOLLOW/NEVER lists.

What it rewrites. Every binding whose value calls a Relax op gets a colour from the
``ColorPolicy`` (node override > ONNX op type > Relax op > unknown = NEVER):
  * ALWAYS: float32 inputs are cast to the low dtype; conv/matmul get ``out_dtype`` set
    to the op's accumulation dtype (float32 by default) and their result is cast down.
  * FOLLOW: low precision if every non-constant floating input already is (constants
    count as castable), otherwise float32 with low inputs cast back up.
  * NEVER: inputs restored to their original dtypes; the output is as before.
Inputs that were not float32 in the original program (int, bool, float64) are never
touched. Each cast of a value is emitted once per scope and reused; the float32 result of
an fp32-accumulating op is remembered, so a NEVER consumer reads it instead of casting
the rounded value back up. Function results and ``If`` branch results are cast back to
their original types, so model inputs/outputs keep their dtypes and branches agree.

Range guards (``range_guards=True``) win over the lists: a constant whose values overflow
the low dtype, or whose non-zeros mostly underflow to zero, is never cast — the op
consuming it computes in float32 and the decision is reported. Likewise an op whose ONNX
node saw activations above ``activation_limit`` in calibration (``activation_peaks``, from
amptool.calibrate) stays float32.

Why our own pass: TVM's ``ToMixedPrecision`` is fp16-only, keeps policies as global C++
attributes, crashes on Clip/HardSigmoid and silently skips non-dataflow blocks (any model
with ``If``). This pass visits each binding once and infers only the binding at hand, so
its cost is linear in the number of ops.

When it does not fire: ``dtype == "float32"`` returns the module unchanged; calls to
functions (not ops) and ops with explicit type arguments (call_tir, call_dps_packed) are
treated as NEVER. If type inference rejects a rewritten call, that call falls back to NEVER.

Preserves: function signatures, output types, binding names (so ONNX provenance survives),
well-formedness (checked by the pipeline).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from amptool import _tvm
from amptool.colors.policy import Color, ColorPolicy
from amptool.frontend.importer import NodeOrigin
from amptool.passes.range_guards import DTYPE_MAX, ActivationGuard, Guarded, castable

log = logging.getLogger(__name__)

#: Ops that make a tensor from attributes (and, for ``full``, a fill value) alone. A float32
#: result of one is as castable as a constant when its fill is (zeros, ones and eye always
#: are): FOLLOW consumers go low and read a cast of it, as they would a weight's. Without
#: this, a ``zeros`` too large for FoldConstant (ConcretizeLike makes them from Shrink,
#: ConstantOfShape) kept every consumer in float32.
CREATION_OPS = frozenset({"relax.zeros", "relax.ones", "relax.eye", "relax.full"})
SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


class Decision(NamedTuple):
    """The colour and compute dtype chosen for one binding (for inspect and reports).

    A NamedTuple, not a frozen dataclass: one is made per binding, and a frozen
    dataclass's ``__init__`` costs ~1 µs more."""

    var: str
    node: str | None
    onnx_op: str | None
    relax_op: str
    color: Color
    dtype: str


@dataclass
class MixedPrecisionReport:
    dtype: str
    casts_inserted: int = 0
    weight_casts: int = 0
    unknown_ops: dict[str, int] = field(default_factory=collections.Counter)
    guarded: list[Guarded] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    @property
    def converted(self) -> int:
        return sum(1 for d in self.decisions if d.dtype == self.dtype)


def to_mixed_precision(
    mod: Any,
    policy: ColorPolicy,
    dtype: str,
    provenance: dict[str, NodeOrigin] | None = None,
    *,
    range_guards: bool = True,
    activation_peaks: Mapping[str, float] | None = None,
) -> tuple[Any, MixedPrecisionReport]:
    """Rewrite ``mod`` to ``dtype`` under ``policy``; returns the new module and a report."""
    report = MixedPrecisionReport(dtype=dtype)
    if dtype == "float32":
        return mod, report
    if dtype not in DTYPE_MAX:
        raise ValueError(f"unsupported low-precision dtype {dtype!r}")
    guard = ActivationGuard(dict(activation_peaks or {}), policy.activation_limit(dtype), dtype)
    mutator = _make_mutator(mod, policy, dtype, provenance or {}, range_guards, report, guard)
    with _gc_paused():
        return mutator.run(), report


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the pass.

    The pass allocates a few objects per binding and keeps them (decisions, cast caches)
    until it ends, so the collector rescans an ever larger heap ever more often: measured
    at 11% of the pass at 100k ops, and the only cost per op that grew with the module
    (benchmarks/pass_scaling.py). Nothing the pass builds is cyclic garbage; the previous
    state is restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _make_mutator(
    mod: Any,
    policy: ColorPolicy,
    low: str,
    provenance: dict[str, NodeOrigin],
    range_guards: bool,
    report: MixedPrecisionReport,
    activation_guard: ActivationGuard,
) -> Any:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    @mutator
    class _MixedPrecision(PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.module = module
            self.scopes: list[dict[tuple[int, str], Any]] = []
            self.const_verdict: dict[int, str | None] = {}
            self.constant_like: set[int] = set()  # hash of vars bound to castable creation ops

        # ------------------------------------------------------------ driver

        def run(self) -> Any:
            for gv, func in _tvm.relax_functions(self.module):
                new_func = self.visit_expr(func)
                self.builder_.update_func(gv, new_func)
            return self.builder_.get()

        # ------------------------------------------------------------ scopes & casts

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

        def _cast(self, expr: Any, dtype: str) -> Any:
            """``expr`` as ``dtype``: itself, a cached cast, or a new cast emitted once."""
            have = _tvm.tensor_dtype(expr)
            if have == dtype:
                return expr
            hit = self._cached(expr, dtype)  # first: a hit needs no binding lookup
            if hit is not None:
                return hit
            source = self._widened_from(expr, have)
            if source is not None and _tvm.tensor_dtype(source) == dtype:
                return source  # low → float32 → low is the identity: use the low value
            # Constants are bound and cached like any value: the pipeline's fold stage
            # (fold_casts.py) turns the binding into one low-precision constant, so a weight
            # shared by several ops stays shared.
            if _tvm.is_constant(expr):
                report.weight_casts += 1
                name = ""
            else:
                report.casts_inserted += 1
                name = f"{_tvm.var_name(expr)}_{SHORT.get(dtype, dtype)}" if isinstance(expr, relax.Var) else ""
            casted = self.builder_.emit(_tvm.astype(expr, dtype), name_hint=name)
            self._remember(expr, dtype, casted)
            self._remember(casted, have or dtype, expr)
            return casted

        def _widened_from(self, expr: Any, dtype: str | None) -> Any | None:
            """The low-precision value ``expr`` (of ``dtype``) was cast up from, if it is such a cast."""
            if dtype != "float32" or not isinstance(expr, relax.Var):
                return None
            bound = self.lookup_binding(expr)
            if not isinstance(bound, relax.Call) or _tvm.op_name(bound) != "relax.astype":
                return None
            source = bound.args[0]
            return source if _tvm.tensor_dtype(source) in DTYPE_MAX else None

        def _cast_like(self, expr: Any, ty: Any) -> Any:
            """Cast a (possibly tuple-typed) expression back to the dtypes of ``ty``."""
            if isinstance(ty, relax.TensorType):
                want = str(ty.dtype)
                have = _tvm.tensor_dtype(expr)
                if have and want and have != want and have in _tvm.FLOAT_DTYPES and want in _tvm.FLOAT_DTYPES:
                    return self._cast(expr, want)
                return expr
            if isinstance(ty, relax.TupleType) and _tvm.is_tuple_type(getattr(expr, "ty", None)):
                if _same_dtypes(expr.ty, ty):
                    return expr
                fields = []
                for i, field_ty in enumerate(ty.fields):
                    item = expr.fields[i] if isinstance(expr, relax.Tuple) else self.builder_.emit(
                        relax.TupleGetItem(expr, i)
                    )
                    fields.append(self._cast_like(item, field_ty))
                return relax.Tuple(fields)
            return expr

        # ------------------------------------------------------------ restore at scope ends

        def visit_seq_expr_(self, seq: Any) -> Any:
            """Visit blocks, then cast the result back to the original type if it changed."""
            blocks = [self.visit_binding_block(block) for block in seq.blocks]
            body = self.visit_expr(seq.body)
            if not _same_dtypes(getattr(body, "ty", None), seq.body.ty):
                self.builder_._begin_binding_block()
                self.scopes.append({})
                body = self._cast_like(body, seq.body.ty)
                if isinstance(body, relax.Tuple):
                    body = self.builder_.emit(body)
                self.scopes.pop()
                tail = self.builder_._end_block()
                if len(tail.bindings):
                    blocks.append(tail)
            blocks = [b for b in blocks if len(b.bindings)]
            return relax.SeqExpr(blocks, body)

        # ------------------------------------------------------------ bindings

        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            relax_op = _tvm.op_name(value) if isinstance(value, relax.Call) else None
            if relax_op is None or relax_op == "relax.astype":
                super().visit_var_binding_(binding)
                return
            name = _tvm.var_name(binding.var)
            new_value, accumulated = self._rewrite(name, value, relax_op)
            new_var = self._emit_like(binding.var, name, new_value)
            if relax_op in CREATION_OPS and self._castable_creation(new_value):
                self.constant_like.add(hash(new_var))
            if accumulated:
                # fp32-accumulated conv/matmul: consumers get the low cast; the fp32
                # value stays cached for NEVER consumers (see _cast).
                new_var = self._cast(new_var, low)
            self.set_var_remap(binding.var, new_var)

        def _emit_like(self, old_var: Any, name: str, value: Any) -> Any:
            """Emit ``value`` (normalized) bound to a var of the same kind as ``old_var``, named ``name``."""
            dataflow = isinstance(old_var, relax.DataflowVar)
            new_var = _tvm.new_var(name, value.ty, dataflow=dataflow)
            self.builder_.emit_normalized(_tvm.var_binding(new_var, value))
            return new_var

        def _rewrite(self, name: str, call: Any, relax_op: str) -> tuple[Any, bool]:
            origin = provenance.get(name)
            # Read call.args once: each pass over a TVM Array costs ~2 µs per element.
            orig_args = _tvm.array_items(call.args)
            args = [self.visit_expr(arg) for arg in orig_args]
            old_dtypes = [_tvm.tensor_dtype(arg) for arg in orig_args]  # None: not a tensor
            leaves = _float32_leaves(orig_args, args, old_dtypes)
            color = self._color(call, relax_op, origin, leaves)
            if not leaves:
                return self._restore(call, args, orig_args, old_dtypes), False
            guard_reason = None
            target = "float32"
            if color is Color.ALWAYS:
                target = low
            elif color is Color.FOLLOW:
                moving = [new for (_, new) in leaves
                          if not _tvm.is_constant(new) and hash(new) not in self.constant_like]
                if moving and all(_tvm.tensor_dtype(new) == low for new in moving):
                    target = low
            if target == low and range_guards:
                kind = "constant"
                guard_reason = self._constant_guard(leaves)
                if guard_reason is None and origin is not None:
                    kind = "activation"
                    guard_reason = activation_guard.reason(origin.node)
                if guard_reason is not None:
                    target = "float32"
                    node_label = origin.node if origin else name
                    report.guarded.append(Guarded(node_label, relax_op, guard_reason, kind))
            built = self._build(call, relax_op, args, orig_args, old_dtypes, target, origin)
            if built is None:  # type inference refused the low-precision call
                target = "float32"
                built = (self._restore(call, args, orig_args, old_dtypes), False)
            final_color = Color.NEVER if guard_reason else color
            report.decisions.append(
                Decision(
                    name,
                    origin.node if origin else None,
                    origin.op_type if origin else None,
                    relax_op,
                    final_color,
                    target,
                )
            )
            return built

        def _color(self, call: Any, relax_op: str, origin: NodeOrigin | None, leaves: list) -> Color:
            if len(call.ty_args):
                return Color.NEVER
            color = policy.color_of(relax_op, origin.node if origin else None, origin.op_type if origin else None)
            if color is None:
                if leaves:
                    label = relax_op + (f" (ONNX {origin.op_type})" if origin else "")
                    report.unknown_ops[label] += 1
                return Color.NEVER
            return color

        def _castable_creation(self, call: Any) -> bool:
            """A float32 creation op whose tensor arguments (a fill value) are castable constants."""
            if _tvm.tensor_dtype(call) != "float32":
                return False
            tensors = [arg for arg in _tvm.array_items(call.args) if _tvm.tensor_dtype(arg) is not None]
            return all(_tvm.is_constant(arg) for arg in tensors) and self._constant_guard(
                [(arg, arg) for arg in tensors]) is None

        def _constant_guard(self, leaves: list) -> str | None:
            for _, new in leaves:
                if not _tvm.is_constant(new):
                    continue
                key = hash(new)
                if key not in self.const_verdict:
                    self.const_verdict[key] = castable(_tvm.constant_view(new), low)
                if self.const_verdict[key] is not None:
                    return self.const_verdict[key]
            return None

        def _build(
            self, call: Any, relax_op: str, args: list, orig_args: list, old_dtypes: list, target: str, origin: Any
        ) -> tuple[Any, bool] | None:
            """(call with float32 leaves cast to ``target``, accumulated-in-wider-dtype);
            None if type inference refuses it."""
            new_args = [self._retype_arg(*arg, target) for arg in zip(args, orig_args, old_dtypes)]
            try:
                if target == low and relax_op in _tvm.OUT_DTYPE_OPS:
                    acc = policy.accumulation_of(relax_op, origin.op_type if origin else None) or low
                    rebuilt = _tvm.call_with_out_dtype(call, new_args, acc)
                    return self.builder_.normalize(rebuilt), acc != low
                return self.builder_.normalize(_tvm.call_with_args(call, new_args)), False
            except Exception as err:  # TVMError from type inference
                log.debug("%s refused %s inputs (%s); keeping float32", relax_op, target, err)
                return None

        def _retype_arg(self, new: Any, old: Any, old_dtype: str | None, target: str) -> Any:
            if old_dtype is None and isinstance(new, relax.Tuple) and isinstance(old, relax.Tuple):
                return relax.Tuple([self._retype_arg(n, o, _tvm.tensor_dtype(o), target)
                                    for n, o in zip(new.fields, old.fields)])
            if old_dtype is None:
                return self._cast_like(new, old.ty) if hasattr(old, "ty") else new
            if old_dtype == "float32":
                return self._cast(new, target)
            return self._cast(new, old_dtype) if _tvm.tensor_dtype(new) != old_dtype else new

        def _restore(self, call: Any, args: list, orig_args: list, old_dtypes: list) -> Any:
            new_args = [self._retype_arg(*arg, "float32") for arg in zip(args, orig_args, old_dtypes)]
            return self.builder_.normalize(_tvm.call_with_args(call, new_args))

    return _MixedPrecision(mod)


def _float32_leaves(orig_args: list, new_args: list, old_dtypes: list) -> list[tuple[Any, Any]]:
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
    from tvm import relax  # noqa: PLC0415

    if isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType):
        return str(a.dtype) == str(b.dtype)
    if isinstance(a, relax.TupleType) and isinstance(b, relax.TupleType):
        return len(a.fields) == len(b.fields) and all(_same_dtypes(x, y) for x, y in zip(a.fields, b.fields))
    return True
