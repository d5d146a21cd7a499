"""Relax IR access: types and constants, op names, passes, and rebuilding calls (the
mixed-precision pass's hot path: FFI constructors, memoised names and dtypes)."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool._tvm.common import quiet_native_stderr


def tensor_dtype(expr: Any) -> str | None:
    """The dtype of a tensor-typed Relax expression, or None for anything else.

    Hot: the mixed-precision pass asks several times per binding. Reading ``PrimType.dtype``
    builds a ``tvm_ffi.dtype`` (~1.5 µs); TVM interns PrimType nodes (one per dtype), so the
    string is memoised per node, the node kept alive with it so its handle stays its own.
    """
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, _relax_tensor_type()):
        return None
    prim = ty.dtype
    if prim is None:
        return None
    hit = _DTYPE_NAMES.get(prim.__chandle__())
    if hit is None:
        if len(_DTYPE_NAMES) > 256:  # PrimTypes built outside TVM's interning: stay bounded
            _DTYPE_NAMES.clear()
        hit = _DTYPE_NAMES[prim.__chandle__()] = (prim, str(prim) or None)
    return hit[1]


#: PrimType handle → (the PrimType, its dtype string or None).
_DTYPE_NAMES: dict[int, tuple[Any, str | None]] = {}


def static_shape(expr: Any) -> list[int] | None:
    """A Relax expression's static shape; None for a symbolic or unknown one."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None:
        return None
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError):  # symbolic dims
        return None


@functools.cache
def _relax_tensor_type() -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax.TensorType


def is_tuple_type(ty: Any) -> bool:
    from tvm import relax  # noqa: PLC0415

    return isinstance(ty, relax.TupleType)


def is_tuple_expr(expr: Any) -> bool:
    """Whether ``expr`` is a ``relax.Tuple`` literal (not a tuple-typed variable)."""
    return isinstance(expr, _relax_classes().Tuple)


@functools.cache
def _relax_classes() -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax


def is_constant(expr: Any) -> bool:
    import tvm  # noqa: PLC0415

    return isinstance(expr, tvm.ir.GenericConst)


def constant_numpy(expr: Any) -> np.ndarray:
    """The value of a Relax tensor constant as a numpy array (bf16 via ml_dtypes)."""
    import ml_dtypes  # noqa: F401,PLC0415

    return np.asarray(expr.value.numpy())


def constant_view(expr: Any) -> np.ndarray:
    """A read-only, zero-copy view of a constant's value (DLPack); a copy where numpy lacks
    the dtype. For checks that only read: ~0.5 µs instead of ~10 µs for ``constant_numpy``."""
    try:
        view = np.from_dlpack(expr.value)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return constant_numpy(expr)
    view.flags.writeable = False
    return view


def var_name(var: Any) -> str:
    return str(var.name)


def op_name(call: Any) -> str | None:
    """'relax.nn.conv2d' for a call to a registered op; None for calls to functions.

    Hot (once or more per binding in the mixed-precision pass): ops are interned, so each
    op's name is read once and memoised by handle, the op kept alive with it."""
    op = getattr(call, "op", None)
    if op is None:
        return None
    hit = _OP_NAMES.get(op.__chandle__())
    if hit is not None:
        return hit[1]
    if not isinstance(op, _ir_op_type()):
        return None
    _OP_NAMES[op.__chandle__()] = (op, str(op.name))
    return _OP_NAMES[op.__chandle__()][1]


#: Op handle → (the Op, its name).
_OP_NAMES: dict[int, tuple[Any, str]] = {}


@functools.cache
def _ir_op_type() -> Any:
    import tvm  # noqa: PLC0415

    return tvm.ir.Op


def registered_relax_ops() -> list[str]:
    import tvm  # noqa: PLC0415

    return sorted(n for n in tvm.ir.Op.list_op_names() if n.startswith("relax."))


def relax_functions(mod: Any) -> list[tuple[Any, Any]]:
    """(GlobalVar, relax.Function) pairs of a module; PrimFuncs are skipped."""
    from tvm import relax  # noqa: PLC0415

    return [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]


def any_call(mod: Any, accept: Any) -> bool:
    """Whether a call in one of ``mod``'s Relax functions satisfies ``accept(call)`` (a cheap
    look before a rewrite that builds a mutator and rebuilds the module)."""
    return any(accept(call) for _gv, func in relax_functions(mod) for call in bound_calls(func))


#: The calls of the Relax functions ``bound_calls`` walked last: handle → (function, its calls).
#: A function is immutable and held here, so its handle names it until it leaves the cache —
#: with its constants: ``forget_calls`` empties it (each build stage ends with it).
_CALLS_OF: collections.OrderedDict[int, tuple[Any, tuple[Any, ...]]] = collections.OrderedDict()
_CALLS_CACHED = 4


def forget_calls() -> None:
    """Drop what ``bound_calls`` remembers (and the functions and weights it holds)."""
    _CALLS_OF.clear()


def bound_calls(func: Any) -> tuple[Any, ...]:
    """Every call in a Relax function, nested functions and ``If`` branches included.

    Why not ``post_order_visit``: it calls back into Python for every node, each variable
    reference and constant included (1.7 M callbacks, 3.4 s, per look at a 300-step unrolled
    LSTM); in normal form a call sits only at the top of a binding's value, a branch's body or
    a tuple field, so walking bindings finds them all at a fraction of the nodes. The layout
    passes each look at the same function (most change nothing): the last few are remembered.
    """
    handle = func.__chandle__()
    known = _CALLS_OF.get(handle)
    if known is not None and known[0].same_as(func):
        _CALLS_OF.move_to_end(handle)
        return known[1]
    calls = tuple(_walk_calls(func))
    _CALLS_OF[handle] = (func, calls)
    while len(_CALLS_OF) > _CALLS_CACHED:
        _CALLS_OF.popitem(last=False)
    return calls


def _walk_calls(func: Any) -> Iterator[Any]:
    from tvm import relax  # noqa: PLC0415

    nesting = (relax.Call, relax.Function, relax.SeqExpr, relax.If, relax.Tuple, relax.TupleGetItem)
    pending = [func]
    while pending:
        expr = pending.pop()
        if isinstance(expr, relax.Call):
            yield expr
            pending.extend(arg for arg in expr.args if isinstance(arg, nesting))
        elif isinstance(expr, relax.Function):
            pending.append(expr.body)
        elif isinstance(expr, relax.SeqExpr):
            pending.append(expr.body)
            pending.extend(reversed([b.value for block in expr.blocks for b in block.bindings]))
        elif isinstance(expr, relax.If):
            pending.extend((expr.false_branch, expr.true_branch))
        elif isinstance(expr, relax.Tuple):
            pending.extend(reversed(list(expr.fields)))
        elif isinstance(expr, relax.TupleGetItem):
            pending.append(expr.tuple_value)


def var_uses(func: Any) -> collections.Counter[int]:
    """How often each Relax variable of ``func`` is read (variable handle → count): in its
    bindings' values and in the result of its body."""
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    uses: collections.Counter[int] = collections.Counter()

    def count(var: Any) -> None:
        uses[var.__chandle__()] += 1

    for block in func.body.blocks:
        for binding in block.bindings:
            tvm_ffi.structural_walk(binding.value, (relax.Var, count))
    tvm_ffi.structural_walk(func.body.body, (relax.Var, count))
    return uses


def calls_op(call: Any, op: Any) -> bool:
    """Whether ``call`` is a call to the registered operator ``op`` (a ``tvm.ir.Op``)."""
    import tvm  # noqa: PLC0415

    return isinstance(call.op, tvm.ir.Op) and call.op.same_as(op)


def rewrite_functions(mod: Any, mutator: Any) -> Any:
    """``mod`` with each of its Relax functions rewritten by ``mutator`` (a PyExprMutator built on ``mod``)."""
    for gv, func in relax_functions(mod):
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


@functools.cache
def dataflow_scoped_mutator() -> type:
    """A ``PyExprMutator`` whose ``in_dataflow`` says whether the binding at hand is inside a
    dataflow block: the base of the rewrites that only act there. Subclass it and decorate the
    subclass with ``relax.expr_functor.mutator``."""
    from tvm.relax.expr_functor import PyExprMutator  # noqa: PLC0415

    class DataflowScoped(PyExprMutator):
        in_dataflow = False

        def visit_dataflow_block_(self, block: Any) -> Any:
            outer, self.in_dataflow = self.in_dataflow, True
            try:
                return super().visit_dataflow_block_(block)
            finally:
                self.in_dataflow = outer

        def visit_binding_block_(self, block: Any) -> Any:
            outer, self.in_dataflow = self.in_dataflow, False
            try:
                return super().visit_binding_block_(block)
            finally:
                self.in_dataflow = outer

    return DataflowScoped


def fold_constant(mod: Any) -> Any:
    """Fold constant subexpressions (weight casts become low-precision constants)."""
    from tvm import relax  # noqa: PLC0415

    with quiet_native_stderr():
        return relax.transform.FoldConstant()(mod)


def assert_well_formed(mod: Any, after: str) -> None:
    """Postcondition of every pass: raise (a bug, not a user error) if ``mod`` is ill-formed."""
    from tvm import relax  # noqa: PLC0415

    try:
        relax.analysis.well_formed(mod)
    except Exception as err:
        raise RuntimeError(f"module is ill-formed after {after}: {err}") from err


def module_script(mod: Any) -> str:
    """The module as TVMScript text without ANSI colour."""
    return str(mod.script(show_meta=False))


#: Ops whose accumulation dtype is their ``out_dtype`` attribute.
OUT_DTYPE_OPS = (
    "relax.nn.conv1d",
    "relax.nn.conv2d",
    "relax.nn.conv3d",
    "relax.nn.conv1d_transpose",
    "relax.nn.conv2d_transpose",
    "relax.nn.conv3d_transpose",
    "relax.matmul",
)


_ATTR_METHODS = frozenset({"id_", "is_", "same_as", "get_int", "get_int_tuple", "get_str"})


#: Attribute names per attrs class: ``dir()`` costs ~20 µs, once per class is enough.
_ATTR_NAMES: dict[type, tuple[str, ...]] = {}


def attrs_dict(call: Any) -> dict[str, Any]:
    """An op call's attributes as keyword arguments of its Python constructor."""
    import tvm  # noqa: PLC0415

    attrs = call.attrs
    if attrs is None:
        return {}
    names = _ATTR_NAMES.get(type(attrs))
    if names is None:
        names = tuple(k for k in dir(attrs) if not k.startswith("_") and k not in _ATTR_METHODS)
        if not isinstance(attrs, tvm.ir.DictAttrs):  # a DictAttrs' keys vary per instance
            _ATTR_NAMES[type(attrs)] = names
    return {k: getattr(attrs, k) for k in names}


def call_with_out_dtype(call: Any, args: list[Any], out_dtype: str) -> Any:
    """Rebuild a conv/matmul call on new args with a new ``out_dtype`` (its accumulation).

    Uses the op's Python constructor: building ``relax.Call`` with a dict of attrs
    segfaults in 0.27.
    """
    from tvm import relax  # noqa: PLC0415

    name = op_name(call)
    assert name in OUT_DTYPE_OPS, name
    ctor: Any = relax.op
    for part in name.split(".")[1:]:
        ctor = getattr(ctor, part)
    kwargs = attrs_dict(call)
    kwargs["out_dtype"] = out_dtype
    return ctor(*args, **kwargs)


def call_with_args(call: Any, args: list[Any]) -> Any:
    """``call`` with new arguments, its result type left for the builder to infer."""
    import tvm  # noqa: PLC0415

    return _constructors().call(tvm.ir.Type.missing(), call.op, args, call.attrs, call.ty_args, call.span)


def array_items(array: Any) -> list[Any]:
    """The elements of a TVM Array (``call.args``…) as a list: one FFI call per element, where
    iterating the Python wrapper makes two plus index checks (~1 µs per element saved)."""
    size, get = _constructors().array_size, _constructors().array_get
    return [get(array, i) for i in range(size(array))]


def var_binding(var: Any, value: Any) -> Any:
    """``relax.VarBinding(var, value)`` through its FFI constructor."""
    return _constructors().var_binding(var, value, None)


def astype(expr: Any, dtype: str) -> Any:
    """``relax.op.astype`` through its FFI constructor (one per cast the pass emits)."""
    return _constructors().astype(expr, dtype)


def dims(expr: Any, begin: int, end: int) -> Any:
    """The dims ``begin:end`` of a Relax tensor ``expr`` as an int64 tensor of the values they take at
    run time (symbolic ones included): a length an op needs as data (a wrap of negative indices,
    ``min(k, length)``)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    return op.strided_slice(op.shape_to_tensor(op.shape_of(expr)), [0], [begin], [end])


def new_var(name: str, ty: Any, *, dataflow: bool) -> Any:
    """A ``relax.DataflowVar`` (or ``relax.Var``) named ``name`` of type ``ty``."""
    ctors = _constructors()
    return (ctors.dataflow_var if dataflow else ctors.var)(name, ty, None)


@dataclass(frozen=True)
class _Constructors:
    call: Any
    var: Any
    dataflow_var: Any
    astype: Any
    var_binding: Any
    array_size: Any
    array_get: Any


@functools.cache
def _constructors() -> _Constructors:
    """The FFI constructors behind ``relax.Call``, ``relax.Var`` and ``relax.DataflowVar``.

    The mixed-precision pass builds one call and one var per binding. The Python classes
    re-import modules and convert their arguments on every call: ``relax.Call(...)`` costs
    ~10 µs in 0.27, its FFI constructor ~1 µs (same node: ``Call.__init__`` passes
    ``Type.missing()`` as the result type). Same arguments as the Python constructors.
    """
    from tvm.ir import _ffi_api as ir_api  # noqa: PLC0415
    from tvm.relax import _ffi_api as relax_api  # noqa: PLC0415
    from tvm.relax.op import _ffi_api as op_api  # noqa: PLC0415
    from tvm_ffi import _ffi_api as ffi_api  # noqa: PLC0415

    return _Constructors(call=ir_api.Call, var=ir_api.Var, dataflow_var=relax_api.DataflowVar, astype=op_api.astype,
                         var_binding=relax_api.VarBinding, array_size=ffi_api.ArraySize,
                         array_get=ffi_api.ArrayGetItem)


#: (unsigned type, exponent all ones, sign bit clear) of each float dtype's bit pattern.
_FLOAT_BITS = {
    "float64": ("uint64", 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
    "float32": ("uint32", 0x7F800000, 0x7FFFFFFF),
    "float16": ("uint16", 0x7C00, 0x7FFF),
    "bfloat16": ("uint16", 0x7F80, 0x7FFF),
}


def _magnitude_bits(x: Any) -> tuple[Any, Any]:
    """``x``'s bits without the sign, and the bits of infinity, as unsigned TIR expressions."""
    from tvm import tirx  # noqa: PLC0415

    dtype = x.dtype if hasattr(x, "dtype") else x.ty  # a TE tensor's element (0.27: an ir.Call) has ``ty``
    unsigned, infinity, magnitude = _FLOAT_BITS[str(dtype)]
    bits = tirx.reinterpret(unsigned, x) & tirx.const(magnitude, unsigned)
    return bits, tirx.const(infinity, unsigned)


def is_nan(x: Any) -> Any:
    """The NaN test for a float TIR expression, on its bits (magnitude above infinity's).

    Why not ``tirx.isnan``: it makes TVM's vectorizer scalarize the whole loop around it (LLVM then
    re-vectorizes 8 lanes wide at best; a softmax's NaN-preserving exp ran on ymm registers instead
    of zmm, BERT-base's [12, 128, 128] softmax 0.185 → 0.145 ms at one thread). Not ``x != x``:
    TVM's simplifier folds that to false."""
    bits, infinity = _magnitude_bits(x)
    return bits > infinity


def is_inf(x: Any) -> Any:
    """The ±inf test on the bits, for the reason ``is_nan`` gives (``tirx.isinf`` scalarizes too)."""
    bits, infinity = _magnitude_bits(x)
    return bits == infinity
