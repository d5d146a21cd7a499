"""Prepare an ONNX model for import: pin shapes, fold constants and BatchNorm in fp32.

Why always, not only when import fails: measured on real exports, TVM's ONNX frontend
fails on shape-computation chains (``Reshape requires the input new shape to be Shape``)
that onnxruntime's basic graph optimisation folds away once input shapes are pinned, and
the same pass folds BatchNorm into the preceding Conv *in fp32* — which defuses the
classic fp16 trap of a running variance of ~1e8. Basic-level rewrites are exact up to fp32
rounding and stay within the standard ONNX domain (extended levels add contrib ops).

When amptool's own folding (constants, Shapes, Ifs, then each Conv → BatchNorm pair) leaves only
plain ops, onnxruntime's session would change nothing that matters and is not opened
(``ort_folding``): ~1 s and a check-numerics' two sessions less on a ResNet-50.

Each step is recorded by name in ``PreparedModel.steps`` (and then in manifest.json).
A step that fails is skipped and recorded as ``<step>-skipped`` with the reason, because
the un-prepared model may still import.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool.errors import UserError, error_summary
from amptool.frontend.conv_batchnorm import fold_conv_batchnorm
from amptool.frontend.fold import fold_model, infer_shapes
from amptool.frontend.gradient import fold_protected, has_gradients
from amptool.frontend.graph import default_opset
from amptool.frontend.load import name_nodes
from amptool.frontend.ort_folding import constants_as_initializers, folding_needed
from amptool.frontend.signature import TensorSpec
from amptool.frontend.unroll import too_long
from amptool.runtime.onnxruntime_runner import Apart, exposable_tensors, split_apart

log = logging.getLogger(__name__)

#: onnxruntime refuses most models below opset 7; converting to 13 makes most runnable.
MIN_RUNNABLE_OPSET = 7
UPGRADE_OPSET = 13


@dataclass
class PreparedModel:
    model: onnx.ModelProto
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: _PendingCheck | None = None  # check-numerics still running (``prepare_model(defer_check=True)``)

    def settle(self) -> bool:
        """Wait for a deferred check-numerics and take its verdict; True when it reverted the folding
        (``model`` is then the unfolded one, shapes inferred: whatever was built from the folded one
        must be built again)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        try:
            outcome = pending.result.result()
        finally:
            shutil.rmtree(pending.workdir, ignore_errors=True)
        at = self.steps.index(_CHECK_PENDING)
        reverted = _take_outcome(self, pending.unfolded, outcome, at)
        if reverted:
            _infer_and_name(self, "shape-inference-unfolded")
        return reverted

    def checked_tensors(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
        """Every main-graph tensor of the folded model as check-numerics computed it (waiting for it),
        when it ran on ``feeds`` with them exposed (``prepare_model(expose_tensors=True)``); else None.
        Calibration reads these instead of opening a session of its own on the same model."""
        pending = self.pending
        if pending is None:
            return None
        outcome = pending.result.result()
        if outcome.tensors is None or outcome.feeds is None or not _same_arrays(outcome.feeds, feeds):
            return None
        return outcome.tensors

    def discard(self) -> None:
        """Drop a deferred check unread (the build failed first): wait for it, remove its files."""
        pending, self.pending = self.pending, None
        if pending is not None:
            concurrent.futures.wait([pending.result])
            shutil.rmtree(pending.workdir, ignore_errors=True)


#: The step check-numerics holds in ``PreparedModel.steps`` while it runs in the background.
_CHECK_PENDING = "check-numerics-pending"


@dataclass(frozen=True)
class _Outcome:
    """check-numerics' verdict (``step``, ``note``, whether to ``revert``) and, when it exposed them,
    every tensor of its run on the folded model and the ``feeds`` of that run."""

    step: str
    note: str | None
    revert: bool
    feeds: Mapping[str, np.ndarray] | None = None
    tensors: dict[str, Any] | None = None


@dataclass
class _PendingCheck:
    result: concurrent.futures.Future[_Outcome]
    unfolded: onnx.ModelProto
    workdir: str  # holds the file the check reads; removed once it is settled


def drop_weight_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove graph inputs that are backed by an initializer, in place.

    They are weights (old exporters and onnx's version converter list them as inputs).
    Left as inputs, onnxruntime treats them as overridable and folds nothing through them,
    and the importer would make them parameters.
    """
    weights = {init.name for init in model.graph.initializer}
    real_inputs = [v for v in model.graph.input if v.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)
    # IR < 4 requires every initializer to be an input; onnxruntime then rejects the model
    # ("initializer_arg was false"). IR 4 changed only that rule, so raising it is safe.
    model.ir_version = max(model.ir_version, 4)
    return model


def pin_shapes(model: onnx.ModelProto, inputs: Sequence[TensorSpec]) -> onnx.ModelProto:
    """Return a copy whose graph inputs carry the pinned static shapes."""
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    drop_weight_inputs(pinned)
    by_name = {spec.name: spec for spec in inputs}
    for value in pinned.graph.input:
        spec = by_name.get(value.name)
        if spec is None or spec.shape is None:
            continue
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for d in spec.shape:
            shape.dim.add().dim_value = int(d)
    # Declared output/value_info shapes of dynamic models are often stale once inputs are
    # pinned (and sometimes simply wrong); let inference recompute them.
    for value in pinned.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    del pinned.graph.value_info[:]
    return pinned


def freeze_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy in which the given graph inputs are initializers holding ``values``."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [v for v in frozen.graph.input if v.name not in values]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    for name, value in values.items():
        frozen.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
    return frozen


def prepare_model(
    model: onnx.ModelProto,
    inputs: Sequence[TensorSpec],
    *,
    optimize: bool = True,
    fixed_inputs: Mapping[str, np.ndarray] | None = None,
    defer_check: bool = False,
    expose_tensors: bool = False,
) -> PreparedModel:
    """Fix inputs, pin shapes, upgrade ancient opsets, then fold in fp32 (onnxruntime + own).

    ``defer_check``: run check-numerics (two onnxruntime runs, ~0.35 s of a ResNet-50's prepare) in a
    thread, and return at once with ``pending`` set; the caller imports and rewrites meanwhile, then
    calls ``settle()`` — and starts again from the unfolded model in the rare case it reverts.
    ``expose_tensors``: the check's run on the folded model returns every main-graph tensor too,
    for ``PreparedModel.checked_tensors`` (calibration's run, without a session of its own)."""
    steps = []
    if fixed_inputs:
        model = freeze_inputs(model, fixed_inputs)
        steps.append("fix-inputs")
    prepared = PreparedModel(model=pin_shapes(model, inputs), steps=[*steps, "pin-shapes"])
    _refuse_endless_loops(prepared.model)
    if default_opset(prepared.model) < MIN_RUNNABLE_OPSET:
        _try(
            prepared,
            "upgrade-opset",
            lambda m: drop_weight_inputs(upgrade_opset(m)),
        )
    if optimize and has_gradients(prepared.model):
        # amptool's folder, with xs/zs held as inputs so no differentiated path folds away;
        # onnxruntime cannot load the training domain (nor could it keep the tensor names
        # Gradient refers to), so its folding and the before/after check are skipped.
        _try(prepared, "fold-subgraphs", lambda m: fold_protected(m, lambda x: _fold_everywhere(x, prepared.notes)))
        for step in ("onnxruntime-fold", "check-numerics"):
            prepared.steps.append(f"{step}-skipped")
            prepared.notes.append(f"{step}: the model has Gradient nodes (ai.onnx.preview.training)")
    elif optimize:
        unfolded = prepared.model
        # amptool's folder first: it inlines If nodes whose condition is now constant, which
        # onnxruntime's own If inlining gets wrong on nested branches (seen: silero-vad with
        # a fixed sample rate — an invalid graph, at times a segfault).
        _try(prepared, "fold-subgraphs", lambda m: _fold_everywhere(m, prepared.notes))
        subgraphs_folded = prepared.model is not unfolded
        plain = _without_onnxruntime_folding(prepared.model)
        # The onnxruntime session that folds computes the original model when nothing before it
        # changed the graph (only shapes pinned): check-numerics then reads its reference from it.
        as_original = (not fixed_inputs and prepared.steps == ["pin-shapes", "fold-subgraphs"]
                       and not prepared.notes)
        workdir: str | None = tempfile.mkdtemp(prefix="amptool-prepare-")
        try:
            _FOLDING.session = _FOLDING.path = None
            if plain is not None:
                prepared.model = plain[0]
                prepared.steps.extend(["fold-batchnorm"] * bool(plain[1]) + ["onnxruntime-fold-unneeded"])
            else:
                _try(prepared, "onnxruntime-fold", lambda m: _onnxruntime_basic_optimize(m, str(workdir)))
            reference, _FOLDING.session = _FOLDING.session, None
            saved = prepared.model, _FOLDING.path
            if prepared.steps[-1] == "onnxruntime-fold":
                # onnxruntime expands function ops (GroupNormalization, Attention, LinearAttention …)
                # into their bodies, whose Shape arithmetic and Scans it leaves unfolded: our folder,
                # again, folds those and unrolls the Scans the TVM frontend cannot take.
                _try(prepared, "fold-expanded", lambda m: _fold_everywhere(m, prepared.notes, "fold-expanded"))
            # Without onnxruntime's session, check-numerics runs when our folder changed the graph: the
            # BatchNorm fold alone is arithmetic that tests/test_conv_batchnorm.py pins against
            # onnxruntime, and checking it here cost a ResNet-50 convert two sessions (~1.1-1.8 s wall).
            if (subgraphs_folded if plain is not None else prepared.model is not unfolded):
                # The file onnxruntime wrote, when it is still the model: a session opens a path
                # ~0.1 s faster than the 100 MB of a ResNet-50 serialised again (measured). Otherwise
                # the model as it is now (it is changed below while a deferred check runs): its
                # weights apart as arrays when large (BERT-base: no 440 MB serialised, parsed and
                # copied again by onnxruntime), else serialised.
                try:
                    folded = (saved[1] if prepared.model is saved[0] and saved[1]
                              else split_apart(prepared.model) or prepared.model.SerializeToString())
                except Exception as err:  # noqa: BLE001 - e.g. over protobuf's 2 GB: skipped, saying why
                    folded = err
                expose = exposable_tensors(prepared.model) if expose_tensors else ()
                check = functools.partial(_numerics_outcome, model, unfolded, inputs, fixed_inputs or {},
                                          reference if as_original else None, folded, expose)
                if defer_check:
                    thread_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="amptool-check")
                    prepared.pending = _PendingCheck(thread_pool.submit(check), unfolded, str(workdir))
                    thread_pool.shutdown(wait=False)
                    prepared.steps.append(_CHECK_PENDING)
                    workdir = None  # the check's now: settle() removes it
                else:
                    _take_outcome(prepared, unfolded, check())
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
    _infer_and_name(prepared, "shape-inference")
    return prepared


def _infer_and_name(prepared: PreparedModel, step: str) -> None:
    """Shape inference (recorded as ``step``) and node names: the importer's input."""
    _try(prepared, step, lambda m: infer_shapes(m, data_prop=True))
    name_nodes(prepared.model.graph)


def upgrade_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert to UPGRADE_OPSET and raise ir_version to match.

    The version converter keeps an old ir_version (3), which makes onnxruntime list
    initializers as graph inputs and then lose some of them when it deduplicates constants.
    """
    upgraded = onnx.version_converter.convert_version(model, UPGRADE_OPSET)
    needed = onnx.helper.find_min_ir_version_for(list(upgraded.opset_import), ignore_unknown=True)
    upgraded.ir_version = max(upgraded.ir_version, needed)
    return upgraded


def reference_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model onnxruntime should run as the fp32 reference: ancient opsets upgraded."""
    if default_opset(model) >= MIN_RUNNABLE_OPSET:
        return model
    try:
        return upgrade_opset(model)
    except Exception as err:  # noqa: BLE001 - the original may still run
        log.info("opset upgrade for the reference failed: %s", err)
        return model


def _try(prepared: PreparedModel, step: str, fn: Callable[[onnx.ModelProto], onnx.ModelProto]) -> None:
    try:
        prepared.model = fn(prepared.model)
        prepared.steps.append(step)
    except Exception as err:  # noqa: BLE001 - any failure: keep the model as it was, say why
        reason = error_summary(err, limit=200)
        log.info("prepare step %s skipped: %s", step, reason)
        prepared.steps.append(f"{step}-skipped")
        prepared.notes.append(f"{step}: {reason}")


#: Folding may reorder fp32 arithmetic (BatchNorm into Conv), nothing more: outputs must
#: agree to this fraction of their magnitude, and exactly for integers and NaN/Inf positions.
NUMERICS_RTOL = 1e-3


def _refuse_endless_loops(model: onnx.ModelProto) -> None:
    """A Loop known to run past amptool's run-time bound, or for ever, is refused before onnxruntime
    runs the model: its folding session and check-numerics would run every iteration (10**12 of them
    hung convert)."""
    for name, why in too_long(model).items():
        raise UserError(f"Loop '{name}' cannot run: {why}",
                        "Export the model with a shorter loop, or pin what bounds it with --fixed-input or "
                        "--input-shape.")


def _numerics_outcome(
    original: onnx.ModelProto,
    unfolded: onnx.ModelProto,
    inputs: Sequence[TensorSpec],
    fixed: Mapping[str, np.ndarray],
    reference: Any,
    folded: str | bytes | Apart | Exception,
    expose: Sequence[str] = (),
) -> _Outcome:
    """check-numerics: onnxruntime before and after folding on seeded inputs. ``reference``: a
    session that computes ``original`` already (one session less to open), or None; ``folded``: the
    folded model, a file or serialised (or why it could not be); ``expose``: its tensors to return
    too (``_Outcome.tensors``). Reads nothing else the caller may change, so it can run in a thread.

    Why: prepare must never change what the model computes — a folding bug would otherwise
    surface as an "fp16 error" that no colour list can fix.
    """
    from amptool.runtime.inputs import generate_inputs  # noqa: PLC0415
    from amptool.runtime.onnxruntime_runner import run_session  # noqa: PLC0415

    try:
        if isinstance(folded, Exception):
            raise folded
        feeds = generate_inputs(inputs, unfolded, seed=0)
        before = (run_session(reference, {**feeds, **fixed}) if reference is not None
                  else _run(reference_model(original), {**feeds, **fixed}))
        exposed = _run_exposed(folded, feeds, expose) if expose else None
        after = exposed if exposed is not None else _run(folded, feeds)
    except Exception as err:  # noqa: BLE001 - a reference that cannot run skips the check, saying why
        reason = error_summary(err, limit=160)
        return _Outcome("check-numerics-skipped",
                        f"check-numerics: onnxruntime could not run both models ({reason})", False)
    mismatch = _first_mismatch(before, after)
    if mismatch is None:
        return _Outcome("check-numerics", None, False, feeds, exposed)
    return _Outcome("folding-reverted",
                    f"check-numerics: folding changed output {mismatch}; import uses the unfolded model", True)


def _run_exposed(folded: str | bytes | Apart, feeds: Mapping[str, np.ndarray],
                 expose: Sequence[str]) -> dict[str, Any] | None:
    """One unoptimised run of the folded model (optimising would fuse exposed tensors away) with
    ``expose`` as outputs too; None when that cannot run (weights in an external file, which a
    session opened from bytes does not find): check-numerics then runs as without them."""
    from amptool.runtime.onnxruntime_runner import run_session, session  # noqa: PLC0415

    try:
        if isinstance(folded, str):
            with open(folded, "rb") as handle:
                folded = handle.read()
        return run_session(session(folded, optimize="disable", outputs=expose, one_shot=True), feeds)
    except Exception as err:  # noqa: BLE001 - the plain check still runs
        log.debug("check-numerics: no exposed run (%s)", error_summary(err, limit=160))
        return None


def _same_arrays(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.array_equal(a[k], b[k]) for k in a)


def _take_outcome(prepared: PreparedModel, unfolded: onnx.ModelProto, outcome: _Outcome, at: int | None = None) -> bool:
    """Record check-numerics' ``outcome`` in ``prepared`` (its step at ``at``, else appended) and
    undo the folding when it says so; True when it did."""
    if at is None:
        prepared.steps.append(outcome.step)
    else:
        prepared.steps[at] = outcome.step
    if outcome.note:
        prepared.notes.append(outcome.note)
    if outcome.revert:
        log.warning("prepare changed the model's numerics (%s); importing it unfolded", outcome.note)
        prepared.model = unfolded
    return outcome.revert


def _run(model: onnx.ModelProto | Apart | str | bytes, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of ``model``. Basic optimisation, as the folding session: opening a ResNet-50 at "all"
    costs ~0.2 s more (weight layouts) for a single run."""
    from amptool.runtime.onnxruntime_runner import run_session, session  # noqa: PLC0415

    return run_session(session(model, optimize="basic", one_shot=True), feeds)


def _first_mismatch(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> str | None:
    for name, want in before.items():
        got = after.get(name)
        if got is None:
            return f"'{name}' (missing)"
        if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):  # a sequence output
            if not isinstance(want, (list, tuple)) or not isinstance(got, (list, tuple)) or len(want) != len(got):
                return f"'{name}' (sequence lengths differ)"
            mismatch = _first_mismatch({f"{name}[{i}]": w for i, w in enumerate(want)},
                                       {f"{name}[{i}]": g for i, g in enumerate(got)})
            if mismatch:
                return mismatch
            continue
        want, got = np.asarray(want), np.asarray(got)
        if want.shape != got.shape:
            return f"'{name}' (shape {list(got.shape)} vs {list(want.shape)})"
        if want.dtype.kind != "f":
            if not np.array_equal(want, got):
                return f"'{name}' (values differ)"
            continue
        w, g = want.astype(np.float64), got.astype(np.float64)
        if not np.array_equal(np.isnan(w), np.isnan(g)) or not np.array_equal(np.isinf(w), np.isinf(g)):
            return f"'{name}' (NaN/Inf positions differ)"
        finite = np.isfinite(w)
        if finite.any():
            scale = float(np.max(np.abs(w[finite])))
            err = float(np.max(np.abs(w[finite] - g[finite])))
            if err > NUMERICS_RTOL * scale + 1e-6:
                return f"'{name}' (max |Δ| {err:.3g} vs max |ref| {scale:.3g})"
    return None


def _without_onnxruntime_folding(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """``model`` with its Conv → BatchNorm pairs folded and how many, when that leaves nothing for
    onnxruntime's folding session to change (``ort_folding``); None when the session is still needed
    (then it folds the BatchNorms too, as before)."""
    try:
        folded, count = fold_conv_batchnorm(model)
        reason = folding_needed(folded)
    except Exception as err:  # noqa: BLE001 - onnxruntime's folding, as before, decides
        log.info("own BatchNorm folding not used: %s", error_summary(err, limit=200))
        return None
    if reason is not None:
        log.debug("onnxruntime folding needed: %s", reason)
        return None
    return constants_as_initializers(folded), count


def _fold_everywhere(model: onnx.ModelProto, notes: list[str], step: str = "fold-subgraphs") -> onnx.ModelProto:
    """``model`` folded; ``model`` itself (not a copy) when nothing folded."""
    folded, stats = fold_model(model)
    if not stats.changed:
        return model
    notes.append(
        f"{step}: {stats.folded} node(s) and {stats.shapes} Shape(s) folded, "
        f"{stats.ifs_inlined} If(s) with a constant condition inlined, "
        f"{stats.loops_unrolled} Loop/Scan(s) with a known trip count unrolled"
        + (f", {stats.lists_stacked} list(s) appended to in a Loop made scan outputs" if stats.lists_stacked else "")
        + (f", {stats.scans_looped} Scan(s) made run-time Loops" if stats.scans_looped else "")
    )
    return folded


#: The session ``_onnxruntime_basic_optimize`` folded in (it computes the model it was given, so
#: check-numerics may take its reference from it) and the file it wrote; per thread, taken by
#: ``prepare_model``.
_FOLDING = threading.local()


def _onnxruntime_basic_optimize(model: onnx.ModelProto, workdir: str) -> onnx.ModelProto:
    """onnxruntime's basic-level graph optimisation of ``model``, written into ``workdir``. Its session
    is ``_FOLDING.session``; ``_FOLDING.path`` the file, when it holds exactly the model returned."""
    from amptool.runtime.onnxruntime_runner import session  # noqa: PLC0415

    out_path = os.path.join(workdir, "prepared.onnx")
    external = {"session.optimized_model_external_initializers_file_name": "prepared.data"}
    data = model.SerializeToString()  # once: its size decides, where ByteSize() costs as much again
    _FOLDING.session = session(data, optimize="basic", save_optimized=out_path,
                               session_config=external if len(data) > 1_500_000_000 else None)
    # IR < 4 requires initializers to be listed as inputs, so onnxruntime lists them.
    loaded = onnx.load(out_path, load_external_data=True)
    as_saved = (len(loaded.graph.input), loaded.ir_version)
    optimized = drop_weight_inputs(loaded)
    _FOLDING.path = out_path if (len(optimized.graph.input), optimized.ir_version) == as_saved else None
    if default_opset(optimized) != default_opset(model):
        log.debug("onnxruntime changed the opset import; keeping its output")
    return optimized
