"""``Loop`` nodes whose trip count or exit depends on run-time values, as a recursive Relax function.

Why: prepare unrolls the loops whose iterations are known before run time (unroll.py); the rest —
a ``while`` whose exit condition is computed from data (a decoder's "until end-of-sequence", an
iterative refinement "until converged"), or a trip count read from an input's value — have no
converter in TVM 0.27, whose Relax has no loop construct. Relax does have functions that call
themselves under an ``If``, and the VM runs them: that is what a loop is.

What: ``Loop(M, cond, v…)`` with body ``(i, cond_in, v_in…) → (cond_out, v_out…, scan…)`` becomes

    def loop(i, M, cond, v…, captures…):
        go = i < M and cond                  # (fused with a code the VM checks: going on past the
                                             # bound stops the run, not a stack overflow or the memory)
        empties = (an empty tensor per scan output)
        if go:
            cond_out, v_out…, scan… = body(i, cond, v…)
            (v_final…, scans…) = loop(i + 1, M, cond_out, v_out…, captures…)
            return (v_final…, concat(scan[None], scans)…)
        else:
            return (v…, empties…)

and the node is ``loop(0, M, cond, v_initial…, captures…)``. The body is imported by the same
importer (its converters, provenance, nested ``If``/``Loop``), with the outer values it reads passed
in as parameters (``captures``) and constants kept as constants. Loop-carried values keep their
static shape when the body keeps it; a dim the body changes becomes a symbolic one (the body is
imported once more to learn that). Scan outputs are built on the way back from the recursion, so
no level holds a partial stack; their first dim is named after the call (``detection.py`` style).

When not: a carried value that is not a tensor (a sequence), one whose rank or dtype the body
changes, or a scan output whose per-iteration shape is unknown: a user error naming the Loop.

Run time: one VM frame per iteration, holding the values it passes on until the loop ends.
``MAX_ITERATIONS`` bounds the depth, lower for large values (``MEMORY_BUDGET_BYTES``); the runtime
calls a module holding loops on a thread whose stack holds that depth
(``_tvm.runtime.DEEP_STACK_BYTES``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool import _tvm
from amptool.errors import LOOP_BOUND, LOOP_BOUND_CODE, UserError
from amptool.frontend.graph import identifier, iter_nodes

#: Most iterations a run-time loop may take: each is a frame of the VM's (~3.5 KB of stack).
MAX_ITERATIONS = LOOP_BOUND
#: What a loop's frames may hold: each keeps the values it passes on (its carried values and scan
#: slice) until the loop ends — a [256, 1024] float32 state over 1,000 iterations held 1 GB — so a
#: loop of large values is bounded lower (a one-line error, not the machine out of memory).
MEMORY_BUDGET_BYTES = 8 << 30
#: The lowest bound that budget sets.
MIN_ITERATIONS = 256
#: Name prefix of the functions loops become (``app.convert.count_loops`` counts them for the manifest).
FUNCTION_PREFIX = "amptool_loop_"
_INT64_MAX = np.iinfo(np.int64).max


@dataclass
class LoopFunctions:
    """The loop functions made during one import, added to the module when it is complete."""

    functions: list[tuple[Any, Any]] = field(default_factory=list)  # (GlobalVar, relax.Function)

    def add_to(self, mod: Any) -> Any:
        for gv, func in self.functions:
            mod[gv] = func
        return mod

    def fresh_name(self, base: str) -> str:
        """``base``, or ``base_2``…: two Loops whose names sanitise alike get functions of their own."""
        taken = {gv.name_hint for gv, _func in self.functions}
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name

    @contextlib.contextmanager
    def trial(self) -> Iterator[None]:
        """Functions made inside are dropped (nested Loops of a body imported only for its types)."""
        made = len(self.functions)
        try:
            yield
        finally:
            del self.functions[made:]


@dataclass
class _Signature:
    """What the loop function takes, and how the body sees it."""

    params: list[Any]
    carried: list[Any]  # the parameters of the loop-carried values (a slice of params)
    scope: dict[str, Any]  # ONNX name → value, for the body: captures as parameters, constants as they are


def convert_loop(importer: Any, node_name: str, inputs: list[Any], attrs: dict[str, Any],
                 functions: LoopFunctions) -> Any:
    """The Loop ``node_name`` as a call of a new recursive function; its output, or a relax.Tuple of them.
    ``importer``: the running ONNX graph importer (its ``bb`` and ``_nodes`` are borrowed while the
    body is imported)."""
    from tvm import relax, tirx  # noqa: PLC0415

    body: onnx.GraphProto = attrs["body"]
    outer = importer.bb
    carried = [outer.normalize(v) for v in inputs[2:]]
    for k, value in enumerate(carried):
        ty = getattr(value, "ty", None)
        if not isinstance(ty, relax.TensorType) or ty.shape is None:  # (a known rank has named dims by now)
            raise UserError(f"Loop '{node_name}' carries '{body.input[2 + k].name}', which is not a tensor of "
                            "known rank (a sequence or an optional); amptool runs loops over tensors only",
                            "Export the loop with tensors (torch: stack the list), or pin the trip count with "
                            "--fixed-input so the loop unrolls.")
    count = len(body.output) - 1 - len(carried)
    m = _scalar(outer, inputs[0], "int64", _INT64_MAX)
    cond = _scalar(outer, inputs[1], "bool", True)
    captures = _captures(importer, body, outer)
    types = [v.ty for v in carried]
    for _ in range(3):  # the carried types the body keeps: a changed dim becomes symbolic
        probe = _probe(importer, body, types, captures)
        widened = [_join(node_name, body.input[2 + k].name, t, probe.carried[k]) for k, t in enumerate(types)]
        if all(_same(a, b) for a, b in zip(widened, types)):
            break
        types = widened
    else:
        raise UserError(f"Loop '{node_name}': the shapes of its loop-carried values do not settle",
                        "Pin the trip count with --fixed-input so the loop unrolls.")
    scans = probe.scans
    for k, ty in enumerate(scans):
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            name = body.output[1 + len(carried) + k].name
            raise UserError(f"Loop '{node_name}': the shape of its scan output '{name}' is not known before run time",
                            "Pin input shapes with --input-shape.")
    gv = _function(importer, body, node_name, types, scans, captures, functions)
    call = outer.emit(relax.Call(gv, [relax.const(0, "int64"), m, cond, *carried, *[v for _, v in captures]]),
                      name_hint=identifier(node_name))
    outputs = [outer.emit(relax.TupleGetItem(call, k)) for k in range(len(carried) + count)]
    for k, ty in enumerate(types):  # a carried dim the loop changes: named, for the readers' converters
        if any(_symbolic(d) for d in ty.shape.values):
            outputs[k] = outer.match_cast(outputs[k], _fresh(ty))
    for k, ty in enumerate(scans):  # a run-time length, named likewise
        dims = [tirx.Var(f"{identifier(node_name)}_trips", "int64"), *ty.shape.values]
        outputs[len(carried) + k] = outer.match_cast(outputs[len(carried) + k], relax.TensorType(dims, ty.dtype))
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)  # (the importer takes a 1-tuple as one value)


@dataclass
class _Probe:
    carried: list[Any]  # the types of the body's v_out
    scans: list[Any]  # the types of one iteration's scan values


def _probe(importer: Any, body: onnx.GraphProto, types: list[Any], captures: list[tuple[str, Any]]) -> _Probe:
    """The types the body gives when the carried values have ``types`` (imported, then dropped)."""
    from tvm import relax  # noqa: PLC0415

    builder = relax.BlockBuilder()
    signature = _signature(body, types, captures)
    with builder.function("probe", params=signature.params, private=True):
        outs = _import_body(importer, builder, body, signature, trial=True)
        builder.emit_func_output(relax.Tuple(outs))
    count = len(types)
    tys = [o.ty for o in outs]
    return _Probe(carried=tys[1:1 + count], scans=tys[1 + count:])


def _function(importer: Any, body: onnx.GraphProto, node_name: str, types: list[Any], scans: list[Any],
              captures: list[tuple[str, Any]], functions: LoopFunctions) -> Any:
    """The recursive function running ``body``; its GlobalVar (the function goes to ``functions``).

    Its ``If``'s else branch allocates nothing — the empty scans are made before the ``If``: TVM
    0.27's memory planning crashed the VM (AllocTensor) when one branch allocated and the other
    held a symbolic-shape concat. One function, not a deciding one calling a step: each VM call
    checks every parameter (benchmarks/README.md, "Thirty-second session")."""
    from tvm import relax, tirx  # noqa: PLC0415
    from tvm.relax.expr import _update_type  # noqa: PLC0415

    name = functions.fresh_name(f"{FUNCTION_PREFIX}{identifier(node_name)}")
    signature = _signature(body, types, captures)
    loop = relax.GlobalVar(name)
    _update_type(loop, relax.FuncType([p.ty for p in signature.params],
                                      relax.TupleType(_result_types(types, scans)), purity=True))
    i, m, cond = signature.params[:3]
    builder = relax.BlockBuilder()
    # (force_pure: an If branch in the body that does not type raises through assert_op, control_flow.py)
    with builder.function(name, params=signature.params, attrs={"relax.force_pure": True}, private=True):
        with builder.dataflow():  # (fused; the empty scans made from a run-time value: not folded)
            go = builder.emit_output(relax.op.logical_and(relax.op.less(i, m), cond))
            code = builder.emit_output(relax.op.tensor_to_shape(_bound_code(go, i, _iteration_bound(types, scans))))
            following = builder.emit_output(relax.op.add(i, relax.const(1, "int64")))
            empties = [builder.emit_output(relax.op.broadcast_to(
                relax.op.reshape(relax.op.astype(i, t.dtype), [1] * (len(t.shape.values) + 1)),
                [0, *t.shape.values])) for t in scans]
        builder.match_cast(code, relax.ShapeType([LOOP_BOUND_CODE]))  # the VM stops the run past the bound
        # A dataflow block, so TVM fuses the body's kernels (it fuses nothing outside one); not where
        # an If is imported into the block (an If cannot sit in a dataflow block).
        flow = not any(n.op_type == "If" for n in iter_nodes(body))
        builder._begin_dataflow_block() if flow else builder._begin_binding_block()
        outs = _import_body(importer, builder, body, signature)
        cond_out = _scalar(builder, outs[0], "bool", True)
        v_out = [_as_type(builder, v, p.ty) for v, p in zip(outs[1:1 + len(types)], signature.carried)]
        rest = builder.emit(relax.Call(loop, [following, m, cond_out, *v_out, *signature.params[3 + len(types):]]))
        results = [builder.emit(relax.TupleGetItem(rest, k)) for k in range(len(types) + len(scans))]
        for k, ty in enumerate(scans):  # this iteration's in front of the later ones' (the later length named)
            later = builder.match_cast(results[len(types) + k], relax.TensorType(
                [tirx.Var("later_trips", "int64"), *ty.shape.values], ty.dtype))
            here = builder.emit(relax.op.expand_dims(outs[1 + len(types) + k], [0]))
            results[len(types) + k] = builder.emit(relax.op.concat([here, later], axis=0))
        taken = builder.emit(relax.Tuple(results))
        if flow:
            taken = builder.emit_output(taken)
        then = relax.SeqExpr([builder._end_block()], taken)
        otherwise = relax.SeqExpr([], relax.Tuple([*signature.carried, *empties]))
        builder.emit_func_output(builder.emit(relax.If(go, then, otherwise)))
    functions.functions.append((loop, builder.get()[name]))
    return loop


def _iteration_bound(types: list[Any], scans: list[Any]) -> int:
    """How many iterations the loop may run: ``MAX_ITERATIONS``, lower where its frames would hold
    more than ``MEMORY_BUDGET_BYTES`` (static dims counted; a symbolic one as 1)."""
    from tvm import tirx  # noqa: PLC0415

    held = 0
    for ty in [*types, *scans]:
        elements = int(np.prod([int(d) if isinstance(d, tirx.IntImm) else 1 for d in ty.shape.values]))
        held += elements * np.dtype(_numpy_dtype(str(ty.dtype))).itemsize
    return MAX_ITERATIONS if not held else min(MAX_ITERATIONS, max(MIN_ITERATIONS, MEMORY_BUDGET_BYTES // held))


def _numpy_dtype(dtype: str) -> str:
    return "float16" if dtype == "bfloat16" else dtype  # (two bytes either way; numpy has no bfloat16)


def _bound_code(go: Any, i: Any, bound: int) -> Any:
    """``[LOOP_BOUND_CODE]``, or ``[LOOP_BOUND_CODE + bound]`` where the loop would go on past
    ``bound`` iterations: a value the VM's shape check of it stops the run on (and its error names).

    Why not an assertion: TVM's ``assert_op`` calls back into Python (several µs an iteration, and
    no Python under a runtime-only deployment), and amptool compiles kernels without their TIR
    assertions (``cpu._without_kernel_asserts``). A VM shape check stops the run in compiled code on
    any target, and ``errors.model_raised`` recognises it by the code."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    past = op.logical_and(go, op.greater_equal(i, relax.const(bound, "int64")))
    excess = op.multiply(op.astype(past, "int64"), relax.const(bound, "int64"))
    return op.reshape(op.add(excess, relax.const(LOOP_BOUND_CODE, "int64")), [1])


def _result_types(types: list[Any], scans: list[Any]) -> list[Any]:
    """What a loop returns: each carried value's static type, or its rank alone where a dim changes
    (its final size is the run's); each scan stacked, its length the run's."""
    from tvm import relax  # noqa: PLC0415

    carried = [t if not any(_symbolic(d) for d in t.shape.values) else relax.TensorType(ndim=t.ndim, dtype=t.dtype)
               for t in types]
    return [*carried, *[relax.TensorType(ndim=len(t.shape.values) + 1, dtype=t.dtype) for t in scans]]


def _signature(body: onnx.GraphProto, types: list[Any], captures: list[tuple[str, Any]]) -> _Signature:
    """Fresh parameters: the counter, the trip count, the condition, the carried values (``types``)
    and the captured outer values; the body's scope maps its inputs and the captures to them."""
    from tvm import relax  # noqa: PLC0415

    i = relax.Var("iteration", relax.TensorType([], "int64"))
    m = relax.Var("trip_count", relax.TensorType([], "int64"))
    cond = relax.Var("condition", relax.TensorType([], "bool"))
    renamed: dict[Any, Any] = {}  # each function defines its own symbolic dims (TVM: a var per function)
    carried = [relax.Var(identifier(body.input[2 + k].name), _own_dims(ty, renamed)) for k, ty in enumerate(types)]
    captured = [relax.Var(identifier(name), _own_dims(value.ty, renamed)) for name, value in captures]
    scope: dict[str, Any] = {name: param for (name, _), param in zip(captures, captured)}
    scope[body.input[0].name] = i
    if len(body.input) > 1:
        scope[body.input[1].name] = cond
    scope.update({body.input[2 + k].name: param for k, param in enumerate(carried)})
    return _Signature([i, m, cond, *carried, *captured], carried, scope)


def _own_dims(ty: Any, renamed: dict[Any, Any]) -> Any:
    """``ty`` with each symbolic dim a fresh variable (the same one for the same dim in ``renamed``)."""
    from tvm import relax, tirx  # noqa: PLC0415

    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return ty
    dims = []
    for dim in ty.shape.values:
        if _symbolic(dim):
            key = dim if isinstance(dim, tirx.Var) else str(dim)
            dim = renamed.setdefault(key, tirx.Var(dim.name if isinstance(dim, tirx.Var) else "dim", "int64"))
        dims.append(dim)
    return relax.TensorType(dims, ty.dtype)


def _import_body(importer: Any, builder: Any, body: onnx.GraphProto, signature: _Signature,
                 trial: bool = False) -> list[Any]:
    """The body's outputs, imported into ``builder`` by ``importer`` with ``signature.scope`` in view
    (``trial``: an import whose warnings and nested loops' functions are dropped with it)."""
    from tvm import relax  # noqa: PLC0415

    saved_bb, saved_nodes = importer.bb, importer._nodes
    constants = {name: value for name, value in saved_nodes.items() if _constant(value)}
    importer.bb, importer._nodes = builder, {**constants, **signature.scope}
    try:
        with contextlib.ExitStack() as scope:
            scope.enter_context(importer._branches.scope(keep_warnings=not trial))  # its Ifs: this function's own
            if trial:
                scope.enter_context(importer._loops.trial())
            for tensor in body.initializer:
                importer._nodes[tensor.name] = relax.const(importer._parse_array(tensor))
            importer._construct_nodes(body)
            return [builder.normalize(importer._nodes[o.name]) for o in body.output]
    finally:
        importer.bb, importer._nodes = saved_bb, saved_nodes


def _captures(importer: Any, body: onnx.GraphProto, outer: Any) -> list[tuple[str, Any]]:
    """(ONNX name, value) of each outer value the body reads that is not a constant, as a Var."""
    from tvm import relax  # noqa: PLC0415

    read: set[str] = {o.name for o in body.output}
    for node in iter_nodes(body):
        read.update(name for name in node.input if name)
    own = {i.name for i in body.input}
    captures = []
    for name in sorted(read - own):
        value = importer._nodes.get(name)
        if value is None or _constant(value):
            continue
        if not isinstance(value, relax.Var):
            value = outer.emit(value)
            importer._nodes[name] = value
        captures.append((name, value))
    return captures


def _constant(value: Any) -> bool:
    """A value the loop function can use as it is: a constant, or a shape of numbers."""
    from tvm import relax, tirx  # noqa: PLC0415

    if _tvm.is_constant(value):
        return True
    if isinstance(value, relax.ShapeExpr):
        return all(isinstance(d, tirx.IntImm) for d in value.values)
    return False


def _scalar(builder: Any, value: Any, dtype: str, default: Any) -> Any:
    """An optional Loop input (M, cond) or the body's cond_out as a 0-d ``dtype`` tensor."""
    from tvm import relax  # noqa: PLC0415

    if value is None:
        return relax.const(default, dtype)
    if isinstance(value.ty, relax.TensorType) and value.ty.ndim == 0 and str(value.ty.dtype) == dtype:
        return value  # (no kernel: a loop's condition is one an iteration)
    return builder.emit(relax.op.astype(relax.op.reshape(value, []), dtype))


def _join(node_name: str, name: str, before: Any, after: Any) -> Any:
    """A tensor type that holds both the value before an iteration and after it: the dims that
    differ (or are unknown after) become symbolic."""
    from tvm import relax, tirx  # noqa: PLC0415

    if not isinstance(after, relax.TensorType) or str(after.dtype) != str(before.dtype) or after.ndim != before.ndim:
        raise UserError(f"Loop '{node_name}' changes the type of its loop-carried value '{name}' "
                        f"({_describe(before)} → {_describe(after)})",
                        "Pin the trip count with --fixed-input so the loop unrolls.")
    if after.shape is None:
        return relax.TensorType([tirx.Var(f"{identifier(name)}_{k}", "int64") for k in range(before.ndim)],
                                before.dtype)
    dims = []
    for k, (a, b) in enumerate(zip(before.shape.values, after.shape.values)):
        same = isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm) and int(a) == int(b)
        dims.append(a if same or a.same_as(b) else tirx.Var(f"{identifier(name)}_{k}", "int64"))
    return relax.TensorType(dims, before.dtype)


def _same(a: Any, b: Any) -> bool:
    from tvm import tirx  # noqa: PLC0415

    def dim(d: Any) -> Any:
        return int(d) if isinstance(d, tirx.IntImm) else "?"

    return [dim(d) for d in a.shape.values] == [dim(d) for d in b.shape.values]


def _as_type(builder: Any, value: Any, ty: Any) -> Any:
    """``value`` typed as the parameter it is passed to (a run-time check where the shapes are symbolic)."""
    from tvm import relax  # noqa: PLC0415

    if str(value.ty.dtype) != str(ty.dtype):
        value = builder.emit(relax.op.astype(value, ty.dtype))
    if _same(value.ty, ty) and all(not _symbolic(d) for d in ty.shape.values):
        return value
    return builder.match_cast(value, _fresh(ty))


def _symbolic(dim: Any) -> bool:
    from tvm import tirx  # noqa: PLC0415

    return not isinstance(dim, tirx.IntImm)


def _fresh(ty: Any) -> Any:
    """``ty`` with fresh symbolic dims in place of its symbolic ones (a match_cast binds new names)."""
    from tvm import relax, tirx  # noqa: PLC0415

    dims = [tirx.Var(f"{d.name}_next", "int64") if _symbolic(d) else d for d in ty.shape.values]
    return relax.TensorType(dims, ty.dtype)


def _describe(ty: Any) -> str:
    shape = getattr(ty, "shape", None)
    return f"{getattr(ty, 'dtype', '?')}{list(shape.values) if shape is not None else ''}"

