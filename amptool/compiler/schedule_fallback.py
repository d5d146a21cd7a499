"""When a scheduled kernel fails to compile, build it with a plain schedule instead of failing the model.

What: ``codegen_or_fall_back`` runs the codegen; if it raises, every kernel is compiled alone to find
the ones that fail, each is replaced by its unscheduled version (kept from before the ``schedule``
stage) scheduled by the pipeline's plain rule, and the codegen runs again. A warning names each
kernel and TVM's message.

Why: amptool's schedule rules are checked when they are applied (a rule that raises is skipped:
``cpu_schedules.Guarded``), but some schedules only fail later, in TIR lowering or LLVM — a 1×8
softmax once had its whole body moved under a vectorized loop, and TVM refused it in
``VectorizeLoop``, failing the whole convert. A slower kernel beats no model; tests/test_schedule_fallback.py
forces such a schedule.

Both pipelines use it: the CPU's plain schedule puts a kernel's outer loops in parallel, the GPU's
is DLight's ``Fallback`` (threads bound, nothing else).

When not: a failure no single kernel reproduces (the VM's own code, a link error), one every
kernel reproduces (the compiler itself), or one the plain schedules do not cure: the original
error is raised, and nothing is said of a fallback.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

import tvm

from amptool.compiler.split_codegen import codegen_workers
from amptool.compiler.stack_tiles import tir_pipeline_for

log = logging.getLogger(__name__)


def codegen_or_fall_back(lowered: Any, unscheduled: Any | None, target: Any, codegen: Callable[[Any], Any],
                         plain_rule: Any) -> Any:
    """``codegen(lowered)``, or — when it raises and ``unscheduled`` (the module before scheduling)
    is known — ``codegen`` of ``lowered`` with each kernel that fails alone rescheduled by
    ``plain_rule`` (a DLight rule) from its unscheduled version."""
    try:
        return codegen(lowered)
    except Exception as first:
        if unscheduled is None:
            raise
        kernels = sum(1 for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
        failing = _failing_kernels(lowered, target)
        if not failing or (kernels > 1 and len(failing) == kernels):
            raise  # nothing, or everything, fails alone: the compiler, not a schedule
        replaced = _replace(lowered, unscheduled, failing, target, plain_rule)
        if replaced is None:
            raise
        try:
            executable = codegen(replaced)
        except Exception:  # noqa: BLE001 - the plain schedules fail too: the first error is the one to report
            raise first from None
        for name, reason in failing.items():
            log.warning("kernel %s: its schedule does not compile (%s); built with a plain schedule, slower",
                        name, reason)
        return executable


def _failing_kernels(mod: Any, target: Any) -> dict[str, str]:
    """Kernel name → TVM's message (its error's last line), for each PrimFunc of ``mod`` that fails alone."""
    kernels = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    context = tvm.transform.PassContext.current()

    def error_of(item: tuple[Any, Any]) -> str | None:
        gv, func = item
        try:
            with context, target:
                tvm.compile(tvm.IRModule({gv: func}), target=target, tir_pipeline=tir_pipeline_for(target))
        except Exception as err:  # noqa: BLE001 - any compile error marks the kernel
            lines = [line for line in str(err).splitlines() if line.strip()]
            return (lines[-1] if lines else type(err).__name__)[:200]
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=codegen_workers()) as pool:
        errors = list(pool.map(error_of, kernels))
    return {gv.name_hint: error for (gv, _), error in zip(kernels, errors, strict=True) if error is not None}


def _replace(lowered: Any, unscheduled: Any, failing: dict[str, str], target: Any, plain_rule: Any) -> Any | None:
    """``lowered`` with each failing kernel's body from ``unscheduled``, scheduled by ``plain_rule``
    (its attributes, the symbol the VM calls included, kept); None if one has no unscheduled twin.
    A kernel made to write in place after scheduling (``in_place``) is made so again from its
    twin's plain schedule — None if that one does not qualify."""
    from tvm.s_tir import dlight  # noqa: PLC0415

    from amptool.compiler.in_place import IN_PLACE_OF, in_place_kernel  # noqa: PLC0415

    before = {gv.name_hint: (gv, f) for gv, f in unscheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    current = {gv.name_hint: f for gv, f in lowered.functions_items()}
    twins: dict[str, tuple[str, int | None]] = {}  # failing kernel → (its unscheduled twin, the input it writes)
    for name in failing:
        if name in before:
            twins[name] = (name, None)
        elif IN_PLACE_OF in (current[name].attrs or {}):
            origin, index = current[name].attrs[IN_PLACE_OF]
            twins[name] = (str(origin), int(index))
        if name not in twins or twins[name][0] not in before:
            return None
    picked = tvm.IRModule({before[origin][0]: before[origin][1] for origin, _ in twins.values()})
    with target:
        plain = dlight.ApplyDefaultSchedule(plain_rule)(picked)
    out = lowered.clone()
    for gv, func in lowered.functions_items():
        if gv.name_hint in failing:
            origin, index = twins[gv.name_hint]
            kernel = plain[origin] if index is None else in_place_kernel(plain[origin], index, origin)
            if kernel is None:
                return None
            out.update_func(gv, kernel.with_attrs(dict(func.attrs)))
    return out
