"""The GPU (CUDA, Vulkan) build pipeline: TVM's Relax GPU pipeline, tensor cores on CUDA.

    sanitize names       Relax variables renamed to C identifiers (kernel parameters carry them)
    library dispatch     sampling/sort ops → TVM's GPU implementations
    legalize             Relax ops → TIR
    annotate patterns, fold constants, fuse ops, fuse tir
    schedule             amptool.compiler.cuda_matmul.TensorCoreMatmul (fp16/bf16 GEMMs and convs
                         → TVM's wmma schedule), then DLight's GPU rules: Matmul, GEMV,
                         Reduction, GeneralReduction, Fallback
    lower dataflow, finalize   TVM's own passes for the target (memory planning, VM lowering)
    codegen              host and device code, the kernels split over one thread per CPU (split_codegen)

Why not ``tvm.compile(mod, target)``: its CUDA pipeline tensorizes a GEMM only when every
extent exceeds 64 and only in float16, so BERT's attention products, ResNet's 64-channel and
7x7 convolutions and every bfloat16 GEMM ran on the FMA units; and ONNX tensor names such as
``gpu_0/data_0`` became kernel parameter names that nvcc rejects. ``lower`` returns the
scheduled module that codegen takes (``--lower-only``); it needs no codegen for the target,
so it also works for Vulkan with a TVM built without Vulkan support.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.relax.backend.gpu_generic import pipeline as generic_pipeline
from tvm.s_tir import dlight

from amptool.compiler import split_codegen, stages
from amptool.compiler.cuda_matmul import TensorCoreMatmul
from amptool.compiler.gpu_names import sanitize_names
from amptool.compiler.schedule_fallback import codegen_or_fall_back

STAGES = ("sanitize names", *stages.STAGES)


def schedule_rules(target: Any) -> list[Any]:
    """DLight's default CUDA rules, TensorCoreMatmul first (a no-op off CUDA sm_70+)."""
    gpu = dlight.gpu
    return [TensorCoreMatmul(), gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def stage_passes(target: Any) -> stages.Stages:
    """(stage, passes) in build order for a GPU ``target``."""
    # tvm.relax.pipeline's dispatchers reach for backend.cuda.<fn>, which 0.27 only defines in
    # backend.cuda.pipeline (AttributeError): pick the backend module here.
    backend: Any = cuda_pipeline if str(target.kind.name) == "cuda" else generic_pipeline
    return [("sanitize names", [sanitize_names]), *stages.relax_stages(target, backend, None, schedule_rules(target))]


def lower(
    mod: Any,
    target: Any,
    on_stage: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
    before: dict[str, Any] | None = None,
) -> Any:
    """The scheduled module codegen takes: Relax lowered to VM calls, every PrimFunc scheduled.
    ``before``: see ``stages.run_stages``."""
    return stages.run_stages(mod, target, stage_passes(target), on_stage, timings, before)


def build(mod: Any, target: Any, on_stage: Callable[[str], None] | None = None) -> tuple[Any, dict[str, float]]:
    """Compile a Relax module for a CUDA/Vulkan ``target``; returns the VM executable and the
    seconds each stage took."""
    timings: dict[str, float] = {}
    before: dict[str, Any] = {"schedule": None}
    mod = lower(mod, target, on_stage, timings, before)
    if on_stage:
        on_stage("codegen")
    start = time.perf_counter()
    with target:
        executable = codegen_or_fall_back(mod, before["schedule"], target,
                                          lambda m: split_codegen.codegen(m, target), dlight.gpu.Fallback())
    timings["codegen"] = time.perf_counter() - start
    return executable, timings
