"""The GPU (CUDA, Vulkan) build pipeline: TVM's Relax GPU pipeline with safe schedule rules.

    library dispatch     sampling/sort ops → TVM's GPU implementations
    legalize             Relax ops → TIR
    annotate patterns    each PrimFunc's fusion class
    fold constants, fuse ops, fuse tir
    schedule             DLight GPU rules (TVM's own): Matmul, GEMV, Reduction, Fallback
    lower dataflow, finalize   TVM's own passes (memory planning, VM lowering)

Why not ``tvm.compile(mod, target)``: TVM 0.27's CUDA pipeline segfaults on float16 —
DLight's wmma tensor-core rule crashes inside Tensorize for fp16 matmuls whose extents all
exceed 64. ``lower`` returns the scheduled module that codegen takes (``--lower-only``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.s_tir import dlight

from amptool.build.cuda_matmul import TensorCoreMatmul
from amptool.build.gpu_names import sanitize_names

STAGES = (
    "sanitize names",
    "library dispatch",
    "legalize",
    "annotate patterns",
    "fold constants",
    "fuse ops",
    "fuse tir",
    "schedule",
    "lower dataflow",
    "finalize",
)


def schedule_rules(target: Any) -> list[Any]:
    """DLight's default CUDA rules, TensorCoreMatmul first (a no-op off CUDA sm_70+)."""
    gpu = dlight.gpu
    return [TensorCoreMatmul(), gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def stage_passes(target: Any) -> list[tuple[str, list[Any]]]:
    """(stage, passes) in build order for a GPU ``target``."""
    passes = [
        ("sanitize names", [sanitize_names]),
        ("library dispatch", cuda_pipeline.library_dispatch_passes(target)),
        ("legalize", [relax.transform.LegalizeOps()]),
        ("annotate patterns", [relax.transform.AnnotateTIROpPattern()]),
        ("fold constants", [relax.transform.FoldConstant()]),
        ("fuse ops", [relax.transform.FuseOps()]),
        ("fuse tir", [relax.transform.FuseTIR()]),
        ("schedule", [dlight.ApplyDefaultSchedule(*schedule_rules(target))]),
        ("lower dataflow", cuda_pipeline.dataflow_lower_passes(target)),
        ("finalize", cuda_pipeline.finalize_passes(target)),
    ]
    assert tuple(name for name, _ in passes) == STAGES
    return passes


def lower(
    mod: Any,
    target: Any,
    on_stage: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
) -> Any:
    """The scheduled module codegen takes: Relax lowered to VM calls, every PrimFunc scheduled."""
    with target:
        for name, passes in stage_passes(target):
            if on_stage:
                on_stage(name)
            start = time.perf_counter()
            mod = tvm.transform.Sequential(passes)(mod)
            if timings is not None:
                timings[name] = time.perf_counter() - start
    return mod


def build(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None) -> tuple[Any, dict[str, float]]:
    """Compile a Relax module for a CUDA/Vulkan ``target``; returns the VM executable and the
    seconds each stage took."""
    timings: dict[str, float] = {}
    mod = lower(mod, target, on_stage, timings)
    if on_stage:
        on_stage("codegen")
    start = time.perf_counter()
    with target:
        executable = tvm.compile(mod, target=target, relax_pipeline=None)
    timings["codegen"] = time.perf_counter() - start
    return executable, timings
