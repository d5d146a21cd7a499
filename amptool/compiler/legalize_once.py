"""LegalizeOps that builds each distinct kernel once.

TVM legalizes every call on its own: a TE compute, a PrimFunc, its structural hash — and only
then finds the PrimFunc already in the module. Most calls repeat one another (ResNet-50: 178
calls, 58 distinct; BERT-base: 520, 40), and legalizing was ~0.4 s of a ResNet-50 build.

A call is a repeat of an earlier one when it has the same op, attributes, result type, argument
types (shape values included, so a reshape's target shape is part of it), the same arguments
constant, the same values for arguments that are not tensors (``clip``'s bounds), and the same
arguments repeated (``add(x, x)`` is not ``add(x, y)``). Its legalization is then the earlier
one's ``call_tir`` on its own arguments — taken over only where that was exactly a ``call_tir`` of
a kernel on some of the call's own arguments, every constant among them (TVM compiles a scalar
constant into the kernel: ``add(x, 1)`` holds the 1), no symbolic shapes. A call on the very same
constants as an earlier one also takes over a ``call_tir`` on constants the legalization made from
them (weights packed first) or compiled in. Any other legalization (several kernels, values
computed first, dynamic shapes) runs for each call.

A legalization that packs a constant first (a conv's weights) can still share its kernel:
``call_te`` builds a TE kernel once per run for arguments of the same types and the same other
values (ResNet-50: 53 convs, 24 kernels), each call taking its own packed constant.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from amptool import _tvm

Legalization = Callable[[Any, Any], Any]


def legalize_ops(custom: Mapping[str, Legalization] | None = None) -> Any:
    """A module pass: ``relax.transform.LegalizeOps(custom)`` with every op's legalization
    (``custom``'s or TVM's ``FLegalize``) run once per distinct call."""

    @tvm.transform.module_pass(opt_level=0, name="amptool.LegalizeOnce")
    def legalize(mod: Any, _ctx: Any) -> Any:
        once = {name: _Once(fn) for name in _op_names(mod) if (fn := _legalization(name, custom or {})) is not None}
        built = _TE_KERNELS.set({})
        try:
            return relax.transform.LegalizeOps(once)(mod)
        finally:
            _TE_KERNELS.reset(built)

    return legalize


#: The TE kernels ``call_te`` built in the running ``legalize_ops`` pass: key → (kernel, result types).
_TE_KERNELS: contextvars.ContextVar[dict[tuple[Any, ...], tuple[Any, list[Any]]] | None] = contextvars.ContextVar(
    "amptool_te_kernels", default=None)


def call_te(bb: Any, compute: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``bb.call_te(compute, *args, **kwargs)``, whose kernel is built once per ``legalize_ops`` run
    for tensor arguments of the same types (constants too: their values are the kernel's inputs)
    and the same other arguments; a later call gets ``call_tir`` of that kernel on its own tensors.

    Why: building a TE kernel (the compute, its PrimFunc, the structural hash that finds it
    already in the module) is most of a conv's legalization, and repeated convs differ only in
    their packed weights: ResNet-50's conv legalization 0.26–0.65 → 0.17–0.42 s (with the
    weights read without a copy). Outside that pass, or with an
    argument that is symbolic, a scalar constant (TE may fold it into the kernel) or no plain
    value, it is ``bb.call_te``.
    """
    built = _TE_KERNELS.get()
    key = None if built is None else _te_key(compute, args, kwargs)
    if built is None or key is None:
        return bb.call_te(compute, *args, **kwargs)
    if key in built:
        kernel, out = built[key]
        return relax.call_tir(kernel, list(args), out)
    result = bb.call_te(compute, *args, **kwargs)
    if (made := _te_kernel_of(result, args)) is not None:
        built[key] = made
    return result


def _te_key(compute: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The compute, each tensor argument's shape and dtype, every other argument's value; None when
    one is symbolic, a scalar constant, or no plain value."""
    keys: list[Any] = []
    for arg in args:
        if not isinstance(arg, relax.Expr):
            return None
        ty = arg.ty
        if not (isinstance(ty, relax.TensorType) and _static_type(ty)) or (
                isinstance(arg, tvm.ir.GenericConst) and ty.ndim == 0):
            return None
        keys.append((tuple(int(d) for d in ty.shape.values), str(ty.dtype)))
    plain = _plain(dict(kwargs))
    return None if plain is None else (compute, tuple(keys), plain)


def _plain(value: Any) -> Any:
    """``value`` as a hashable key if it is made of Python numbers, strings, lists, tuples and dicts;
    else None."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        items = [_plain(item) for item in value]
        return None if any(item is None for item in items) else (type(value).__name__, tuple(items))
    if isinstance(value, dict):
        pairs = [(str(k), _plain(v)) for k, v in sorted(value.items())]
        return None if any(v is None for _k, v in pairs) else ("dict", tuple(pairs))
    return None


def _te_kernel_of(result: Any, args: tuple[Any, ...]) -> tuple[Any, list[Any]] | None:
    """(kernel, result types) when ``result`` is ``call_tir(kernel, args)`` on exactly ``args``, in
    their order; else None."""
    parts = _call_tir_parts(result)
    if parts is None:
        return None
    kernel, fields, out = parts
    if len(fields) != len(args) or not all(f.same_as(a) for f, a in zip(fields, args, strict=True)):
        return None
    return kernel, out


def _call_tir_parts(result: Any) -> tuple[Any, list[Any], list[Any]] | None:
    """(kernel, arguments, result types) of ``call_tir(kernel, (arguments…), out)``; None for any
    other expression. The result types are a list as ``call_tir`` takes them back (a multi-output
    kernel's are the list of its tensors)."""
    if not isinstance(result, relax.Call) or not result.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return None
    if len(result.args) != 2 or not isinstance(result.args[0], tvm.ir.GlobalVar):
        return None
    if not isinstance(result.args[1], relax.Tuple):
        return None
    out = result.ty_args[0] if len(result.ty_args) == 1 else None
    return (result.args[0], list(result.args[1].fields),
            list(out.fields) if isinstance(out, relax.TupleType) else list(result.ty_args))


def tvms_legalization(bb: Any, call: Any) -> Any:
    """TVM's own legalization of ``call`` (its op's ``FLegalize``)."""
    return tvm.ir.Op.get(str(call.op.name)).get_attr("FLegalize")(bb, call)


def _legalization(name: str, custom: Mapping[str, Legalization]) -> Legalization | None:
    if name in custom:
        return custom[name]
    return tvm.ir.Op.get(name).get_attr("FLegalize")


def _op_names(mod: Any) -> set[str]:
    return {str(call.op.name) for _gv, func in _tvm.relax_functions(mod) for call in _tvm.bound_calls(func)
            if isinstance(call.op, tvm.ir.Op)}


@dataclass(frozen=True)
class _Kernel:
    """A legalized call: the call, its kernel, what the kernel takes — an index into the call's
    arguments, or a constant the legalization made (packed weights) — and its result.
    ``same_constants``: reusable only by a call whose constant arguments are this call's own."""

    call: Any
    kernel: Any  # GlobalVar
    takes: tuple[Any, ...]
    out: list[Any]
    same_constants: bool

    def serves(self, call: Any) -> bool:
        if not _same_signature(self.call, call):
            return False
        return not self.same_constants or all(
            mine.same_as(theirs) for mine, theirs in zip(self.call.args, call.args, strict=True)
            if isinstance(mine, tvm.ir.GenericConst))

    def apply(self, call: Any) -> Any:
        args = [call.args[t] if isinstance(t, int) else t for t in self.takes]
        return relax.call_tir(self.kernel, args, self.out)


class _Once:
    """One op's legalization, remembered per distinct call (see the module docstring)."""

    def __init__(self, legalization: Legalization) -> None:
        self.legalization = legalization
        self.seen: dict[tuple[Any, ...], list[_Kernel]] = {}

    def __call__(self, bb: Any, call: Any) -> Any:
        if (value := _filled(call)) is not None:
            return _filled_kernel(bb, call, value)
        key = _key(call)
        if key is not None:
            for known in self.seen.get(key, ()):
                if known.serves(call):
                    return known.apply(call)
        result = self.legalization(bb, call)
        if key is not None:
            kernel = _kernel_of(call, result)
            if kernel is not None:
                self.seen.setdefault(key, []).append(kernel)
        return result


#: Reductions that divide by the number of elements they reduce; over none, onnxruntime's value is 0.
_AVERAGES = ("relax.mean", "relax.variance", "relax.std")


def _filled(call: Any) -> float | None:
    """The one value ``call``'s result can hold, when its operands' static shapes decide it: any
    value (0) for an empty result, 0 for an average over no elements (onnxruntime's ReduceMean of
    nothing; 0 / 0 for TVM's, a compile error); None otherwise."""
    shape = _tvm.static_shape(call) if isinstance(call.ty, relax.TensorType) else None
    tensors = [arg for arg in call.args if isinstance(arg.ty, relax.TensorType)]
    if shape is None or not tensors:
        return None
    if 0 in shape:
        return 0.0
    if str(call.op.name) in _AVERAGES and "float" in str(call.ty.dtype):
        data = _tvm.static_shape(call.args[0])
        axes = range(len(data or ())) if call.attrs.axis is None else [int(a) for a in call.attrs.axis]
        if data is not None and any(data[a] == 0 for a in axes):
            return 0.0
    return None


def _filled_kernel(bb: Any, call: Any, value: float) -> Any:
    """``call``'s result filled with ``value`` by a kernel that reads nothing.

    Why: an op's own legalization divides by the number of elements it reduces, zero here
    (InstanceNormalization over [1, 3, 0, 4]: TVM's constant folding stopped on "Divide by zero").
    The kernel takes the call's first tensor, unread, so constant folding leaves it alone: TVM 0.27
    cannot read an empty constant back from its pool."""
    from tvm import te, tirx  # noqa: PLC0415

    dtype, shape = str(call.ty.dtype), _tvm.static_shape(call)
    source = next(arg for arg in call.args if isinstance(arg.ty, relax.TensorType))
    return bb.call_te(lambda _unread: te.compute(shape, lambda *_: tirx.const(value, dtype), name="filled"), source,
                      primfunc_name_hint="filled")


def _key(call: Any) -> tuple[Any, ...] | None:
    """What must match for one call's legalization to serve another (hashes; ``_same_signature``
    confirms): tensors by type, anything else (shapes, primitive values) by value. None for calls
    with a symbolic shape or value."""
    if not all(_static(arg) for arg in call.args) or not _static_type(call.ty):
        return None
    first: dict[Any, int] = {}
    aliasing = tuple(first.setdefault(arg, i) for i, arg in enumerate(call.args))
    return (str(call.op.name), tvm_ffi.structural_hash(call.attrs) if call.attrs is not None else 0,
            tvm_ffi.structural_hash(call.ty), tuple(tvm_ffi.structural_hash(_signature(arg)) for arg in call.args),
            tuple(isinstance(arg, tvm.ir.GenericConst) for arg in call.args), aliasing)


def _signature(arg: Any) -> Any:
    """What of an argument a legalization reads: a tensor's type, any other argument itself."""
    return arg.ty if isinstance(arg.ty, relax.TensorType) else arg


def _static(arg: Any) -> bool:
    """An argument with nothing symbolic: a static-shape tensor (tuple), shape, or number, or a
    tuple of those (``strided_slice``'s axes, begins and ends: without it each of an unrolled
    LSTM's 9,600 gate slices was legalized through TE on its own, 11 s)."""
    if isinstance(arg, relax.Tuple):
        return all(_static(field) for field in arg.fields)
    if isinstance(arg.ty, tvm.ir.PrimType):
        return isinstance(arg, (tvm.tirx.IntImm, tvm.tirx.FloatImm))
    return _static_type(arg.ty)


def _static_type(ty: Any) -> bool:
    if isinstance(ty, relax.TupleType):
        return all(_static_type(field) for field in ty.fields)
    if isinstance(ty, relax.TensorType):
        return ty.shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values)
    if isinstance(ty, relax.ShapeType):
        return ty.values is not None and all(isinstance(d, tvm.tirx.IntImm) for d in ty.values)
    return False


def _same_signature(known: Any, call: Any) -> bool:
    """The hash key's fields compared for real: attributes, result type, arguments' signatures."""
    equal = tvm_ffi.structural_equal
    return (equal(known.attrs, call.attrs) and equal(known.ty, call.ty)
            and all(equal(_signature(a), _signature(b)) for a, b in zip(known.args, call.args, strict=True)))


def _kernel_of(call: Any, result: Any) -> _Kernel | None:
    """``result`` as a kernel another call can reuse: ``call_tir(kernel, (some of the call's
    arguments, and constants), out)``; else None. A kernel that takes every constant argument of the call serves
    calls with other constants; one that takes constants the legalization made from them (packed
    weights) or holds one compiled in (``add(x, 1)`` holds the 1) serves only calls on the very same
    constants — an unrolled recurrence's steps, whose recurrent weight was packed once per step
    (600 copies of a 1 MB matrix for a 300-frame bidirectional LSTM)."""
    parts = _call_tir_parts(result)
    if parts is None:
        return None
    kernel, fields, out = parts
    takes: list[Any] = []
    for field in fields:
        index = next((i for i, arg in enumerate(call.args) if arg.same_as(field)), None)
        if index is None and not isinstance(field, tvm.ir.GenericConst):
            return None  # a value the legalization computed first
        takes.append(field if index is None else index)
    same_constants = any(not isinstance(t, int) for t in takes) or any(
        isinstance(arg, tvm.ir.GenericConst) and i not in takes for i, arg in enumerate(call.args))
    return _Kernel(call, kernel, tuple(takes), out, same_constants)
