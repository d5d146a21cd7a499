"""Targets and compilation: the target spec, the build and lower entry points, exported
libraries, LLVM and toolchain facts."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from amptool._tvm.common import quiet_native_stderr


def host_cpu() -> str:
    """LLVM's name for this CPU ('znver4'); 'native' is silently ignored by LLVM 22."""
    import tvm  # noqa: PLC0415

    return str(tvm.target.codegen.llvm_get_system_cpu())


def make_target(spec: dict[str, Any]) -> Any:
    """A Target from a dict spec; 0.27 rejects the old 'llvm -mcpu=…' strings."""
    import tvm  # noqa: PLC0415

    return tvm.target.Target(spec)


#: Build pipelines: amptool's (fusion + packed kernels + schedules; LLVM only, other targets
#: fall back to TVM's) and TVM's own default (``tvm.compile``: unfused, unscheduled on CPU).
PIPELINES = ("amptool", "tvm")


def compile_module(mod: Any, target_spec: dict[str, Any], *, pipeline: str = "amptool") -> Any:
    """A Relax VM executable for ``target_spec``; see ``amptool.build.cpu`` for the CPU pipeline."""
    import tvm  # noqa: PLC0415

    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {PIPELINES}")
    target = make_target(target_spec)
    with quiet_native_stderr():
        if pipeline == "amptool" and str(target.kind.name) == "llvm":
            from amptool.build import cpu  # noqa: PLC0415

            executable, _timings = cpu.build(mod, target)
            return executable
        if pipeline == "amptool" and str(target.kind.name) in GPU_KINDS:
            from amptool.build import gpu  # noqa: PLC0415

            executable, _timings = gpu.build(mod, target)
            return executable
        return tvm.compile(mod, target=target)


#: Target kinds built by ``amptool.build.gpu`` (TVM's default CUDA pipeline leaves most fp16 GEMMs
#: and every bf16 one off the tensor cores; see that module).
GPU_KINDS = ("cuda", "vulkan")


def lower_module(mod: Any, target_spec: dict[str, Any]) -> Any:
    """The scheduled IRModule that codegen would take for ``target_spec`` (``--lower-only``):
    Relax lowered to VM calls, every PrimFunc scheduled. Needs no codegen for the target, so a
    Vulkan or CUDA target can be checked on a machine whose TVM cannot build for it."""

    target = make_target(target_spec)
    kind = str(target.kind.name)
    with quiet_native_stderr():
        if kind == "llvm":
            from amptool.build import cpu  # noqa: PLC0415

            return cpu.lower(mod, target)
        if kind in GPU_KINDS:
            from amptool.build import gpu  # noqa: PLC0415

            return gpu.lower(mod, target)
    raise ValueError(f"no lowering for target kind {kind!r}")


def export_library(executable: Any, path: str) -> None:
    with quiet_native_stderr():
        executable.export_library(path)


def llvm_is_valid_cpu(cpu: str, triple: str | None = None) -> bool:
    import tvm  # noqa: PLC0415

    codegen = tvm.target.codegen
    return bool(codegen.llvm_is_valid_cpu(cpu, triple or codegen.llvm_get_system_triple()))


def llvm_unknown_features(spec: dict[str, Any]) -> list[str]:
    """Features in ``spec['mattr']`` LLVM does not know. LLVM only warns on stderr
    ("'+x' is not a recognized feature for this target") and ignores them; read that warning."""
    import tempfile  # noqa: PLC0415

    import tvm  # noqa: PLC0415

    target = make_target(spec)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            tvm.target.codegen.llvm_get_cpu_features(target)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    return re.findall(r"'[+-]?([^']+)' is not a recognized feature", text)


def versions() -> dict[str, str]:
    import tvm  # noqa: PLC0415

    found = {"apache-tvm": str(tvm.__version__)}
    try:
        import tvm_ffi  # noqa: PLC0415

        found["apache-tvm-ffi"] = str(getattr(tvm_ffi, "__version__", "unknown"))
    except ImportError:  # pragma: no cover
        pass
    return found


def count_prim_funcs(mod: Any) -> int:
    """Kernels (TIR PrimFuncs) in a lowered module."""
    import tvm  # noqa: PLC0415

    return sum(1 for _gv, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc))


def toolchain_versions(target_spec: dict[str, Any]) -> dict[str, str]:
    """The code generator's toolchain for a build: LLVM's major version, the CUDA toolkit's."""
    import tvm  # noqa: PLC0415

    found = {"llvm": str(tvm.target.codegen.llvm_version_major(allow_none=True))}
    if target_spec.get("kind") == "cuda":
        try:
            from tvm.support import nvcc  # noqa: PLC0415

            found["cuda"] = ".".join(str(part) for part in nvcc.get_cuda_version())
        except Exception:  # no toolkit: the library carries CUDA source, JIT-compiled on load
            found["cuda"] = "not found"
    return found
