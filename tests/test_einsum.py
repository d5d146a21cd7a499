"""Two-operand Einsum as a matmul (``amptool.frontend.einsum``): onnxruntime's values for batch,
contracted, free and summed-out letters in any order, and TVM's einsum kept where the conversion
declines (diagonals, ellipsis)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from amptool.app.convert import ConvertConfig, rewrite_model
from tests.onnx_checks import onnxruntime_and_amptool, save_node_model

CASES = {
    # equation: (shape of a, shape of b, whether it becomes a matmul)
    "bhqd,bhkd->bhqk": ([2, 3, 5, 4], [2, 3, 6, 4], True),
    "bhqk,bhkd->bhqd": ([2, 3, 5, 6], [2, 3, 6, 4], True),
    "ij,jk": ([5, 4], [4, 3], True),  # implicit output
    "abc,cd->dba": ([2, 3, 4], [4, 5], True),  # output transposed
    "ijk,jl->il": ([2, 3, 4], [3, 5], True),  # k summed out of a alone
    "nchw,kc->nkhw": ([1, 4, 5, 6], [3, 4], True),  # a 1x1 conv
    "i,i->": ([7], [7], True),  # a dot product to a scalar
    "i,j->ij": ([3], [4], True),  # an outer product
    "ii,i->i": ([3, 3], [3], False),  # a diagonal
    "...ij,...jk->...ik": ([2, 3, 4], [2, 4, 5], False),  # ellipsis
}


@pytest.mark.parametrize("equation", CASES)
def test_matches_onnxruntime(tmp_path: Path, equation: str) -> None:
    shape_a, shape_b, as_matmul = CASES[equation]
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal(shape_a).astype(np.float32), "b": rng.standard_normal(shape_b).astype(np.float32)}
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    path = save_node_model(tmp_path / "einsum.onnx", node, feeds)
    want, got = onnxruntime_and_amptool(path, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    script = rewrite_model(ConvertConfig(model=path, dtype="float32")).passes.mod.script()
    assert ("einsum" not in script) == as_matmul  # TVM's converter gives a call_tir of an "einsum" kernel
