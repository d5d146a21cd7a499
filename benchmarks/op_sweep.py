"""Layer sweep: one ONNX layer (or a small block) per model, amptool against onnxruntime.

    .venv/bin/python benchmarks/op_sweep.py                       # every layer, 2 threads, a table
    .venv/bin/python benchmarks/op_sweep.py --only conv_transpose,reduce_mean_hw --dtype float16

Why: whole-model benchmarks (cpu_speed.py) average over the layers a model happens to have; a
layer that one schedule misses entirely (TVM's generic kernel, a scalar loop) shows up there only
in the model that has it. Each layer here is timed alone — float32 against onnxruntime, the low
dtype against amptool's float32 — so a 6× outlier is visible at once (ConvTranspose and ReduceMean
over H×W were, 2026-12-02). Single layers in a low dtype include the casts of the model's float32
inputs and outputs: whole models pay those once, a one-layer model pays them per layer.

Each variant runs in a worker process of its own, one at a time (``amptool bench``). Layers are
seeded and built in code; nothing is downloaded. Rows under ~0.5 ms are mostly call-to-call noise
(thread wake-ups after each turn's quiet gap: a 30 µs CumSum read 5–6× here and 0.47× in-process):
read them for large outliers and confirm those with back-to-back calls in one process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from amptool.app.bench import ONNXRUNTIME, BenchConfig, amptool_variant, bench_model  # noqa: E402
from benchmarks.cpu_speed import _ms, _ratio  # noqa: E402 - the same table cells

Layer = Callable[[], onnx.ModelProto]


def _value(name: str, *shape: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _const(name: str, values: list[float] | list[int], dtype: type = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def _weights(seed: int) -> Callable[..., onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    return lambda name, *shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "layer", inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _conv(cin: int, cout: int, size: list[int], kernel: int, group: int = 1, **attrs: object) -> Layer:
    """A Conv with bias; "same" padding unless ``pads`` is given."""
    def build() -> onnx.ModelProto:
        w = _weights(0)
        dilation = int(attrs.get("dilations", [1])[0])  # type: ignore[index]
        stride = int(attrs.get("strides", [1])[0])  # type: ignore[index]
        pads = attrs.get("pads", [kernel // 2 * dilation] * 2 * len(size))
        out = [(n + 2 * int(pads[0]) - dilation * (kernel - 1) - 1) // stride + 1 for n in size]  # type: ignore[index]
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, **{**attrs, "pads": pads})
        return _model([node], [_value("x", 1, cin, *size)], [_value("y", 1, cout, *out)],
                      [w("w", cout, cin // group, *([kernel] * len(size))), w("b", cout)])
    return build


def _single(op: str, shape: list[int], out: list[int] | None = None,
            extra: tuple[list[str], list[onnx.TensorProto]] = ([], []), **attrs: object) -> Layer:
    names, initializers = extra
    return lambda: _model([helper.make_node(op, ["x", *names], ["y"], **attrs)], [_value("x", *shape)],
                          [_value("y", *(out or shape))], list(initializers))


def _conv_transpose(kernel: int, pad: int, output_padding: int) -> Layer:
    """128→64, stride 2, 28² → 56² (the kernel/pad/output_padding of a decoder's upsampling)."""
    def build() -> onnx.ModelProto:
        w = _weights(1)
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[pad] * 4,
                                output_padding=[output_padding] * 2, kernel_shape=[kernel, kernel])
        return _model([node], [_value("x", 1, 128, 28, 28)], [_value("y", 1, 64, 56, 56)],
                      [w("w", 128, 64, kernel, kernel), w("b", 64)])
    return build


def _recurrent(op: str, gates: int) -> Layer:
    def build() -> onnx.ModelProto:
        w = _weights(2)
        node = helper.make_node(op, ["x", "w", "r", "b"], ["y"], hidden_size=256)
        return _model([node], [_value("x", 50, 1, 128)], [_value("y", 50, 1, 1, 256)],
                      [w("w", 1, gates * 256, 128), w("r", 1, gates * 256, 256), w("b", 1, 2 * gates * 256)])
    return build


def _matmul(rows: list[int], k: int, n: int) -> Layer:
    return lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_value("x", *rows, k)],
                          [_value("y", *rows, n)], [_weights(3)("w", k, n)])


def _squeeze_excite() -> onnx.ModelProto:
    w = _weights(4)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c"], ["m"], axes=[2, 3], keepdims=1),
        helper.make_node("Conv", ["m", "w1", "b1"], ["s1"]), helper.make_node("Relu", ["s1"], ["s2"]),
        helper.make_node("Conv", ["s2", "w2", "b2"], ["s3"]), helper.make_node("Sigmoid", ["s3"], ["s4"]),
        helper.make_node("Mul", ["c", "s4"], ["y"]),
    ]
    return _model(nodes, [_value("x", 1, 96, 56, 56)], [_value("y", 1, 96, 56, 56)],
                  [w("w0", 96, 96, 3, 3), w("b0", 96), w("w1", 24, 96, 1, 1), w("b1", 24), w("w2", 96, 24, 1, 1),
                   w("b2", 96)])


def _channel_shuffle() -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["b", "s2"], ["y"])]
    return _model(nodes, [_value("x", 1, 232, 28, 28)], [_value("y", 1, 232, 28, 28)],
                  [_const("s1", [1, 2, 116, 28, 28]), _const("s2", [1, 232, 28, 28])])


def _conv1x7() -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 3, 0, 3])
    return _model([node], [_value("x", 1, 128, 17, 17)], [_value("y", 1, 128, 17, 17)],
                  [_weights(10)("w", 128, 128, 1, 7)])


def _batch_norm() -> onnx.ModelProto:
    w = _weights(7)
    variance = numpy_helper.from_array(np.ones(128, np.float32), "v")
    return _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                  [_value("x", 1, 128, 56, 56)], [_value("y", 1, 128, 56, 56)], [w("s", 128), w("b", 128), w("m", 128),
                                                                                  variance])


def _einsum() -> onnx.ModelProto:
    node = helper.make_node("Einsum", ["q", "k"], ["y"], equation="bhqd,bhkd->bhqk")
    return _model([node], [_value("q", 1, 8, 256, 64), _value("k", 1, 8, 256, 64)], [_value("y", 1, 8, 256, 256)], [])


def _grid_sample() -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(
        [helper.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear")], "layer",
        [_value("x", 1, 64, 48, 64), _value("g", 1, 48, 64, 2)], [_value("y", 1, 64, 48, 64)]),
        opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    return model


_SCALE2 = (["", "s"], [_const("s", [1, 1, 2, 2], np.float32)])
_TOPK = (["k"], [_const("k", [50])])

#: name → (what it stands for, model builder)
LAYERS: dict[str, tuple[str, Layer]] = {
    "conv3x3": ("Conv 64→64 3×3 + Relu, 56² (ResNet)", _conv(64, 64, [56, 56], 3)),
    "conv_dilated": ("Conv 64→64 3×3 dilation 2, 56² (DeepLab)", _conv(64, 64, [56, 56], 3, dilations=[2, 2])),
    "conv_grouped32": ("Conv 128→128 3×3 groups 32, 56² (ResNeXt)", _conv(128, 128, [56, 56], 3, group=32)),
    "conv_grouped6": ("Conv 144→144 3×3 groups 6, 28² (RegNet)", _conv(144, 144, [28, 28], 3, group=6)),
    "depthwise5x5_s2": ("Conv 240 depthwise 5×5 stride 2, 28² (EfficientNet)",
                        _conv(240, 240, [28, 28], 5, group=240, strides=[2, 2], pads=[2, 2, 2, 2])),
    "conv1d": ("Conv1d 256→256 k5, 400 steps (speech)", _conv(256, 256, [400], 5)),
    "conv1x7": ("Conv 128→128 1×7, 17² (Inception-v3)", _conv1x7),
    "conv_transpose": ("ConvTranspose 128→64 3×3 stride 2, 28²→56² (decoder)", _conv_transpose(3, 1, 1)),
    "conv_transpose4x4": ("ConvTranspose 128→64 4×4 stride 2, 28²→56² (CenterNet, GAN)", _conv_transpose(4, 1, 0)),
    "conv_transpose2x2": ("ConvTranspose 128→64 2×2 stride 2, 28²→56² (U-Net)", _conv_transpose(2, 0, 0)),
    "squeeze_excite": ("Conv + squeeze-excite block, 96ch 56² (MobileNetV3)", _squeeze_excite),
    "batch_norm": ("BatchNormalization alone, 128×56² (DenseNet)", _batch_norm),
    "einsum_attention": ("Einsum bhqd,bhkd->bhqk, 8 heads 256² (attention scores)", _einsum),
    "classifier": ("Gemm 1×2048 · 2048×1000ᵀ (ResNet head)",
                   lambda: _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], [_value("x", 1, 2048)],
                                  [_value("y", 1, 1000)], [_weights(8)("w", 1000, 2048), _weights(9)("b", 1000)])),
    "gemv": ("MatMul 1×2048 · 2048×8192 (LLM decode)", _matmul([1], 2048, 8192)),
    "matmul_prefill": ("MatMul 256×1024 · 1024×4096 (LLM prefill)", _matmul([1, 256], 1024, 4096)),
    "matmul_seq_first": ("MatMul 128×1×768 · 768×768 (sequence-first transformer)", _matmul([128, 1], 768, 768)),
    "lstm": ("LSTM hidden 256, 50 steps", _recurrent("LSTM", 4)),
    "gru": ("GRU hidden 256, 50 steps", _recurrent("GRU", 3)),
    "softmax_384": ("Softmax over 384, 12×384 rows (attention)", _single("Softmax", [1, 12, 384, 384], axis=-1)),
    "exp": ("Exp, 1×12×384×384", _single("Exp", [1, 12, 384, 384])),
    "reduce_mean_hw": ("ReduceMean over H,W, 512×64² (global pooling)",
                       _single("ReduceMean", [1, 512, 64, 64], [1, 512, 1, 1], axes=[2, 3], keepdims=1)),
    "instance_norm": ("InstanceNormalization 64×128² (style transfer)",
                      lambda: _model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])],
                                     [_value("x", 1, 64, 128, 128)], [_value("y", 1, 64, 128, 128)],
                                     [_weights(5)("s", 64), _weights(6)("b", 64)])),
    "avgpool3x3": ("AveragePool 3×3 stride 1, 128×56²", _single("AveragePool", [1, 128, 56, 56], kernel_shape=[3, 3],
                                                                 pads=[1, 1, 1, 1])),
    "maxpool5x5": ("MaxPool 5×5 stride 1, 256×20² (YOLO SPPF)",
                   _single("MaxPool", [1, 256, 20, 20], kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
    "maxpool3x3_s2": ("MaxPool 3×3 stride 2, 64×112² (ResNet stem)",
                      _single("MaxPool", [1, 64, 112, 112], [1, 64, 56, 56], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2])),
    "resize_nearest": ("Resize nearest ×2, 256×40² (FPN)",
                       _single("Resize", [1, 256, 40, 40], [1, 256, 80, 80], _SCALE2, mode="nearest")),
    "resize_linear": ("Resize linear ×2, 64×100² (segmentation)",
                      _single("Resize", [1, 64, 100, 100], [1, 64, 200, 200], _SCALE2, mode="linear")),
    "channel_shuffle": ("Reshape-Transpose-Reshape, 232×28² (ShuffleNet)", _channel_shuffle),
    "grid_sample": ("GridSample bilinear, 64×48×64 (optical flow warp)", _grid_sample),
    "cumsum": ("CumSum over 4096 rows of 64", _single("CumSum", [1, 4096, 64], extra=(["a"], [_const("a", 1)]))),
    "topk": ("TopK 50 of 32000 (sampling)",
             lambda: _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1)], [_value("x", 1, 32000)],
                            [_value("v", 1, 50), helper.make_tensor_value_info("i", TensorProto.INT64, [1, 50])],
                            _TOPK[1])),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(LAYERS)}")
    parser.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(LAYERS)
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        parser.error(f"unknown layer(s) {', '.join(unknown)}; choose from {', '.join(LAYERS)}")
    low = amptool_variant(args.dtype)
    fp32 = amptool_variant("float32")
    print(f"| layer | onnxruntime fp32 ms | amptool fp32 ms | amptool {args.dtype} ms | fp32 vs onnxruntime "
          f"| {args.dtype} vs fp32 |\n|---|---:|---:|---:|---:|---:|", flush=True)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="amptool-op-sweep-") as tmp:
        for name in names:
            title, build = LAYERS[name]
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(build(), path)
            config = BenchConfig(model=path, dtypes=(args.dtype,), threads=args.threads, rounds=args.rounds,
                                 runs=args.runs)
            report = bench_model(config)
            print(f"| {title} | {_ms(report, ONNXRUNTIME, 3)} | {_ms(report, fp32, 3)} | {_ms(report, low, 3)} "
                  f"| {_ratio(report, fp32, ONNXRUNTIME)} | {_ratio(report, low, fp32)} |", flush=True)
    print(f"\n{args.threads} thread(s), {args.rounds} rounds × {args.runs} runs per variant, medians; ratio of "
          f"pooled medians (per-round paired ratio in parentheses). Load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after.")


if __name__ == "__main__":
    main()
