"""The CPU (LLVM) build pipeline: fusion, packed-weight kernels, schedules — no tuning.

    library dispatch     sampling/sort ops → TVM's CPU implementations
    legalize             Relax ops → TIR; conv2d/matmul/erf/tanh via amptool.compiler.cpu_kernels
    annotate patterns    each PrimFunc's fusion class (elementwise, injective, reduction…)
    fold constants       packed weights and other constant-only kernels evaluated once
    fuse ops, fuse tir   conv/matmul + bias + residual add + activation + cast → one kernel
    schedule             amptool.compiler.cpu_schedules: tiled, vectorized, parallel
    lower dataflow, finalize   TVM's own passes (memory planning, VM lowering)

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
from amptool.compiler.cpu_kernels import legalize_map
from amptool.compiler.cpu_schedules import (
    Guarded,
    Tiling,
    injective,
    packed_conv2d,
    packed_matmul,
    parallel_outer,
    row_reduction,
    tiled_reduction,
)
from amptool.compiler.cpu_schedules_bf16 import packed_conv2d_bf16, packed_matmul_bf16

STAGES = stages.STAGES


def default_rules(tiling: Tiling | None = None) -> list[Any]:
    """The schedule rules in the order they are tried (``tiling=None``: derived from the target)."""
    return [Guarded(fn, tiling) for fn in (packed_conv2d, packed_matmul, packed_conv2d_bf16, packed_matmul_bf16,
                                           tiled_reduction, injective, row_reduction, parallel_outer)]


def stage_passes(target: Any) -> stages.Stages:
    """(stage, passes) in build order, for ``target`` (an LLVM Target)."""
    return stages.relax_stages(target, cpu_generic, legalize_map(), default_rules())


def lower(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None,
          timings: dict[str, float] | None = None) -> Any:
    """The scheduled module codegen takes (``--lower-only``): Relax lowered to VM calls."""
    return stages.run_stages(mod, target, stage_passes(target), on_stage, timings)


def build(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None) -> tuple[Any, dict[str, float]]:
    """Compile a Relax module for an LLVM ``target``; returns the VM executable and the seconds
    each stage took (``codegen`` is TIR lowering plus LLVM)."""
    timings: dict[str, float] = {}
    mod = lower(mod, target, on_stage, timings)
    if on_stage:
        on_stage("codegen")
    start = time.perf_counter()
    executable = tvm.compile(mod, target=target, relax_pipeline=None)
    timings["codegen"] = time.perf_counter() - start
    return executable, timings
