"""Compilation pipelines per target: the Relax → TIR → machine-code half of amptool.

TVM 0.27's ``tvm.compile(mod, target="llvm")`` runs a plain pipeline (no constant folding, no
fusion, no schedules): every kernel single-threaded and unvectorized. ``cpu`` replaces it for
LLVM targets with fusion, packed-weight kernels and schedule rules of amptool's own. Like
``amptool._tvm`` this package talks to TVM directly; ``compile_module``/``lower_module`` below are
the one place that picks a pipeline for a target (``_tvm`` stays the bottom layer: it imports
nothing of amptool).
"""

from __future__ import annotations

from typing import Any

from amptool._tvm import make_target, quiet_native_stderr
from amptool._tvm.schedule import unchecked_schedules

#: Build pipelines: amptool's (fusion + packed kernels + schedules; LLVM only, other targets
#: fall back to TVM's) and TVM's own default (``tvm.compile``: unfused, unscheduled on CPU).
PIPELINES = ("amptool", "tvm")


def compile_module(mod: Any, target_spec: dict[str, Any], *, pipeline: str = "amptool", kernels: Any = None,
                   secondary: str | None = None) -> Any:
    """A Relax VM executable for ``target_spec``; see ``amptool.compiler.cpu`` for the CPU pipeline.
    ``kernels``: a ``kernel_cache.KernelCache`` shared by the in-memory builds of one search;
    ``secondary``: a function beside ``main`` whose own kernels may be compiled for less (CPU
    only, ``split_codegen.codegen``: other targets compile everything as usual)."""
    import tvm  # noqa: PLC0415

    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {PIPELINES}")
    target = make_target(target_spec)
    with quiet_native_stderr(), unchecked_schedules():
        if pipeline == "amptool" and str(target.kind.name) == "llvm":
            from amptool.compiler import cpu  # noqa: PLC0415 - each pipeline imports its backend

            executable, _timings = cpu.build(mod, target, kernels=kernels, secondary=secondary)
            return executable
        if pipeline == "amptool" and str(target.kind.name) in GPU_KINDS:
            from amptool.compiler import gpu  # noqa: PLC0415 - each pipeline imports its backend

            executable, _timings = gpu.build(mod, target)
            return executable
        return tvm.compile(mod, target=target)


#: Target kinds built by ``amptool.compiler.gpu`` (TVM's default CUDA pipeline leaves most fp16 GEMMs
#: and every bf16 one off the tensor cores; see that module).
GPU_KINDS = ("cuda", "vulkan")


def lower_module(mod: Any, target_spec: dict[str, Any]) -> Any:
    """The scheduled IRModule that codegen would take for ``target_spec`` (``--lower-only``):
    Relax lowered to VM calls, every PrimFunc scheduled. Needs no codegen for the target, so a
    Vulkan or CUDA target can be checked on a machine whose TVM cannot build for it."""

    target = make_target(target_spec)
    kind = str(target.kind.name)
    with quiet_native_stderr(), unchecked_schedules():
        if kind == "llvm":
            from amptool.compiler import cpu  # noqa: PLC0415 - each pipeline imports its backend

            return cpu.lower(mod, target)
        if kind in GPU_KINDS:
            from amptool.compiler import gpu  # noqa: PLC0415 - each pipeline imports its backend

            return gpu.lower(mod, target)
    raise ValueError(f"no lowering for target kind {kind!r}")
