"""``amptool run``: an artifact reproduces diff's outputs, also under a runtime-only TVM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amptool import _tvm
from amptool.app.convert import ConvertConfig, build_model
from tests.conftest import read_json, single_error

HAS_GPU = _tvm.cuda_compute_version() is not None
REPO = Path(__file__).resolve().parent.parent


def _inputs(manifest_path: Path, path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    manifest = read_json(manifest_path)
    arrays = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in manifest["inputs"]}
    np.savez(path, **arrays)
    return arrays


@pytest.fixture(scope="module")
def fp16_artifact(tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """tiny_cnn converted to float16 for llvm, and an inputs file for it."""
    import onnx

    from amptool.app.convert import convert_model
    from amptool.testing import model_zoo

    root = tmp_path_factory.mktemp("artifact")
    model = root / "tiny_cnn.onnx"
    onnx.save(model_zoo.ALL_BUILDERS["tiny_cnn"](), model)
    convert_model(ConvertConfig(model=str(model), dtype="float16"), str(root / "out"))
    inputs = _inputs(root / "out" / "manifest.json", root / "x.npz")
    return model, root / "out", inputs


@pytest.fixture(scope="module")
def runtime_only_tvm(tmp_path_factory) -> Path:
    """A copy of the installed tvm package without its compiler library (a deployment install)."""
    import tvm

    root = tmp_path_factory.mktemp("runtime_only")
    source = Path(tvm.__file__).parent
    shutil.copytree(source, root / "tvm",
                    ignore=lambda _d, names: [n for n in names if n in ("libtvm_compiler.so", "__pycache__")])
    assert not list((root / "tvm").rglob("libtvm_compiler*"))
    return root


def _run_subprocess(args: list[str], runtime_only: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if runtime_only is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(runtime_only), str(REPO)])
        env["TVM_USE_RUNTIME_LIB"] = "1"
    return subprocess.run([sys.executable, "-m", "amptool", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_run_reproduces_diff_outputs_bit_for_bit(fp16_artifact, run_cli, tmp_path):
    model, outdir, inputs = fp16_artifact
    x = tmp_path / "x.npz"
    np.savez(x, **inputs)
    result = run_cli("run", str(outdir), "--inputs", str(x), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    assert "float16 on cpu" in result.output
    saved = run_cli("diff", str(model), "--dtype", "float16", "--inputs", str(x), "--save-outputs",
                    str(tmp_path / "d.npz"))
    assert saved.exit_code == 0, saved.output
    with np.load(tmp_path / "y.npz") as y, np.load(tmp_path / "d.npz") as d:
        assert list(y.files) == [o["name"] for o in read_json(outdir / "manifest.json")["outputs"]]
        for name in y.files:
            np.testing.assert_array_equal(y[name], d[f"converted/{name}"])
            assert y[name].dtype == d[f"converted/{name}"].dtype


def test_run_equals_the_in_memory_build(fp16_artifact, run_cli, tmp_path):
    model, outdir, inputs = fp16_artifact
    np.savez(tmp_path / "x.npz", **inputs)
    result = run_cli("run", str(outdir), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    expected = build_model(ConvertConfig(model=str(model), dtype="float16")).compiled().run(inputs)
    with np.load(tmp_path / "y.npz") as y:
        assert set(y.files) == set(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(y[name], value)


def test_run_under_a_runtime_only_tvm(fp16_artifact, runtime_only_tvm, run_cli, tmp_path):
    _model, outdir, inputs = fp16_artifact
    np.savez(tmp_path / "x.npz", **inputs)
    probe = subprocess.run(
        [sys.executable, "-c", "import tvm, json; print(json.dumps([tvm.__file__, tvm.base._RUNTIME_ONLY, "
                               "sorted(tvm.base._LOADED_LIBS)]))"],
        capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(runtime_only_tvm), "TVM_USE_RUNTIME_LIB": "1"},
    )
    tvm_file, runtime_only, libs = json.loads(probe.stdout.strip().splitlines()[-1])
    assert tvm_file.startswith(str(runtime_only_tvm)) and runtime_only and libs == ["tvm_runtime"]
    done = _run_subprocess(["run", str(outdir), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")],
                           runtime_only_tvm)
    assert done.returncode == 0, done.stderr
    assert "TVM runtime only" in done.stdout
    normal = run_cli("run", str(outdir), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "z.npz"))
    assert normal.exit_code == 0, normal.output
    with np.load(tmp_path / "y.npz") as y, np.load(tmp_path / "z.npz") as z:
        assert y.files == z.files
        for name in y.files:
            np.testing.assert_array_equal(y[name], z[name])


def test_cuda_jit_callback_works_without_the_compiler(runtime_only_tvm):
    """Kernels a CUDA library carries as source are compiled on load by tvm.support.nvcc, which
    asks Target.current() — an FFI function only the compiler library has. Once amptool has
    opened (or tried) the CUDA device, the callback gets past it to the GPU query."""
    code = (
        "from amptool import _tvm\n"
        "try:\n    _tvm.open_device('cuda:0')\nexcept LookupError:\n    pass\n"
        "import tvm, tvm.support.nvcc as nvcc\n"
        "assert tvm.base._RUNTIME_ONLY\n"
        "try:\n    print(nvcc.get_target_compute_version(None))\n"
        "except ValueError as err:\n    print('no GPU:', err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(runtime_only_tvm), str(REPO)]),
                               "TVM_USE_RUNTIME_LIB": "1"})
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("no GPU: No CUDA architecture") if not HAS_GPU else last[0].isdigit()


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("missing_outdir", 2, "Artifact directory not found"),
        ("not_an_artifact", 2, "is not an amptool artifact (no manifest.json)"),
        ("missing_input", 2, "no array for input(s) 'input'"),
        ("extra_input", 2, "unknown input(s) 'extra'"),
        ("wrong_shape", 2, "has shape [2, 3, 32, 32], the compiled model takes [1, 3, 32, 32]"),
        ("wrong_dtype", 2, "is float64, the model expects float32"),
        ("device_kind", 2, "this library was built for cpu, not cuda"),
        ("bad_device", 2, "--device 'gpu0' is not a device"),
        ("missing_library", 2, "has a manifest but no library model.so"),
    ],
)
def test_bad_run_is_one_line_and_writes_nothing(case, code, message, fp16_artifact, run_cli, tmp_path):
    _model, outdir, inputs = fp16_artifact
    arrays = dict(inputs)
    target = str(outdir)
    extra: list[str] = []
    if case == "missing_outdir":
        target = str(tmp_path / "nope")
    elif case == "not_an_artifact":
        target = str(tmp_path)
    elif case == "missing_input":
        arrays = {}
    elif case == "extra_input":
        arrays["extra"] = np.zeros(1, np.float32)
    elif case == "wrong_shape":
        arrays = {k: np.concatenate([v, v]) for k, v in arrays.items()}
    elif case == "wrong_dtype":
        arrays = {k: v.astype(np.float64) for k, v in arrays.items()}
    elif case == "device_kind":
        extra = ["--device", "cuda:0"]
    elif case == "bad_device":
        extra = ["--device", "gpu0"]
    elif case == "missing_library":
        copy = tmp_path / "copy"
        shutil.copytree(outdir, copy)
        (copy / "model.so").unlink()
        target = str(copy)
    np.savez(tmp_path / "x.npz", **arrays)
    result = run_cli("run", target, "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"), *extra)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert result.output.startswith("error: ") and single_error(result.output)
    assert not (tmp_path / "y.npz").exists()


def test_bfloat16_io_takes_and_returns_float32_files(zoo_model, run_cli, tmp_path):
    """.npz cannot hold bfloat16: a --low-precision-io bfloat16 model reads and writes float32."""
    model = zoo_model("tiny_cnn")
    out = tmp_path / "out"
    assert run_cli("convert", model, "--dtype", "bfloat16", "--low-precision-io", "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    assert {i["dtype"] for i in manifest["inputs"]} == {"bfloat16"}
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", **{i["name"]: rng.standard_normal(i["shape"]).astype(np.float32)
                                    for i in manifest["inputs"]})
    result = run_cli("run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "y.npz") as y:
        assert all(y[n].dtype == np.float32 for n in y.files)
        assert all(np.isfinite(y[n]).all() for n in y.files)


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_cuda_artifact_runs_on_the_gpu_also_runtime_only(zoo_model, run_cli, runtime_only_tvm, tmp_path):
    model = zoo_model("tiny_cnn")
    out = tmp_path / "out"
    assert run_cli("convert", model, "--target", "cuda", "--dtype", "float16", "-o", str(out)).exit_code == 0
    inputs = _inputs(out / "manifest.json", tmp_path / "x.npz")
    result = run_cli("run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    expected = build_model(ConvertConfig(model=model, dtype="float16", target="cuda")).compiled().run(inputs)
    done = _run_subprocess(["run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "z.npz")],
                           runtime_only_tvm)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "y.npz") as y, np.load(tmp_path / "z.npz") as z:
        for name, value in expected.items():
            np.testing.assert_array_equal(z[name], y[name])  # same library, runtime-only or not
            np.testing.assert_allclose(y[name].astype(np.float32), value.astype(np.float32), rtol=1e-3, atol=1e-3)
