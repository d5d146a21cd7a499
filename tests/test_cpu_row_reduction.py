"""Row reductions (softmax, layer norm, RMS norm) with vectorized partial results
(``amptool.compiler.cpu_row_reduction``): the same numbers as onnxruntime, the partial-sum
blocks really vectorized, and the rows it must leave to dlight's rule left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from amptool.app.convert import ConvertConfig, build_model
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import scheduled_kernels

tvm = pytest.importorskip("tvm")


def _model(tmp_path: Path, shape: list[int], body: str, params: str = "", out: list[int] | None = None) -> str:
    dims = ", ".join(str(d) for d in shape)
    out_dims = ", ".join(str(d) for d in (shape if out is None else out))
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[{dims}] x) => (float[{out_dims}] y) {params} {{ {body} }}""")
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return str(path)


def _layer_norm(width: int) -> tuple[str, str]:
    rng = np.random.default_rng(1)
    scale = ", ".join(f"{v:.5f}" for v in rng.normal(1.0, 0.1, width))
    bias = ", ".join(f"{v:.5f}" for v in rng.normal(0.0, 0.1, width))
    return (f"<float[{width}] s = {{{scale}}}, float[{width}] b = {{{bias}}}>",
            "y = LayerNormalization <axis = -1, epsilon = 0.00001> (x, s, b)")


_RMS_NORM = ("",
             "sq = Mul (x, x)\n m = ReduceMean <keepdims = 1> (sq, axes)\n v = Add (m, eps)\n"
             " r = Sqrt (v)\n y = Div (x, r)")

CASES = {
    # name: (shape, params, body, whether every reduction is factored[, output shape])
    "softmax 128": ([2, 3, 128], "", "y = Softmax <axis = -1> (x)", True),
    "softmax 1000 (padded to 1008: whole 16-lane vectors)": ([2, 1000], "", "y = Softmax <axis = -1> (x)", True),
    # no lane width divides the row: padded with -inf to whole vectors (15x onnxruntime's time at 197 before)
    "softmax 77 (padded to 80)": ([3, 77], "", "y = Softmax <axis = -1> (x)", True),
    "softmax 197 (ViT's tokens, padded to 208)": ([2, 197], "", "y = Softmax <axis = -1> (x)", True),
    # no lane width divides the row: a vector body and a scalar tail (cpu_tail_reduction)
    "reduce max over 77": ([3, 77], "<int64[1] axes = {-1}>", "y = ReduceMax <keepdims = 0> (x, axes)", True, [3]),
    "reduce min over 50": ([3, 50], "<int64[1] axes = {-1}>", "y = ReduceMin <keepdims = 1> (x, axes)", True, [3, 1]),
    "reduce mean over 37": ([5, 37], "<int64[1] axes = {-1}>", "y = ReduceMean <keepdims = 0> (x, axes)", True, [5]),
    "reduce sum over 131": ([2, 3, 131], "<int64[1] axes = {2}>", "y = ReduceSum <keepdims = 1> (x, axes)", True,
                            [2, 3, 1]),
    "instance norm over 3199 (wav2vec2's GroupNorm)": (
        [1, 3, 3199], "<float[3] s = {1.0, 0.5, 2.0}, float[3] b = {0.0, 0.1, -0.2}>",
        "y = InstanceNormalization <epsilon = 0.00001> (x, s, b)", True),
    "reduce sum of 7 (shorter than two vectors: TVM's)": ([4, 7], "<int64[1] axes = {-1}>",
                                                          "y = ReduceSum <keepdims = 0> (x, axes)", False, [4]),
    "softmax of one row of 8 (a unit row dropped from one block only)": ([1, 8], "", "y = Softmax <axis = -1> (x)",
                                                                          False),
    # moved to the last axis first (cpu_softmax_axis): contiguous rows, vector partials
    "softmax over channels": ([2, 64, 4, 4], "", "y = Softmax <axis = 1> (x)", True),
    "layer norm 768": ([1, 16, 768], *_layer_norm(768), True),
    "rms norm 96": ([2, 5, 96], "<float[1] eps = {0.000001}, int64[1] axes = {-1}>", _RMS_NORM[1], True),
    "reduce max alone": ([8, 256], "<int64[1] axes = {-1}>", "y = ReduceMax <keepdims = 0> (x, axes)", True, [8]),
    "reduce sum of two axes": ([4, 6, 64], "<int64[2] axes = {1, 2}>", "y = ReduceSum <keepdims = 0> (x, axes)",
                               True, [4]),
    # the last block writes one value per row (the divide after the sum): 6.2x onnxruntime's time before
    "mean over the spatial axes": ([2, 8, 16, 16], "<int64[2] axes = {2, 3}>",
                                   "y = ReduceMean <keepdims = 1> (x, axes)", True, [2, 8, 1, 1]),
    "instance norm": ([1, 4, 32, 32], "<float[4] s = {1.0, 0.5, 2.0, -1.0}, float[4] b = {0.0, 0.1, -0.2, 0.3}>",
                      "y = InstanceNormalization <epsilon = 0.00001> (x, s, b)", True),
    # one row of everything: torch's GroupNorm(1, C) (poolformer, mobilevitv2) is Reshape → this → Reshape
    "instance norm over one row of 50176": ([1, 1, 50176], "<float[1] s = {1.5}, float[1] b = {0.25}>",
                                            "y = InstanceNormalization <epsilon = 0.00001> (x, s, b)", True),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_onnxruntime(tmp_path: Path, case: str) -> None:
    shape, params, body, _, *out = CASES[case]
    path = _model(tmp_path, shape, body, params, *out)
    x = np.random.default_rng(7).normal(0.0, 3.0, shape).astype(np.float32)
    x.reshape(-1)[:5] = [40.0, -40.0, 0.0, 1e-3, 88.0]  # far apart: shifts and sums span a wide range
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", CASES)
def test_partial_results_are_vectorized_where_they_can_be(tmp_path: Path, case: str) -> None:
    shape, params, body, factored, *out = CASES[case]
    scripts = scheduled_kernels(_model(tmp_path, shape, body, params, *out), "float32")
    partials = [s for s in scripts if "_rf_update" in s]
    if not factored:
        assert not partials
        return
    assert partials
    for text in partials:  # the loop right above each partial-result update is the vectorized lane loop
        lines = text.splitlines()
        updates = [i for i, line in enumerate(lines) if 'T.sblock("' in line and '_rf_update"' in line]
        assert updates and all("T.vectorized" in lines[i - 1] for i in updates)


@pytest.mark.parametrize("width", [64, 77])
def test_all_minus_infinity_row_matches_onnxruntime(tmp_path: Path, width: int) -> None:
    """A fully masked attention row: max is -inf; both runtimes give NaN (the shift is -inf - -inf),
    also where the row is padded with -inf to whole vectors (77)."""
    path = _model(tmp_path, [2, width], "y = Softmax <axis = -1> (x)")
    x = np.random.default_rng(0).normal(size=(2, width)).astype(np.float32)
    x[1] = -np.inf
    x[0, 3] = -np.inf
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-6)


def test_softmax_rows_a_full_vector_does_not_divide_are_padded(tmp_path: Path) -> None:
    """100 scores (4-lane vectors divide them) padded with -inf to 112 for 16-lane ones: the exp
    polynomial ran at a quarter of the width (Whisper's 1500 × 1500 scores, one thread: 24.2 →
    20.5 ms a layer)."""
    from amptool import _tvm
    from amptool.compiler.cpu_kernels import vector_lanes

    if vector_lanes(_tvm.make_target(host_llvm_spec())) != 16:
        pytest.skip("16-lane vectors (AVX-512) only")
    text = "\n".join(scheduled_kernels(_model(tmp_path, [3, 100], "y = Softmax <axis = -1> (x)"), "float32"))
    assert "T.int64(112)" in text and "T.vectorized(T.int64(16))" in text


def test_rows_four_lanes_divide_write_whole_vectors(tmp_path: Path) -> None:
    """A row of 100 (4 lanes divide it, 16 do not) writes its normalized values 16 lanes at a time
    with a scalar tail, not 4 lanes at a time (Whisper's 1500-key softmax: 7.8 → 7.0 ms); values
    stay onnxruntime's."""
    from amptool import _tvm
    from amptool.compiler.cpu_kernels import vector_lanes

    if vector_lanes(_tvm.make_target(host_llvm_spec())) != 16:
        pytest.skip("16-lane vectors (AVX-512) only")
    path = _model(tmp_path, [3, 100], "y = Softmax <axis = -1> (x)")
    (script,) = scheduled_kernels(path, "float32")
    lines = script.splitlines()
    crops = [i for i, line in enumerate(lines) if 'T.sblock("softmax_crop' in line]  # the last step's blocks
    assert "T.vectorized(T.int64(4))" not in script
    assert any("T.vectorized(T.int64(16))" in lines[i - 1] for i in crops), script
    x = np.random.default_rng(14).standard_normal((3, 100)).astype(np.float32) * 4
    want = ort.InferenceSession(path).run(None, {"x": x})[0]
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_softmax_output_step_vectorized_and_shift_inlined(tmp_path: Path) -> None:
    """The normalizing divide, the kernel's last block, is vectorized along the row (it was left
    scalar once the rows were fused into the parallel loop), and the shift is inlined into the exp
    once the exp's own block is (the NaN select around the exp read the shift too)."""
    (script,) = scheduled_kernels(_model(tmp_path, [2, 3, 128], "y = Softmax <axis = -1> (x)"), "float32")
    lines = script.splitlines()
    last = next(i for i, line in enumerate(lines) if 'T.sblock("' in line and "norm" in line)
    assert "T.vectorized" in lines[last - 1]
    assert 'T.sblock("softmax_shift")' not in script


def test_softmax_divides_once_per_row(tmp_path: Path) -> None:
    """The normalization multiplies by the row sum's reciprocal: the kernel's only divide is the
    row's, not one per vector along it; values stay onnxruntime's."""
    path = _model(tmp_path, [2, 3, 128], "y = Softmax <axis = -1> (x)")
    (script,) = scheduled_kernels(path, "float32")
    divides = [line for line in script.splitlines() if " / " in line]
    # exp × (1 / sum): the reciprocal is loop-invariant along the row (LLVM hoists it); exp / sum is not
    assert len(divides) == 1 and "(T.float32(1.0) / softmax_exp_red[" in divides[0], divides
    x = np.random.default_rng(13).standard_normal((2, 3, 128)).astype(np.float32) * 4
    want = ort.InferenceSession(path).run(None, {"x": x})[0]
    got = build_model(ConvertConfig(model=path, dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_a_row_no_vector_divides_is_a_vector_body_and_a_scalar_tail(tmp_path: Path) -> None:
    """wav2vec2's GroupNorm over 3199 samples: each reduction is a vectorized body and a scalar
    tail, and the normalizing step runs whole vectors then the rest (TVM's scalar mean and variance
    took 20.5 ms at one thread for 512 rows, onnxruntime 1.7; now 1.5)."""
    from amptool import _tvm
    from amptool.compiler.cpu_kernels import vector_lanes

    lanes = vector_lanes(_tvm.make_target(host_llvm_spec()))
    shape, params, body, *_ = CASES["instance norm over 3199 (wav2vec2's GroupNorm)"]
    text = "\n".join(scheduled_kernels(_model(tmp_path, shape, body, params), "float32"))
    assert '_tail")' in text and '_body_rf_update")' in text
    whole = 3199 // lanes * lanes
    assert f"range(T.int64({whole}), T.int64(3199))" in text  # the elementwise step's tail
    assert f"T.vectorized(T.int64({lanes}))" in text


@pytest.mark.parametrize(("length", "lanes", "body"), [
    (3199, 16, 3184), (3199, 8, 3192), (77, 16, 64), (37, 16, 32), (50, 4, 48),
    (768, 16, None), (100, 16, None),  # a vector (4 lanes) divides them: no split
    (31, 16, None),  # under two vectors
])
def test_tail_split(length: int, lanes: int, body: int | None) -> None:
    from amptool.compiler.cpu_tail_reduction import tail_split

    assert tail_split(length, lanes) == body


def test_a_reduction_over_everything_runs_once_not_per_output_element(tmp_path: Path) -> None:
    """GroupNorm(1, C) as InstanceNormalization over [1, 1, C·H·W]: one mean and one variance for all
    the elements the kernel then normalizes. dlight's rule computed the mean inside the parallel loop
    over the outputs, once per element — quadratic: poolformer_s12's diff took 150 s, now ~4 s."""
    path = _model(tmp_path, [1, 1, 50176], "y = InstanceNormalization <epsilon = 0.00001> (x, s, b)",
                  "<float[1] s = {1.0}, float[1] b = {0.0}>")
    for text in scheduled_kernels(path, "float32"):
        lines = text.splitlines()
        updates = [i for i, line in enumerate(lines) if '_rf_update"' in line]
        parallel = [i for i, line in enumerate(lines) if "T.parallel" in line]
        assert updates, text
        assert all(p > max(updates) for p in parallel), text  # the elementwise loop comes after, not around
