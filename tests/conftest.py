"""Shared fixtures: models from the zoo saved to disk, and an in-process CLI runner."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner, Result

from amptool.compiler.targets import host_llvm_spec
from amptool.testing import model_zoo

warnings.filterwarnings("ignore", category=UserWarning)

ONNX_DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"


@pytest.fixture
def zoo_model(tmp_path: Path) -> Callable[[str], str]:
    """Save a model_zoo builder's model to tmp_path and return its path."""

    def save(name: str, **kwargs: Any) -> str:
        path = tmp_path / f"{name}.onnx"
        onnx.save(model_zoo.ALL_BUILDERS[name](**kwargs), path)
        return str(path)

    return save


@pytest.fixture
def amplifier(tmp_path: Path) -> str:
    """tests.onnx_checks.amplifier_model saved: activations beyond float16 from constants that fit it."""
    from tests.onnx_checks import amplifier_model

    path = tmp_path / "amplifier.onnx"
    onnx.save(amplifier_model(), path)
    return str(path)


@pytest.fixture
def onnxruntime_folding(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare folds through onnxruntime's session even where its own BatchNorm fold would do
    (``frontend/ort_folding.py``): for tests of that session's path (its check, its reverts)."""
    from amptool.frontend import prepare

    monkeypatch.setattr(prepare, "folding_needed", lambda _model: "forced by a test")


@pytest.fixture
def run_cli() -> Callable[..., Result]:
    """Run amptool in-process; returns click's Result (exit_code, output)."""
    from amptool.cli.main import cli

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return run


def read_json(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def single_error(output: str) -> bool:
    """The output carries exactly one error line — amptool's ``error:`` or click's usage ``Error:`` —
    a user error printed once, not a crash (an internal error prints ``internal error:``)."""
    return sum(line.startswith(("error:", "Error:")) for line in output.splitlines()) == 1


def export_packs_tvms_blob(executable: Any, path: str, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Export ``executable`` to ``path`` and check that its packed imports were written as our own
    ELF object (not through TVM's LLVM packer) holding exactly TVM's serialisation; returns it.
    Skips where amptool's ELF writer is not used."""
    import ctypes
    import threading

    import numpy as np
    import tvm

    from amptool import _tvm
    from amptool._tvm import build as tvm_build
    from amptool._tvm import elf

    if elf.host_machine() is None:
        pytest.skip("the ELF writer is used on Linux x86-64/AArch64 only")
    llvm_packs: list[Any] = []
    real = tvm.runtime._ffi_api.ModulePackImportsToLLVM
    monkeypatch.setattr(tvm.runtime._ffi_api, "ModulePackImportsToLLVM",
                        lambda *args: llvm_packs.append(args) or real(*args))
    # packed in the exporting thread, whose big blocks glibc takes from the heap (see build.py)
    packing_threads: list[Any] = []
    real_pack = tvm.runtime._ffi_api.ModulePackImportsToTensor
    monkeypatch.setattr(tvm.runtime._ffi_api, "ModulePackImportsToTensor",
                        lambda *args: packing_threads.append(threading.current_thread()) or real_pack(*args))
    _tvm.export_library(executable, path)
    assert not llvm_packs
    assert packing_threads == [threading.current_thread()]
    monkeypatch.setattr(tvm.runtime._ffi_api, "ModulePackImportsToTensor", real_pack)
    want: bytes = np.from_dlpack(tvm.runtime._ffi_api.ModulePackImportsToTensor(executable.mod)).tobytes()
    start = ctypes.addressof(ctypes.c_char.in_dll(ctypes.CDLL(path), tvm_build.LIBRARY_BLOB_SYMBOL))
    assert ctypes.string_at(start, len(want)) == want
    return want


def bf16_dot_target_options() -> tuple[str, ...] | None:
    """``target_options`` under which a bfloat16 build of this host uses ``vdpbf16ps`` and can run
    here: none where the host's CPU is one the dot product pays on, ``-mcpu=znver4`` where it is
    not (an Intel server core: same instruction, the kernels amptool builds for AMD), None (skip)
    without AVX512-BF16."""
    from amptool import _tvm
    from amptool.compiler.cpu_intrinsics import has_bf16_dot
    from amptool.compiler.cpu_speed import bf16_dot_pays

    host = host_llvm_spec()
    if not has_bf16_dot(_tvm.make_target(host)):
        return None
    return () if bf16_dot_pays(host["mcpu"], host.get("mattr", ())) else ("-mcpu=znver4",)


def staged_module(path: str, dtype: str, last_stage: str, mcpu: str | None = None) -> Any:
    """The module the CPU pipeline has made of ``path`` in ``dtype`` (``mcpu``, default this host's
    CPU) after its stages up to and including ``last_stage``; no codegen."""
    import tvm

    from amptool import _tvm
    from amptool.app.convert import ConvertConfig, rewrite_model
    from amptool.compiler import cpu

    mod = rewrite_model(ConvertConfig(model=path, dtype=dtype)).passes.mod
    target = _tvm.make_target({"kind": "llvm", "mcpu": mcpu} if mcpu else host_llvm_spec())
    with target:
        for name, passes in cpu.stage_passes(target):
            mod = tvm.transform.Sequential(passes)(mod)
            if name == last_stage:
                return mod
    raise ValueError(f"no CPU stage {last_stage!r}")


def scheduled_kernels(path: str, dtype: str, mcpu: str | None = None) -> list[str]:
    """The scripts of the kernels the CPU pipeline schedules for ``path`` in ``dtype`` (``mcpu``,
    default this host's CPU): every stage up to and including ``schedule``, no codegen."""
    import tvm

    mod = staged_module(path, dtype, "schedule", mcpu)
    return [f.script() for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def kernel_after_pass(path: str, name_part: str, pass_name: str, dtype: str = "float32") -> str:
    """The TIR of the scheduled kernel of ``path`` whose name has ``name_part``, right after the TVM
    lowering pass whose name has ``pass_name`` (``VectorizeLoop``: where a select TVM cannot keep as
    a vector becomes a loop of scalars; ``FlattenBuffer``: the buffers as allocated)."""
    import tvm

    from amptool import _tvm

    mod = staged_module(path, dtype, "schedule")
    func = next(f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and name_part in gv.name_hint)
    seen: list[str] = []

    @tvm.instrument.pass_instrument
    class AfterPass:
        def run_after_pass(self, module: Any, info: Any) -> None:
            if pass_name in info.name:
                seen.append(module.script())

    with tvm.transform.PassContext(instruments=[AfterPass()]):
        tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                    target=_tvm.make_target(host_llvm_spec()))
    return seen[-1]
