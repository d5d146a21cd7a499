"""What the CPU and GPU build pipelines share: the Relax stage list, into which each plugs its
backend (TVM's per-target pass lists), legalization and schedule rules, and running the
stages one by one, timed.

    library dispatch     sampling/sort ops → the backend's implementations
    legalize             Relax ops → TIR (with the pipeline's own legalizations; each distinct call once)
    annotate patterns    each PrimFunc's fusion class (elementwise, injective, reduction…)
    fold constants       packed weights and other constant-only kernels evaluated once
    fuse ops, fuse tir   conv/matmul + bias + residual add + activation + cast → one kernel
    schedule             the pipeline's schedule rules (DLight's ApplyDefaultSchedule)
    lower dataflow, finalize   the backend's own passes (memory planning, VM lowering)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm
from tvm import relax
from tvm.s_tir import dlight

from amptool import _tvm
from amptool._tvm.script import cheap_frame_stack
from amptool.compiler.legalize_divide import legalize_divide, legalize_multiply
from amptool.compiler.legalize_once import legalize_ops

STAGES = (
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

Stages = list[tuple[str, list[Any]]]


def relax_stages(target: Any, backend: Any, legalize: Mapping[str, Any] | None, rules: Sequence[Any]) -> Stages:
    """(stage, passes) in ``STAGES`` order. ``backend``: a ``tvm.relax.backend.*.pipeline``
    module; ``legalize``: op name → legalization overriding TVM's (and the shared
    ``legalize_divide`` and ``legalize_multiply``); ``rules``: schedule rules."""
    shared = {"relax.divide": legalize_divide, "relax.multiply": legalize_multiply}
    stages = [
        ("library dispatch", backend.library_dispatch_passes(target)),
        ("legalize", [legalize_ops({**shared, **(legalize or {})})]),
        ("annotate patterns", [relax.transform.AnnotateTIROpPattern()]),
        ("fold constants", [relax.transform.FoldConstant()]),
        ("fuse ops", [relax.transform.FuseOps()]),
        ("fuse tir", [relax.transform.FuseTIR()]),
        ("schedule", [dlight.ApplyDefaultSchedule(*rules)]),
        ("lower dataflow", backend.dataflow_lower_passes(target)),
        ("finalize", backend.finalize_passes(target)),
    ]
    assert tuple(name for name, _ in stages) == STAGES
    return stages


def run_stages(
    mod: Any,
    target: Any,
    stages: Stages,
    on_stage: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
    before: dict[str, Any] | None = None,
) -> Any:
    """Apply ``stages`` in order under ``target``; each stage's seconds go to ``timings``, and the
    module as it was before each stage named in ``before`` to that key. Schedules may parse
    TVMScript (tensor intrinsics: TVM's for CUDA tensor cores, ``cpu_intrinsics`` for bf16), hence
    ``cheap_frame_stack``."""
    with target, cheap_frame_stack():
        for name, passes in stages:
            if before is not None and name in before:
                before[name] = mod.clone()  # a copy of the function map: DLight assigns into the module it gets
            if on_stage:
                on_stage(name)
            start = time.perf_counter()
            try:
                mod = tvm.transform.Sequential(passes)(mod)
            finally:
                _tvm.forget_calls()  # the stage's look-ups hold its functions (and their weights)
            if timings is not None:
                timings[name] = time.perf_counter() - start
    return mod
