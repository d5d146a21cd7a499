"""``_tvm.is_nan`` / ``_tvm.is_inf``: the NaN and infinity tests amptool's kernels use, on the
bits, because TVM's ``tirx.isnan``/``isinf`` make its vectorizer scalarize the loop around them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.parser
import pytest

from amptool import _tvm
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import scheduled_kernels

tvm = pytest.importorskip("tvm")


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_bit_tests_match_numpy_in_a_vectorized_loop(dtype: str) -> None:
    from tvm import s_tir, te, tirx

    x = te.placeholder((64,), dtype=dtype, name="x")
    nan = te.compute(x.shape, lambda i: tirx.Select(_tvm.is_nan(x(i)), tirx.const(1, "int32"), tirx.const(0, "int32")))
    inf = te.compute(x.shape, lambda i: tirx.Select(_tvm.is_inf(x(i)), tirx.const(1, "int32"), tirx.const(0, "int32")))
    sch = s_tir.Schedule(te.create_prim_func([x, nan, inf]))
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        _, lanes = sch.split(sch.get_loops(block)[0], [None, 16])
        sch.vectorize(lanes)
    lib = tvm.tirx.build(sch.mod, target=_tvm.make_target(host_llvm_spec()))
    finfo = np.finfo(dtype)
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, finfo.max, -finfo.max, finfo.tiny,
                       finfo.tiny / 4, finfo.eps] * 6, dtype=dtype)[:64]
    values = np.resize(values, 64)
    outs = [tvm.runtime.tensor(np.zeros(64, np.int32)) for _ in range(2)]
    lib(tvm.runtime.tensor(values), *outs)
    np.testing.assert_array_equal(outs[0].numpy(), np.isnan(values).astype(np.int32))
    np.testing.assert_array_equal(outs[1].numpy(), np.isinf(values).astype(np.int32))


def test_softmax_and_gelu_kernels_carry_no_scalarizing_tests(tmp_path: Path) -> None:
    """BERT-base's [12, 128, 128] softmax ran its exp 8 lanes wide around ``T.isnan`` (0.185 ms at
    one thread, 0.145 with the bit test)."""
    path = str(tmp_path / "model.onnx")
    onnx.save(onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 20]>
        g (float[2, 4, 64] x) => (float[2, 4, 64] y) {
            s = Softmax <axis = -1> (x)
            y = Gelu (s)
        }"""), path)
    text = "\n".join(scheduled_kernels(path, "float32"))
    assert "T.isnan" not in text and "T.isinf" not in text
