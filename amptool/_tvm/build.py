"""Targets and compilation: the target spec, the build and lower entry points, exported
libraries, LLVM and toolchain facts."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
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


def export_library(executable: Any, path: str, cross_cc: str | None = None) -> None:
    """Write the shared library; ``cross_cc`` links it with another architecture's compiler
    (``aarch64-linux-gnu-g++``) for a build whose ``mtriple`` is not this host's."""
    fcompile = None
    if cross_cc:
        from tvm.support import cc  # noqa: PLC0415

        fcompile = cc.cross_compiler(cross_cc)
    with quiet_native_stderr():
        executable.export_library(path, fcompile=fcompile)


def system_triple() -> str:
    """LLVM's triple for this host ('x86_64-pc-linux-gnu'): what a build without -mtriple targets."""
    import tvm  # noqa: PLC0415

    return str(tvm.target.codegen.llvm_get_system_triple())


def llvm_is_valid_cpu(cpu: str, triple: str | None = None) -> bool:
    import tvm  # noqa: PLC0415

    codegen = tvm.target.codegen
    return bool(codegen.llvm_is_valid_cpu(cpu, triple or codegen.llvm_get_system_triple()))


def llvm_cpu_features(spec: dict[str, Any], names: Sequence[str]) -> dict[str, bool]:
    """Which of ``names`` (LLVM feature names: 'f16c', 'avx512bf16') the spec's CPU has, after
    its ``mattr``; for a non-x86 or unknown CPU, every answer is False."""
    import tvm  # noqa: PLC0415

    with quiet_native_stderr():
        target = make_target(spec)
        return {name: bool(tvm.target.codegen.llvm_cpu_has_features([name], target)) for name in names}


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
        except Exception:  # noqa: BLE001 - no toolkit: the library carries CUDA source, JIT-compiled on load
            found["cuda"] = "not found"
    return found
