"""Small, realistic ONNX models built in code for amptool's tests and demos.

Every builder returns an :class:`onnx.ModelProto` that

* uses opset 17 (default domain) and IR version 8,
* passes ``onnx.checker.check_model(model, full_check=True)``,
* runs in onnxruntime on CPU,
* gives every node a unique, PyTorch-exporter-style ``name``
  (for example ``/layer1/0/conv1/Conv``) and names initializers like
  PyTorch parameters (for example ``layer1.0.conv1.weight``),
* is deterministic: weights come from a fixed-seed NumPy generator with
  realistic initialisation (Kaiming/He for convolutions, Xavier or
  ``N(0, 0.02)`` for transformer layers, BatchNorm statistics that look like
  those of a trained network).

Only ``onnx``, ``onnx.helper``, ``onnx.numpy_helper`` and NumPy are used, so
the zoo needs no framework or download.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

__all__ = [
    "OPSET",
    "IR_VERSION",
    "tiny_cnn",
    "resnet_like",
    "transformer_encoder",
    "mlp_with_bool_mask",
    "batchnorm_huge_variance",
    "scale_beyond_fp16",
    "dynamic_batch_cnn",
    "HUGE_VARIANCE_CHANNELS",
    "ALL_BUILDERS",
]

OPSET: int = 17
IR_VERSION: int = 8

_PRODUCER = "amptool.testing.model_zoo"

Dim = int | str


# --------------------------------------------------------------------------- #
# Graph-building helper
# --------------------------------------------------------------------------- #
class _GraphBuilder:
    """Collects nodes and initializers and enforces unique, meaningful names.

    Node outputs are named ``<node name>_output_0`` as the PyTorch exporter
    does, so tensor names stay readable in error messages and reports.
    """

    def __init__(self, seed: int) -> None:
        self.rng: np.random.Generator = np.random.default_rng(seed)
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._node_names: set[str] = set()
        self._tensor_names: set[str] = set()
        self._constants: dict[str, str] = {}

    # -- tensors ----------------------------------------------------------- #
    def _claim_tensor_name(self, name: str) -> None:
        if name in self._tensor_names:
            raise ValueError(f"duplicate tensor name {name!r}")
        self._tensor_names.add(name)

    def declare_input(self, name: str) -> str:
        """Reserve the name of a graph input."""
        self._claim_tensor_name(name)
        return name

    def initializer(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer called ``name`` and return the name."""
        self._claim_tensor_name(name)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C", copy=True), name=name))
        return name

    def constant(self, name: str, value: Any, dtype: type[np.generic] = np.float32) -> str:
        """Return a (cached) constant initializer; scalars get shape ``[]``."""
        if name in self._constants:
            return self._constants[name]
        self._constants[name] = self.initializer(name, np.asarray(value, dtype=dtype))
        return name

    # -- nodes ------------------------------------------------------------- #
    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        output: str | None = None,
        **attrs: Any,
    ) -> str:
        """Append a single-output node named ``name``; return its output name."""
        if name in self._node_names:
            raise ValueError(f"duplicate node name {name!r}")
        self._node_names.add(name)
        out = output if output is not None else f"{name}_output_0"
        self._claim_tensor_name(out)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    # -- model ------------------------------------------------------------- #
    def make_model(
        self,
        graph_name: str,
        inputs: Sequence[ValueInfoProto],
        outputs: Sequence[ValueInfoProto],
        doc: str,
    ) -> ModelProto:
        """Assemble the graph into an opset-17 / IR-8 model and validate it."""
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            list(inputs),
            list(outputs),
            initializer=self.initializers,
            doc_string=doc,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=_PRODUCER,
            producer_version="1.0",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def _scope(param: str) -> str:
    """``layer1.0.conv1`` -> ``/layer1/0/conv1`` (PyTorch exporter scope)."""
    return "/" + param.replace(".", "/")


# --------------------------------------------------------------------------- #
# Parameter initialisers
# --------------------------------------------------------------------------- #
def _kaiming_conv(rng: np.random.Generator, cout: int, cin: int, k: int) -> np.ndarray:
    """He/Kaiming-normal weights for a ReLU conv (fan_in mode)."""
    std = math.sqrt(2.0 / (cin * k * k))
    return rng.normal(0.0, std, size=(cout, cin, k, k)).astype(np.float32)


def _xavier_uniform(rng: np.random.Generator, fan_in: int, fan_out: int, shape: Sequence[int]) -> np.ndarray:
    """Glorot/Xavier-uniform weights."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=tuple(shape)).astype(np.float32)


def _linear_uniform(rng: np.random.Generator, fan_in: int, shape: Sequence[int]) -> np.ndarray:
    """PyTorch ``nn.Linear`` default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=tuple(shape)).astype(np.float32)


def _bn_params(rng: np.random.Generator, c: int) -> dict[str, np.ndarray]:
    """BatchNorm parameters resembling a trained network."""
    return {
        "weight": rng.normal(1.0, 0.1, size=c).astype(np.float32),
        "bias": rng.normal(0.0, 0.1, size=c).astype(np.float32),
        "running_mean": rng.normal(0.0, 0.1, size=c).astype(np.float32),
        "running_var": rng.uniform(0.5, 1.5, size=c).astype(np.float32),
    }


# --------------------------------------------------------------------------- #
# Layer helpers
# --------------------------------------------------------------------------- #
def _conv(
    b: _GraphBuilder,
    x: str,
    param: str,
    cin: int,
    cout: int,
    k: int,
    stride: int = 1,
    pad: int | None = None,
    bias: bool = False,
) -> str:
    """Conv2d with He init; no bias by default because a BatchNorm follows."""
    p = k // 2 if pad is None else pad
    inputs = [b.initializer(f"{param}.weight", _kaiming_conv(b.rng, cout, cin, k))]
    if bias:
        inputs.append(b.initializer(f"{param}.bias", _linear_uniform(b.rng, cin * k * k, (cout,))))
    return b.node(
        "Conv",
        [x, *inputs],
        f"{_scope(param)}/Conv",
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[p, p, p, p],
        dilations=[1, 1],
        group=1,
    )


def _batchnorm(
    b: _GraphBuilder,
    x: str,
    param: str,
    params: dict[str, np.ndarray],
    epsilon: float = 1e-5,
) -> str:
    """Inference-mode BatchNormalization (single output)."""
    names = [b.initializer(f"{param}.{key}", params[key]) for key in ("weight", "bias", "running_mean", "running_var")]
    return b.node(
        "BatchNormalization",
        [x, *names],
        f"{_scope(param)}/BatchNormalization",
        epsilon=epsilon,
        momentum=0.9,
    )


def _gemm_classifier(b: _GraphBuilder, x: str, param: str, fan_in: int, n_out: int, output: str | None = None) -> str:
    """``nn.Linear`` exported as Gemm with ``transB=1`` (weight is [out, in])."""
    w = b.initializer(f"{param}.weight", _linear_uniform(b.rng, fan_in, (n_out, fan_in)))
    bias = b.initializer(f"{param}.bias", _linear_uniform(b.rng, fan_in, (n_out,)))
    return b.node("Gemm", [x, w, bias], f"{_scope(param)}/Gemm", output=output, alpha=1.0, beta=1.0, transB=1)


# --------------------------------------------------------------------------- #
# CNNs
# --------------------------------------------------------------------------- #
def _build_tiny_cnn(batch: Dim, graph_name: str, doc: str) -> ModelProto:
    """Shared body of :func:`tiny_cnn` and :func:`dynamic_batch_cnn`."""
    b = _GraphBuilder(seed=0)
    x = b.declare_input("input")

    h = _conv(b, x, "features.0", 3, 8, 3)
    h = _batchnorm(b, h, "features.1", _bn_params(b.rng, 8))
    h = b.node("Relu", [h], "/features/2/Relu")
    h = b.node("MaxPool", [h], "/features/3/MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    h = _conv(b, h, "features.4", 8, 16, 3)
    h = _batchnorm(b, h, "features.5", _bn_params(b.rng, 16))
    h = b.node("Relu", [h], "/features/6/Relu")
    h = b.node("GlobalAveragePool", [h], "/avgpool/GlobalAveragePool")
    h = b.node("Flatten", [h], "/Flatten", axis=1)
    h = _gemm_classifier(b, h, "classifier", 16, 10)
    b.node("Softmax", [h], "/Softmax", output="probs", axis=-1)

    return b.make_model(
        graph_name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 10])],
        doc,
    )


def tiny_cnn() -> ModelProto:
    """Smallest end-to-end image classifier (the shipped demo model, < 100 KB).

    Exists to exercise the common CNN path (Conv, BatchNormalization, Relu,
    MaxPool, GlobalAveragePool, Flatten, Gemm, Softmax) quickly.

    Input ``input`` float32 [1, 3, 32, 32]; output ``probs`` float32 [1, 10].
    """
    return _build_tiny_cnn(1, "tiny_cnn", "Tiny CNN classifier: 2x(Conv+BN+Relu), pooling, Gemm, Softmax.")


def dynamic_batch_cnn() -> ModelProto:
    """:func:`tiny_cnn` with a symbolic batch dimension ``batch``.

    Exists to check that conversion keeps symbolic shapes (``dim_param``)
    intact and that the converted model runs for any batch size.

    Input ``input`` float32 [batch, 3, 32, 32]; output ``probs`` float32 [batch, 10].
    """
    return _build_tiny_cnn("batch", "dynamic_batch_cnn", "Tiny CNN classifier with a symbolic batch dimension.")


def _basic_block(b: _GraphBuilder, x: str, param: str, cin: int, cout: int, stride: int) -> str:
    """ResNet BasicBlock: conv-bn-relu-conv-bn + (identity | 1x1 projection), relu."""
    scope = _scope(param)
    h = _conv(b, x, f"{param}.conv1", cin, cout, 3, stride=stride)
    h = _batchnorm(b, h, f"{param}.bn1", _bn_params(b.rng, cout))
    h = b.node("Relu", [h], f"{scope}/relu/Relu")
    h = _conv(b, h, f"{param}.conv2", cout, cout, 3)
    h = _batchnorm(b, h, f"{param}.bn2", _bn_params(b.rng, cout))
    if stride != 1 or cin != cout:
        shortcut = _conv(b, x, f"{param}.downsample.0", cin, cout, 1, stride=stride, pad=0)
        shortcut = _batchnorm(b, shortcut, f"{param}.downsample.1", _bn_params(b.rng, cout))
    else:
        shortcut = x
    h = b.node("Add", [h, shortcut], f"{scope}/Add")
    return b.node("Relu", [h], f"{scope}/relu_1/Relu")


def resnet_like(width: int = 16, blocks: int = 2, image: int = 32) -> ModelProto:
    """ResNet-style classifier with identity and projection shortcuts.

    Exists to exercise residual Adds (where fp16 error accumulates across
    blocks) and strided 1x1 projection shortcuts. Layout: stem Conv+BN+Relu
    (``width`` channels); ``layer1`` with ``blocks`` BasicBlocks at ``width``
    channels, stride 1 (identity shortcuts); ``layer2`` with ``blocks``
    BasicBlocks at ``2*width`` channels whose first block has stride 2 and a
    1x1 Conv+BN projection shortcut; GlobalAveragePool, Flatten, Gemm -> 10.

    Input ``input`` float32 [1, 3, image, image]; output ``logits`` float32 [1, 10].
    """
    if width < 1 or blocks < 1 or image < 2:
        raise ValueError("width and blocks must be >= 1 and image >= 2")
    b = _GraphBuilder(seed=1)
    x = b.declare_input("input")

    h = _conv(b, x, "conv1", 3, width, 3)
    h = _batchnorm(b, h, "bn1", _bn_params(b.rng, width))
    h = b.node("Relu", [h], "/relu/Relu")

    cin = width
    for stage, (cout, first_stride) in enumerate([(width, 1), (2 * width, 2)], start=1):
        for i in range(blocks):
            stride = first_stride if i == 0 else 1
            h = _basic_block(b, h, f"layer{stage}.{i}", cin, cout, stride)
            cin = cout

    h = b.node("GlobalAveragePool", [h], "/avgpool/GlobalAveragePool")
    h = b.node("Flatten", [h], "/Flatten", axis=1)
    _gemm_classifier(b, h, "fc", cin, 10, output="logits")

    return b.make_model(
        "resnet_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        f"ResNet-like classifier: width={width}, blocks per stage={blocks}, image={image}.",
    )


# --------------------------------------------------------------------------- #
# Transformer encoder
# --------------------------------------------------------------------------- #
def _layernorm(b: _GraphBuilder, x: str, param: str, d: int, output: str | None = None) -> str:
    """Opset-17 LayerNormalization over the last axis (near-identity affine)."""
    gamma = b.initializer(f"{param}.weight", b.rng.normal(1.0, 0.02, size=d).astype(np.float32))
    beta = b.initializer(f"{param}.bias", b.rng.normal(0.0, 0.02, size=d).astype(np.float32))
    return b.node(
        "LayerNormalization",
        [x, gamma, beta],
        f"{_scope(param)}/LayerNormalization",
        output=output,
        axis=-1,
        epsilon=1e-5,
    )


def _linear(b: _GraphBuilder, x: str, param: str, d_in: int, d_out: int) -> str:
    """``nn.Linear`` exported as MatMul (weight stored [in, out]) + Add bias."""
    w = b.initializer(f"{param}.weight", _xavier_uniform(b.rng, d_in, d_out, (d_in, d_out)))
    bias = b.initializer(f"{param}.bias", b.rng.normal(0.0, 0.02, size=d_out).astype(np.float32))
    scope = _scope(param)
    h = b.node("MatMul", [x, w], f"{scope}/MatMul")
    return b.node("Add", [h, bias], f"{scope}/Add")


def _gelu_erf(b: _GraphBuilder, x: str, scope: str) -> str:
    """Exact GELU as exported: ``0.5 * x * (1 + Erf(x / sqrt(2)))``."""
    sqrt2 = b.constant("const.sqrt_2", math.sqrt(2.0))
    one = b.constant("const.one", 1.0)
    half = b.constant("const.half", 0.5)
    h = b.node("Div", [x, sqrt2], f"{scope}/Div")
    h = b.node("Erf", [h], f"{scope}/Erf")
    h = b.node("Add", [h, one], f"{scope}/Add")
    h = b.node("Mul", [x, h], f"{scope}/Mul")
    return b.node("Mul", [h, half], f"{scope}/Mul_1")


def _self_attention(
    b: _GraphBuilder, x: str, mask_bias: str, param: str, seq: int, d_model: int, heads: int
) -> str:
    """Multi-head self-attention with additive mask bias."""
    head_dim = d_model // heads
    scope = _scope(param)
    split_shape = b.constant(f"{param}.split_heads_shape", [1, seq, heads, head_dim], np.int64)
    merge_shape = b.constant(f"{param}.merge_heads_shape", [1, seq, d_model], np.int64)
    scale = b.constant("const.sqrt_head_dim", math.sqrt(head_dim))

    def heads_of(name: str, perm: list[int]) -> str:
        h = _linear(b, x, f"{param}.{name}", d_model, d_model)
        h = b.node("Reshape", [h, split_shape], f"{scope}/{name}/Reshape")
        return b.node("Transpose", [h], f"{scope}/{name}/Transpose", perm=perm)

    q = heads_of("query", [0, 2, 1, 3])  # [1, H, S, Dh]
    k = heads_of("key", [0, 2, 3, 1])  # [1, H, Dh, S]
    v = heads_of("value", [0, 2, 1, 3])  # [1, H, S, Dh]

    scores = b.node("MatMul", [q, k], f"{scope}/MatMul")  # [1, H, S, S]
    scores = b.node("Div", [scores, scale], f"{scope}/Div")
    scores = b.node("Add", [scores, mask_bias], f"{scope}/Add")
    probs = b.node("Softmax", [scores], f"{scope}/Softmax", axis=-1)
    ctx = b.node("MatMul", [probs, v], f"{scope}/MatMul_1")  # [1, H, S, Dh]
    ctx = b.node("Transpose", [ctx], f"{scope}/Transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, merge_shape], f"{scope}/Reshape")
    return _linear(b, ctx, f"{param}.out_proj", d_model, d_model)


def transformer_encoder(
    vocab: int = 100,
    seq: int = 16,
    d_model: int = 32,
    heads: int = 4,
    layers: int = 2,
) -> ModelProto:
    """Pre-norm BERT-style encoder with padding mask and tanh pooler.

    Exists to exercise the transformer path: Gather embeddings, opset-17
    LayerNormalization, attention Softmax with a large negative (-10000) mask
    bias, Erf-based GELU, residual Adds, int64 inputs that must stay integer,
    and two graph outputs.

    Inputs ``input_ids`` int64 [1, seq] and ``attention_mask`` int64 [1, seq]
    (1 = keep, 0 = pad). Outputs ``last_hidden_state`` float32
    [1, seq, d_model] and ``pooled`` float32 [1, d_model].
    """
    if d_model % heads != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
    if min(vocab, seq, d_model, heads, layers) < 1:
        raise ValueError("all sizes must be >= 1")
    b = _GraphBuilder(seed=2)
    ids = b.declare_input("input_ids")
    mask = b.declare_input("attention_mask")

    # Embeddings: token Gather + learned absolute positions, then LayerNorm.
    word = b.initializer(
        "embeddings.word_embeddings.weight", b.rng.normal(0.0, 0.02, size=(vocab, d_model)).astype(np.float32)
    )
    pos = b.initializer(
        "embeddings.position_embeddings.weight", b.rng.normal(0.0, 0.02, size=(seq, d_model)).astype(np.float32)
    )
    h = b.node("Gather", [word, ids], "/embeddings/word_embeddings/Gather", axis=0)  # [1, S, D]
    h = b.node("Add", [h, pos], "/embeddings/Add")
    h = _layernorm(b, h, "embeddings.LayerNorm", d_model)

    # Additive attention bias: (1 - float(mask)) * -10000, shaped [1, 1, 1, S].
    unsq_axes = b.constant("const.mask_unsqueeze_axes", [1, 2], np.int64)
    m = b.node("Unsqueeze", [mask, unsq_axes], "/mask/Unsqueeze")
    m = b.node("Cast", [m], "/mask/Cast", to=TensorProto.FLOAT)
    m = b.node("Sub", [b.constant("const.one", 1.0), m], "/mask/Sub")
    mask_bias = b.node("Mul", [m, b.constant("const.mask_min", -10000.0)], "/mask/Mul")

    for layer in range(layers):
        param = f"encoder.layer.{layer}"
        scope = _scope(param)
        a = _layernorm(b, h, f"{param}.attention_norm", d_model)
        a = _self_attention(b, a, mask_bias, f"{param}.attention", seq, d_model, heads)
        h = b.node("Add", [h, a], f"{scope}/Add")

        f = _layernorm(b, h, f"{param}.mlp_norm", d_model)
        f = _linear(b, f, f"{param}.mlp.fc1", d_model, 4 * d_model)
        f = _gelu_erf(b, f, f"{scope}/mlp/act")
        f = _linear(b, f, f"{param}.mlp.fc2", 4 * d_model, d_model)
        h = b.node("Add", [h, f], f"{scope}/Add_1")

    h = _layernorm(b, h, "final_norm", d_model, output="last_hidden_state")

    # Pooler: tanh(Linear(hidden[:, 0])).
    first = b.node(
        "Gather", [h, b.constant("const.first_token_index", 0, np.int64)], "/pooler/Gather", axis=1
    )  # [1, D]
    w = b.initializer("pooler.dense.weight", _xavier_uniform(b.rng, d_model, d_model, (d_model, d_model)))
    bias = b.initializer("pooler.dense.bias", b.rng.normal(0.0, 0.02, size=d_model).astype(np.float32))
    p = b.node("Gemm", [first, w, bias], "/pooler/dense/Gemm", alpha=1.0, beta=1.0, transB=1)
    b.node("Tanh", [p], "/pooler/activation/Tanh", output="pooled")

    return b.make_model(
        "transformer_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq]),
        ],
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, d_model]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, d_model]),
        ],
        f"Pre-norm transformer encoder: vocab={vocab}, seq={seq}, d_model={d_model}, "
        f"heads={heads}, layers={layers}.",
    )


# --------------------------------------------------------------------------- #
# Edge-case models
# --------------------------------------------------------------------------- #
def mlp_with_bool_mask() -> ModelProto:
    """Two-layer MLP whose input is gated by a bool mask via Where.

    Exists to test bool graph inputs: a precision converter must leave the
    bool ``mask`` (and Where's condition) untouched while converting floats.

    Inputs ``x`` float32 [2, 8] and ``mask`` bool [2, 8]; output ``y`` float32 [2, 4].
    """
    b = _GraphBuilder(seed=3)
    x = b.declare_input("x")
    mask = b.declare_input("mask")
    h = b.node("Where", [mask, x, b.constant("const.zero", 0.0)], "/Where")
    w1 = b.initializer("fc1.weight", _xavier_uniform(b.rng, 8, 16, (8, 16)))
    w2 = b.initializer("fc2.weight", _xavier_uniform(b.rng, 16, 4, (16, 4)))
    h = b.node("MatMul", [h, w1], "/fc1/MatMul")
    h = b.node("Relu", [h], "/relu/Relu")
    b.node("MatMul", [h, w2], "/fc2/MatMul", output="y")
    return b.make_model(
        "mlp_with_bool_mask",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        "MLP with a bool mask input applied through Where.",
    )


#: Channels of :func:`batchnorm_huge_variance` whose running variance is ~1e8.
HUGE_VARIANCE_CHANNELS: tuple[int, ...] = (1, 4, 6)


def batchnorm_huge_variance() -> ModelProto:
    """Conv + BatchNorm whose running variance is ~1e8 on some channels.

    Reproduces the fp16 range trap: the variance (far beyond the fp16 max of
    65504) becomes inf when cast to float16, so ``x / sqrt(var + eps)``
    collapses to 0 even though fp32 is fine. The BN scale on those channels is
    ~sqrt(var) (~1e4, representable in fp16) so the fp32 output stays O(1).

    Input ``input`` float32 [1, 3, 16, 16]; output ``features`` float32 [1, 8].
    """
    b = _GraphBuilder(seed=4)
    x = b.declare_input("input")
    h = _conv(b, x, "conv", 3, 8, 3)

    bn = _bn_params(b.rng, 8)
    for c in HUGE_VARIANCE_CHANNELS:
        var = float(b.rng.uniform(0.5, 2.0)) * 1e8
        bn["running_var"][c] = var
        bn["weight"][c] = math.sqrt(var) * float(b.rng.uniform(0.5, 1.5))
    h = _batchnorm(b, h, "bn", bn)
    h = b.node("Relu", [h], "/relu/Relu")
    h = b.node("GlobalAveragePool", [h], "/avgpool/GlobalAveragePool")
    b.node("Flatten", [h], "/Flatten", output="features", axis=1)
    return b.make_model(
        "batchnorm_huge_variance",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8])],
        "Conv + BatchNorm with running variance ~1e8 on some channels (fp16 range trap).",
    )


def scale_beyond_fp16() -> ModelProto:
    """MatMul followed by x1e5 then x1e-5: a no-op in fp32, inf in fp16.

    Exists to test overflow detection: 1e5 itself exceeds the fp16 max
    (65504) and so does the intermediate product, so an all-fp16 model
    produces inf although the fp32 model is exact and finite.

    Input ``x`` float32 [1, 16]; output ``y`` float32 [1, 16].
    """
    b = _GraphBuilder(seed=5)
    x = b.declare_input("x")
    w = b.initializer("fc.weight", _xavier_uniform(b.rng, 16, 16, (16, 16)))
    h = b.node("MatMul", [x, w], "/fc/MatMul")
    h = b.node("Mul", [h, b.constant("scale_up", 1e5)], "/scale_up/Mul")
    h = b.node("Mul", [h, b.constant("scale_down", 1e-5)], "/scale_down/Mul")
    b.node("Relu", [h], "/relu/Relu", output="y")
    return b.make_model(
        "scale_beyond_fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        "MatMul then Mul by 1e5 and 1e-5: fine in fp32, overflows in fp16.",
    )


ALL_BUILDERS: dict[str, Callable[[], ModelProto]] = {
    "tiny_cnn": tiny_cnn,
    "resnet_like": resnet_like,
    "transformer_encoder": transformer_encoder,
    "mlp_with_bool_mask": mlp_with_bool_mask,
    "batchnorm_huge_variance": batchnorm_huge_variance,
    "scale_beyond_fp16": scale_beyond_fp16,
    "dynamic_batch_cnn": dynamic_batch_cnn,
}
