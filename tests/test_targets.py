"""Target registry: --target / --cuda-arch / --target-options, capability checks, --lower-only."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from amptool import _tvm
from amptool.compiler import targets
from amptool.errors import TargetUnavailableError, UserError
from tests.conftest import read_json, single_error

HAS_VULKAN = _tvm.has_global_func("target.build.vulkan")
HAS_GPU = _tvm.cuda_compute_version() is not None


def test_llvm_defaults_to_the_host_cpu():
    resolved = targets.resolve_target("llvm")
    corrections = _tvm.host_feature_corrections(_tvm.host_cpu())
    assert resolved.spec == {"kind": "llvm", "mcpu": _tvm.host_cpu(), **({"mattr": corrections} if corrections else {})}
    assert resolved.device == "cpu" and resolved.arch is None
    has = _tvm.llvm_cpu_features(resolved.spec, ["avx512f", "avx512bf16", "f16c"])
    flags = set(Path("/proc/cpuinfo").read_text().split()) if os.path.exists("/proc/cpuinfo") else None
    if flags and "flags" in flags:  # x86 Linux: the target has exactly the host's features
        assert has == {"avx512f": "avx512f" in flags, "avx512bf16": "avx512_bf16" in flags, "f16c": "f16c" in flags}


def test_host_features_correct_a_cpu_name_a_vm_got_wrong():
    """A hypervisor's model number can name another CPU: an AMX server VM was 'rocketlake' to LLVM
    (no AVX512-BF16, AVX512-FP16 or AMX), so bfloat16 builds never used the instructions it has; a
    VM with AVX-512 off under an AVX-512 model would die of SIGILL. The kernel's flags correct both."""
    sapphire = frozenset({"avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
                          "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "gfni",
                          "avx512_vpopcntdq", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16",
                          "amx_int8", "vaes", "vpclmulqdq"})
    assert _tvm.host_feature_corrections("rocketlake", sapphire) == [
        "+amx-bf16", "+amx-int8", "+amx-tile", "+avx512bf16", "+avx512fp16", "+avxvnni"]
    assert _tvm.host_feature_corrections("sapphirerapids", sapphire) == []
    no_avx512 = frozenset({"avx", "avx2", "fma", "f16c"})
    assert "-avx512f" in _tvm.host_feature_corrections("skylake-avx512", no_avx512)
    assert _tvm.host_feature_corrections("skylake-avx512", frozenset()) == []  # no flags read: nothing to say
    spec = {"kind": "llvm", "mcpu": "rocketlake", "mattr": _tvm.host_feature_corrections("rocketlake", sapphire)}
    assert _tvm.llvm_cpu_features(spec, ["avx512bf16", "amx-bf16"]) == {"avx512bf16": True, "amx-bf16": True}
    from amptool.compiler.cpu_speed import bf16_dot_pays

    assert not bf16_dot_pays(spec["mcpu"], spec["mattr"])  # an Intel server core: FMAs beat its vdpbf16ps
    assert bf16_dot_pays("znver4") and not bf16_dot_pays("sapphirerapids")


def test_user_features_come_after_the_hosts_and_a_named_cpu_drops_them(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(targets, "_host_cpu_and_corrections", lambda: ("rocketlake", ("+avx512bf16",)))
    assert targets.resolve_target("llvm").spec == {"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+avx512bf16"]}
    spec = targets.resolve_target("llvm", options=["-mattr=-avx512bf16"], lower_only=True).spec
    assert spec["mattr"] == ["+avx512bf16", "-avx512bf16"]
    assert not _tvm.llvm_cpu_features(spec, ["avx512bf16"])["avx512bf16"]  # the user's, last, wins
    assert targets.resolve_target("llvm", options=["-mcpu=znver4"], lower_only=True).spec == {
        "kind": "llvm", "mcpu": "znver4"}


def test_target_options_become_dict_keys():
    resolved = targets.resolve_target("llvm", options=["-mcpu=skylake-avx512 -mattr=+avx2,-avx512f", "-mattr=+f16c"])
    assert resolved.spec == {"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["+avx2", "-avx512f", "+f16c"]}
    _tvm.make_target(resolved.spec)  # TVM takes it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["-O3"], "'-O3' is not one of -mcpu=NAME"),
        (["-mcpu"], "'-mcpu' is not one of"),
        (["-mattr=avx2"], "'avx2' needs a + or -"),
        (["-mcpu=notacpu"], "-mcpu=notacpu: LLVM does not know this CPU"),
        (["-mattr=+avx2,+notafeature"], "LLVM does not know feature(s) notafeature"),
    ],
)
def test_bad_target_options_are_user_errors(options, message):
    with pytest.raises(UserError) as info:
        targets.resolve_target("llvm", options=options)
    assert message in str(info.value)
    assert not isinstance(info.value, TargetUnavailableError)


def test_cuda_arch_comes_from_flag_then_local_gpu_then_default(monkeypatch):
    assert targets.resolve_target("cuda", "sm_80").spec == {"kind": "cuda", "arch": "sm_80"}
    assert targets.resolve_target("cuda", "sm_80").arch_source == "--cuda-arch"
    monkeypatch.setattr(_tvm, "cuda_compute_version", lambda: "8.6")
    local = targets.resolve_target("cuda")
    assert (local.arch, local.arch_source) == ("sm_86", "local GPU")
    monkeypatch.setattr(_tvm, "cuda_compute_version", lambda: None)
    monkeypatch.setattr(targets, "_nvidia_smi_compute_cap", lambda: None)
    default = targets.resolve_target("cuda")
    assert (default.arch, default.arch_source) == (targets.DEFAULT_CUDA_ARCH, "default")
    assert default.spec["arch"] == "sm_90"


@pytest.mark.parametrize(
    ("name", "arch", "options", "message"),
    [
        ("cuda", "sm8", (), "'sm8' is not a CUDA architecture"),
        ("cuda", "sm_35", (), "'sm_35' is not a CUDA architecture sm_50 or newer"),
        ("llvm", "sm_80", (), "--cuda-arch sm_80: only used with --target cuda"),
        ("cuda", None, ("-mcpu=znver4",), "--target-options: only used with --target llvm"),
        ("cuda11", None, (), "Unknown target 'cuda11'"),
    ],
)
def test_flags_that_do_not_apply_are_user_errors(name, arch, options, message):
    with pytest.raises(UserError) as info:
        targets.check_target_flags(name, arch, options)
    assert message in str(info.value)


@pytest.mark.skipif(HAS_VULKAN, reason="this TVM has Vulkan codegen")
def test_vulkan_without_codegen_exits_3_naming_what_is_missing(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target", "vulkan", "-o", str(out))
    assert result.exit_code == 3, result.output
    first = result.output.strip().splitlines()[0]
    assert "target.build.vulkan" in first and "USE_VULKAN=ON" in first
    assert single_error(result.output)
    assert not out.exists()


@pytest.mark.parametrize("target", ["vulkan", "cuda", "llvm"])
def test_lower_only_lowers_and_schedules_without_codegen(target, zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target", target, "--lower-only", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out)) == ["lowered.py", "manifest.json"]
    manifest = read_json(out / "manifest.json")
    assert manifest["lower_only"] is True and manifest["library"] is None
    assert manifest["target"] == target and manifest["kernels"] > 0
    assert "lower" in manifest["timings_s"] and "compile" not in manifest["timings_s"]
    script = (out / "lowered.py").read_text()
    assert "T.prim_func" in script
    if target != "llvm":  # GPU kernels carry thread bindings once scheduled
        assert "threadIdx.x" in script
    if target == "vulkan" and not HAS_VULKAN:
        assert "target.build.vulkan" in manifest["codegen_missing"]
    if target == "cuda":
        assert manifest["arch"] == manifest["target_spec"]["arch"]


def test_lower_only_artifact_cannot_run(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    assert run_cli("convert", zoo_model("tiny_cnn"), "--lower-only", "-o", str(out)).exit_code == 0
    result = run_cli("run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 2
    assert "--lower-only" in result.output and not (tmp_path / "y.npz").exists()


def test_lower_only_refuses_auto_fallback(zoo_model, run_cli, tmp_path):
    result = run_cli("convert", zoo_model("tiny_cnn"), "--lower-only", "--auto-fallback", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "--lower-only and --auto-fallback" in result.output


def test_cli_target_options_reach_the_manifest(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--dtype", "float32", "--target-options",
                     "-mcpu=x86-64-v3 -mattr=+f16c", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    assert manifest["target_spec"] == {"kind": "llvm", "mcpu": "x86-64-v3", "mattr": ["+f16c"]}
    assert manifest["target_options"] == ["-mcpu=x86-64-v3 -mattr=+f16c"]
    assert manifest["arch"] is None and manifest["versions"]["llvm"].isdigit()


def test_cli_bad_target_options_is_one_line_exit_2(zoo_model, run_cli, tmp_path):
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target-options", "-mcpu=notacpu", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert result.output.startswith("error: --target-options -mcpu=notacpu") and single_error(result.output)
    assert not (tmp_path / "o").exists()


def test_cuda_manifest_records_the_resolved_target(zoo_model, run_cli, tmp_path, monkeypatch):
    """Wiring only (the CUDA build itself is the test below): what resolve_target chose
    reaches the manifest."""
    import amptool.app.convert as convert

    real = convert._compile
    monkeypatch.setattr(convert, "_compile", lambda mod, spec: real(mod, {"kind": "llvm"}))
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target", "cuda", "--cuda-arch", "sm_86", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    assert manifest["target_spec"] == {"kind": "cuda", "arch": "sm_86"}
    assert (manifest["arch"], manifest["device"], manifest["target_options"]) == ("sm_86", "cuda", [])
    assert "cuda" in manifest["versions"] and "llvm" in manifest["versions"]


def test_cuda_builds_without_a_gpu_and_records_the_arch(zoo_model, run_cli, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target", "cuda", "--cuda-arch", "sm_80", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = read_json(out / "manifest.json")
    assert manifest["target_spec"] == {"kind": "cuda", "arch": "sm_80"}
    assert manifest["arch"] == "sm_80" and manifest["device"] == "cuda" and manifest["library"] == "model.so"
    assert "cuda" in manifest["versions"]
    if not HAS_GPU:  # running needs the device: exit 3, one line naming what is missing
        inputs = tmp_path / "x.npz"
        np.savez(inputs, **{i["name"]: np.zeros(i["shape"], i["dtype"]) for i in manifest["inputs"]})
        run = run_cli("run", str(out), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"))
        assert run.exit_code == 3, run.output
        assert run.output.startswith(f"error: Cannot run {out} on cuda: ") and single_error(run.output)
        assert not (tmp_path / "y.npz").exists()


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible: the CUDA bench runs")
def test_bench_on_cuda_without_a_gpu_exits_3(zoo_model, run_cli, tmp_path):
    result = run_cli("bench", zoo_model("tiny_cnn"), "--target", "cuda", "--cuda-arch", "sm_80", "--rounds", "1",
                     "--runs", "1", "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 3, result.output
    assert result.output.startswith("error: Target 'cuda' builds here but cannot run: ")
    assert single_error(result.output)
    assert not (tmp_path / "b.json").exists()


def test_bench_refuses_cuda_arch_for_llvm(zoo_model, run_cli):
    result = run_cli("bench", zoo_model("tiny_cnn"), "--cuda-arch", "sm_80")
    assert result.exit_code == 2 and "--cuda-arch sm_80: only used with --target cuda" in result.output


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_bench_on_cuda_synchronises_and_names_the_gpu(zoo_model, run_cli, tmp_path):
    result = run_cli("bench", zoo_model("tiny_cnn"), "--target", "cuda", "--rounds", "1", "--runs", "2",
                     "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    data = read_json(tmp_path / "b.json")
    assert data["host"]["gpu"] and data["clock"].endswith("device synchronised after each")
    assert all(r["median_ms"] > 0 for r in data["results"])


GPU_CHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "gpu_check.sh")


def test_gpu_check_script_parses():
    import subprocess

    subprocess.run(["bash", "-n", GPU_CHECK], check=True)
    script = GPU_CHECK.replace(".sh", ".py")
    subprocess.run([sys.executable, "-m", "py_compile", script], check=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU driver is here")
def test_gpu_check_stops_cleanly_without_a_gpu(tmp_path):
    import subprocess

    done = subprocess.run(["bash", GPU_CHECK], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stderr.strip() == ("gpu_check: no NVIDIA driver here (nvidia-smi not found); "
                                   "run this on a machine with an NVIDIA GPU")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible: the CUDA diff runs")
def test_diff_on_cuda_without_a_gpu_exits_3_before_building(zoo_model, run_cli, tmp_path, monkeypatch):
    import amptool.app.convert as convert

    monkeypatch.setattr(convert, "rewrite_model", lambda *a, **k: pytest.fail("built for a device that is not here"))
    result = run_cli("diff", zoo_model("tiny_cnn"), "--target", "cuda", "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 3, result.output
    assert result.output.startswith("error: Target 'cuda' builds here but cannot run: ")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("name", "arch", "dtype", "want"), [
    ("cuda", None, "float16", (targets.CUDA_TENSOR_INTRINSICS,)),
    ("cuda", "sm_80", "bfloat16", (targets.CUDA_TENSOR_INTRINSICS,)),
    ("cuda", "sm_90a", "float16", (targets.CUDA_TENSOR_INTRINSICS,)),
    ("cuda", "sm_61", "float16", ()),  # no tensor cores: DLight never asks for the intrinsics
    ("cuda", "sm_90", "float32", ()),
    ("cuda", "sm9", "float16", ()),  # a bad arch is check_target_flags' to report
    ("llvm", None, "bfloat16", ()),
])
def test_slow_imports_are_the_tensor_intrinsics_of_low_precision_cuda_builds(name, arch, dtype, want):
    assert targets.slow_imports(name, arch, dtype) == want


def test_cuda_without_codegen_still_exits_3_before_writing(zoo_model, run_cli, tmp_path, monkeypatch):
    """CUDA is resolved once TVM is needed (its import overlaps load and prepare), not before
    load: a TVM without CUDA codegen still stops with one line, exit 3, nothing written."""
    spec = targets.TARGETS["cuda"]
    monkeypatch.setitem(targets.TARGETS, "cuda", dataclasses.replace(spec, missing=lambda: "no CUDA codegen (test)"))
    out = tmp_path / "out"
    result = run_cli("convert", zoo_model("tiny_cnn"), "--target", "cuda", "-o", str(out))
    assert result.exit_code == 3, result.output
    assert "no CUDA codegen (test)" in result.output and single_error(result.output)
    assert not out.exists()
