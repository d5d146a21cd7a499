"""Attention as one CPU kernel (``compiler/cpu_attention``): matmul → scale/mask steps → softmax →
matmul becomes one kernel per block of query rows, values as onnxruntime's; and the patterns it
must leave as three kernels are left."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool.compiler.cpu_attention import MIN_KEYS
from tests.conftest import scheduled_kernels
from tests.onnx_checks import onnxruntime_and_amptool

pytest.importorskip("tvm")

HEADS, DEPTH = 2, 32


def _model(path: Path, rows: int, keys: int, steps: list[onnx.NodeProto], inits: list[onnx.TensorProto],
           softmax_input: str, extra_outputs: tuple[str, ...] = (), nan_to_zero: bool = False,
           cast: bool = False) -> str:
    """q [1, H, rows, D] · kᵀ [1, H, D, keys] → steps → softmax → (where(isnan, 0)) → · v [1, H, keys, D]."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"]), *steps,
             helper.make_node("Softmax", [softmax_input], ["p"], axis=-1)]
    probabilities = "p"
    if cast:  # GPT-2's export: a Cast to the float32 the probabilities already are
        nodes.append(helper.make_node("Cast", ["p"], ["pc"], to=TensorProto.FLOAT))
        probabilities = "pc"
    if nan_to_zero:
        inits = [*inits, numpy_helper.from_array(np.zeros((), np.float32), "zero")]
        nodes += [helper.make_node("IsNaN", [probabilities], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", probabilities], ["pz"])]
        probabilities = "pz"
    nodes.append(helper.make_node("MatMul", [probabilities, "v"], ["y"]))
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (
        ("q", [1, HEADS, rows, DEPTH]), ("kt", [1, HEADS, DEPTH, keys]), ("v", [1, HEADS, keys, DEPTH]))]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", *extra_outputs)]
    model = helper.make_model(helper.make_graph(nodes, "attention", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _feeds(rows: int, keys: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"q": rng.standard_normal((1, HEADS, rows, DEPTH)).astype(np.float32),
            "kt": rng.standard_normal((1, HEADS, DEPTH, keys)).astype(np.float32),
            "v": rng.standard_normal((1, HEADS, keys, DEPTH)).astype(np.float32)}


def _fused(path: str) -> bool:
    return any('T.sblock("amp_attention_scores' in text for text in scheduled_kernels(path, "float32"))


@pytest.mark.parametrize("rows", [300, 1, 4])
def test_plain_attention_over_keys_no_vector_divides(tmp_path: Path, rows: int) -> None:
    """Whisper's pattern (scale applied to q and k before): 300 keys, padded to 304 and masked;
    also a decoding step's one query row (and a few: one block of all of them)."""
    path = _model(tmp_path / "plain.onnx", rows, 300, [], [], "scores")
    assert _fused(path)
    want, got = onnxruntime_and_amptool(path, _feeds(rows, 300))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scale_and_padding_mask_with_a_fully_masked_row(tmp_path: Path, dtype: str) -> None:
    """BERT's pattern with PyTorch's SDPA export: divide, add a mask, softmax, where(isnan, 0) (then
    a float16 build's cast of the probabilities). A row whose keys are all masked is NaN after the
    softmax and zeros after the where, in both."""
    mask = np.zeros((1, 1, 256, 256), np.float32)
    mask[..., 200:] = -np.inf  # padding keys
    mask[0, 0, 7, :] = -np.inf  # one query row sees nothing
    inits = [numpy_helper.from_array(np.array(np.sqrt(DEPTH), np.float32), "scale"),
             numpy_helper.from_array(mask, "mask")]
    steps = [helper.make_node("Div", ["scores", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["masked"])]
    path = _model(tmp_path / "masked.onnx", 256, 256, steps, inits, "masked", nan_to_zero=True)
    assert any('T.sblock("amp_attention_scores' in text for text in scheduled_kernels(path, dtype))
    want, got = onnxruntime_and_amptool(path, _feeds(256, 256), dtype)
    assert not np.isnan(want).any() and not np.asarray(want)[0, :, 7].any()
    assert not np.asarray(got)[0, :, 7].any()
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tolerance, atol=tolerance)


def test_causal_mask_and_a_scale_on_the_left(tmp_path: Path) -> None:
    """An LLM prefill's pattern: a constant times the scores, plus a [rows, keys] causal mask; and
    GPT-2's Cast of the float32 probabilities to float32."""
    causal = np.triu(np.full((264, 264), -1e9, np.float32), k=1)
    inits = [numpy_helper.from_array(np.array(0.125, np.float32), "scale"), numpy_helper.from_array(causal, "causal")]
    steps = [helper.make_node("Mul", ["scale", "scores"], ["scaled"]),
             helper.make_node("Add", ["scaled", "causal"], ["masked"])]
    path = _model(tmp_path / "causal.onnx", 264, 264, steps, inits, "masked", cast=True)
    assert _fused(path)
    want, got = onnxruntime_and_amptool(path, _feeds(264, 264))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_few_keys_are_left_as_three_kernels(tmp_path: Path) -> None:
    """Below MIN_KEYS the scores stay in cache between the three kernels, which are faster."""
    path = _model(tmp_path / "left.onnx", 300, MIN_KEYS - 16, [], [], "scores")
    assert not _fused(path)
    want, got = onnxruntime_and_amptool(path, _feeds(300, MIN_KEYS - 16))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_prime_query_count_is_padded_to_whole_blocks(tmp_path: Path) -> None:
    """ViT's case (197 tokens; 257 here, with a [rows, keys] mask read at the real rows only): q
    padded with zero rows to whole blocks, the extra rows cropped."""
    mask = np.random.default_rng(5).uniform(-3.0, 0.0, (257, 300)).astype(np.float32)
    path = _model(tmp_path / "prime.onnx", 257, 300, [helper.make_node("Add", ["scores", "mask"], ["masked"])],
                  [numpy_helper.from_array(mask, "mask")], "masked")
    kernels = "\n".join(scheduled_kernels(path, "float32"))
    assert 'T.sblock("amp_attention_scores' in kernels and "crop_queries" in kernels
    want, got = onnxruntime_and_amptool(path, _feeds(257, 300))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_probabilities_returned_too_are_left_as_they_are(tmp_path: Path) -> None:
    """The attention weights are an output: the fused kernel would not compute them."""
    path = _model(tmp_path / "weights.onnx", 300, 300, [], [], "scores", extra_outputs=("p",))
    assert not _fused(path)


def test_avx2_tiles_fit_sixteen_registers(tmp_path: Path) -> None:
    """An AVX2 target (8-lane vectors, 16 registers) builds the kernel with its tiles sized to it
    (the product takes v's columns two vectors at a time: whole, 6 rows × 4 vectors would need 24
    accumulators there); the values stay onnxruntime's."""
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = _model(tmp_path / "avx2.onnx", 300, 300, [], [], "scores")
    text = "\n".join(scheduled_kernels(path, "float32", mcpu="haswell"))
    assert 'T.sblock("amp_attention_scores' in text and "T.vectorized(T.int64(8))" in text
    feeds = _feeds(300, 300)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]
    build = build_model(ConvertConfig(model=path, dtype="float32", target_options=("-mcpu=haswell",)))
    np.testing.assert_allclose(build.compiled().run(feeds)["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("keys", [300, 1500])
def test_low_precision_builds_round_the_probabilities_as_three_kernels_do(tmp_path: Path, dtype: str,
                                                                            keys: int) -> None:
    """A float16/bfloat16 build is one kernel too, with the probabilities rounded to the low dtype
    before the product as the unfused build's cast does: its values are the three kernels' up to
    summation order (both compared with onnxruntime float32, the same error). 300 keys: the rounded
    weights a row pass of their own; 1500: inlined into the product."""
    from amptool.app.convert import ConvertConfig, build_model
    from amptool.compiler import cpu_attention

    path = _model(tmp_path / "low.onnx", 12, keys, [], [], "scores")
    assert any('T.sblock("amp_attention_scores' in text for text in scheduled_kernels(path, dtype))
    feeds = _feeds(12, keys)
    want, fused = onnxruntime_and_amptool(path, feeds, dtype)
    original = cpu_attention.MIN_KEYS
    cpu_attention.MIN_KEYS = 10**9
    try:
        unfused = build_model(ConvertConfig(model=path, dtype=dtype)).compiled().run(feeds)["y"]
    finally:
        cpu_attention.MIN_KEYS = original
    error = np.abs(np.asarray(unfused, np.float32) - want).max()
    apart = np.abs(np.asarray(fused, np.float32) - np.asarray(unfused, np.float32)).max()
    print(f"rounding error {error:.3g}, fused vs unfused {apart:.3g}")
    assert apart <= 0.25 * error  # (without the rounding, the two would be apart by about the error)


def test_bfloat16_attention_stays_three_kernels_where_amx_takes_its_products(tmp_path: Path) -> None:
    """On an AMX target a bfloat16 attention whose two products the tiles take (32 rows or more) is
    not fused: ``Q·Kᵀ`` and ``P·V`` run on AMX (``amx_plan.takes_attention``); elsewhere, and with
    fewer rows, it is one kernel. Lowered for named CPUs: no AMX needed here."""
    path = _model(tmp_path / "amx.onnx", 64, 300, [], [], "scores")
    amx = "\n".join(scheduled_kernels(path, "bfloat16", mcpu="sapphirerapids"))
    assert 'T.sblock("amp_attention_scores' not in amx and "amptool_amx_bf16_32x32" in amx
    assert any('T.sblock("amp_attention_scores' in t for t in scheduled_kernels(path, "bfloat16", mcpu="znver4"))
    few = _model(tmp_path / "few.onnx", 12, 300, [], [], "scores")
    assert any('T.sblock("amp_attention_scores' in t for t in scheduled_kernels(few, "bfloat16", mcpu="sapphirerapids"))
