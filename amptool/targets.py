"""Target registry: a name → how to build for it, and whether this machine can.

A registry is a plain mapping of names to frozen specs behind ``get_target(name)``.
Capability is checked up front, so a target that this TVM cannot build stops with one line
naming what is missing (exit 3) before any work is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amptool import _tvm
from amptool.errors import TargetUnavailableError, UserError


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    device: str
    build_spec: Callable[[], dict[str, Any]]
    missing: Callable[[], str | None]  # None when buildable here, else what is missing


def _llvm_spec() -> dict[str, Any]:
    # Plain "llvm" is generic x86-64 without F16C: fp16 is then 12–16× slower than fp32.
    # Naming the host CPU enables F16C/AVX-512 (measured 1.0–1.2× fp32).
    return {"kind": "llvm", "mcpu": _tvm.host_cpu()}


def _llvm_missing() -> str | None:
    return None if _tvm.has_global_func("target.build.llvm") else "this TVM has no LLVM codegen"


def _vulkan_missing() -> str | None:
    if not _tvm.has_global_func("target.build.vulkan"):
        return (
            "this TVM was built without Vulkan codegen (target.build.vulkan); "
            "install a TVM built with USE_VULKAN=ON"
        )
    return "amptool's Vulkan build path is not implemented yet"


def _cuda_missing() -> str | None:
    if not _tvm.has_global_func("target.build.cuda"):
        return "this TVM was built without CUDA codegen (target.build.cuda)"
    return (
        "amptool's CUDA build path is not implemented yet (the default TVM 0.27 CUDA "
        "pipeline crashes on float16 matmul/conv)"
    )


TARGETS: dict[str, TargetSpec] = {
    "llvm": TargetSpec("llvm", "CPU via LLVM, tuned to this host's CPU", "cpu", _llvm_spec, _llvm_missing),
    "cuda": TargetSpec("cuda", "NVIDIA GPU", "cuda", lambda: {"kind": "cuda", "arch": "sm_90"}, _cuda_missing),
    "vulkan": TargetSpec("vulkan", "Vulkan GPU", "vulkan", lambda: {"kind": "vulkan"}, _vulkan_missing),
}


def get_target(name: str) -> TargetSpec:
    """The spec for ``name``; raises UserError (unknown) or TargetUnavailableError (exit 3)."""
    spec = TARGETS.get(name)
    if spec is None:
        available = [n for n, t in TARGETS.items() if t.missing() is None]
        raise UserError(
            f"Unknown target '{name}'. Available here: {', '.join(available)}.",
            f"Known targets: {', '.join(TARGETS)}.",
        )
    reason = spec.missing()
    if reason is not None:
        raise TargetUnavailableError(
            f"Target '{name}' is not available here: {reason}",
            "Use --target llvm on this machine.",
        )
    return spec
