"""The CPU (LLVM) build pipeline: fusion, packed-weight kernels, schedules — no tuning.

    layout               transposed convs as phase convs (cpu_conv_transpose), 1-D convs as 2-D
                         (cpu_conv1d), softmax over a middle axis moved last (cpu_softmax_axis);
                         convolutions and the layers between them to NHWC (cpu_layout); grouped
                         bfloat16 convs one conv a group where AMX tiles take them (amx_groups)
    epilogues            low-precision elementwise chains after a cast computed in float32 (widen_epilogues)
    library dispatch     sampling/sort ops → TVM's CPU implementations
    legalize             Relax ops → TIR; conv2d/matmul/erf/tanh via amptool.compiler.cpu_kernels
    annotate patterns    each PrimFunc's fusion class (elementwise, injective, reduction…)
    fold constants       packed weights and other constant-only kernels evaluated once
    fuse ops, fuse tir   conv/matmul + bias + residual add + activation + cast → one kernel
    schedule             amptool.compiler.cpu_schedules: tiled, vectorized, parallel
    in place             residual adds' kernels write over the residual when nothing reads it after (in_place)
    lower dataflow, finalize   TVM's own passes (memory planning, VM lowering)
    codegen              TIR lowering and LLVM, the kernels split over one thread per CPU (split_codegen),
                         without TIR's argument asserts (``_without_kernel_asserts``)

Why not ``tvm.compile(mod, target)``: its default pipeline for LLVM legalizes and stops — no
folding, no fusion, no schedules — so every kernel ran single-threaded and scalar, 30–80×
slower than onnxruntime (measured; see benchmarks/README.md). TVM's ``cpu_generic`` pipeline
adds fusion but still no schedules; its DLight CPU rules cover only GEMV and row reductions.
MetaSchedule would tune kernels well but costs minutes to hours per model; this pipeline
builds a ResNet-50 in seconds, within ~1.2× of onnxruntime on one thread.

``STAGES`` is the order; ``tests/test_cpu_pipeline.py`` pins it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tvm
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

from amptool.compiler import stages
from amptool.compiler.amx_epilogues import fuse_amx_epilogues
from amptool.compiler.amx_groups import split_amx_groups
from amptool.compiler.cpu_attention import SCORES_BLOCK, attention, fuse_attention
from amptool.compiler.cpu_conv1d import conv1d_as_conv2d
from amptool.compiler.cpu_conv_transpose import split_conv_transpose
from amptool.compiler.cpu_depthwise import DEPTHWISE_BLOCK
from amptool.compiler.cpu_kernels import CONV2D_BF16_BLOCK, CONV2D_BLOCK, MATMUL_BF16_BLOCK, MATMUL_BLOCK, legalize_map
from amptool.compiler.cpu_layout import layout_passes
from amptool.compiler.cpu_nhwc import CONV2D_NHWC_BF16_BLOCK, CONV2D_NHWC_BLOCK, DEPTHWISE_NHWC_BLOCK
from amptool.compiler.cpu_row_reduction import vector_row_reduction
from amptool.compiler.cpu_scan import rewrite_scans
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
from amptool.compiler.cpu_softmax_axis import softmax_to_last_axis
from amptool.compiler.in_place import write_in_place
from amptool.compiler.kernel_cache import KernelCache
from amptool.compiler.schedule_fallback import codegen_or_fall_back
from amptool.compiler.split_codegen import codegen
from amptool.compiler.uniform_selects import UniformSelects
from amptool.compiler.widen_epilogues import widen_epilogues

_SCHEDULED = stages.STAGES.index("schedule") + 1
STAGES = ("layout", "epilogues", *stages.STAGES[:_SCHEDULED], "in place", *stages.STAGES[_SCHEDULED:])


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
        packed_conv2d_bf16: CONV2D_BF16_BLOCK, packed_matmul_bf16: MATMUL_BF16_BLOCK, attention: SCORES_BLOCK,
    }
    return [Guarded(fn, tiling, requires.get(fn)) for fn in (
        attention, nhwc_conv2d, nhwc_depthwise, nhwc_conv2d_bf16, packed_conv2d, depthwise_conv2d, packed_matmul,
        packed_conv2d_bf16, packed_matmul_bf16, tiled_reduction, injective, vector_row_reduction, row_reduction,
        parallel_outer)]


def stage_passes(target: Any) -> stages.Stages:
    """(stage, passes) in build order, for ``target`` (an LLVM Target): the ``layout`` stage
    (``cpu_layout``), then the stages every backend has."""
    shared = stages.relax_stages(target, cpu_generic, legalize_map(), default_rules())
    schedule, schedule_passes = shared[_SCHEDULED - 1]
    return [("layout", [_FUSE_ATTENTION, _SPLIT_CONV_TRANSPOSE, _CONV1D_AS_CONV2D, _ROW_SCANS, _SOFTMAX_LAST_AXIS,
                        *layout_passes(), _SPLIT_AMX_GROUPS]),
            ("epilogues", [_WIDEN_EPILOGUES, _AMX_EPILOGUES]),
            *shared[:_SCHEDULED - 1], (schedule, [*schedule_passes, UniformSelects]), ("in place", [_IN_PLACE]),
            *shared[_SCHEDULED:]]


def _module_pass(rewrite: Callable[[Any], Any], name: str) -> Any:
    """``rewrite`` (an IRModule → IRModule function) as a TVM module pass named ``amptool.NAME``."""
    return tvm.transform.module_pass(lambda mod, _ctx: rewrite(mod), opt_level=0, name=f"amptool.{name}")


_FUSE_ATTENTION = _module_pass(fuse_attention, "FuseAttention")
_SPLIT_CONV_TRANSPOSE = _module_pass(split_conv_transpose, "SplitConvTranspose")
_CONV1D_AS_CONV2D = _module_pass(conv1d_as_conv2d, "Conv1dAsConv2d")
_ROW_SCANS = _module_pass(rewrite_scans, "RowScans")
_SOFTMAX_LAST_AXIS = _module_pass(softmax_to_last_axis, "SoftmaxLastAxis")
_WIDEN_EPILOGUES = _module_pass(widen_epilogues, "WidenEpilogues")
_AMX_EPILOGUES = _module_pass(fuse_amx_epilogues, "AmxEpilogues")
_SPLIT_AMX_GROUPS = _module_pass(split_amx_groups, "SplitAmxGroups")
_IN_PLACE = _module_pass(write_in_place, "WriteInPlace")


def lower(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None,
          timings: dict[str, float] | None = None, before: dict[str, Any] | None = None) -> Any:
    """The scheduled module codegen takes (``--lower-only``): Relax lowered to VM calls.
    ``before``: see ``stages.run_stages``."""
    return stages.run_stages(mod, target, stage_passes(target), on_stage, timings, before)


def build(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None,
          kernels: KernelCache | None = None, secondary: str | None = None) -> tuple[Any, dict[str, float]]:
    """Compile a Relax module for an LLVM ``target``; returns the VM executable and the seconds
    each stage took (``codegen`` is TIR lowering plus LLVM). ``kernels``, ``secondary``: see
    ``split_codegen.codegen``."""
    timings: dict[str, float] = {}
    before: dict[str, Any] = {"schedule": None}
    mod = lower(mod, target, on_stage, timings, before)
    if on_stage:
        on_stage("codegen")
    start = time.perf_counter()
    with _without_kernel_asserts():
        executable = codegen_or_fall_back(
            mod, before["schedule"], target, lambda m: codegen(m, target, kernels=kernels, secondary=secondary),
            Guarded(parallel_outer, None))
    timings["codegen"] = time.perf_counter() - start
    return executable, timings


def _without_kernel_asserts() -> Any:
    """The current PassContext with ``tirx.disable_assert``: kernels compiled without the checks
    TVM's packed-function wrapper puts before each body (argument count and type codes, each
    tensor's dtype, rank, shape, strides, offset and device).

    Why: those checks were half of each kernel's object code, and LLVM's time follows code size:
    ResNet-50's 37 kernels took 4.4–5.2 s of LLVM CPU time with them, 3.45 s without (each
    compiled alone). Nothing but the VM calls a kernel, with tensors it allocated or checked: a
    caller's wrong input is refused by the Relax function's own checks (``match_cast`` of every
    parameter, VM builtins that the setting does not touch), before any kernel runs.
    """
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(opt_level=current.opt_level,
                                     required_pass=list(current.required_pass),
                                     disabled_pass=list(current.disabled_pass),
                                     instruments=list(current.instruments),
                                     config={**dict(current.config), "tirx.disable_assert": True})

