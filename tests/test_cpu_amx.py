"""bfloat16 matmuls on AMX tiles (``compiler.cpu_amx``): chosen for AMX targets and the shapes the
micro-kernel takes, and — where this CPU has AMX — equal to onnxruntime's product of the same
bfloat16-exact operands up to the output's rounding, in a fresh process too (the kernel asks
Linux for the tile state itself)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool import _tvm
from amptool.compiler import cpu_amx
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import scheduled_kernels

HAS_AMX = cpu_amx.has_amx_bf16(_tvm.make_target(host_llvm_spec()))
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX-BF16")


def _bf16_exact(array: np.ndarray) -> np.ndarray:
    """float32 values that bfloat16 holds exactly: the product then differs only by its summation."""
    return array.astype(ml_dtypes.bfloat16).astype(np.float32)


def _matmul_model(path: Path, lead: tuple[int, ...], k: int, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(_bf16_exact(rng.standard_normal((k, n)) / np.sqrt(k)), "w")
    b = numpy_helper.from_array(_bf16_exact(rng.standard_normal(n)), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("lead", "k", "n", "amx"), [
    ((1, 128), 768, 768, True),   # BERT-base's projections
    ((197,), 64, 97, True),       # a row tail (197 = 6 blocks + 5) and a column tail (97 = 3 blocks + 1)
    ((3, 50), 96, 48, True),      # batch axes taken as rows
    ((1, 16), 768, 768, False),   # fewer rows than a block: the vector kernels
    ((1, 128), 72, 64, False),    # k no multiple of 32, over one step
    ((2, 40), 24, 40, True),      # one short step (MobileNetV2's 24-channel 1×1 convs)
])
def test_amx_is_chosen_for_the_shapes_it_takes(tmp_path: Path, lead: tuple[int, ...], k: int, n: int,
                                               amx: bool) -> None:
    """Lowered for a Sapphire Rapids target (no AMX needed on this machine to lower)."""
    path = _matmul_model(tmp_path / "mm.onnx", lead, k, n)
    text = "\n".join(scheduled_kernels(str(path), "bfloat16", "sapphirerapids"))
    assert ("amptool_amx_bf16_32x32" in text) == amx
    assert "amptool_amx_bf16_32x32" not in "\n".join(scheduled_kernels(str(path), "bfloat16", "znver4"))


@needs_amx
@pytest.mark.parametrize(("lead", "k", "n"), [((1, 128), 768, 768), ((197,), 64, 97), ((3, 50), 96, 48),
                                              ((32,), 32, 16), ((2, 40), 24, 40), ((64,), 2, 20),
                                              ((1, 1250), 32, 16)])  # 40 row blocks dealt unevenly
def test_amx_products_are_onnxruntimes(tmp_path: Path, lead: tuple[int, ...], k: int, n: int) -> None:
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = str(_matmul_model(tmp_path / "mm.onnx", lead, k, n))
    x = _bf16_exact(np.random.default_rng(1).standard_normal((*lead, k)).astype(np.float32))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    built = build_model(ConvertConfig(model=path, dtype="bfloat16"))
    got = np.asarray(built.compiled().run({"x": x})["y"], np.float32)
    # Operands exact in bfloat16: what is left is float32 summation order and the bfloat16 rounding
    # of the product and of the sum with the bias (2 × 2⁻⁹ relative), far below a wrong tile's error.
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6 * float(np.abs(want).max()))


@needs_amx
def test_an_exported_amx_build_runs_in_a_fresh_process(tmp_path: Path) -> None:
    """No one has asked Linux for the tile state in a new process: the kernel does, or the first
    tile instruction would kill it (SIGILL)."""
    path = _matmul_model(tmp_path / "mm.onnx", (64,), 128, 64)
    subprocess.run([sys.executable, "-m", "amptool", "convert", str(path), "--dtype", "bfloat16", "-o",
                    str(tmp_path / "out")], check=True, capture_output=True)
    script = ("import numpy as np, amptool; m = amptool.load(%r); y = m.run({'x': np.ones((64, 128), np.float32)}); "
              "print(np.isfinite(np.asarray(y['y'], np.float32)).all())")
    done = subprocess.run([sys.executable, "-c", script % str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def _conv_model(path: Path, shape: tuple[int, ...], out_channels: int, kernel: tuple[int, int], pads: list[int],
                strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1), group: int = 1) -> Path:
    rng = np.random.default_rng(2)
    per_group = shape[1] // group
    fan_in = per_group * kernel[0] * kernel[1]
    w = _bf16_exact(rng.standard_normal((out_channels, per_group, *kernel)) / np.sqrt(fan_in))
    b = _bf16_exact(rng.standard_normal(out_channels))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, strides=list(strides),
                              dilations=list(dilations), group=group), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w.astype(np.float32), "w"),
                               numpy_helper.from_array(b.astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


_CONVS = [
    ((1, 64, 14, 14), 64, (3, 3), [1, 1, 1, 1], (1, 1), (1, 1), True),    # ResNet's 3×3
    ((2, 32, 10, 9), 40, (3, 2), [0, 1, 2, 0], (1, 1), (2, 1), True),     # dilated, uneven pads, a column tail
    ((1, 64, 7, 7), 96, (1, 1), [0, 0, 0, 0], (1, 1), (1, 1), True),      # pointwise: the matmul kernel
    ((1, 64, 14, 14), 64, (3, 3), [1, 1, 1, 1], (2, 2), (1, 1), True),    # stride 2: phase images
    ((1, 256, 14, 14), 96, (1, 1), [0, 0, 0, 0], (2, 2), (1, 1), True),   # a 1×1 stride-2 downsample
    ((1, 48, 13, 15), 40, (3, 3), [1, 0, 2, 1], (2, 1), (1, 1), True),    # uneven strides, 48 channels padded to 64
    ((1, 3, 32, 32), 64, (7, 7), [3, 3, 3, 3], (2, 2), (1, 1), True),     # an RGB stem: taps span pixels
    ((1, 5, 20, 21), 24, (5, 7), [2, 3, 2, 3], (1, 2), (2, 1), True),     # 5 channels, dilated rows, stride 2
    ((1, 64, 4, 4), 64, (3, 3), [1, 1, 1, 1], (1, 1), (1, 1), False),     # 4 × 6 at the padded width: < 32 rows
]


@pytest.mark.parametrize(("shape", "out_channels", "kernel", "pads", "strides", "dilations", "amx"), _CONVS)
def test_amx_takes_the_convs_of_a_block_of_pixels(tmp_path: Path, shape: tuple[int, ...], out_channels: int,
                                        kernel: tuple[int, int], pads: list[int], strides: tuple[int, int],
                                        dilations: tuple[int, int], amx: bool) -> None:
    path = _conv_model(tmp_path / "conv.onnx", shape, out_channels, kernel, pads, strides, dilations)
    text = "\n".join(scheduled_kernels(str(path), "bfloat16", "sapphirerapids"))
    assert ("amptool_amx_bf16_32x32" in text) == amx


@needs_amx
@pytest.mark.parametrize(("shape", "out_channels", "kernel", "pads", "strides", "dilations", "amx"),
                         [case for case in _CONVS if case[-1]])
def test_amx_convs_are_onnxruntimes(tmp_path: Path, shape: tuple[int, ...], out_channels: int,
                                    kernel: tuple[int, int], pads: list[int], strides: tuple[int, int],
                                    dilations: tuple[int, int], amx: bool) -> None:
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = str(_conv_model(tmp_path / "conv.onnx", shape, out_channels, kernel, pads, strides, dilations))
    x = _bf16_exact(np.random.default_rng(3).standard_normal(shape).astype(np.float32))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    got = np.asarray(build_model(ConvertConfig(model=path, dtype="bfloat16")).compiled().run({"x": x})["y"], np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6 * float(np.abs(want).max()))


_GROUPED = [
    ((1, 128, 14, 14), 128, 2, (3, 3), (1, 1), "conv"),     # RegNet's 64-channel groups
    ((2, 192, 14, 14), 192, 3, (3, 3), (2, 2), "conv"),     # three groups, stride 2, two images
    ((1, 96, 12, 12), 96, 2, (3, 3), (1, 1), "conv"),       # 48 channels a group: padded taps, a column tail
    ((1, 128, 14, 14), 256, 2, (1, 1), (1, 1), "matmul"),   # 1×1 groups: one matmul a group
    ((1, 64, 14, 14), 64, 4, (3, 3), (1, 1), None),         # 16-channel groups: under one tile step
    ((1, 64, 14, 14), 64, 64, (3, 3), (1, 1), None),        # depthwise: its own kernels
]


def _grouped_model(tmp_path: Path, shape: tuple[int, ...], out_channels: int, group: int, kernel: tuple[int, int],
                   strides: tuple[int, int]) -> Path:
    pads = [kernel[0] // 2, kernel[1] // 2] * 2
    return _conv_model(tmp_path / "conv.onnx", shape, out_channels, kernel, pads, strides, group=group)


@pytest.mark.parametrize(("shape", "out_channels", "group", "kernel", "strides", "kind"), _GROUPED)
def test_grouped_convs_run_on_amx_tiles(tmp_path: Path, shape: tuple[int, ...], out_channels: int, group: int,
                                        kernel: tuple[int, int], strides: tuple[int, int], kind: str | None) -> None:
    """A grouped bfloat16 conv whose groups take a tile step (32 channels or more) runs on AMX tiles:
    with taps as one conv call for every group — no per-group gather, call and concat (RegNet
    bfloat16 1.15× → 0.96× OpenVINO's) — 1×1 groups as one matmul a group (``amx_groups``); narrower
    groups and depthwise convs keep their vector kernels, and a CPU without AMX all of them."""
    from tests.conftest import staged_module

    path = _grouped_model(tmp_path, shape, out_channels, group, kernel, strides)
    text = "\n".join(scheduled_kernels(str(path), "bfloat16", "sapphirerapids"))
    assert ("amptool_amx_bf16_32x32" in text) == (kind is not None)
    main = staged_module(str(path), "bfloat16", "schedule", "sapphirerapids")["main"].script()
    calls = len(re.findall(r"call_tir\(amx_conv\w*," if kind == "conv" else r"call_tir\(amx_matmul\w*,", main))
    assert calls == {"conv": 1, "matmul": group, None: 0}[kind], main
    assert "amptool_amx_bf16_32x32" not in "\n".join(scheduled_kernels(str(path), "bfloat16", "znver4"))


@needs_amx
@pytest.mark.parametrize(("shape", "out_channels", "group", "kernel", "strides", "kind"),
                         [case for case in _GROUPED if case[-1]])
def test_grouped_amx_convs_are_onnxruntimes(tmp_path: Path, shape: tuple[int, ...], out_channels: int, group: int,
                                           kernel: tuple[int, int], strides: tuple[int, int], kind: str) -> None:
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = str(_grouped_model(tmp_path, shape, out_channels, group, kernel, strides))
    x = _bf16_exact(np.random.default_rng(4).standard_normal(shape).astype(np.float32))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    got = np.asarray(build_model(ConvertConfig(model=path, dtype="bfloat16")).compiled().run({"x": x})["y"], np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6 * float(np.abs(want).max()))


def _residual_block(path: Path, downsample: bool, clip: bool) -> Path:
    """A stem conv, then conv → bias → ReLU → conv → bias → + shortcut → ReLU (or Clip 0..6), the
    shortcut the block's input or a 1×1 conv of it (ResNet's downsample: its add is in both convs'
    reach), then a 1×1 conv: the block's values all stay inside the bfloat16 graph."""
    rng = np.random.default_rng(6)
    out = 64 if downsample else 32

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(_bf16_exact(rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))), name)

    def bias(name: str, size: int) -> onnx.TensorProto:
        return numpy_helper.from_array(_bf16_exact(rng.standard_normal(size)), name)

    inits = [weight("w0", (32, 32, 1, 1)), bias("b0", 32), weight("w1", (64, 32, 3, 3)), bias("b1", 64),
             weight("w2", (out, 64, 3, 3)), bias("b2", out), weight("w3", (32, out, 1, 1)),
             numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"]), helper.make_node("Relu", ["c0"], ["h"]),
             helper.make_node("Conv", ["h", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1])]
    if downsample:
        inits.append(weight("wd", (64, 32, 1, 1)))
        nodes.append(helper.make_node("Conv", ["h", "wd"], ["shortcut"]))
    nodes += [helper.make_node("Add", ["c2", "shortcut" if downsample else "h"], ["s"]),
              helper.make_node("Clip", ["s", "lo", "hi"], ["a"]) if clip else helper.make_node("Relu", ["s"], ["a"]),
              helper.make_node("Conv", ["a", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("downsample", "clip"), [(False, False), (True, False), (False, True)])
def test_epilogues_run_inside_the_amx_kernels(tmp_path: Path, downsample: bool, clip: bool) -> None:
    """Bias, shortcut, ReLU/clip and the cast to bfloat16 are applied as each tile is stored: no
    kernel of their own is left (amx_epilogues)."""
    path = _residual_block(tmp_path / "block.onnx", downsample, clip)
    kernels = scheduled_kernels(str(path), "bfloat16", "sapphirerapids")
    amx = [k for k in kernels if "amptool_amx_bf16_32x32" in k]
    assert len(amx) == (5 if downsample else 4)
    others = [k for k in kernels if "amptool_amx_bf16_32x32" not in k]
    assert not [k for k in others if "T.max(" in k or "T.min(" in k], others  # no ReLU/clip kernel left
    assert sum('"bfloat16"' in k.split("y: T.Buffer")[-1][:80] for k in amx) >= 1  # a kernel storing bfloat16


@needs_amx
@pytest.mark.parametrize(("downsample", "clip"), [(False, False), (True, False), (False, True)])
def test_fused_epilogues_give_onnxruntimes_values(tmp_path: Path, downsample: bool, clip: bool) -> None:
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = str(_residual_block(tmp_path / "block.onnx", downsample, clip))
    x = _bf16_exact(np.random.default_rng(8).standard_normal((1, 32, 12, 12)).astype(np.float32))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    got = np.asarray(build_model(ConvertConfig(model=path, dtype="bfloat16")).compiled().run({"x": x})["y"], np.float32)
    # The intermediate activation is rounded to bfloat16 between the convs: a few bfloat16 ulps.
    np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * float(np.abs(want).max()))


@pytest.mark.parametrize(("tasks", "cores"), [(392, 2), (96, 2), (40, 2), (5, 2), (1, 1), (300, 64)])
def test_workers_deal_every_task_once_and_evenly(tasks: int, cores: int) -> None:
    """A kernel's strips are dealt to parallel workers in contiguous runs (one tile configuration and
    one epilogue tile a worker): every task once, runs differing by at most one, 8 workers a core
    unless the tasks are fewer or would be over 8 a worker."""
    workers = cpu_amx.parallel_workers(tasks, cores)
    runs = [range(w * tasks // workers, (w + 1) * tasks // workers) for w in range(workers)]
    assert [task for run in runs for task in run] == list(range(tasks))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1
    assert workers == min(tasks, max(8 * cores, -(-tasks // 8)))


def test_a_product_of_constants_is_left_to_folding_off_the_tiles() -> None:
    """Relax folds a call on constants by running it on the build machine, which may have no AMX (a
    cross-compile for another CPU): such a call gets no AMX kernel; the same call on a variable does."""
    import tvm
    from tvm import relax

    from amptool.compiler import amx_plan

    rng = np.random.default_rng(0)
    weight = relax.const(tvm.runtime.tensor(rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)))
    data = relax.const(tvm.runtime.tensor(rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16)))
    variable = relax.Var("x", relax.TensorType([32, 64], "bfloat16"))
    normalize = relax.BlockBuilder().normalize
    with _tvm.make_target({"kind": "llvm", "mcpu": "sapphirerapids"}):
        assert amx_plan.plan(normalize(relax.op.matmul(variable, weight, out_dtype="float32"))) is not None
        assert amx_plan.plan(normalize(relax.op.matmul(data, weight, out_dtype="float32"))) is None


def _batched_model(path: Path, batch: tuple[int, ...], m: int, k: int, n: int) -> Path:
    """``x · (y + 0)``: a product of two computed tensors (the Add keeps ``y`` an activation)."""
    zero = numpy_helper.from_array(np.zeros((1,), np.float32), "zero")
    nodes = [helper.make_node("Add", ["y", "zero"], ["v"]), helper.make_node("MatMul", ["x", "v"], ["out"])]
    graph = helper.make_graph(nodes, "bmm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*batch, m, k]),
                                             helper.make_tensor_value_info("y", TensorProto.FLOAT, [*batch, k, n])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [*batch, m, n])], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


_BATCHED = [((1, 12), 128, 64, 128),  # BERT-base's Q·Kᵀ
            ((2, 3), 197, 64, 197),   # ViT's 197 tokens: a row tail and a column tail (197 = 6 · 32 + 5)
            ((4,), 40, 24, 48),       # one short k step, a half column block
            ((3,), 64, 96, 32),       # three k steps
            ((2, 3), 197, 197, 64),   # ViT's P·V: k = 6 · 32 + 5, its last step from a zero-padded copy
            ((2,), 77, 45, 40)]       # CLIP's 77 tokens, an odd k = 32 + 13


@pytest.mark.parametrize(("batch", "m", "k", "n"), _BATCHED)
def test_products_of_activations_take_amx_tiles(tmp_path: Path, batch: tuple[int, ...], m: int, k: int,
                                                n: int) -> None:
    """Attention's bfloat16 products of two computed tensors lower to the batched AMX kernel for an
    AMX target (no AMX needed here to lower), to the vector kernels for others."""
    path = _batched_model(tmp_path / "bmm.onnx", batch, m, k, n)
    assert "amptool_amx_bf16_32x32" in "\n".join(scheduled_kernels(str(path), "bfloat16", "sapphirerapids"))
    assert "amptool_amx_bf16_32x32" not in "\n".join(scheduled_kernels(str(path), "bfloat16", "znver4"))


@needs_amx
@pytest.mark.parametrize(("batch", "m", "k", "n"), _BATCHED)
def test_amx_products_of_activations_are_onnxruntimes(tmp_path: Path, batch: tuple[int, ...], m: int, k: int,
                                                      n: int) -> None:
    import onnxruntime as ort

    from amptool.app.convert import ConvertConfig, build_model

    path = str(_batched_model(tmp_path / "bmm.onnx", batch, m, k, n))
    rng = np.random.default_rng(3)
    feeds = {"x": _bf16_exact(rng.standard_normal((*batch, m, k)).astype(np.float32)),
             "y": _bf16_exact(rng.standard_normal((*batch, k, n)).astype(np.float32))}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["out"], feeds)[0]
    got = np.asarray(build_model(ConvertConfig(model=path, dtype="bfloat16")).compiled().run(feeds)["out"], np.float32)
    # float32 sums of exact products; the output's one bfloat16 rounding (the model's float32 output
    # is cast from the bfloat16 graph) is the error left
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6 * float(np.abs(want).max()))
