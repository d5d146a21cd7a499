"""MixedPrecision: rewrite a Relax module to float16/bfloat16 under ALWAYS/FOLLOW/NEVER lists.

What it rewrites. Every binding whose value calls a Relax op gets a colour from the
``ColorPolicy`` (node override > ONNX op type > Relax op > unknown = NEVER):
  * ALWAYS: float32 inputs are cast to the low dtype; conv/matmul get ``out_dtype`` set
    to the op's accumulation dtype (float32 by default) and their result is cast down.
  * FOLLOW: low precision if every non-constant floating input already is (constants
    count as castable), otherwise float32 with low inputs cast back up.
  * NEVER: inputs restored to their original dtypes; the output is as before.
Inputs that were not float32 in the original program (int, bool, float64) are never
touched. Each cast of a value is emitted once per scope and reused; the float32 result of
an fp32-accumulating op is remembered, so a NEVER consumer reads it instead of casting
the rounded value back up. Function results and ``If`` branch results are cast back to
their original types, so model inputs/outputs keep their dtypes and branches agree.

Range guards (``range_guards=True``) win over the lists: a constant whose values overflow
the low dtype, or whose non-zeros mostly underflow to zero, is never cast — the op
consuming it computes in float32 and the decision is reported. Likewise an op whose ONNX
node saw activations above ``activation_limit`` in calibration (``activation_peaks``, from
amptool.app.calibrate) stays float32, and so does an Add/Sub whose calibrated result cancelled
more than the policy's ``cancellation_limit`` below its operands, with the ops that make those
operands (``cancellation``: node → (ratio, feeding nodes); None turns that guard off).

Why our own pass: TVM's ``ToMixedPrecision`` is fp16-only, keeps policies as global C++
attributes, crashes on Clip/HardSigmoid and silently skips non-dataflow blocks (any model
with ``If``). This pass visits each binding once and infers only the binding at hand, so
its cost is linear in the number of ops.

When it does not fire: ``dtype == "float32"`` returns the module unchanged; calls to
functions (not ops) and ops with explicit type arguments (call_tir, call_dps_packed) are
treated as NEVER. If type inference rejects a rewritten call, that call falls back to NEVER.

Preserves: function signatures, output types, binding names (so ONNX provenance survives),
well-formedness (checked by the pipeline).

Where: this module is the entry point; the rewrite is ``MixedPrecisionMutator``
(mixed_precision_mutator.py, one method per decision, imports TVM); what it decides and
reports lives in mixed_precision_types.py, which the pass's readers import without TVM.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from typing import Any

from amptool.colors.policy import ColorPolicy
from amptool.frontend.importer import NodeOrigin
from amptool.passes.mixed_precision_types import CREATION_OPS, Decision, MixedPrecisionReport
from amptool.passes.range_guards import DTYPE_MAX, ActivationGuard, CancellationGuard

__all__ = ["CREATION_OPS", "Decision", "MixedPrecisionReport", "to_mixed_precision"]


def to_mixed_precision(
    mod: Any,
    policy: ColorPolicy,
    dtype: str,
    provenance: dict[str, NodeOrigin] | None = None,
    *,
    range_guards: bool = True,
    activation_peaks: Mapping[str, float] | None = None,
    cancellation: Mapping[str, tuple[float, tuple[str, ...]]] | None = None,
) -> tuple[Any, MixedPrecisionReport]:
    """Rewrite ``mod`` to ``dtype`` under ``policy``; returns the new module and a report."""
    report = MixedPrecisionReport(dtype=dtype)
    if dtype == "float32":
        return mod, report
    if dtype not in DTYPE_MAX:
        raise ValueError(f"unsupported low-precision dtype {dtype!r}")
    # Imported here: the mutator subclasses a TVM class, and TVM loads lazily (--help).
    from amptool.passes.mixed_precision_mutator import MixedPrecisionMutator  # noqa: PLC0415

    guard = ActivationGuard(dict(activation_peaks or {}), policy.activation_limit(dtype), dtype)
    cancels = CancellationGuard.from_ratios(cancellation or {}, policy.cancellation_bound())
    rewriter = MixedPrecisionMutator(mod, policy=policy, low=dtype, report=report, activation_guard=guard,
                                     provenance=provenance, range_guards=range_guards, cancellation_guard=cancels)
    with _gc_paused():
        return rewriter.run(), report


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the pass.

    The pass allocates a few objects per binding and keeps them (decisions, cast caches)
    until it ends, so the collector rescans an ever larger heap ever more often: measured
    at 11% of the pass at 100k ops, and the only cost per op that grew with the module
    (benchmarks/pass_scaling.py). Nothing the pass builds is cyclic garbage; the previous
    state is restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
