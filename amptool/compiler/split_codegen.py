"""The last step of a build, TIR to machine code, with the kernels split over threads (CPU and GPU).

TVM lowers and compiles a module's kernels one after the other on one core; its builds release
the GIL, so kernels split over a few modules compile side by side. Measured on this 2-core
machine: ResNet-50's CPU codegen 1.35 → 0.91 s wall, its CUDA (sm_90) codegen 3.0 → 1.6 s.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import tvm

from amptool.compiler.kernel_cache import KernelCache
from amptool.compiler.stack_tiles import tir_pipeline_for

#: LLVM's optimisation level for a secondary entry's own kernels (``codegen``): -O0, whose fast
#: instruction selection halves their LLVM time. On MobileNetV2's fp16 search (--atol 0.005) the
#: first probed build's codegen took 2.4 s at -O1, 1.55 s at -O0, and its step 7.3 → 6.4 s (1.36×
#: → 1.23× a plain convert), every step keeping the same nodes (benchmarks/convert_speed.py).
QUICK_OPT_LEVEL = 0

#: At most this many modules (threads) per build.
MAX_CODEGEN_WORKERS = 4


def codegen_workers() -> int:
    """The CPUs this process may run on, up to ``MAX_CODEGEN_WORKERS``."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    return max(1, min(count, MAX_CODEGEN_WORKERS))


def codegen(mod: Any, target: Any, workers: int | None = None, kernels: KernelCache | None = None,
            secondary: str | None = None) -> Any:
    """``tvm.compile(mod, target, relax_pipeline=None)`` — the lowered module to a VM executable —
    with its kernels split over ``workers`` modules built in threads (default:
    ``codegen_workers()``): LLVM modules for a CPU target, host modules each with its device
    module for a GPU target.

    Why: see the module docstring. The kernels are separate public functions, so each compiles
    to the same code in whichever module holds it (tests/test_convert_speed.py compares outputs
    bit for bit); the VM finds them by name in the executable's imports, and TVM's export links
    every host module into one ``.so`` (a GPU build packs the device modules with the weights).

    When not: one worker or one kernel; a kernel that calls another (the call would cross
    modules), a private one, external modules or a system library: then it is TVM's build.

    ``kernels`` (in-memory builds only, never exported): kernels an earlier build with the same
    cache compiled are taken from its modules, the others compiled and added (``kernel_cache``).
    ``secondary`` (LLVM targets): a Relax function whose own kernels (those ``main`` does not call)
    are compiled at ``QUICK_OPT_LEVEL`` — a probe copy, run once per search step, whose values rank
    nodes and decide nothing — while ``main`` keeps -O3.

    Every path compiles TIR with ``stack_tiles.tir_pipeline_for(target)`` (CPU: register tiles on
    the stack).
    """
    from tvm import relax  # noqa: PLC0415
    from tvm.relax import vm_build  # noqa: PLC0415

    workers = codegen_workers() if workers is None else workers
    tir_pipeline = tir_pipeline_for(target)
    attrs = dict(mod.attrs) if mod.attrs else {}
    if ((workers < 2 and kernels is None) or attrs.get("external_mods")
            or "wasm" in str(target.attrs.get("mtriple", "")) or not _splittable(mod)):
        return tvm.compile(mod, target=target, relax_pipeline=None, tir_pipeline=tir_pipeline)
    compiled: dict[str, Any] = {}
    primary = _kernels_of(mod, "main") if secondary is not None else frozenset()
    if kernels is not None:
        mod, compiled = kernels.name_kernels(mod, target, primary)
        if secondary is not None:
            primary = _kernels_of(mod, "main")  # renamed
    # What relax.build does after its (here: no) Relax pipeline, the kernels' build split.
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    leftover = vm_build._vmcodegen(builder, mod, "bytecode")
    if not _splittable(leftover):
        return vm_build._vmlink(builder, target, vm_build._filter_tir(leftover), tir_pipeline, [], params)
    todo = [(gv, f) for gv, f in leftover.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in compiled]
    names = {gv.name_hint for gv in primary}
    quick = [(gv, f) for gv, f in todo if names and gv.name_hint not in names]
    todo = [(gv, f) for gv, f in todo if not names or gv.name_hint in names]
    quick_target = tvm.target.Target({**target.export(), "opt-level": QUICK_OPT_LEVEL}) if quick else target
    parts = [(tvm.IRModule(dict(group[i::workers]), attrs=leftover.attrs), part_target)
             for group, part_target in ((todo, target), (quick, quick_target))
             for i in range(min(workers, len(group)))]
    context = tvm.transform.PassContext.current()

    def build_part(part: tuple[Any, Any]) -> Any:
        """``tvm.tirx.build(part, target)``, through ``tvm.compile`` like the one-module build."""
        with context:
            return tvm.compile(part[0], target=part[1], tir_pipeline=tir_pipeline).mod

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(workers, len(parts)))) as pool:
        libs = list(pool.map(build_part, parts))
    if kernels is not None:
        for (part, part_target), lib in zip(parts, libs, strict=True):
            kernels.remember(part, lib, quick=part_target is not target)
    libs += list({id(m): m for m in compiled.values()}.values())  # each earlier module once
    return vm_build.VMExecutable(relax._ffi_api.VMLink(builder, target, libs[0], libs[1:], params))


def _kernels_of(mod: Any, entry: str) -> frozenset[Any]:
    """The GlobalVars of the kernels Relax function ``entry`` calls (none when there is no such function)."""
    from tvm import relax  # noqa: PLC0415

    if not any(gv.name_hint == entry for gv in mod.get_global_vars()):
        return frozenset()
    return frozenset(gv for gv in relax.analysis.all_global_vars(mod[entry])
                     if isinstance(mod[gv], tvm.tirx.PrimFunc))


def _splittable(mod: Any) -> bool:
    """At least two kernels, each of them standalone."""
    kernels = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return len(kernels) >= 2 and all(_standalone(f) for f in kernels)


def _standalone(kernel: Any) -> bool:
    """A public kernel that calls no other function of the module (found by its GlobalVar)."""
    import tvm_ffi  # noqa: PLC0415

    if kernel.attrs is None or "global_symbol" not in kernel.attrs:
        return False
    found = tvm_ffi.structural_walk(kernel, (tvm.ir.GlobalVar, tvm_ffi.VisitInterrupt), order="pre")
    return found is None
