"""FoldConstant without the compile time: exact folds in numpy, TVM's pass only when it has work.

What: ``fold_constants(mod)`` gives the module ``relax.transform.FoldConstant()`` gives. Inside
dataflow blocks the calls that only move a constant's data fold in numpy —

    reshape / flatten / expand_dims / squeeze (C)   → C reshaped to the static output shape
    permute_dims(C, axes)                           → C transposed
    shape_of(x) with x of static shape              → the shape; shape_to_tensor(shape) → int64 C
    small index arithmetic on constants              → C (below)

— and every use of the folded variable (or of one bound to a constant already, such as the
casts ``fold_casts`` folds) gets the constant, as FoldConstant does. The index arithmetic is
what TVM's frontend writes around an index (``Gather``'s ``where(i < 0, i + shape[axis], i)``),
once per copy of an unrolled ``Loop`` body: elementwise ``add``/``subtract``/``multiply``,
comparisons, ``where``, ``take``, ``maximum``/``minimum``, ``negative``, ``abs`` and integer
``astype`` on constants of at most ``SMALL`` elements, integer or bool (or float32/float64
where numpy's IEEE arithmetic is the kernel's), each checked against the call's type. TVM's pass
then runs only if a call is left that it could fold (every argument a constant, shape or immediate;
a call_tir on constants; a ``*_like``/shape-reading op; a variable bound to a constant or shape).
Otherwise its other effect, dropping unused dataflow bindings, is applied on its own.

Why: FoldConstant evaluates each fold by compiling a kernel (tens of ms each: ResNet-50's 53
bias reshapes cost 2–3 s; a 300-iteration Loop's index arithmetic, 1,500 kernels, 70 s), and
it legalizes every op call in the module through TE to find out whether its arguments are
constant (0.3–0.4 s for ResNet-50 even when nothing folds) — twice per convert, and once more
per auto-fallback candidate.

When it does not fire: outside dataflow blocks (FoldConstant folds only inside them), shapes
that are not static; casts (FoldConstant's constants carry slightly other type annotations than
numpy's: run ``fold_casts`` first, as the fold stage does). Those are left to FoldConstant.

Preserves: values bit for bit (data movement only), and the module FoldConstant would give
(``tests/test_convert_speed.py`` compares them structurally).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from amptool import _tvm

#: Ops that keep a constant's elements in order and only change its shape.
_RESHAPES = frozenset({"relax.reshape", "relax.flatten", "relax.expand_dims", "relax.squeeze"})
#: Ops that read an argument's shape (not its values): FoldConstant folds them even with a
#: non-constant argument, so their presence means TVM's pass must run.
_SHAPE_READERS = frozenset({
    "relax.shape_of", "relax.size", "relax.tensor_to_shape", "relax.shape_to_tensor", "relax.hint_on_device",
    "relax.to_vdevice", "relax.wrap_param", "relax.builtin.stop_lift_params", "relax.collapse_sum_to",
})


#: The most elements an arithmetic fold computes in numpy (index arithmetic, not tensors of data).
SMALL = 4096
#: Dtypes the arithmetic folds compute in: exact in numpy as in a kernel.
_FOLD_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                          "float32", "float64"})
_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.less": np.less,
           "relax.greater": np.greater, "relax.less_equal": np.less_equal,
           "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal}
_UNARY = {"relax.negative": np.negative, "relax.abs": np.abs}
_ARITHMETIC = frozenset({"relax.add", "relax.subtract", "relax.multiply"})


def fold_constants(mod: Any) -> Any:
    """``mod`` with its constant subexpressions folded (see the module docstring)."""
    from tvm import relax  # noqa: PLC0415

    folder = _folder_class()(mod)
    folded = _tvm.rewrite_functions(mod, folder)
    if folder.needs_tvm:
        return _tvm.fold_constant(folded)
    # What FoldConstant also does to every function: drop dataflow bindings nothing uses.
    for gv, func in _tvm.relax_functions(folded):
        folded[gv] = relax.analysis.remove_all_unused(func)
    return folded


def _folder_class() -> Any:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import mutator  # noqa: PLC0415

    @mutator
    class _Folder(_tvm.dataflow_scoped_mutator()):  # type: ignore[misc]
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.constants: dict[Any, Any] = {}  # folded variable → its constant
            self.needs_tvm = False

        def visit_var_(self, op: Any) -> Any:
            folded = self.constants.get(op.__chandle__())
            return folded if folded is not None else super().visit_var_(op)

        def visit_dataflow_var_(self, op: Any) -> Any:
            folded = self.constants.get(op.__chandle__())
            return folded if folded is not None else super().visit_dataflow_var_(op)

        def resolve(self, expr: Any) -> Any:
            """``expr``, or the constant a folded variable stands for."""
            if isinstance(expr, relax.Var):
                return self.constants.get(expr.__chandle__(), expr)
            return expr

        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            if _tvm.is_constant(self.resolve(value)):  # FoldConstant puts it into every use, in any block
                self.constants[binding.var.__chandle__()] = self.resolve(value)
                super().visit_var_binding_(binding)
                return
            if self.in_dataflow and isinstance(value, relax.Call):
                folded = _fold_call(value, self.resolve)
                if folded is not None:
                    folded = self.builder_.normalize(folded)
                    self.constants[binding.var.__chandle__()] = folded
                    self.builder_.emit_normalized(_tvm.var_binding(binding.var, folded))
                    return
            if not self.needs_tvm and _tvm_could_fold(value, self.resolve):
                self.needs_tvm = True
            super().visit_var_binding_(binding)

        def visit_match_cast_(self, binding: Any) -> None:
            if not self.needs_tvm and _tvm_could_fold(binding.value, self.resolve):
                self.needs_tvm = True
            super().visit_match_cast_(binding)

    return _Folder


def _fold_call(call: Any, resolve: Callable[[Any], Any]) -> Any | None:
    """The constant (or shape) ``call`` computes from its arguments (``resolve``: a variable → its
    folded value), for the folds above; None for anything else."""
    from tvm import relax  # noqa: PLC0415

    name = _tvm.op_name(call)
    if name is None or not len(call.args):
        return None
    source = resolve(call.args[0])
    if name == "relax.shape_of":
        shape = _static_shape(source)
        return None if shape is None else relax.ShapeExpr(list(shape))
    if name == "relax.shape_to_tensor":
        if not isinstance(source, relax.ShapeExpr) or not _is_static(source, resolve):
            return None
        return relax.const(np.array([int(d) for d in source.values], np.int64), "int64")
    if name not in _RESHAPES and name != "relax.permute_dims":
        return _fold_arithmetic(call, name, [resolve(arg) for arg in call.args])
    dtype = _tvm.tensor_dtype(source)
    shape = _static_shape(call)
    if not _tvm.is_constant(source) or dtype is None or _tvm.tensor_dtype(call) != dtype or shape is None:
        return None
    data = _tvm.constant_numpy(source)
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        data = np.transpose(data, None if axes is None else [int(a) for a in axes])
        if data.shape != shape:
            return None
    if data.size != int(np.prod(shape, dtype=np.int64)):
        return None
    return relax.const(data.reshape(shape).copy(order="C"), dtype)  # (ascontiguousarray makes 0-d 1-d)


def _fold_arithmetic(call: Any, name: str, args: list[Any]) -> Any | None:
    """``call`` on small constants evaluated in numpy (module docstring), or None."""
    from tvm import relax  # noqa: PLC0415

    dtype, shape = _tvm.tensor_dtype(call), _static_shape(call)
    if dtype not in _FOLD_DTYPES or shape is None or int(np.prod(shape, dtype=np.int64)) > SMALL:
        return None
    tensors = args if name != "relax.take" else args[:2]
    if not all(_tvm.is_constant(arg) and _tvm.tensor_dtype(arg) in _FOLD_DTYPES for arg in tensors):
        return None
    values = [_tvm.constant_numpy(arg) for arg in tensors]
    if any(value.size > SMALL for value in values):
        return None
    with np.errstate(all="ignore"):  # integer wrap-around is what a kernel computes too
        result = _evaluate(call, name, values)
    if result is None:
        return None
    result = np.asarray(result)
    if result.shape != shape:
        return None
    return relax.const(np.array(result.astype(dtype), order="C"), dtype)  # (ascontiguousarray makes 0-d 1-d)


def _evaluate(call: Any, name: str, values: list[np.ndarray]) -> Any:
    """numpy's value of an arithmetic call, or None where it could differ from the kernel's."""
    if name in _BINARY and len(values) == 2:
        if values[0].dtype != values[1].dtype:
            return None  # Relax requires equal dtypes; numpy would promote
        if values[0].dtype == np.bool_ and name in _ARITHMETIC:
            return None  # numpy's bool sum is an or; a kernel's 1-bit sum is not
        return _BINARY[name](values[0], values[1])
    if name in _UNARY and len(values) == 1:
        return None if values[0].dtype == np.bool_ else _UNARY[name](values[0])
    if name == "relax.where" and len(values) == 3 and values[0].dtype == np.bool_:
        return np.where(values[0], values[1], values[2])
    if name == "relax.astype" and len(values) == 1 and values[0].dtype.kind in "biu":
        return values[0]  # cast to the call's dtype by the caller: integer to anything is exact or wraps alike
    if name == "relax.take" and len(values) == 2 and values[1].dtype.kind in "iu":
        data, indices = values
        attrs = call.attrs
        axis = None if attrs.axis is None else int(attrs.axis)
        mode = str(attrs.mode)
        if mode == "fast":
            size = data.size if axis is None else data.shape[axis]
            if np.any(indices < 0) or np.any(indices >= size):
                return None  # out of range: a "fast" kernel reads whatever is there
            mode = "wrap"
        if mode == "wrap":
            return np.take(data, indices, axis=axis, mode="wrap")
        if mode == "clip":
            return np.take(data, indices, axis=axis, mode="clip")
        return None
    return None


def _static_shape(expr: Any) -> tuple[int, ...] | None:
    from tvm import relax, tirx  # noqa: PLC0415

    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tirx.IntImm) for d in shape.values):
        return None
    return tuple(int(d.value) for d in shape.values)


def _tvm_could_fold(value: Any, resolve: Callable[[Any], Any]) -> bool:
    """Whether FoldConstant might change this binding (``resolve``: variable → its folded
    constant, else itself): conservative, True when unsure."""
    from tvm import relax  # noqa: PLC0415

    if isinstance(resolve(value), relax.ShapeExpr):
        return True  # FoldConstant puts the shape into the calls that take the variable
    if not isinstance(value, relax.Call):
        return False
    name = _tvm.op_name(value)
    if name is None:
        return False  # a call of a function: FoldConstant leaves it
    if name.endswith("_like") or name in _SHAPE_READERS or name.startswith("relax.inspect."):
        return True
    if name == "relax.call_tir":
        return all(_tvm.is_constant(resolve(f)) for f in value.args[1].fields)
    return all(_is_static(arg, resolve) for arg in value.args)


def _is_static(expr: Any, resolve: Callable[[Any], Any]) -> bool:
    """Anything but a variable (through tuples): a constant, shape, immediate, function…"""
    from tvm import relax  # noqa: PLC0415

    expr = resolve(expr)
    if isinstance(expr, relax.Var):
        return False
    if isinstance(expr, relax.Tuple):
        return all(_is_static(field, resolve) for field in expr.fields)
    if isinstance(expr, relax.ShapeExpr):
        from tvm import tirx  # noqa: PLC0415

        return all(isinstance(d, tirx.IntImm) for d in expr.values)
    return True
