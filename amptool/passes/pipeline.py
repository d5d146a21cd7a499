"""The one place where the order of Relax passes lives.

    imported fp32 module
      → lower_io              (--low-precision-io) float32 inputs/outputs become the low dtype
      → ConcretizeLike        (off with --no-concretize) *_like ops and shape_of patterns with
                              static shapes become creation/shape ops; dead code and unused
                              parameters of internal functions dropped
      → FoldConstant (fp32)   first, ops TVM has no kernel for in a dtype (isnan of bfloat16,
                              topk of uint32, …) get wider copies of their operands
                              (kernel_dtypes.py); then weight reshapes/transposes become plain constants, so the
                              mixed-precision pass sees them as castable constants and the
                              range guard can read their values
      → MixedPrecision        colour lists → casts, accumulation dtypes
      → fold casts + FoldConstant   weight casts become low-precision constants (cast in
                              numpy: FoldConstant compiles a kernel per cast, seconds per model;
                              see fold_casts.py), then anything else constant folds
      (both FoldConstants: reshapes and transposes of constants fold in numpy, and TVM's pass
      runs only when something is left that it could fold; see fold_constants.py)
      → well-formedness check after each step that changed the module (a failure is a bug,
        not a user error; an ill-formed import is left for TVM's own passes to refuse)

``tests/test_mixed_precision.py::test_pass_order_is_pinned`` pins this order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amptool import _tvm
from amptool.colors.policy import ColorPolicy
from amptool.errors import UserError, error_summary
from amptool.frontend.importer import NodeOrigin
from amptool.passes import stats
from amptool.passes.concretize_like import ConcretizeReport, concretize_like
from amptool.passes.fold_casts import fold_constant_casts
from amptool.passes.fold_constants import fold_constants
from amptool.passes.kernel_dtypes import widen_operands
from amptool.passes.low_precision_io import lower_io
from amptool.passes.mixed_precision import MixedPrecisionReport, to_mixed_precision

#: lower_io runs only with --low-precision-io; concretize is skipped under --no-concretize.
PASS_ORDER = ("lower_io", "concretize", "prefold", "mixed_precision", "fold")
#: Stages that run TVM's own passes (stage → TVM pass): their failures on a module with symbolic shapes
#: are reported as user errors (pin the shapes); elsewhere, as amptool's own passes' are, bugs.
TVM_PASSES = {"prefold": "FoldConstant", "fold": "FoldConstant"}


def _symbolic_shapes(mod: Any) -> bool:
    """Whether a tensor of a Relax function of ``mod`` — an input, or a value a binding makes —
    has a dim not known as a number: a dynamic shape chain, the case the pin hint is for."""
    from tvm import relax  # noqa: PLC0415

    def symbolic(var: Any) -> bool:
        return _tvm.tensor_dtype(var) is not None and _tvm.static_shape(var) is None

    for _gv, func in _tvm.relax_functions(mod):
        if any(symbolic(param) for param in func.params):
            return True
        blocks = func.body.blocks if isinstance(func.body, relax.SeqExpr) else []
        if any(symbolic(binding.var) for block in blocks for binding in block.bindings):
            return True
    return False


@dataclass
class PassResult:
    mod: Any
    report: MixedPrecisionReport
    timings_s: dict[str, float] = field(default_factory=dict)
    weight_bytes: dict[str, int] = field(default_factory=dict)
    concretize: ConcretizeReport | None = None  # None: ConcretizeLike was turned off
    #: the module after prefold, before the colours apply: another colouring starts from it
    prefolded: Any = None


def run_passes(
    mod: Any,
    policy: ColorPolicy,
    dtype: str,
    provenance: dict[str, NodeOrigin],
    *,
    range_guards: bool = True,
    activation_peaks: Mapping[str, float] | None = None,
    cancellation: Mapping[str, tuple[float, tuple[str, ...]]] | None = None,
    low_precision_io: bool = False,
    concretize: bool = True,
    on_stage: Callable[[str], None] | None = None,
    prefolded: PassResult | None = None,
) -> PassResult:
    """Run PASS_ORDER on ``mod``; time each pass on its own. ``prefolded``: an earlier result
    for the same module, dtype and options, whose passes up to prefold (which no colour list
    changes) are reused: only mixed_precision and fold run (auto-fallback's candidates)."""
    timings: dict[str, float] = {}

    def stage(name: str, fn: Callable[[Any], Any], current: Any) -> Any:
        """Run one pass, time it alone, then check well-formedness (its postcondition)."""
        if on_stage:
            on_stage(name)
        start = time.perf_counter()
        try:
            out = fn(current)
            timings[name] = time.perf_counter() - start
            if not out.same_as(current):  # unchanged: the importer's module, right or wrong
                _tvm.assert_well_formed(out, TVM_PASSES.get(name, name))
        except UserError:
            raise
        except Exception as err:
            if name not in TVM_PASSES or not _symbolic_shapes(current):
                # Our own pass failing is a bug; so is TVM's on a model whose inputs have static
                # shapes (a bfloat16 op TVM had no kernel for failed FoldConstant): keep the traceback.
                raise
            raise UserError(
                f"TVM's {TVM_PASSES[name]} ({name}) failed on this model: {error_summary(err, last=True)}",
                "Pin input shapes with --input-shape; dynamic shape chains are the usual cause.",
            ) from err
        return out

    report_box: dict[str, MixedPrecisionReport] = {}
    like_box: dict[str, ConcretizeReport] = {}

    def concretized(current: Any) -> Any:
        new, like_box["report"] = concretize_like(current, dtype)
        return new

    def mixed(current: Any) -> Any:
        new, report = to_mixed_precision(
            current, policy, dtype, provenance, range_guards=range_guards, activation_peaks=activation_peaks,
            cancellation=cancellation,
        )
        report_box["report"] = report
        return new

    if prefolded is not None and prefolded.prefolded is not None:
        mod, before = prefolded.prefolded, prefolded.weight_bytes["before"]
        if prefolded.concretize is not None:
            like_box["report"] = prefolded.concretize
    else:
        if low_precision_io and dtype != "float32":
            mod = stage("lower_io", lambda m: lower_io(m, dtype), mod)
        if concretize:
            mod = stage("concretize", concretized, mod)
        mod = stage("prefold", lambda m: fold_constants(widen_operands(m)), mod)
        before = stats.constant_bytes(mod)
    prefolded_mod = mod
    mod = stage("mixed_precision", mixed, mod)
    mod = stage("fold", lambda m: fold_constants(fold_constant_casts(m)), mod)
    after = stats.constant_bytes(mod)
    return PassResult(
        mod=mod,
        report=report_box["report"],
        timings_s=timings,
        weight_bytes={"before": before, "after": after},
        concretize=like_box.get("report"),
        prefolded=prefolded_mod,
    )

