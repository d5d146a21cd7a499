"""Benchmark models built in code: a torchvision-shaped ResNet-50 and a BERT-base-shaped encoder.

No download: weights are seeded Kaiming/Xavier draws and BatchNorm statistics that look
trained, so activations stay in float16 range (unlike the onnx wheel's ``light_*`` models,
whose constant weights overflow it). Timing does not depend on the values.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amptool.testing import model_zoo

OPSET = 17


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0
        self._names: set[str] = set()

    def weight(self, name: str, array: np.ndarray | np.floating) -> str:
        if name not in self._names:
            self._names.add(name)
            self.inits.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        self._count += 1
        name = f"/{op}_{self._count}"
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool | str = True,
                group: int = 1) -> str:
        std = math.sqrt(2.0 / (cin // group * k * k))
        w = self.weight(f"w{self._count}", self.rng.normal(0.0, std, (cout, cin // group, k, k)))
        h = self.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        bn = [self.weight(f"bn{self._count}.{p}", v) for p, v in (
            ("scale", self.rng.normal(1.0, 0.1, cout)), ("bias", self.rng.normal(0.0, 0.1, cout)),
            ("mean", self.rng.normal(0.0, 0.1, cout)), ("var", self.rng.uniform(0.5, 1.5, cout)))]
        h = self.node("BatchNormalization", [h, *bn], epsilon=1e-5)
        if relu == "relu6":
            low, high = self.weight("relu6.min", np.float32(0.0)), self.weight("relu6.max", np.float32(6.0))
            return self.node("Clip", [h, low, high])
        return self.node("Relu", [h]) if relu else h


def resnet50(batch: int = 1, image: int = 224) -> onnx.ModelProto:
    """ResNet-50 v1.5 (torchvision layout: stride on the 3x3 conv), 1000 classes."""
    g = _Graph(seed=50)
    h = g.conv_bn("input", 3, 64, 7, stride=2)
    h = g.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = g.conv_bn(h, cin, width, 1)
            y = g.conv_bn(y, width, width, 3, stride=s)
            y = g.conv_bn(y, width, width * 4, 1, relu=False)
            short = g.conv_bn(h, cin, width * 4, 1, stride=s, relu=False) if i == 0 else h
            h = g.node("Relu", [g.node("Add", [y, short])])
            cin = width * 4
    h = g.node("GlobalAveragePool", [h])
    h = g.node("Flatten", [h], axis=1)
    bound = 1.0 / math.sqrt(cin)
    w = g.weight("fc.weight", g.rng.uniform(-bound, bound, (1000, cin)))
    b = g.weight("fc.bias", g.rng.uniform(-bound, bound, (1000,)))
    g.nodes.append(helper.make_node("Gemm", [h, w, b], ["logits"], name="/fc/Gemm", transB=1))
    return _model(g, "resnet50", batch, image)


def _model(g: _Graph, name: str, batch: int, image: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 1000])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mobilenet_v2(batch: int = 1, image: int = 224) -> onnx.ModelProto:
    """MobileNetV2 1.0 (torchvision layout): inverted residuals with depthwise 3x3 convs, ReLU6."""
    g = _Graph(seed=2)
    h = g.conv_bn("input", 3, 32, 3, stride=2, relu="relu6")
    cin = 32
    for expand, cout, repeat, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(repeat):
            s = stride if i == 0 else 1
            hidden = cin * expand
            y = g.conv_bn(h, cin, hidden, 1, relu="relu6") if expand != 1 else h
            y = g.conv_bn(y, hidden, hidden, 3, stride=s, relu="relu6", group=hidden)
            y = g.conv_bn(y, hidden, cout, 1, relu=False)
            h = g.node("Add", [y, h]) if s == 1 and cin == cout else y
            cin = cout
    h = g.conv_bn(h, cin, 1280, 1, relu="relu6")
    h = g.node("GlobalAveragePool", [h])
    h = g.node("Flatten", [h], axis=1)
    bound = 1.0 / math.sqrt(1280)
    w = g.weight("classifier.weight", g.rng.uniform(-bound, bound, (1000, 1280)))
    b = g.weight("classifier.bias", g.rng.uniform(-bound, bound, (1000,)))
    g.nodes.append(helper.make_node("Gemm", [h, w, b], ["logits"], name="/classifier/Gemm", transB=1))
    return _model(g, "mobilenet_v2", batch, image)


def bert_base(layers: int = 12, seq: int = 128) -> onnx.ModelProto:
    """BERT-base shape (d_model 768, 12 heads, GELU MLP 3072) from amptool's model zoo."""
    return model_zoo.transformer_encoder(vocab=30522, seq=seq, d_model=768, heads=12, layers=layers)


def bert_mini(layers: int = 4, seq: int = 128) -> onnx.ModelProto:
    """BERT-mini shape (d_model 256, 4 heads, GELU MLP 1024, 4 layers): the export on which bench's
    onnxruntime time was ~4x too slow before each runtime got a process of its own."""
    return model_zoo.transformer_encoder(vocab=30522, seq=seq, d_model=256, heads=4, layers=layers)


def lstm_long(steps: int = 300, features: int = 80, hidden: int = 256) -> onnx.ModelProto:
    """Two stacked bidirectional LSTM nodes over ``steps`` frames (a speech or OCR encoder's
    shape, as PyTorch exports it: layer 2 reads layer 1's Y with the directions concatenated),
    then a Linear to 30 classes. amptool unrolls each step: the model for convert time."""
    g = _Graph(seed=5)
    x = "frames"
    width = features
    for layer in range(2):
        scale = 1.0 / math.sqrt(hidden)
        w = g.weight(f"lstm{layer}.W", g.rng.uniform(-scale, scale, (2, 4 * hidden, width)))
        r = g.weight(f"lstm{layer}.R", g.rng.uniform(-scale, scale, (2, 4 * hidden, hidden)))
        b = g.weight(f"lstm{layer}.B", g.rng.uniform(-scale, scale, (2, 8 * hidden)))
        y = g.node("LSTM", [x, w, r, b], hidden_size=hidden, direction="bidirectional")
        y = g.node("Transpose", [y], perm=[0, 2, 1, 3])  # [T, 2, 1, H] → [T, 1, 2, H]
        x = g.node("Reshape", [y, "lstm.shape"])
        width = 2 * hidden
    g.inits.append(numpy_helper.from_array(np.array([steps, 1, 2 * hidden], np.int64), "lstm.shape"))
    fc = g.weight("fc.W", g.rng.normal(0.0, 1.0 / math.sqrt(width), (width, 30)))
    logits = g.node("MatMul", [x, fc])
    graph = helper.make_graph(g.nodes, "lstm_long", [helper.make_tensor_value_info(
        "frames", TensorProto.FLOAT, [steps, 1, features])], [helper.make_tensor_value_info(
        logits, TensorProto.FLOAT, [steps, 1, 30])], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def loop_long(steps: int = 300, features: int = 64, hidden: int = 128) -> onnx.ModelProto:
    """An Elman RNN written as an ONNX ``Loop`` of ``steps`` iterations (as tf2onnx writes a
    Keras RNN): the body Gathers its frame, two MatMuls, Add, Tanh; the states are a scan output.
    amptool unrolls the loop: the model for convert time."""
    rng = np.random.default_rng(6)
    body = helper.make_graph(
        [helper.make_node("Gather", ["frames", "i"], ["frame"], axis=0),
         helper.make_node("MatMul", ["frame", "W"], ["a"]), helper.make_node("MatMul", ["h_in", "R"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Tanh", ["s"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["h_out"], ["h_t"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, hidden])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("h_t", TensorProto.FLOAT, [1, hidden])])
    inits = [numpy_helper.from_array(np.array(steps, np.int64), "steps"),
             numpy_helper.from_array(np.zeros((1, hidden), np.float32), "h0"),
             numpy_helper.from_array((rng.standard_normal((features, hidden)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32), "R")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["steps", "", "h0"], ["h_last", "states"], body=body)], "loop_long",
        [helper.make_tensor_value_info("frames", TensorProto.FLOAT, [steps, 1, features])],
        [helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("states", TensorProto.FLOAT, [steps, 1, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
