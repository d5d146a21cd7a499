"""amptool's CPU build pipeline: stage order, packed kernels, schedules — and the same numbers
as TVM's plain build on every kernel path (packed, fallback, generic rules)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool import _tvm, compiler
from amptool.app.convert import ConvertConfig, build_model
from amptool.compiler.targets import host_llvm_spec
from tests.conftest import kernel_after_pass, scheduled_kernels
from tests.onnx_checks import onnxruntime_and_amptool

tvm = pytest.importorskip("tvm")


def _save(tmp_path: Path, text: str, name: str = "model") -> str:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _weights(*shape: int, seed: int = 0) -> str:
    values = np.random.default_rng(seed).normal(0.0, 0.2, size=shape).astype(np.float32)
    return ", ".join(f"{v:.6f}" for v in values.ravel())


def _conv_model(channels_out: int, group: int = 1, extra: str = "", cin: int = 8) -> str:
    k = 3
    w = _weights(channels_out, cin // group, k, k)
    b = _weights(channels_out, seed=1)
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, {cin}, 12, 10] x) => (float[1, {channels_out}, 6, 5] y) <
        float[{channels_out}, {cin // group}, {k}, {k}] w = {{{w}}},
        float[{channels_out}] b = {{{b}}}> {{
        c = Conv <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], group = {group}{extra}> (x, w, b)
        y = Relu (c)
    }}"""


def _matmul_model() -> str:
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 5, 24] x) => (float[2, 5, 48] y) <float[24, 48] w = {{{_weights(24, 48)}}}> {{
        m = MatMul (x, w)
        y = Erf (m)
    }}"""


def _both(path: str, dtype: str, feeds: dict[str, np.ndarray],
          target_options: tuple[str, ...] = ()) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Outputs of amptool's build and of TVM's plain build of the same converted module."""
    result = build_model(ConvertConfig(model=path, dtype=dtype, target_options=target_options))
    ours = result.compiled().run(feeds)
    plain_vm = _tvm.vm_from_executable(compiler.compile_module(result.passes.mod, result.target_spec, pipeline="tvm"))
    plain = _tvm.run_vm(plain_vm, [feeds[s.name] for s in result.inputs])
    return [ours[s.name] for s in result.outputs], plain


def test_stage_order_is_pinned() -> None:
    from amptool.compiler import cpu

    assert cpu.STAGES == (
        "layout", "epilogues", "library dispatch", "legalize", "annotate patterns", "fold constants", "fuse ops",
        "fuse tir", "schedule", "in place", "lower dataflow", "finalize",
    )
    assert tuple(name for name, _ in cpu.stage_passes(_tvm.make_target({"kind": "llvm"}))) == cpu.STAGES


@pytest.mark.parametrize(
    ("channels_out", "group", "extra"),
    [
        (16, 1, ""),  # packed, one vector of output channels
        (24, 1, ""),  # zero filters pad it to two vectors (bfloat16 and, with AVX-512, float32)
        (10, 1, ""),  # not a multiple of 8: padded to one vector too
        (16, 2, ""),  # grouped: TVM's conv2d, generic rules
        (16, 1, ", dilations = [2, 1]"),  # dilation in the packed kernel
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_conv_matches_plain_build(tmp_path: Path, channels_out: int, group: int, extra: str, dtype: str) -> None:
    if extra:
        text = _conv_model(channels_out, group, extra).replace("float[1, 16, 6, 5] y", "float[1, 16, 5, 5] y")
    else:
        text = _conv_model(channels_out, group)
    path = _save(tmp_path, text)
    x = np.random.default_rng(2).standard_normal((1, 8, 12, 10)).astype(np.float32)
    ours, plain = _both(path, dtype, {"x": x})
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]  # bfloat16: 2 ulp of 8 bits
    np.testing.assert_allclose(ours[0], plain[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv_with_a_prime_output_width(tmp_path: Path, dtype: str) -> None:
    """17 columns have no register-tile divisor: the kernel computes 24 and crops."""
    text = _conv_model(16).replace("float[1, 8, 12, 10] x", "float[1, 8, 6, 34] x").replace(
        "float[1, 16, 6, 5] y", "float[1, 16, 3, 17] y")
    path = _save(tmp_path, text)
    x = np.random.default_rng(5).standard_normal((1, 8, 6, 34)).astype(np.float32)
    ours, plain = _both(path, dtype, {"x": x})
    assert ours[0].shape == (1, 16, 3, 17)
    tol = 1e-5 if dtype == "float32" else 1.6e-2
    np.testing.assert_allclose(ours[0], plain[0], rtol=tol, atol=tol)


def test_bfloat16_conv_with_odd_input_channels(tmp_path: Path) -> None:
    """The vdpbf16ps kernel pairs input channels; an odd count gets a zero partner (built for a
    CPU the dot product pays on where this host can run it, else this host's FMA kernel)."""
    from tests.conftest import bf16_dot_target_options

    path = _save(tmp_path, _conv_model(32, cin=3))
    x = np.random.default_rng(4).standard_normal((1, 3, 12, 10)).astype(np.float32)
    ours, plain = _both(path, "bfloat16", {"x": x}, bf16_dot_target_options() or ())
    np.testing.assert_allclose(ours[0], plain[0], rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_erf_match_plain_build(tmp_path: Path, dtype: str) -> None:
    path = _save(tmp_path, _matmul_model())
    x = np.random.default_rng(3).standard_normal((2, 5, 24)).astype(np.float32)
    ours, plain = _both(path, dtype, {"x": x})
    # fast_erf differs from libm by at most ~3e-7; bfloat16 rounds to 8 bits either way.
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(ours[0], plain[0], rtol=tol, atol=tol)


def test_erf_keeps_nan_and_saturates_inf(tmp_path: Path) -> None:
    path = _save(tmp_path, """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[6] x) => (float[6] y) { y = Erf (x) }""")
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 0.5, -3.0], dtype=np.float32)
    result = build_model(ConvertConfig(model=path, dtype="float32"))
    y = result.compiled().run({"x": x})["y"]
    assert np.isnan(y[0])
    np.testing.assert_allclose(y[1:], [1.0, -1.0, 0.0, 0.5204999, -0.9999779], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv_weights_are_packed_and_kernels_scheduled(tmp_path: Path, layout: str) -> None:
    """NHWC: the layout stage's kernel, weight ``[OC/B, KH, KW, IC, B]`` with ``B`` the register
    tile's channel vectors (``tile_vectors``); NCHW (the layout stage skipped, as
    when TVM's ConvertLayout fails): weight ``[OC/B, IC, KH, KW, B]``, one vector per block."""
    from amptool.compiler import cpu
    from amptool.compiler.cpu_kernels import CONV2D_BLOCK, tile_vectors, vector_lanes
    from amptool.compiler.cpu_nhwc import CONV2D_NHWC_BLOCK

    path = _save(tmp_path, _conv_model(32))
    mod = build_model(ConvertConfig(model=path, dtype="float32")).passes.mod
    target = _tvm.make_target(host_llvm_spec())
    with target:
        for name, passes in cpu.stage_passes(target):
            if name == "layout" and layout == "NCHW":
                continue
            mod = tvm.transform.Sequential(passes)(mod)
            if name == "schedule":
                break
    block = CONV2D_NHWC_BLOCK if layout == "NHWC" else CONV2D_BLOCK
    kernels = [f for _, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f'"{block}_init"' in f.script()]
    assert len(kernels) == 1
    text = kernels[0].script()
    lanes = vector_lanes(target)
    block = lanes * tile_vectors(32 // lanes, lanes, 5)
    dims = (32 // block, 3, 3, 8, block) if layout == "NHWC" else (32 // lanes, 8, 3, 3, lanes)
    assert f"({', '.join(f'T.int64({d})' for d in dims)})" in text
    assert kernels[0].attrs["tirx.is_scheduled"]
    assert "T.parallel" in text and "T.vectorized" in text


@pytest.mark.parametrize("model", ["conv", "batched matmul"])
def test_bfloat16_uses_the_dot_product_instruction(tmp_path: Path, model: str) -> None:
    """Also for a matmul with a batch dim: its tile once failed to tensorize, and the kernel fell
    back to a scalar loop (a BERT encoder in bfloat16 ran 10× slower than in float32)."""
    from tests.conftest import bf16_dot_target_options

    options = bf16_dot_target_options()
    if options is None:
        pytest.skip("this CPU has no AVX512-BF16")
    path = _save(tmp_path, _conv_model(32) if model == "conv" else _matmul_model())
    result = build_model(ConvertConfig(model=path, dtype="bfloat16", target_options=options))
    assert any("vdpbf16ps" in _assembly(m) for m in [result.executable.mod, *result.executable.mod.imports])


def _assembly(module: object) -> str:
    try:
        return str(module.inspect_source("asm"))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - modules without assembly (the VM bytecode)
        return ""


@pytest.mark.parametrize(("dtype", "vectors"), [("bfloat16", 4), ("float32", 1)])
def test_products_of_two_inputs_tile_wider_when_operands_convert(tmp_path: Path, dtype: str, vectors: int) -> None:
    """An attention-shaped product of two run-time inputs: in bfloat16 each operand value is
    converted as it is read, so the tile spans 4 vectors of columns (16 FMAs per 8 conversions);
    in float32 one vector (the row value is a broadcast memory operand)."""
    path = _save(tmp_path, """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3, 8, 32] a, float[2, 3, 32, 128] b) => (float[2, 3, 8, 128] y) { y = MatMul (a, b) }""")
    lines = "\n".join(scheduled_kernels(path, dtype)).splitlines()
    update = next(i for i, line in enumerate(lines) if 'T.sblock("matmul_update")' in line)
    from amptool.compiler.cpu_kernels import vector_lanes

    width = vectors * vector_lanes(_tvm.make_target(host_llvm_spec()))
    assert f"T.vectorized(T.int64({width}))" in lines[update - 1]
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((2, 3, 8, 32)).astype(np.float32),
             "b": rng.standard_normal((2, 3, 32, 128)).astype(np.float32)}
    ours, plain = _both(path, dtype, feeds)
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2}[dtype]
    np.testing.assert_allclose(ours[0], plain[0], rtol=tol, atol=tol * 6)


def test_no_serial_scalar_steps_left_beside_a_scheduled_block(tmp_path: Path) -> None:
    """A GRU cell's kernel is its recurrent matmul with the gates around it: the matmul rule
    schedules the matmul and its bias add, and the tanh/blend steps after it ran as serial scalar
    loops (one per step) until leftovers were inlined and vectorized. No root-level loop nest of a
    spatial step may be left without a vectorized (or parallel) loop."""
    rng = np.random.default_rng(0)
    hidden, features, steps = 32, 16, 3
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
               for name, shape in (("w", [1, 3 * hidden, features]), ("r", [1, 3 * hidden, hidden]),
                                   ("b", [1, 6 * hidden]))]
    graph = helper.make_graph(
        [helper.make_node("GRU", ["x", "w", "r", "b"], ["y"], hidden_size=hidden)], "gru",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 1, 1, hidden])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "gru.onnx"
    onnx.save(model, path)
    for script in scheduled_kernels(str(path), "float32"):
        nests = script.split("\n    for ")[1:]  # root-level loop nests (the body is indented 4)
        for nest in nests:
            if "T.axis.reduce" in nest.split("\n    with")[0]:
                continue
            assert "T.vectorized" in nest or "T.parallel" in nest or "T.int64(1))" in nest.split("\n")[0], nest[:400]


def _head(tmp_path: Path, weight: np.ndarray) -> Path:
    """A one-row classifier head ``x [1, K] · weight [K, N]`` saved as an ONNX model."""
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_one_row_matmul_takes_several_column_blocks(tmp_path: Path) -> None:
    """A 1-row matmul (a classifier head) gives each tile several column blocks, each its own
    accumulator, instead of one dependent FMA chain per block; the values stay onnxruntime's."""
    rng = np.random.default_rng(4)
    weight = rng.standard_normal((200, 40)).astype(np.float32)
    path = _head(tmp_path, weight)
    (script,) = [s for s in scheduled_kernels(str(path), "float32") if "amp_matmul_update" in s]
    lines = script.splitlines()
    update = next(i for i, line in enumerate(lines) if 'T.sblock("amp_matmul_update")' in line)
    blocks = re.search(r"T\.unroll\(T\.int64\((\d+)\)\)", lines[update - 2])
    # 40 columns: five 8-lane blocks (AVX2), or three 16-lane ones padded to 48 (AVX-512)
    assert "T.vectorized" in lines[update - 1] and blocks and int(blocks.group(1)) >= 3, script
    x = rng.standard_normal((1, 200)).astype(np.float32)
    got = build_model(ConvertConfig(model=str(path), dtype="float32")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ weight, rtol=1e-5, atol=1e-4)


def test_half_vector_columns_pad_to_whole_vectors(tmp_path: Path) -> None:
    """A bfloat16 product whose columns no 16-lane vector divides (1000 ImageNet classes; 40 here)
    pads its weight to whole vectors, not 8-lane blocks (the head ran 3.6x slower in them); the
    padded columns are cropped, the values stay onnxruntime's within bfloat16's rounding."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((64, 40)).astype(np.float32)
    path = _head(tmp_path, weight)
    (script,) = [s for s in scheduled_kernels(str(path), "bfloat16", "skylake-avx512") if "amp_matmul_update" in s]
    packed = re.search(r'param_0: T\.Buffer\(\(T\.int64\(\d+\), T\.int64\(64\), T\.int64\((\d+)\)\)', script)
    assert packed and int(packed.group(1)) % 16 == 0, script  # 48 columns: three vectors
    x = rng.standard_normal((1, 64)).astype(np.float32)
    got = build_model(ConvertConfig(model=str(path), dtype="bfloat16")).compiled().run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ weight, rtol=0.05, atol=0.1)


def test_kernels_carry_no_argument_checks_and_the_vm_still_refuses_a_wrong_input(tmp_path: Path) -> None:
    """Codegen drops TVM's per-kernel argument checks (half of each kernel's code, and of LLVM's
    time); the VM checks the model's own inputs before any kernel runs, so a wrong one is refused."""
    path = _save(tmp_path, _conv_model(16))
    result = build_model(ConvertConfig(model=path, dtype="float32"))
    modules = [result.executable.mod, *result.executable.mod.imports]
    llvm = "\n".join(str(m.inspect_source("ll")) for m in modules if m.kind == "llvm")
    assert "fused" in llvm and "Mismatched type on argument" not in llvm and "Expected" not in llvm
    vm = result.compiled()
    vm.run({"x": np.zeros((1, 8, 12, 10), np.float32)})
    with pytest.raises(Exception, match="match_cast|mismatch"):
        _tvm.run_vm(_tvm.vm_from_executable(result.executable), [np.zeros((1, 8, 12, 11), np.float32)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("lead", "rows"), [((24,), 1), ((2, 3), 1), ((6,), 4), ((5,), 3), ((2,), 24)])
def test_stacked_items_of_few_rows_share_a_tile_and_keep_their_epilogue(tmp_path: Path, dtype: str,
                                                                         lead: tuple[int, ...], rows: int) -> None:
    """``[*lead, rows, k] · [k, n]`` × a per-column scale → Relu (a scale: onnxruntime turns a matmul
    and an added bias into a 2-D Gemm): items of few rows (a sequence-first ``[S, 1, E]``) are tiled
    several to a tile (each row had read the whole weight again: 4.4× onnxruntime); the fused scale
    and Relu still land on their own rows, as onnxruntime computes them."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((48, 64)).astype(np.float32)
    shape = [*lead, rows, 48]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "s"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "stacked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*shape[:-1], 64])],
        [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "stacked.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "s": rng.standard_normal(64).astype(np.float32)}
    want, got = onnxruntime_and_amptool(str(path), feeds, dtype)
    if dtype == "bfloat16":  # operands rounded to 8 significant bits: errors scale with the output
        assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    if rows == 1:
        (script,) = [s for s in scheduled_kernels(str(path), dtype) if "amp_matmul" in s]
        # the row loop under the tile (the fused items×rows loop; with bf16's dot product the items'
        # own loop, which tensorize needs unfused): several items to a tile, not one
        tiles = re.findall(r"(?:_fused_1|\bi\d+_1) in T\.unroll\(T\.int64\((\d+)\)\)", script)
        assert tiles and max(int(t) for t in tiles) > 1, script


def test_a_split_into_many_small_outputs_is_vectorized_on_one_thread(tmp_path: Path) -> None:
    """An RNN's input projection cut into its 50 timesteps (bias add and cast fused in): the
    injective rule once failed on the several output blocks, and the fallback ran each 768-value
    piece as a scalar parallel loop (0.19 ms for what takes 0.006). Each piece now gets its own
    vectorized loop, on one thread, and the values are onnxruntime's."""
    steps = 50
    rng = np.random.default_rng(9)
    names = [f"y{t}" for t in range(steps)]
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Split", ["a"], names, axis=0)], "pieces",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 768])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 768]) for n in names],
        [numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "b")])
    path = tmp_path / "pieces.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    (script,) = [s for s in scheduled_kernels(str(path), "float32") if "split" in s]
    assert script.count("T.vectorized") >= steps and "T.parallel" not in script, script
    x = rng.standard_normal((steps, 1, 768)).astype(np.float32)
    got = build_model(ConvertConfig(model=str(path), dtype="float32")).compiled().run({"x": x})
    for t, name in enumerate(names):
        np.testing.assert_array_equal(got[name], x[t:t + 1] + numpy_helper.to_array(graph.initializer[0]))


def test_a_concat_of_many_scan_steps_is_copied_without_inlining(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A Loop's scan output, unrolled: 100 steps each unsqueezed, then one Concat, all fused into one
    kernel. Inlining 100 producers into the concat re-analysed a growing select chain each time
    (14 s at 300 steps); past ``INLINE_BLOCKS`` each step is a copy loop of its own. Values exact."""
    from amptool.compiler import cpu_schedules

    steps = 100
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Unsqueeze", [f"x{t}", "axes"], [f"u{t}"]) for t in range(steps)]
    nodes.append(helper.make_node("Concat", [f"u{t}" for t in range(steps)], ["y"], axis=0))
    graph = helper.make_graph(
        nodes, "scan", [helper.make_tensor_value_info(f"x{t}", TensorProto.FLOAT, [1, 24]) for t in range(steps)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 1, 24])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    path = tmp_path / "scan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    inlined = []
    real = cpu_schedules.try_inline
    monkeypatch.setattr(cpu_schedules, "try_inline", lambda sch, block: inlined.append(block) or real(sch, block))
    xs = {f"x{t}": rng.standard_normal((1, 24)).astype(np.float32) for t in range(steps)}
    got = build_model(ConvertConfig(model=str(path), dtype="float32")).compiled().run(xs)
    assert inlined == []
    np.testing.assert_array_equal(got["y"], np.stack([xs[f"x{t}"] for t in range(steps)]))


def test_float16_max_pooling_runs_on_float32_values_with_the_same_bits(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A float16 max pool's window maximum is taken in float32 (each input converted once, not
    both operands of every step): its outputs are bit for bit those of TVM's float16 pooling,
    overflows to ±inf included, and a window of -inf gives float16's lowest, as there. (The float16
    conv's input is the pool's, channel by channel: a full conv would make NaN of 0 × inf, and
    a window holding NaN follows the float32 build's maximum now.)"""
    from amptool.compiler import cpu, cpu_kernels

    path = _save(tmp_path, """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 13, 11] x) => (float[1, 8, 7, 6] y) <float[8, 1, 1, 1] w = {1, 1, 1, 1, 1, 1, 1, 1}> {
        c = Conv <group = 8> (x, w)
        y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 0, 0], ceil_mode = 1> (c)
    }""")
    (pool,) = [script for script in scheduled_kernels(path, "float16") if '"pool_max_update"' in script]
    assert 'T.Cast("float32"' in pool and 'T.max(' in pool  # the window's maximum over float32 values
    x = np.random.default_rng(5).standard_normal((1, 8, 13, 11)).astype(np.float32) * 3e4  # some overflow
    x[0, :, :4, :4] = -1e6  # whole windows of -inf once in float16
    widened = build_model(ConvertConfig(model=path, dtype="float16")).compiled().run({"x": x})["y"]
    plain = {k: v for k, v in cpu_kernels.legalize_map().items() if "max_pool" not in k}
    monkeypatch.setattr(cpu, "legalize_map", lambda: plain)
    per_op = build_model(ConvertConfig(model=path, dtype="float16")).compiled().run({"x": x})["y"]
    assert np.isinf(widened).any() and (widened == np.finfo(np.float16).min).any()
    assert np.asarray(widened).tobytes() == np.asarray(per_op).tobytes()


@pytest.mark.parametrize(("shape", "perm", "tiled"), [
    ([1, 28, 14, 48], [0, 3, 1, 2], True),  # NHWC → NCHW: columns 14 a tile, channels 16
    ([1, 48, 28, 14], [0, 2, 3, 1], True),  # NCHW → NHWC
    ([2, 17, 19], [0, 2, 1], False),  # no divisor of 17 or 19 in [4, 16]: one vectorized axis, as before
    ([3, 5, 64], [1, 0, 2], False),  # the last axis stays innermost: contiguous already
])
def test_transposes_are_copied_in_square_tiles(tmp_path: Path, shape: list[int], perm: list[int], tiled: bool) -> None:
    """A layout change reads each vector from lines it comes back to only once per tile (16 × 16
    at most), not once per row of the output; the values are the input's, moved."""
    out_shape = [shape[p] for p in perm]
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{",".join(map(str, shape))}] x) => (float[{",".join(map(str, out_shape))}] y) {{
            y = Transpose<perm = [{",".join(map(str, perm))}]>(x)
        }}""")
    kernels = [k for k in scheduled_kernels(path, "float32") if "T_transpose" in k]
    assert len(kernels) == 1
    vectorized = re.findall(r"in T\.vectorized\(T\.int64\((\d+)\)\)", kernels[0])
    split_axes = set(re.findall(r"\bax(\d)_1\b", kernels[0]))  # the inner halves of split loops
    if tiled:
        assert len(split_axes) == 2, kernels[0]
    else:  # at most the last axis cut into vectors the ISA's registers hold (64 into 2 × 32 with AVX2)
        assert split_axes <= {str(len(shape) - 1)}, kernels[0]
    if tiled:
        assert vectorized == [str(out_shape[-1] if out_shape[-1] <= 16 else 16)], kernels[0]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lanes", [16, 8])
def test_matmul_tiles_fill_the_registers(lanes: int) -> None:
    """``matmul_vectors`` × its rows keep accumulators, weight vectors and the broadcast row value
    in the ISA's registers; BERT's 128-row projections over 768 columns take 3 vectors × 8 rows
    (AVX-512) or × 4 (AVX2)."""
    from amptool.compiler.cpu_kernels import matmul_row_cap, matmul_vectors

    registers = 32 if lanes == 16 else 16
    for rows in (1, 7, 8, 50, 128, 197, 384):
        for blocks in range(1, 25):
            vectors = matmul_vectors(rows, blocks, lanes)
            assert blocks % vectors == 0 and vectors <= (4 if lanes == 16 else 3)
            if vectors > 1:
                assert matmul_row_cap(lanes, vectors) * vectors + vectors + 1 <= registers
    assert matmul_vectors(128, 768 // lanes, lanes) == 3


def test_matmul_of_three_vector_tiles_matches_onnxruntime(tmp_path: Path) -> None:
    """144 columns (9 vectors: tiles of 3) over 24 rows of two items: the weight packed in 48-column
    blocks with AVX-512, and onnxruntime's values."""
    from amptool.compiler.cpu_kernels import matmul_vectors, vector_lanes

    values = ", ".join(f"{v:.6f}" for v in np.random.default_rng(5).normal(0.0, 0.1, 96 * 144))
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 24, 96] x) => (float[2, 24, 144] y) <float[96, 144] w = {{{values}}}> {{
            y = MatMul(x, w)
        }}""")
    lanes = vector_lanes(_tvm.make_target(host_llvm_spec()))
    block = lanes * matmul_vectors(24, 144 // lanes, lanes)
    text = "\n".join(scheduled_kernels(path, "float32"))
    assert f"T.Buffer((T.int64({144 // block}), T.int64(96), T.int64({block})), \"float32\")" in text
    x = np.random.default_rng(6).standard_normal((2, 24, 96)).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_bfloat16_matmul_without_dot_products_reads_paired_weights_and_keeps_its_epilogue(tmp_path: Path) -> None:
    """A bfloat16 matmul of a constant weight on a CPU without vdpbf16ps reads its weight as uint32
    pairs of column vectors (bf16_pairs), and its bias and activation stay fused into it (TVM's
    pattern analysis had called the decoded product a plain reduction: BERT-base got 96 more
    kernels). Values: the same as TVM's plain build of the same module."""
    rng = np.random.default_rng(7)
    w = ", ".join(f"{v:.6f}" for v in rng.normal(0.0, 0.1, 64 * 64))
    b = ", ".join(f"{v:.6f}" for v in rng.normal(0.0, 0.1, 64))
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[16, 64] x) => (float[16, 64] y) <float[64, 64] w = {{{w}}}, float[64] b = {{{b}}}> {{
            m = MatMul(x, w)
            a = Add(m, b)
            y = Relu(a)
        }}""")
    for mcpu in ("emeraldrapids", "haswell"):  # AVX-512 whose dot product is slow (FMA kernels), AVX2
        (kernel,) = [k for k in scheduled_kernels(path, "bfloat16", mcpu) if '"amp_matmul_update"' in k]
        assert re.search(r'param_\d+: T\.Buffer\(.*?, "uint32"\)', kernel), kernel
        assert "T.max(" in kernel, kernel  # the Relu, in the matmul's kernel
    feeds = {"x": rng.standard_normal((16, 64)).astype(np.float32)}
    ours, plain = _both(path, "bfloat16", feeds, ("-mattr=-avx512bf16",))
    np.testing.assert_allclose(ours[0], plain[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("spec", "lanes"), [
    ({"kind": "llvm", "mcpu": "znver4"}, 16),
    ({"kind": "llvm", "mcpu": "emeraldrapids"}, 16),
    ({"kind": "llvm", "mcpu": "emeraldrapids", "mattr": ["-avx512f"]}, 8),  # TVM says 512 bits for both
    ({"kind": "llvm", "mcpu": "haswell"}, 8),  # TVM says 512 bits
    ({"kind": "llvm"}, 4),  # generic x86-64: SSE2
])
def test_vector_lanes_follow_the_target_features(spec: dict, lanes: int) -> None:
    """Register tiles are planned for the registers the ISA has: an AVX2 target planned as AVX-512
    spilled (ResNet-50 with -mattr=-avx512f 115 → 157 ms once the tiles grew)."""
    from amptool.compiler.cpu_kernels import vector_lanes

    assert vector_lanes(_tvm.make_target(spec)) == lanes


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize(("op", "gates"), [("LSTM", 4), ("GRU", 3)])
def test_low_precision_recurrent_steps_keep_the_packed_matmul(tmp_path, op, gates, direction):
    """A bfloat16 LSTM/GRU step's hidden-state matmul adds the step's input projection, squeezed
    and cast to float32 first: two side-input steps before the epilogue. Both are inlined, so
    the step keeps the packed, vectorized matmul; it fell to a scalar dot per output column that
    converted the whole hidden state again for each (LSTM hidden 256 × 50 steps: 11.3 → 1.4 ms,
    float32 1.25 ms). Both directions of a bidirectional step are one such matmul, a weight per
    direction. Values stay onnxruntime's within bfloat16 rounding."""
    from tests.onnx_checks import assert_close_to_onnxruntime

    hidden, steps, features = 64, 6, 32
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(12)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w", (dirs, gates * hidden, features)), ("r", (dirs, gates * hidden, hidden)),
                          ("b", (dirs, 2 * gates * hidden)))]
    node = helper.make_node(op, ["x", "w", "r", "b"], ["y"], hidden_size=hidden, direction=direction)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, features])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, dirs, 1, hidden])]
    graph = helper.make_graph([node], "rnn", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path = str(tmp_path / "rnn.onnx")
    onnx.save(model, path)
    matmuls = [s for s in scheduled_kernels(path, "bfloat16") if "amp_matmul_update" in s]
    assert len(matmuls) >= 2, matmuls  # the input projection and the recurrent steps
    per_direction = re.compile(rf"T\.Buffer\(\(T\.int64\(2\), T\.int64\(\d+\), T\.int64\({hidden}\), T\.int64\(\d+\)\)")
    assert (dirs == 2) == any(per_direction.search(s) for s in matmuls), matmuls  # [dirs, N/B, K, B] weights
    for script in matmuls:
        update = script.index('T.sblock("amp_matmul_update")')
        assert "T.vectorized" in script[script.rindex(" for ", 0, update):update], script
    assert_close_to_onnxruntime(path, {"x": rng.standard_normal((steps, 1, features)).astype(np.float32)}, "bfloat16")


@pytest.mark.parametrize(("body", "out_shape"), [
    # NHWC → NCHW with a per-channel bias: the bias stays put along the columns
    ("t = Transpose<perm = [0, 3, 1, 2]>(x)\n y = Add(t, b)", [1, 64, 14, 14]),
    # NHWC → NCHW into a depth-to-space (a transposed conv's phase interleave): each column reads
    # x[h/2, w/2, …], no affine stride along it, but channels are contiguous
    ("t = Transpose<perm = [0, 3, 1, 2]>(x)\n y = DepthToSpace<blocksize = 2>(t)", [1, 16, 28, 28]),
], ids=["bias", "depth_to_space"])
def test_gathers_with_contiguous_channels_are_copied_in_tiles(tmp_path: Path, body: str, out_shape: list[int]) -> None:
    """A layout change fused with a bias add, or with an interleave whose columns are no affine
    function of the output's (a ConvTranspose at a model's output: 2.4× slower untiled), is copied
    in the same tiles: channels split outside the vectorized columns."""
    bias = ", ".join(f"{v:.3f}" for v in np.linspace(-1, 1, 64))
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 14, 14, 64] x) => (float[{",".join(map(str, out_shape))}] y)
        <float[64, 1, 1] b = {{{bias}}}> {{
            {body}
        }}""")
    kernels = scheduled_kernels(path, "float32")
    assert len(kernels) == 1
    assert len(set(re.findall(r"\bax(\d)_1\b", kernels[0]))) == 2, kernels[0]  # channels and columns split
    x = np.random.default_rng(3).standard_normal([1, 14, 14, 64]).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_concat_is_vectorized_within_each_input(tmp_path: Path) -> None:
    """Three 16-channel pieces concatenated along channels: vectors of 16 (each inside one piece,
    its select the same for every lane), not 24 lanes that straddle two pieces and run as scalars."""
    path = _save(tmp_path, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 20, 20, 16] a, float[1, 20, 20, 16] b, float[1, 20, 20, 16] c) => (float[1, 20, 20, 48] y) {
            ra = Relu(a)
            y = Concat<axis = 3>(ra, b, c)
        }""")
    kernels = [k for k in scheduled_kernels(path, "float32") if "T_concat" in k]
    assert len(kernels) == 1
    assert re.findall(r"in T\.vectorized\(T\.int64\((\d+)\)\)", kernels[0]) == ["16"], kernels[0]
    rng = np.random.default_rng(4)
    feeds = {name: rng.standard_normal([1, 20, 20, 16]).astype(np.float32) for name in "abc"}
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("channels", [16, 64])
def test_a_channel_concat_stays_vectors_through_tvms_vectorizer(tmp_path: Path, channels: int) -> None:
    """TVM's vectorizer runs a select whose condition differs between lanes as scalars; a concat's
    ``64 <= c`` did, though each vector lies in one input. Compared per vector (``c // 32``), the
    condition is one value a vector and the copy stays vectors (SqueezeNet's concats 0.29–0.87×)."""
    path = _save(tmp_path, f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 9, 9, {channels}] a, float[1, 9, 9, {channels}] b) => (float[1, 9, 9, {2 * channels}] y) {{
            y = Concat<axis = 3>(a, b)
        }}""")
    text = kernel_after_pass(path, "concat", "VectorizeLoop")
    assert "_s in range" not in text and "T.Ramp(" in text, text
    rng = np.random.default_rng(6)
    feeds = {name: rng.standard_normal([1, 9, 9, channels]).astype(np.float32) for name in "ab"}
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_array_equal(got, want)


def test_a_concat_read_by_a_polynomial_is_computed_once(tmp_path: Path) -> None:
    """A sigmoid over a concat (a detector's class scores from three scales) reads its operand
    dozens of times: the concat is its own step, not a select over gathered loads at every read."""
    path = _save(tmp_path, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 80, 64] a, float[1, 80, 16] b, float[1, 80, 4] c) => (float[1, 80, 84] y) {
            t = Concat<axis = 2>(a, b, c)
            y = Sigmoid(t)
        }""")
    kernels = [k for k in scheduled_kernels(path, "float32") if "T_concat" in k]
    assert len(kernels) == 1
    assert 'T.sblock("T_concat")' in kernels[0] and "T.sblock_alloc_buffer" in kernels[0], kernels[0]
    rng = np.random.default_rng(5)
    feeds = {name: rng.standard_normal([1, 80, n]).astype(np.float32) for name, n in (("a", 64), ("b", 16), ("c", 4))}
    want, got = onnxruntime_and_amptool(path, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_vector_count_no_tile_divides_gets_a_zero_vector(tmp_path: Path) -> None:
    """Five vectors of output channels (EfficientNet's 40 with AVX2; SqueezeNet's 1000 classes are
    125): no tile of 2–4 vectors divides them, and tiles of one vector load a broadcast input per
    FMA. Zero filters pad them to six (tiles of two or three, the extra outputs dropped): SqueezeNet's
    512 → 1000 classifier conv 2.0 → 1.3–1.4 ms. Values stay onnxruntime's."""
    from amptool.compiler.cpu_kernels import vector_lanes

    lanes = vector_lanes(_tvm.make_target(host_llvm_spec()))
    path = _save(tmp_path, _conv_model(5 * lanes))
    packed = [shape for k in scheduled_kernels(path, "float32") if '"amp_conv2d_nhwc_init"' in k
              for shape in re.findall(r"T\.Buffer\(\((T\.int64\(\d+\)(?:, T\.int64\(\d+\)){4})\)", k)]
    dims = [int(d) for d in re.findall(r"T\.int64\((\d+)\)", packed[0])] if packed else []
    assert dims and dims[-1] >= 2 * lanes and dims[0] * dims[-1] == 6 * lanes, packed
    x = np.random.default_rng(9).standard_normal([1, 8, 12, 10]).astype(np.float32)
    want, got = onnxruntime_and_amptool(path, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_pad_along_the_last_axis_keeps_the_usual_vectors(tmp_path: Path) -> None:
    """A pad's selects compare the last axis with 1 and its length: runs no vector divides, so the
    axis is split as any other (the largest divisor of 3002 from one to four vectors: 19 lanes with
    AVX2, 38 with AVX-512), never vectorized whole (LLVM takes minutes)."""
    from amptool.compiler.cpu_kernels import vector_lanes

    lanes = vector_lanes(_tvm.make_target(host_llvm_spec()))
    chunk = max(d for d in range(lanes, 4 * lanes + 1) if 3002 % d == 0)
    path = _save(tmp_path, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4, 8, 3000] x) => (float[1, 4, 8, 3002] y) <int64[8] p = {0, 0, 0, 1, 0, 0, 0, 1}> {
            t = Pad(x, p)
            y = Relu(t)
        }""")
    kernels = scheduled_kernels(path, "float32")
    assert [re.findall(r"in T\.vectorized\(T\.int64\((\d+)\)\)", k) for k in kernels] == [[str(chunk)]]


@pytest.mark.parametrize("mode", ["const", "input"])
def test_a_gather_fuses_into_the_kernel_that_reads_it(tmp_path: Path, mode: str) -> None:
    """A Gather (``take``) is computed inside its consumer's kernel, not copied by a kernel of its
    own: TVM's pattern analysis called a load at a loaded index opaque, and an unrolled GRU paid a
    kernel call per step for its projection row (a CRNN: 64 of its 201 calls). Indices from a
    constant or an input, negative ones included; the values are onnxruntime's."""
    rng = np.random.default_rng(4)
    indices = np.array([[3, -1], [0, 5]], np.int64)
    index_init = [numpy_helper.from_array(indices, "i")] if mode == "const" else []
    index_input = [] if mode == "const" else [helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["g"], axis=1), helper.make_node("Add", ["g", "b"], ["a"]),
         helper.make_node("Tanh", ["a"], ["y"])], "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 32]), *index_input],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2, 2, 32])],
        [numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"), *index_init])
    path = str(tmp_path / "gather.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    import tvm

    from tests.conftest import staged_module

    mod = staged_module(path, "float32", "schedule")
    names = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    (fused,) = [n for n in names if "take" in n]  # with an input's indices, their wrap fuses in too
    assert fused.endswith("tir_tanh"), names
    feeds = {"x": rng.standard_normal((4, 6, 32)).astype(np.float32)}
    if mode == "input":
        feeds["i"] = indices
    ours, plain = _both(path, "float32", feeds)
    np.testing.assert_allclose(ours[0], plain[0], rtol=1e-6, atol=1e-6)
    want = np.tanh(np.take(feeds["x"], indices, axis=1) + numpy_helper.to_array(graph.initializer[0]))
    np.testing.assert_allclose(ours[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("columns", [144, 100])
def test_a_matmul_with_a_constant_weight_per_batch_item_is_packed(tmp_path: Path, dtype: str, columns: int) -> None:
    """``[2, M, K] · [2, K, N]`` with a constant weight per item (a bidirectional recurrence's step)
    is the packed, vectorized matmul with its epilogue fused in, not TVM's unscheduled product;
    a column count no vector divides is padded and cropped. Values are onnxruntime's."""
    from tests.onnx_checks import assert_close_to_onnxruntime

    rng = np.random.default_rng(21)
    w = rng.standard_normal((2, 48, columns)).astype(np.float32) * 0.2
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])], "per_item",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, columns])], [numpy_helper.from_array(w, "w")])
    path = str(tmp_path / "per_item.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    (kernel,) = [s for s in scheduled_kernels(path, dtype) if "amp_matmul_update" in s]
    update = kernel.index('T.sblock("amp_matmul_update")')
    assert "T.vectorized" in kernel[kernel.rindex(" for ", 0, update):update], kernel
    assert "tanh" in kernel, kernel  # the epilogue in the same kernel
    assert_close_to_onnxruntime(path, {"x": rng.standard_normal((2, 3, 48)).astype(np.float32)}, dtype)
