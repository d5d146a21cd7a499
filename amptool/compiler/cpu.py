"""The CPU (LLVM) build pipeline: fusion, packed-weight kernels, schedules — no tuning.

    layout               convolutions and the layers between them to NHWC (cpu_layout)
    epilogues            low-precision elementwise chains after a cast computed in float32 (widen_epilogues)
    library dispatch     sampling/sort ops → TVM's CPU implementations
    legalize             Relax ops → TIR; conv2d/matmul/erf/tanh via amptool.compiler.cpu_kernels
    annotate patterns    each PrimFunc's fusion class (elementwise, injective, reduction…)
    fold constants       packed weights and other constant-only kernels evaluated once
    fuse ops, fuse tir   conv/matmul + bias + residual add + activation + cast → one kernel
    schedule             amptool.compiler.cpu_schedules: tiled, vectorized, parallel
    lower dataflow, finalize   TVM's own passes (memory planning, VM lowering)
    codegen              TIR lowering and LLVM, the kernels split over one thread per CPU

Why not ``tvm.compile(mod, target)``: its default pipeline for LLVM legalizes and stops — no
folding, no fusion, no schedules — so every kernel ran single-threaded and scalar, 30–80×
slower than onnxruntime (measured; see benchmarks/README.md). TVM's ``cpu_generic`` pipeline
adds fusion but still no schedules; its DLight CPU rules cover only GEMV and row reductions.
MetaSchedule would tune kernels well but costs minutes to hours per model; this pipeline
builds a ResNet-50 in seconds, within ~1.2× of onnxruntime on one thread.

``STAGES`` is the order; ``tests/test_cpu_pipeline.py`` pins it.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from typing import Any

import tvm
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

from amptool.compiler import stages
from amptool.compiler.cpu_depthwise import DEPTHWISE_BLOCK
from amptool.compiler.cpu_kernels import CONV2D_BF16_BLOCK, CONV2D_BLOCK, MATMUL_BF16_BLOCK, MATMUL_BLOCK, legalize_map
from amptool.compiler.cpu_layout import layout_passes
from amptool.compiler.cpu_nhwc import CONV2D_NHWC_BF16_BLOCK, CONV2D_NHWC_BLOCK, DEPTHWISE_NHWC_BLOCK
from amptool.compiler.cpu_schedules import (
    Guarded,
    Tiling,
    _find_block,
    depthwise_conv2d,
    injective,
    packed_conv2d,
    packed_matmul,
    parallel_outer,
    row_reduction,
    tiled_reduction,
)
from amptool.compiler.cpu_schedules_nhwc import nhwc_conv2d, nhwc_depthwise
from amptool.compiler.kernel_cache import KernelCache
from amptool.compiler.widen_epilogues import widen_epilogues

STAGES = ("layout", "epilogues", *stages.STAGES)


def _bf16_rule(name: str, block: str) -> Callable[[Any, Tiling], Any | None]:
    """``amptool.compiler.cpu_schedules_bf16``'s rule ``name``, imported when a kernel has its
    ``block``: that module registers the ``vdpbf16ps`` tensor intrinsic, whose TVMScript costs
    0.3–0.6 s to parse (``T.prim_func`` walks the whole call stack), and only bfloat16 builds for
    a CPU with AVX512-BF16 make such blocks (``cpu_kernels`` checks the target first)."""

    def rule(sch: Any, tiling: Tiling) -> Any | None:
        if _find_block(sch, block) is None:
            return None
        from amptool.compiler import cpu_schedules_bf16  # noqa: PLC0415 - see above

        return getattr(cpu_schedules_bf16, name)(sch, tiling)

    rule.__name__ = name
    return rule


packed_conv2d_bf16 = _bf16_rule("packed_conv2d_bf16", CONV2D_BF16_BLOCK)
packed_matmul_bf16 = _bf16_rule("packed_matmul_bf16", MATMUL_BF16_BLOCK)
nhwc_conv2d_bf16 = _bf16_rule("nhwc_conv2d_bf16", CONV2D_NHWC_BF16_BLOCK)


def default_rules(tiling: Tiling | None = None) -> list[Any]:
    """The schedule rules in the order they are tried (``tiling=None``: derived from the target)."""
    requires = {
        nhwc_conv2d: CONV2D_NHWC_BLOCK, nhwc_depthwise: DEPTHWISE_NHWC_BLOCK, nhwc_conv2d_bf16: CONV2D_NHWC_BF16_BLOCK,
        packed_conv2d: CONV2D_BLOCK, depthwise_conv2d: DEPTHWISE_BLOCK, packed_matmul: MATMUL_BLOCK,
        packed_conv2d_bf16: CONV2D_BF16_BLOCK, packed_matmul_bf16: MATMUL_BF16_BLOCK,
    }
    return [Guarded(fn, tiling, requires.get(fn)) for fn in (
        nhwc_conv2d, nhwc_depthwise, nhwc_conv2d_bf16, packed_conv2d, depthwise_conv2d, packed_matmul,
        packed_conv2d_bf16, packed_matmul_bf16, tiled_reduction, injective, row_reduction, parallel_outer)]


def stage_passes(target: Any) -> stages.Stages:
    """(stage, passes) in build order, for ``target`` (an LLVM Target): the ``layout`` stage
    (``cpu_layout``), then the stages every backend has."""
    return [("layout", layout_passes()), ("epilogues", [_WIDEN_EPILOGUES]),
            *stages.relax_stages(target, cpu_generic, legalize_map(), default_rules())]


@tvm.transform.module_pass(opt_level=0, name="amptool.WidenEpilogues")
def _WIDEN_EPILOGUES(mod: Any, _ctx: Any) -> Any:
    return widen_epilogues(mod)


def lower(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None,
          timings: dict[str, float] | None = None) -> Any:
    """The scheduled module codegen takes (``--lower-only``): Relax lowered to VM calls."""
    return stages.run_stages(mod, target, stage_passes(target), on_stage, timings)


def build(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None,
          kernels: KernelCache | None = None, secondary: str | None = None) -> tuple[Any, dict[str, float]]:
    """Compile a Relax module for an LLVM ``target``; returns the VM executable and the seconds
    each stage took (``codegen`` is TIR lowering plus LLVM). ``kernels``, ``secondary``: see ``codegen``."""
    timings: dict[str, float] = {}
    mod = lower(mod, target, on_stage, timings)
    if on_stage:
        on_stage("codegen")
    start = time.perf_counter()
    executable = codegen(mod, target, kernels=kernels, secondary=secondary)
    timings["codegen"] = time.perf_counter() - start
    return executable, timings


#: At most this many LLVM modules (threads) per build.
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
    with its kernels split over ``workers`` LLVM modules built in threads (default:
    ``codegen_workers()``).

    Why: TVM lowers and compiles one module on one core: ~1.4 s of ResNet-50's build (measured
    on a loaded 2-core machine: 1.35 s → 0.91 s wall with two parts). TVM's builds release the
    GIL. The kernels are separate public functions, so each compiles to the same code in
    whichever module holds it (tests/test_convert_speed.py compares outputs bit for bit); the VM
    finds them by name in the executable's imports, and TVM's export links every module into one
    ``.so``.

    When not: one worker or one kernel; a kernel that calls another (the call would cross
    modules), a private one, external modules or a system library: then it is TVM's build.

    ``kernels`` (in-memory builds only, never exported): kernels an earlier build with the same
    cache compiled are taken from its modules, the others compiled and added (``kernel_cache``).
    ``secondary``: a Relax function whose own kernels (those ``main`` does not call) are compiled
    at LLVM -O1 — a probe copy, run once per search step, whose values rank nodes and decide
    nothing: ~35% less LLVM time for them (measured), while ``main`` keeps -O3.
    """
    from tvm import relax  # noqa: PLC0415
    from tvm.relax import vm_build  # noqa: PLC0415

    workers = codegen_workers() if workers is None else workers
    attrs = dict(mod.attrs) if mod.attrs else {}
    if ((workers < 2 and kernels is None) or attrs.get("external_mods")
            or "wasm" in str(target.attrs.get("mtriple", "")) or not _splittable(mod)):
        return tvm.compile(mod, target=target, relax_pipeline=None)
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
        return vm_build._vmlink(builder, target, vm_build._filter_tir(leftover), "default", [], params)
    todo = [(gv, f) for gv, f in leftover.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in compiled]
    names = {gv.name_hint for gv in primary}
    quick = [(gv, f) for gv, f in todo if names and gv.name_hint not in names]
    todo = [(gv, f) for gv, f in todo if not names or gv.name_hint in names]
    quick_target = tvm.target.Target({**target.export(), "opt-level": 1}) if quick else target
    parts = [(tvm.IRModule(dict(group[i::workers]), attrs=leftover.attrs), part_target)
             for group, part_target in ((todo, target), (quick, quick_target))
             for i in range(min(workers, len(group)))]
    context = tvm.transform.PassContext.current()

    def build_part(part: tuple[Any, Any]) -> Any:
        """``tvm.tirx.build(part, target)``, through ``tvm.compile`` like the one-module build."""
        with context:
            return tvm.compile(part[0], target=part[1]).mod

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
