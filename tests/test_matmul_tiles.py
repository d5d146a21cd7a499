"""Matmuls whose shapes have no register tile: a prime row count (ViT's 197 tokens) is padded to
whole tiles and cropped, and a product of two computed tensors whose columns no vector divides
is packed at run time into the same tuned kernel. Values against onnxruntime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx.parser
import pytest

from amptool.compiler.cpu_kernels import matmul_row_cap, matmul_tile
from tests.conftest import scheduled_kernels
from tests.onnx_checks import onnxruntime_and_amptool

tvm = pytest.importorskip("tvm")


def _save(tmp_path: Path, text: str) -> str:
    path = str(tmp_path / "model.onnx")
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def _product(tmp_path: Path, a_shape: list[int], b_shape: list[int], seed: int) -> tuple[str, dict[str, np.ndarray]]:
    """A model of ``MatMul(a, b)`` over two inputs, and seeded inputs for it."""
    out = [*np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])), a_shape[-2], b_shape[-1]]
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float{a_shape} a, float{b_shape} b) => (float{out} y) {{
            y = MatMul(a, b)
        }}""")
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in (("a", a_shape), ("b", b_shape))}
    return path, feeds


def _values(count: int, seed: int) -> str:
    return ", ".join(f"{v:.6f}" for v in np.random.default_rng(seed).normal(0.0, 0.1, count))


@pytest.mark.parametrize("lanes", [16, 8])
def test_prime_row_counts_are_padded_and_others_are_not(lanes: int) -> None:
    """197 rows (a prime) had a one-row tile; padded, the tile fills (ViT-B/16's projections 2.4×
    faster). Row counts with a good divisor keep it: BERT's 128 rows stay 3 vectors × 8 exactly.
    AVX2 takes three vectors × 4 rows where three divide the columns (BERT's 768, ConvNeXt's 96 and
    384), and pads one batch item's rows sooner (``PAD_ROWS_GAIN_AVX2``) where they do not: 512
    columns' 128 and 196 rows' exact 2 × 4 tiles (8 accumulators) become 2 × 6 over 132 and 198.
    Paired bfloat16 weights keep even vector counts."""
    for rows in (197, 577, 257):
        vectors, computed = matmul_tile(rows, 48, lanes)
        tile = next(d for d in range(matmul_row_cap(lanes, vectors), 0, -1) if computed % d == 0)
        assert computed >= rows and computed - rows < tile and vectors * tile >= (12 if lanes == 16 else 6)
    for rows in (1, 8, 384, 1500, *((128, 196) if lanes == 16 else ())):
        assert matmul_tile(rows, 48, lanes)[1] == rows
    if lanes == 16:
        assert matmul_tile(197, 48, 16) == (3, 198)
        assert matmul_tile(128, 48, 16) == (3, 128)
    else:
        assert matmul_tile(128, 96, 8) == (3, 128) and matmul_tile(56, 12, 8, items=56) == (3, 56)
        assert matmul_tile(128, 96, 8, paired=True) == (2, 132)
        assert matmul_tile(128, 64, 8) == (2, 132) and matmul_tile(196, 64, 8) == (2, 198)
        # Several batch items' rows: the usual gain applies.
        assert matmul_tile(56, 64, 8, items=56) == (2, 56) and matmul_tile(128, 64, 8, items=2) == (2, 128)
        assert matmul_tile(49, 16, 8, items=64) == (2, 54)  # Swin-like windows: 2 × 6 beat 1 × 7
        assert matmul_tile(49, 12, 8, items=64) == (3, 52)


def test_a_matmul_over_several_items_keeps_its_tile_compact(tmp_path: Path) -> None:
    """A channels-last Linear over a map (ConvNeXt's MLP: 56 rows an item): the tile's rows are
    split from each item's rows, so its accumulators are one [rows, columns] tile buffer that LLVM
    keeps in registers. Split from the items and rows fused, the buffer spanned 684 vectors (a
    workspace allocation indexed at run time) and LLVM kept a 3 × 4 tile's accumulators in memory:
    2.25 → 1.56 ms at 3 × 4 with the split (onnxruntime 1.80)."""
    from tests.conftest import kernel_after_pass

    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 6, 56, 96] x) => (float[1, 6, 56, 96] y)
          <float[96, 96] w = {{{_values(96 * 96, 8)}}}, float[96] b = {{{_values(96, 9)}}}> {{
            m = MatMul(x, w)
            y = Add(m, b)
        }}""")
    text = kernel_after_pass(path, "matmul", "FlattenBuffer")
    sizes = [int(n) for n in re.findall(r"amp_matmul_intermediate = T\.alloc_buffer\(\(T\.int64\((\d+)\),\)", text)]
    assert sizes and max(sizes) <= 32 * 16, sizes  # one register tile's floats, at most
    x = np.random.default_rng(10).standard_normal((1, 6, 56, 96)).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("batch", [1, 2])
def test_a_prime_row_count_matches_onnxruntime(tmp_path: Path, batch: int) -> None:
    """197 rows computed as 198 and cropped, with a bias and GELU-like epilogue; two items must not
    share a tile (each item's rows are padded on their own)."""
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{batch}, 197, 64] x) => (float[{batch}, 197, 96] y)
          <float[64, 96] w = {{{_values(64 * 96, 1)}}}, float[96] b = {{{_values(96, 2)}}}> {{
            m = MatMul(x, w)
            s = Add(m, b)
            y = Tanh(s)
        }}""")
    text = "\n".join(scheduled_kernels(path, "float32"))
    assert "T.int64(198)" in text  # the padded rows
    x = np.random.default_rng(3).standard_normal((batch, 197, 64)).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("columns", [97, 13])
def test_a_weight_of_columns_no_vector_divides_is_padded_and_cropped(tmp_path: Path, dtype: str, columns: int) -> None:
    """A CTC head's 97 classes: zero weight columns to whole vectors, computed by the packed kernel
    and cropped (TVM's legalization left it unscheduled: a GRU tagger's [80, 512] · [512, 97] took
    2.3 ms, onnxruntime 0.095), bias fused."""
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[80, 1, 64] x) => (float[80, 1, {columns}] y)
          <float[64, {columns}] w = {{{_values(64 * columns, 5)}}}, float[{columns}] b = {{{_values(columns, 6)}}}> {{
            m = MatMul(x, w)
            y = Add(m, b)
        }}""")
    # Lowered for a CPU without AMX tiles (which take bfloat16 products of 32 rows or more).
    text = "\n".join(scheduled_kernels(path, dtype, "znver4"))
    assert 'T.sblock("amp_matmul' in text  # (the crop is inlined into the bias add)
    x = np.random.default_rng(7).standard_normal((80, 1, 64)).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x}, dtype)
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ([1, 3, 197, 32], [1, 3, 32, 197]),  # attention's Q·Kᵀ at 197 tokens
    ([1, 3, 197, 197], [1, 3, 197, 64]),  # and P·V: rows padded, columns whole
    ([2, 3, 37, 24], [3, 24, 41]),  # the right operand broadcast along the first batch dim
    ([2, 3, 37, 24], [1, 3, 24, 41]),  # and along a dim of size 1
])
def test_products_of_two_inputs_with_awkward_shapes_match_onnxruntime(tmp_path: Path, a_shape: list[int],
                                                                      b_shape: list[int]) -> None:
    """Packed at run time (``amp_pack``) and tiled like a weight matmul; Q·Kᵀ at 197 tokens was a
    scalar dot per output (20 ms a layer in ViT-B/16, onnxruntime 0.8)."""
    path, feeds = _product(tmp_path, a_shape, b_shape, seed=4)
    assert 'T.sblock("amp_pack")' in "\n".join(scheduled_kernels(path, "float32"))
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_padded_columns_are_cropped_after_the_product_in_whole_vectors(tmp_path: Path) -> None:
    """The 197 × 197 scores: the crop of the padded columns runs after the product, rows in
    parallel, 192 columns as vectors and 5 alone; under the product's tiles, a bounds test on the
    last block's lanes made TVM scalarize it (ViT: 3.3 → 1.5 ms a layer at one thread)."""
    path, _ = _product(tmp_path, [1, 3, 197, 32], [1, 3, 32, 197], seed=0)
    text = "\n".join(scheduled_kernels(path, "float32"))
    lanes = 16 if "T.vectorized(T.int64(16))" in text else 8
    crop = text[text.index('T.sblock("amp_crop_'):]
    assert f"T.vectorized(T.int64({lanes}))" in crop  # the whole vectors
    assert f"range(T.int64({197 // lanes * lanes}), T.int64(197))" in crop  # the rest


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ([37, 24], [2, 24, 40]),  # the left operand broadcast along a batch dim: rare
    ([1, 2, 37, 24], [1, 2, 24, 60]),  # 60 columns: 15-lane vectors, where packed needs a crop pass
])
def test_other_products_of_two_inputs_keep_tvms_matmul(tmp_path: Path, a_shape: list[int],
                                                      b_shape: list[int]) -> None:
    """Left to TVM's legalization (still correct): Whisper's 1500 × 1500 scores ran 28.9 ms there
    and 37.4 ms packed, its crop a pass of its own through 54 MB."""
    path, feeds = _product(tmp_path, a_shape, b_shape, seed=5)
    assert 'T.sblock("amp_pack")' not in "\n".join(scheduled_kernels(path, "float32"))
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("body", [
    "<float[32, 16] w = {" + ", ".join(["0.5"] * 512) + "}> { y = MatMul(a, w) }",
    "{ y = MatMul(a, b) }",
])
def test_empty_products_convert_and_run(tmp_path: Path, body: str) -> None:
    """A product with zero rows has no register tile to plan: its empty result is a kernel that
    writes nothing (it was an internal error, 'TVM failed to compile', before)."""
    inputs = "float[0, 32] a" if "w =" in body else "float[2, 0, 32] a, float[2, 32, 197] b"
    out = "float[0, 16] y" if "w =" in body else "float[2, 0, 197] y"
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g ({inputs}) => ({out}) {body}""")
    feeds = {"a": np.zeros((0, 32) if "w =" in body else (2, 0, 32), np.float32)}
    if "w =" not in body:
        feeds["b"] = np.ones((2, 32, 197), np.float32)
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
