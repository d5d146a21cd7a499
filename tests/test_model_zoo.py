"""Tests for amptool.testing.model_zoo: every model is valid, runs, and the traps are real."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import ModelProto, numpy_helper

from amptool.testing import model_zoo
from amptool.testing.model_zoo import ALL_BUILDERS

FP16_MAX = float(np.finfo(np.float16).max)

# Expected output shapes for the default (zero-arg) builders; "batch" is resolved at run time.
EXPECTED_OUTPUTS: dict[str, dict[str, tuple[int | str, ...]]] = {
    "tiny_cnn": {"probs": (1, 10)},
    "resnet_like": {"logits": (1, 10)},
    "transformer_encoder": {"last_hidden_state": (1, 16, 32), "pooled": (1, 32)},
    "mlp_with_bool_mask": {"y": (2, 4)},
    "batchnorm_huge_variance": {"features": (1, 8)},
    "scale_beyond_fp16": {"y": (1, 16)},
    "dynamic_batch_cnn": {"probs": ("batch", 10)},
}

DYNAMIC_BATCH = 3


def _session(model: ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _initializer(model: ModelProto, name: str) -> np.ndarray:
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    raise KeyError(name)


def _make_inputs(model: ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random feeds: floats ~N(0,1), ids within vocab, padding mask, random bools."""
    rng = np.random.default_rng(seed)
    init_names = {i.name for i in model.graph.initializer}
    vocab = 0
    if "embeddings.word_embeddings.weight" in init_names:
        vocab = _initializer(model, "embeddings.word_embeddings.weight").shape[0]
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        tt = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC_BATCH for d in tt.shape.dim)
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif value.name == "attention_mask":
            mask = np.ones(shape, dtype=np.int64)
            mask[:, -4:] = 0  # trailing padding
            feeds[value.name] = mask
        elif tt.elem_type == onnx.TensorProto.BOOL:
            feeds[value.name] = rng.random(shape) < 0.5
        elif tt.elem_type == onnx.TensorProto.FLOAT:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        else:  # pragma: no cover - zoo has no other input types
            raise AssertionError(f"unexpected input type for {value.name}")
    return feeds


def _run(model: ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = _session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.fixture(scope="module", params=sorted(ALL_BUILDERS))
def built(request: pytest.FixtureRequest) -> tuple[str, ModelProto]:
    return request.param, ALL_BUILDERS[request.param]()


def test_builders_registry() -> None:
    assert set(ALL_BUILDERS) == set(EXPECTED_OUTPUTS)
    for builder in ALL_BUILDERS.values():
        assert callable(builder)


def test_model_is_valid(built: tuple[str, ModelProto]) -> None:
    name, model = built
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    opsets = {op.domain: op.version for op in model.opset_import}
    assert opsets == {"": 17}
    node_names = [n.name for n in model.graph.node]
    assert all(node_names), f"{name}: every node needs a name"
    assert len(set(node_names)) == len(node_names), f"{name}: node names must be unique"
    assert all(n.startswith("/") for n in node_names)


def test_model_runs_and_outputs_are_finite(built: tuple[str, ModelProto]) -> None:
    name, model = built
    outputs = _run(model, _make_inputs(model))
    expected = EXPECTED_OUTPUTS[name]
    assert list(outputs) == list(expected)
    for out_name, shape in expected.items():
        resolved = tuple(DYNAMIC_BATCH if d == "batch" else d for d in shape)
        value = outputs[out_name]
        assert value.dtype == np.float32
        np.testing.assert_equal(value.shape, resolved)
        np.testing.assert_array_equal(np.isfinite(value), True, err_msg=f"{name}/{out_name} not finite")


def test_builders_are_deterministic(built: tuple[str, ModelProto]) -> None:
    name, model = built
    assert ALL_BUILDERS[name]().SerializeToString() == model.SerializeToString()


def test_tiny_cnn_is_small_and_softmax_normalised() -> None:
    model = model_zoo.tiny_cnn()
    assert model.ByteSize() < 100 * 1024
    probs = _run(model, _make_inputs(model))["probs"]
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_dynamic_batch_cnn_symbolic_dims() -> None:
    model = model_zoo.dynamic_batch_cnn()
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # Same weights as tiny_cnn: each batch row matches the static model.
    static = model_zoo.tiny_cnn()
    x = np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)
    batched = _run(model, {"input": x})["probs"]
    for i in range(2):
        single = _run(static, {"input": x[i : i + 1]})["probs"]
        np.testing.assert_allclose(batched[i : i + 1], single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("width", "blocks", "image"), [(8, 1, 16), (16, 3, 32)])
def test_resnet_like_parameters(width: int, blocks: int, image: int) -> None:
    model = model_zoo.resnet_like(width=width, blocks=blocks, image=image)
    x = np.random.default_rng(1).standard_normal((1, 3, image, image)).astype(np.float32)
    logits = _run(model, {"input": x})["logits"]
    np.testing.assert_equal(logits.shape, (1, 10))
    np.testing.assert_array_equal(np.isfinite(logits), True)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Add") == 2 * blocks
    assert ops.count("Conv") == 1 + 4 * blocks + 1  # stem + 2 per block + one projection


def test_transformer_mask_hides_padding() -> None:
    model = model_zoo.transformer_encoder()
    feeds = _make_inputs(model)
    out_a = _run(model, feeds)
    ids_b = feeds["input_ids"].copy()
    ids_b[:, -4:] = (ids_b[:, -4:] + 1) % 100  # change only padded tokens
    out_b = _run(model, {**feeds, "input_ids": ids_b})
    np.testing.assert_allclose(
        out_a["last_hidden_state"][:, :-4], out_b["last_hidden_state"][:, :-4], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(out_a["pooled"], out_b["pooled"], rtol=1e-5, atol=1e-6)
    assert np.abs(out_a["pooled"]).max() <= 1.0


def test_transformer_custom_sizes() -> None:
    model = model_zoo.transformer_encoder(vocab=50, seq=8, d_model=48, heads=6, layers=1)
    rng = np.random.default_rng(3)
    feeds = {
        "input_ids": rng.integers(0, 50, size=(1, 8), dtype=np.int64),
        "attention_mask": np.array([[1] * 6 + [0] * 2], dtype=np.int64),
    }
    out = _run(model, feeds)
    np.testing.assert_equal(out["last_hidden_state"].shape, (1, 8, 48))
    np.testing.assert_equal(out["pooled"].shape, (1, 48))
    with pytest.raises(ValueError):
        model_zoo.transformer_encoder(d_model=30, heads=4)


def test_mlp_with_bool_mask_respects_mask() -> None:
    model = model_zoo.mlp_with_bool_mask()
    assert model.graph.input[1].type.tensor_type.elem_type == onnx.TensorProto.BOOL
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    all_off = _run(model, {"x": x, "mask": np.zeros((2, 8), dtype=bool)})["y"]
    np.testing.assert_array_equal(all_off, 0.0)
    w1 = _initializer(model, "fc1.weight")
    w2 = _initializer(model, "fc2.weight")
    mask = np.random.default_rng(5).random((2, 8)) < 0.5
    ref = np.maximum(np.where(mask, x, 0.0) @ w1, 0.0) @ w2
    np.testing.assert_allclose(_run(model, {"x": x, "mask": mask})["y"], ref, rtol=1e-5, atol=1e-6)


def test_batchnorm_huge_variance_trap_is_real() -> None:
    model = model_zoo.batchnorm_huge_variance()
    var = _initializer(model, "bn.running_var")
    scale = _initializer(model, "bn.weight")
    assert var.max() > 1e7
    with np.errstate(over="ignore"):
        var16 = var.astype(np.float16)
    assert np.isinf(var16).any(), "casting the BN variance to fp16 must overflow"
    np.testing.assert_array_equal(np.isinf(var16), var > FP16_MAX)
    # The matching scale (~sqrt(var)) is representable, so only the variance is the problem.
    np.testing.assert_array_equal(np.isfinite(scale.astype(np.float16)), True)
    features = _run(model, _make_inputs(model))["features"]
    np.testing.assert_array_equal(np.isfinite(features), True)
    assert np.abs(features).max() < 100.0, "fp32 output should be O(1)"


def test_scale_beyond_fp16_fp32_is_finite_but_fp16_overflows() -> None:
    model = model_zoo.scale_beyond_fp16()
    feeds = _make_inputs(model)
    y = _run(model, feeds)["y"]
    np.testing.assert_array_equal(np.isfinite(y), True)
    w = _initializer(model, "fc.weight")
    up = _initializer(model, "scale_up")
    down = _initializer(model, "scale_down")
    np.testing.assert_allclose(y, np.maximum((feeds["x"] @ w) * up * down, 0.0), rtol=1e-5, atol=1e-6)
    # In fp16 the constant itself and the intermediate product overflow.
    with np.errstate(over="ignore"):
        assert np.isinf(up.astype(np.float16))
        mm16 = feeds["x"].astype(np.float16) @ w.astype(np.float16)
        y16 = np.maximum(mm16 * up.astype(np.float16) * down.astype(np.float16), np.float16(0))
    assert np.isinf(y16).any()


def test_all_builders_zero_arg_signature() -> None:
    builders: dict[str, Callable[[], ModelProto]] = ALL_BUILDERS
    for builder in builders.values():
        assert isinstance(builder(), ModelProto)
