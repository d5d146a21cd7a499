"""CUDA build path: tensor cores for every fp16/bf16 GEMM and convolution, names nvcc accepts.

No GPU here: numbers cannot be checked, so these tests check structure — which kernels issue
tensor-core instructions (read from the generated CUDA source) and, where nvcc is installed,
that the source compiles for the arch. The first CUDA build in a process imports TVM's tensor
intrinsics (~4 s of CPU since ``amptool._tvm.script``; 37 s before); one module-scoped build is shared.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amptool import _tvm
from amptool.compiler import cuda_compile, cuda_inspect
from amptool.compiler.gpu_names import c_identifier
from tests.conftest import export_packs_tvms_blob

HAS_CUDA_CODEGEN = _tvm.has_global_func("target.build.cuda")
HAS_NVCC = cuda_compile.find_nvcc() is not None
needs_cuda = pytest.mark.skipif(not HAS_CUDA_CODEGEN, reason="this TVM has no CUDA codegen")
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")

SOURCE = """
extern "C" __global__ void __launch_bounds__(128) fused_matmul_add_kernel(half* __restrict__ A, half* __restrict__ B);
extern "C" __global__ void __launch_bounds__(128) fused_conv2d_relu_kernel(half* __restrict__ A);
extern "C" __global__ void __launch_bounds__(64) fused_matmul1_tanh_kernel(half* __restrict__ A);
extern "C" __global__ void __launch_bounds__(64) matmul2_kernel(float* __restrict__ A);
extern "C" __global__ void __launch_bounds__(128) fused_matmul_add_kernel(half* __restrict__ A, half* __restrict__ B) {
  nvcuda::wmma::mma_sync(c[0], a[0], b[0], c[0]);
}
extern "C" __global__ void __launch_bounds__(128) fused_conv2d_relu_kernel(half* __restrict__ A) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0}, [%1];" : "=r"(x) : "r"(y));
}
extern "C" __global__ void __launch_bounds__(64) fused_matmul1_tanh_kernel(half* __restrict__ A) {
  acc = acc + A[i] * A[j];
}
extern "C" __global__ void __launch_bounds__(64) matmul2_kernel(float* __restrict__ A) {
  acc = acc + A[i] * A[j];
}
extern "C" __global__ void __launch_bounds__(64) softmax_kernel(half* __restrict__ A) { A[0] = A[1]; }
"""


def test_kernel_inspection_reads_definitions_and_tensor_core_instructions():
    found = {k.name: k for k in cuda_inspect.kernels(SOURCE)}
    assert sorted(found) == ["fused_conv2d_relu_kernel", "fused_matmul1_tanh_kernel", "fused_matmul_add_kernel",
                             "matmul2_kernel", "softmax_kernel"]  # declarations are not counted twice
    assert found["fused_matmul_add_kernel"].tensor_cores and found["fused_conv2d_relu_kernel"].tensor_cores
    assert not found["fused_matmul1_tanh_kernel"].tensor_cores
    assert [k.gemm for k in found.values()].count(True) == 4 and not found["softmax_kernel"].gemm
    assert not found["matmul2_kernel"].low_precision  # a float32 GEMM: not a tensor-core miss


def test_c_identifier():
    assert c_identifier("gpu_0/data_0") == "gpu_0_data_0"
    assert c_identifier("/encoder/layer.0/MatMul:0") == "_encoder_layer_0_MatMul_0"
    assert c_identifier("1x") == "v1x" and c_identifier("") == "v" and c_identifier("ok_1") == "ok_1"


def test_gpu_pipeline_stage_order():
    from amptool.compiler import gpu

    assert gpu.STAGES[0] == "sanitize names" and gpu.STAGES.index("schedule") < gpu.STAGES.index("finalize")
    for spec in ({"kind": "cuda", "arch": "sm_90"}, {"kind": "vulkan"}):
        assert [name for name, _ in gpu.stage_passes(_tvm.make_target(spec))] == list(gpu.STAGES)


def _gemm(m: int, dtype: str, out_dtype: str):
    from tvm import te

    a = te.placeholder((m, 96), dtype, name="a")
    b = te.placeholder((80, 96), dtype, name="b")
    k = te.reduce_axis((0, 96), name="k")
    c = te.compute((m, 80), lambda i, j: te.sum(a[i, k].astype(out_dtype) * b[j, k].astype(out_dtype), axis=k))
    return te.create_prim_func([a, b, c])


@pytest.mark.parametrize(
    ("spec", "m", "dtype", "out_dtype"),
    [
        ({"kind": "cuda", "arch": "sm_75"}, 128, "bfloat16", "float32"),  # bf16 wmma needs sm_80
        ({"kind": "cuda", "arch": "sm_60"}, 128, "float16", "float32"),  # no tensor cores
        ({"kind": "vulkan"}, 128, "float16", "float32"),
        ({"kind": "cuda", "arch": "sm_90"}, 128, "float32", "float32"),  # fp32 stays on the FMA units
        ({"kind": "cuda", "arch": "sm_90"}, 128, "bfloat16", "bfloat16"),  # wmma has no bf16 accumulator
        ({"kind": "cuda", "arch": "sm_90"}, 1, "float16", "float32"),  # a GEMV
    ],
)
def test_tensor_core_rule_declines(spec, m, dtype, out_dtype):
    from amptool.compiler.cuda_matmul import TensorCoreMatmul

    assert TensorCoreMatmul().apply(_gemm(m, dtype, out_dtype), _tvm.make_target(spec), False) is None


def test_sm_version_reads_arch_suffixes():
    from amptool.compiler.cuda_matmul import sm_version

    assert sm_version(_tvm.make_target({"kind": "cuda", "arch": "sm_90a"})) == 90
    assert sm_version(_tvm.make_target({"kind": "cuda", "arch": "sm_80"})) == 80
    assert sm_version(_tvm.make_target({"kind": "vulkan"})) == -1


def _relax_model(dtype: str):
    """A matmul (K = 64, below DLight's own tensor-core gate), a batch matmul, a 3x3 conv on a
    7x7 map with 64 channels, and a one-row GEMV; ONNX-style names with '/' and '.'."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("gpu_0/data_0", relax.TensorType((128, 64), "float32"))
    q = relax.Var("/enc/layer.0/q", relax.TensorType((4, 128, 32), dtype))
    img = relax.Var("img", relax.TensorType((1, 64, 7, 7), dtype))
    row = relax.Var("row", relax.TensorType((1, 256), dtype))
    w = relax.const(rng.standard_normal((64, 96)).astype("float32"))
    wc = relax.const(rng.standard_normal((64, 64, 3, 3)).astype("float32"))
    wr = relax.const(rng.standard_normal((256, 256)).astype("float32"))

    def low(value):
        return relax.op.astype(value, dtype)

    with bb.function("main", [x, q, img, row]):
        with bb.dataflow():
            xl = bb.emit(low(x), name_hint="gpu_0/data_0_low")
            mm = bb.emit(low(relax.op.matmul(xl, low(w), out_dtype="float32")), name_hint="/enc/MatMul")
            att = bb.emit(low(relax.op.matmul(q, relax.op.permute_dims(q, [0, 2, 1]), out_dtype="float32")))
            conv = bb.emit(low(relax.op.nn.conv2d(img, low(wc), padding=1, out_dtype="float32")))
            gemv = bb.emit(low(relax.op.matmul(row, low(wr), out_dtype="float32")))
            out = bb.emit_output(relax.Tuple([mm, att, conv, gemv]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def fp16_sm90():
    from amptool.compiler import gpu

    executable, timings = gpu.build(_relax_model("float16"), _tvm.make_target({"kind": "cuda", "arch": "sm_90"}))
    return executable, timings


@needs_cuda
def test_every_fp16_gemm_and_conv_uses_tensor_cores(fp16_sm90):
    executable, timings = fp16_sm90
    report = cuda_inspect.tensor_core_kernels(executable)
    with_tc = report["with_tensor_cores"]
    assert any("conv2d" in name for name in with_tc), report
    assert len([n for n in with_tc if "matmul" in n]) == 2, report  # the K=64 matmul and the batch matmul
    # the one-row GEMV is memory-bound: DLight's GEMV rule, reported as such
    assert len(report["gemm_without_tensor_cores"]) == 1 and "matmul" in report["gemm_without_tensor_cores"][0]
    assert report["kernels"] == len(with_tc) + len(report["without"])
    assert "schedule" in timings and "codegen" in timings


@needs_cuda
def test_kernel_parameters_are_c_identifiers(fp16_sm90):
    source = cuda_inspect.cuda_sources(fp16_sm90[0])[0]
    assert "gpu_0_data_0" in source and "gpu_0/data_0" not in source and "layer.0" not in source


@needs_cuda
@needs_nvcc
def test_generated_source_compiles_for_sm90(fp16_sm90):
    result = cuda_compile.compile_fatbin(cuda_inspect.cuda_sources(fp16_sm90[0])[0], "sm_90")
    assert len(result.fatbin) > 1000 and "arch=compute_90,code=sm_90" in result.command


@needs_cuda
@pytest.mark.parametrize(("arch", "tensor_cores"), [("sm_80", True), ("sm_75", False)])
def test_bfloat16_uses_tensor_cores_from_sm80(arch, tensor_cores):
    from amptool.compiler import gpu

    executable, _ = gpu.build(_relax_model("bfloat16"), _tvm.make_target({"kind": "cuda", "arch": arch}))
    report = cuda_inspect.tensor_core_kernels(executable)
    gemms_with = [n for n in report["with_tensor_cores"] if "matmul" in n or "conv2d" in n]
    assert len(gemms_with) == (3 if tensor_cores else 0), report
    source = cuda_inspect.cuda_sources(executable)[0]
    assert ("nv_bfloat16, nvcuda::wmma::row_major" in source) == tensor_cores
    if tensor_cores and HAS_NVCC:
        assert cuda_compile.compile_fatbin(source, arch).fatbin


def _onnx_matmul_conv(path: str) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, "conv.w")
    m = numpy_helper.from_array(rng.standard_normal((16 * 8 * 8, 96)).astype(np.float32) * 0.01, "fc.w")
    shape = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input/0", "conv.w"], ["c"], pads=[1, 1, 1, 1], name="/conv/Conv"),
         helper.make_node("Relu", ["c"], ["r"], name="/relu"),
         helper.make_node("Reshape", ["r", "shape"], ["f"], name="/flat"),
         helper.make_node("MatMul", ["f", "fc.w"], ["out"], name="/fc/MatMul")],
        "g", [helper.make_tensor_value_info("input/0", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 96])], [w, m, shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@needs_cuda
def test_convert_for_cuda_reports_tensor_cores_in_the_manifest(tmp_path):
    from amptool.app.convert import ConvertConfig, convert_model

    model = str(tmp_path / "m.onnx")
    _onnx_matmul_conv(model)
    config = ConvertConfig(model=model, dtype="float16", target="cuda", cuda_arch="sm_90")
    _, manifest = convert_model(config, str(tmp_path / "out"))
    cores = manifest["tensor_cores"]
    assert any("conv2d" in name for name in cores["with_tensor_cores"]), cores
    assert cores["gemm_without_tensor_cores"] == [n for n in cores["gemm_without_tensor_cores"] if "matmul" in n]
    assert (tmp_path / "out" / "model.so").is_file()


@needs_cuda
def test_exported_cuda_library_carries_the_blob_tvm_would_pack(fp16_sm90, tmp_path, monkeypatch):
    """A CUDA build's LLVM host modules are exported like the CPU build's: device code, VM
    bytecode and weights packed as our own ELF object, byte for byte TVM's serialisation."""
    executable = fp16_sm90[0]
    assert {m.kind for m in executable.mod._collect_dso_modules()} == {"llvm"}
    want = export_packs_tvms_blob(executable, str(tmp_path / "model.so"), monkeypatch)
    assert b"cuda" in want and b"__global__" in want  # the device module (its CUDA source) is among them


def _kernel_texts(executable) -> dict[str, str]:
    """Each defined kernel's CUDA text, by name, over every device module of the build."""
    import re

    texts = {}
    for source in cuda_inspect.cuda_sources(executable):
        for piece in source.split('extern "C" ')[1:]:
            head = re.match(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", piece)
            if head and "{" in piece and piece.find("{") < piece.find(";"):
                texts[head.group(1)] = piece
    return texts


@needs_cuda
def test_kernels_split_over_modules_are_the_kernels_one_module_holds():
    """The GPU codegen split over threads (split_codegen): every kernel, in whichever device
    module, is the CUDA text the one-module build generates."""
    from amptool.compiler import gpu, split_codegen

    target = _tvm.make_target({"kind": "cuda", "arch": "sm_90"})
    lowered = gpu.lower(_relax_model("float16"), target)
    with target:
        one = split_codegen.codegen(lowered, target, workers=1)
        split = split_codegen.codegen(lowered, target, workers=2)
    assert len(cuda_inspect.cuda_sources(one)) == 1 and len(cuda_inspect.cuda_sources(split)) == 2
    want, got = _kernel_texts(one), _kernel_texts(split)
    assert len(want) >= 4 and got == want


@needs_cuda
def test_division_by_a_constant_zero_builds_for_cuda(tmp_path):
    """``x / 0`` with a constant zero (the shared ``legalize_divide``: a product with ±inf) builds
    for CUDA, where TVM's division folded it into "Divide by zero"."""
    import onnx

    from amptool.app.convert import ConvertConfig, convert_model

    graph = helper.make_graph([helper.make_node("Div", ["x", "c"], ["y"])], "div",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
                              [numpy_helper.from_array(np.float32(0.0), "c")])
    model = str(tmp_path / "div.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    convert_model(ConvertConfig(model=model, dtype="float16", target="cuda", cuda_arch="sm_90"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "model.so").is_file()
