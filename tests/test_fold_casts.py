"""fold_constant_casts: weight casts folded in numpy give the constants TVM's FoldConstant gives."""

from __future__ import annotations

import numpy as np
import pytest

from amptool import _tvm
from amptool.passes.fold_casts import fold_constant_casts

tvm = pytest.importorskip("tvm")
relax = tvm.relax


def _module(dtype: str):
    """x·astype(W) + astype(b) · astype(scalar): two weight casts and a scalar cast to ``dtype``."""
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((8, 4)).astype(np.float32) * np.float32(3.3))
    b = relax.const(np.array([1e-3, 70000.0, -2.5, 0.1], np.float32))  # one overflows float16
    half = relax.const(np.float32(1 / 6))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, bb.emit(relax.op.astype(w, dtype))))
            h = bb.emit(relax.op.add(h, bb.emit(relax.op.astype(b, dtype))))
            out = bb.emit_output(relax.op.multiply(h, bb.emit(relax.op.astype(half, dtype))))
        bb.emit_func_output(out)
    return bb.get()


def _constants(mod) -> list[np.ndarray]:
    found: list[np.ndarray] = []

    def visit(expr):
        if _tvm.is_constant(expr):
            found.append(_tvm.constant_numpy(expr))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_casts_fold_to_the_values_fold_constant_computes(dtype):
    mod = _module(dtype)
    ours = _tvm.fold_constant(fold_constant_casts(mod))
    theirs = _tvm.fold_constant(mod)
    assert "R.astype(metadata" not in _tvm.module_script(ours) and "R.astype(R.const" not in _tvm.module_script(ours)
    ours_by_shape = {c.shape: c for c in _constants(ours)}
    theirs_by_shape = {c.shape: c for c in _constants(theirs) if c.dtype == ours_by_shape[c.shape].dtype}
    for shape in [(8, 4), (4,)]:  # the weight and the bias (inf where float16 overflows, as TVM's)
        a, b = ours_by_shape[shape], theirs_by_shape[shape]
        assert a.dtype == b.dtype and a.view(np.uint16).tolist() == b.view(np.uint16).tolist()
    scalar = ours_by_shape[()]
    assert str(scalar.dtype) == dtype  # FoldConstant leaves this cast; here it folds too


def test_non_float_and_non_constant_casts_stay():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            i = bb.emit(relax.op.astype(relax.const(np.array([1.7, -2.5, 3.0], np.float32)), "int32"))
            out = bb.emit_output(relax.op.add(relax.op.astype(x, "float16"), relax.op.astype(i, "float16")))
        bb.emit_func_output(out)
    text = _tvm.module_script(fold_constant_casts(bb.get()))
    assert 'R.astype(x, dtype="float16")' in text and 'dtype="int32")' in text
