"""``convert``: ONNX → mixed-precision Relax → compiled library + manifest (library API).

    load → prepare → import → calibrate → concretize → prefold → mixed_precision → fold → compile → export

``calibrate`` runs the prepared fp32 model in onnxruntime to find activations the low dtype
cannot hold (the activation range guard); it is skipped for float32 and --no-range-guards.

Each stage is timed on its own and reported in ``manifest.json``'s ``timings_s``. The CLI
(`amptool convert`) is a thin shell over ``build_model`` / ``convert_model``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool import __version__, _tvm, compiler
from amptool.app.artifact import LIBRARY_NAME, write_artifact, write_manifest
from amptool.app.calibrate import Calibration, activation_peaks
from amptool.app.outdir import check_output_dir
from amptool.app.versions import engine_versions
from amptool.colors import ColorPolicy, check_policy_source, load_policy
from amptool.colors.loader import unmatched_node_rules, with_exclusions
from amptool.compiler.cpu_speed import low_precision_speed_note, warn_if_slow
from amptool.compiler.targets import ResolvedTarget, check_target_flags, cross_compiler, resolve_target, slow_imports
from amptool.dtypes import DTYPES
from amptool.errors import TargetUnavailableError, UserError
from amptool.frontend.graph import iter_nodes
from amptool.frontend.importer import ImportedModel, NodeOrigin, import_model
from amptool.frontend.input_values import FixedValue, fixed_input_arrays, resolve_input_shapes
from amptool.frontend.load import LoadedModel, checker_failure, load_model, refuse_quantized
from amptool.frontend.loop_function import FUNCTION_PREFIX as LOOP_FUNCTION_PREFIX
from amptool.frontend.prepare import PreparedModel, prepare_model
from amptool.frontend.signature import (
    DEFAULT_MAX_INPUT_BYTES,
    TensorSpec,
    graph_inputs,
    graph_outputs,
    pin_input_specs,
)
from amptool.passes import stats
from amptool.passes.pipeline import PassResult, run_passes
from amptool.runtime.inputs import TABLE_INDEXING, check_input_shapes, generate_inputs, index_ranges, load_inputs
from amptool.runtime.tvm_runner import CompiledModel

log = logging.getLogger(__name__)

StageCallback = Callable[[str], None]


@dataclass(frozen=True)
class ConvertConfig:
    """Everything that decides what gets built. Frozen: one object, passed down."""

    model: str
    dtype: str = "float16"
    colors: str | None = None
    target: str = "llvm"
    #: input name → dims ("" names the model's only input); parsed from --input-shape at the edge
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    range_guards: bool = True
    cancellation_guard: bool = True  # off with --no-cancellation-guard (range_guards=False turns it off too)
    prepare: bool = True
    #: input name → value (a number, numbers, or an array): inputs baked in as constants
    fixed_inputs: Mapping[str, FixedValue] = field(default_factory=dict)
    calibration: str | None = None  # .npz of inputs for the activation guard; None = seeded
    low_precision_io: bool = False  # float32 inputs/outputs become the low dtype
    cuda_arch: str | None = None  # --cuda-arch sm_XX; None: the local GPU's, else targets.DEFAULT_CUDA_ARCH
    target_options: tuple[str, ...] = ()  # --target-options for llvm: -mcpu=NAME -mattr=+f,-g
    concretize: bool = True  # ConcretizeLike before the mixed-precision pass (--no-concretize)
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES  # --max-input-size: inputs larger are refused
    #: symbolic dim name → value in every input (--dim batch=8), like onnxruntime's free dim override
    dims: Mapping[str, int] = field(default_factory=dict)
    exclude_ops: tuple[str, ...] = ()  # --exclude-op: op types kept float32 on top of the colour lists
    exclude_nodes: tuple[str, ...] = ()  # --exclude-node: node-name globs or /regex/ kept float32

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError(f"Unknown dtype '{self.dtype}'. Choose one of: {', '.join(DTYPES)}.")
        for name in ("exclude_ops", "exclude_nodes"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise UserError(f"{name} takes a sequence of strings, got {value!r}", f"e.g. {name}=('Softmax',).")
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.dims, Mapping) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.dims.values()):
            raise UserError(f"dims takes a mapping of symbolic dim name → positive int, got {self.dims!r}",
                            "e.g. dims={'batch': 8, 'seq_len': 128}.")
        object.__setattr__(self, "dims", dict(self.dims))
        for name in ("input_shapes", "fixed_inputs"):
            if not isinstance(getattr(self, name), Mapping):
                raise UserError(f"{name} takes a mapping of input name → value, got {getattr(self, name)!r}",
                                "e.g. input_shapes={'x': (1, 3, 224, 224)}, fixed_inputs={'sr': 16000}.")
        shapes = {name: tuple(dims) for name, dims in self.input_shapes.items()}
        object.__setattr__(self, "input_shapes", shapes)
        object.__setattr__(self, "fixed_inputs", dict(self.fixed_inputs))
        check_target_flags(self.target, self.cuda_arch, self.target_options)


@dataclass
class BuildResult:
    """An in-memory build: the executable plus everything the manifest reports."""

    config: ConvertConfig
    loaded: LoadedModel
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    policy: ColorPolicy
    passes: PassResult
    target_spec: dict[str, Any]
    device: str
    executable: Any
    fixed_inputs: dict[str, np.ndarray]
    prepare_steps: list[str]
    prepare_notes: list[str]
    calibration: Calibration | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    prepared: Any = None  # the onnx.ModelProto that was imported (per-layer reports run it)
    provenance: dict[str, NodeOrigin] = field(default_factory=dict)
    arch: str | None = None  # CUDA arch built for
    unmatched_node_rules: list[str] = field(default_factory=list)  # node patterns that matched no node
    run_time_loops: int = 0  # Loops left to run time (recursive functions: the VM runs them on a deep stack)
    index_inputs: dict[str, int] = field(default_factory=dict)  # input → rows it indexes (inputs.index_ranges)

    def release_sources(self) -> None:
        """Drop what the build was made from: the ONNX models (as loaded and as imported) and the
        Relax modules, keeping the executable and everything else the manifest reads — for a
        caller done with them before the export, whose serialisation then reuses their memory.

        Why: a model's weights sit in both ONNX models, the Relax modules and the executable; the
        export's serialisation takes three more copies, in fresh pages the kernel faults in one by
        one (BERT-base: 0.8 M faults, 5 s of system time in its export; see ``convert_model``).
        """
        self.loaded = dataclasses.replace(self.loaded, model=onnx.ModelProto())
        self.prepared = None
        self.passes = dataclasses.replace(self.passes, mod=None, prefolded=None)

    def compiled(self) -> CompiledModel:
        try:
            vm = _tvm.vm_from_executable(self.executable, self.device)
        except LookupError as err:
            raise TargetUnavailableError(f"Cannot run the {self.config.target} build here: {err}",
                                         "Build here and run on a machine that has the device (amptool run).") from err
        return CompiledModel(
            vm=vm,
            input_names=[s.name for s in self.inputs],
            output_names=[s.name for s in self.outputs],
            device=self.device,
            input_dtypes=[s.dtype for s in self.inputs],
            deep_stack=self.run_time_loops > 0,
            index_limits=dict(self.index_inputs),
        )

    def manifest(self) -> dict[str, Any]:
        report = self.passes.report
        mod = self.passes.mod
        return {
            "amptool_version": __version__,
            "model": {"path": self.loaded.path, "sha256": self.loaded.sha256()},
            "dtype": self.config.dtype,
            "target": self.config.target,
            "target_spec": self.target_spec,
            "device": self.device,
            "arch": self.arch,
            "triple": self.target_spec.get("mtriple") or _tvm.system_triple(),  # the host code's; run checks it
            "target_options": list(self.config.target_options),
            "library": LIBRARY_NAME,
            "inputs": [s.as_json() for s in self.inputs],
            "fixed_inputs": {name: value.tolist() for name, value in self.fixed_inputs.items()},
            "low_precision_io": self.config.low_precision_io and self.config.dtype != "float32",
            "outputs": [s.as_json() for s in self.outputs],
            "prepare": self.prepare_steps,
            "prepare_notes": self.prepare_notes,
            "colors": self.policy.as_json(),
            "unmatched_node_rules": list(self.unmatched_node_rules),
            "run_time_loops": self.run_time_loops,
            "index_inputs": dict(self.index_inputs),
            "range_guards": self.config.range_guards,
            "ops_by_dtype": stats.ops_by_dtype(mod),
            "casts_inserted": stats.activation_casts(mod),
            "ops_converted": report.converted,
            "ops_considered": len(report.decisions),
            "unknown_ops": dict(report.unknown_ops),
            "guarded": [g.as_json() for g in report.guarded],
            "guarded_by_kind": dict(collections.Counter(g.kind for g in report.guarded)),
            "activation_guard": (
                self.calibration.as_json(self.policy.activation_limit(self.config.dtype))
                if self.calibration is not None else None
            ),
            "cancellation_guard": cancellation_summary(self.config, self.policy, self.calibration),
            "cpu_speed_note": low_precision_speed_note(self.config.dtype, self.target_spec),
            "weight_bytes": dict(self.passes.weight_bytes),
            "concretize_like": self.passes.concretize.as_json() if self.passes.concretize else None,
            "timings_s": timings_json(self.timings_s),
            "tensor_cores": (_tensor_cores(self.executable)
                             if self.target_spec.get("kind") == "cuda" and self.executable is not None else None),
            "versions": {"amptool": __version__, **_tvm.versions(), **_tvm.toolchain_versions(self.target_spec),
                         **engine_versions()},
        }


@dataclass
class Rewritten:
    """The model up to, not including, compilation: what ``inspect`` reports."""

    loaded: LoadedModel
    inputs: list[TensorSpec]
    fixed_inputs: dict[str, np.ndarray]
    policy: ColorPolicy
    passes: PassResult
    prepare_steps: list[str]
    prepare_notes: list[str]
    calibration: Calibration | None
    timings_s: dict[str, float]
    prepared: Any = None  # the onnx.ModelProto that was imported
    imported: ImportedModel | None = None  # kept so other colours can be tried without re-importing
    unmatched_node_rules: list[str] = field(default_factory=list)  # node patterns that matched no ONNX node


def rewrite_model(
    config: ConvertConfig,
    arrays: Mapping[str, np.ndarray] | None = None,
    on_stage: StageCallback | None = None,
    *,
    calibrate: bool = False,
    before_import: Callable[[], object] | None = None,
    loaded: LoadedModel | None = None,
) -> Rewritten:
    """Load (unless ``loaded`` is given: never changed here), prepare, import, calibrate and run the
    Relax passes. ``arrays`` may pin shapes; ``calibrate`` measures even when no range guard reads it
    (inspect --headroom); ``before_import`` runs once TVM is needed (``build_model`` resolves the
    target there)."""
    # load and prepare need no TVM: its ~1 s import overlaps them (and the target's slow parts' import)
    _tvm.import_in_background(*slow_imports(config.target, config.cuda_arch, config.dtype))
    timings: dict[str, float] = {}
    notify = on_stage or (lambda _name: None)
    check_policy_source(config.colors)  # the colour list's file and YAML now; its op names need TVM, below

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        notify(name)
        start = time.perf_counter()
        value = fn()
        timings[name] = time.perf_counter() - start
        return value

    given = loaded if loaded is not None and loaded.path == config.model else None
    loaded = timed("load", lambda: given or load_model(config.model))
    if config.dtype != "float32":
        refuse_quantized(loaded.model, config.model)
    declared = graph_inputs(loaded.model)
    fixed = fixed_input_arrays(config.fixed_inputs, declared)
    declared = [s for s in declared if s.name not in fixed]
    shapes = resolve_input_shapes(config.input_shapes, [s.name for s in declared])
    inputs = pin_input_specs(declared, shapes, arrays, max_bytes=config.max_input_bytes, dims=config.dims)
    calibrating = (config.range_guards or calibrate) and config.dtype != "float32"
    # check-numerics runs beside import and the passes, and is waited for before anything is built;
    # its run on the folded model exposes every tensor when calibration will read them.
    prepared = timed(
        "prepare",
        lambda: prepare_model(loaded.model, inputs, optimize=config.prepare, fixed_inputs=fixed, defer_check=True,
                              expose_tensors=calibrating and not config.calibration),
    )
    try:
        if before_import is not None:
            before_import()
        policy = with_exclusions(load_policy(config.colors), config.exclude_ops, config.exclude_nodes)
        unmatched = unmatched_node_rules(policy, (node.name for node in iter_nodes(loaded.model.graph)))
        for pattern in unmatched:
            log.warning("node rule %r (--exclude-node or the colour list's nodes:) matches no node of %s",
                        pattern, config.model)

        def from_prepared() -> tuple[ImportedModel, Calibration | None, PassResult]:
            imported = timed("import", lambda: import_model(prepared.model, inputs))
            calibration = None
            if calibrating:
                calibration = timed("calibrate", lambda: _calibrate(config, prepared, inputs))
            return imported, calibration, _run_passes(config, imported, policy, calibration, notify)

        try:
            built, failure = from_prepared(), None
        except Exception as err:  # noqa: BLE001 - it stands only if the folding it was built from stands
            built, failure = None, err
        waited = time.perf_counter()
        reverted = prepared.settle()
        timings["prepare"] += time.perf_counter() - waited
        if reverted:  # folding changed what the model computes: all again from the unfolded model
            built = from_prepared()
        elif failure is not None:
            raise failure
        assert built is not None
        imported, calibration, passes = built
    finally:
        prepared.discard()
    timings.update(passes.timings_s)
    return Rewritten(
        loaded=loaded,
        inputs=_io_specs(inputs, config),
        fixed_inputs=fixed,
        policy=policy,
        passes=passes,
        prepare_steps=prepared.steps,
        prepare_notes=prepared.notes,
        calibration=calibration,
        timings_s=timings,
        prepared=prepared.model,
        imported=imported,
        unmatched_node_rules=unmatched,
    )


def rewrite_with_policy(
    rewritten: Rewritten, config: ConvertConfig, policy: ColorPolicy, on_stage: StageCallback | None = None
) -> Rewritten:
    """``rewritten`` (made with ``config``) re-run under other colours: no load, prepare or import,
    and its prefolded module is reused (no colour list changes the passes before mixed_precision)."""
    if rewritten.imported is None:
        raise ValueError("rewritten model carries no import to re-run")
    passes = _run_passes(config, rewritten.imported, policy, rewritten.calibration, on_stage or (lambda _n: None),
                         prefolded=rewritten.passes)
    upstream = {k: v for k, v in rewritten.timings_s.items() if k not in passes.timings_s and k != "compile"}
    return dataclasses.replace(rewritten, policy=policy, passes=passes,
                               timings_s={**upstream, **passes.timings_s})


def _run_passes(config: ConvertConfig, imported: ImportedModel, policy: ColorPolicy,
                calibration: Calibration | None, notify: StageCallback,
                prefolded: PassResult | None = None) -> PassResult:
    return run_passes(
        imported.mod,
        policy,
        config.dtype,
        imported.provenance,
        range_guards=config.range_guards,
        activation_peaks=calibration.peaks if calibration else None,
        cancellation=({n: (c.ratio, c.feeds) for n, c in calibration.cancellation.items()}
                      if calibration and config.cancellation_guard else None),
        low_precision_io=config.low_precision_io,
        concretize=config.concretize,
        on_stage=notify,
        prefolded=prefolded,
    )


def build_model(
    config: ConvertConfig,
    arrays: Mapping[str, np.ndarray] | None = None,
    on_stage: StageCallback | None = None,
    *,
    emit_ir: str | None = None,
    loaded: LoadedModel | None = None,
) -> BuildResult:
    """Load, prepare, import, rewrite and compile — in memory. ``arrays`` may pin shapes;
    ``emit_ir`` names a file for the final Relax module as TVMScript, written before compiling;
    ``loaded``: ``config.model`` loaded already (diff's, which it also hands onnxruntime: read once)."""
    # Fail fast, before any work: the target flags (no TVM needed), and every target but this CPU's
    # plain llvm (nothing of the user's to check) and CUDA (whose codegen the PyPI wheel has), which
    # are resolved where TVM is first needed: TVM's ~1 s import then overlaps load and prepare.
    check_target_flags(config.target, config.cuda_arch, config.target_options)
    late = (config.target == "llvm" and not config.target_options) or config.target == "cuda"
    if not late:
        resolve(config)
    if emit_ir:
        check_ir_path(emit_ir)
    resolve_later = (lambda: resolve(config)) if late else None
    try:
        rewritten = rewrite_model(config, arrays, on_stage, before_import=resolve_later, loaded=loaded)
        if emit_ir:
            write_ir(rewritten.passes.mod, emit_ir)
        return compile_rewritten(config, rewritten, on_stage)
    except (UserError, TargetUnavailableError, MemoryError):
        raise
    except Exception as err:
        if "std::bad_alloc" in str(err):  # TVM's C++ side out of memory (folding a 40 GB ConstantOfShape)
            raise MemoryError("TVM could not allocate what the model needs while building it") from err
        # An invalid model (Tile repeats of -1, a dilation of 10**6) that the load let through because
        # onnxruntime opened it fails somewhere in TVM: the user's problem, said as the checker says it.
        invalid = checker_failure(config.model)
        if invalid is None:
            raise
        raise UserError(f"{config.model} is not a valid ONNX model: {invalid}",
                        "Run onnx.checker.check_model(model, full_check=True) on it and fix the exporter's "
                        "output.") from err


def check_ir_path(path: str) -> None:
    """Refuse an ``--emit-ir`` path that cannot be written, before anything is built."""
    from amptool.fileio import check_writable_file  # noqa: PLC0415

    check_writable_file(path, "--emit-ir", "Name a file in a writable directory, e.g. out/model.relax.py.")


def write_ir(mod: Any, path: str) -> None:
    """Write ``mod`` as TVMScript to ``path`` atomically (constants as metadata references)."""
    from amptool.fileio import atomic_write  # noqa: PLC0415

    with atomic_write(path, "w", "--emit-ir") as handle:
        handle.write(_tvm.module_script(mod))


def compile_rewritten(
    config: ConvertConfig, rewritten: Rewritten, on_stage: StageCallback | None = None
) -> BuildResult:
    """Compile a rewritten model for ``config.target``."""
    target = resolve(config)
    if on_stage:
        on_stage("compile")
    target_spec = target.spec
    warn_if_slow(config.dtype, target_spec)  # before the minutes a slow build's bench would take
    start = time.perf_counter()
    executable = _compile(rewritten.passes.mod, target_spec)
    rewritten.timings_s["compile"] = time.perf_counter() - start
    return BuildResult(
        config=config,
        loaded=rewritten.loaded,
        inputs=rewritten.inputs,
        outputs=_io_specs(graph_outputs(rewritten.loaded.model), config),
        policy=rewritten.policy,
        passes=rewritten.passes,
        target_spec=target_spec,
        device=target.device,
        executable=executable,
        fixed_inputs=rewritten.fixed_inputs,
        prepare_steps=rewritten.prepare_steps,
        prepare_notes=rewritten.prepare_notes,
        calibration=rewritten.calibration,
        timings_s=rewritten.timings_s,
        prepared=rewritten.prepared,
        provenance=rewritten.imported.provenance if rewritten.imported else {},
        arch=target.arch,
        unmatched_node_rules=rewritten.unmatched_node_rules,
        run_time_loops=count_loops(rewritten.passes.mod),
        index_inputs=index_ranges(rewritten.prepared, TABLE_INDEXING) if rewritten.prepared is not None else {},
    )


def count_loops(mod: Any) -> int:
    """How many Loops of ``mod`` run at run time (loop_function.py's functions, one each)."""
    names = [gv.name_hint for gv, _func in _tvm.relax_functions(mod)] if mod is not None else []
    return sum(1 for name in names if name.startswith(LOOP_FUNCTION_PREFIX))


def resolve(config: ConvertConfig, *, lower_only: bool = False) -> ResolvedTarget:
    """The target ``config`` builds for; exit 3 when this TVM cannot (unless ``lower_only``)."""
    return resolve_target(config.target, config.cuda_arch, config.target_options, lower_only=lower_only)


def _io_specs(specs: list[TensorSpec], config: ConvertConfig) -> list[TensorSpec]:
    """The compiled module's signature: float32 entries in the low dtype under --low-precision-io."""
    if not config.low_precision_io or config.dtype == "float32":
        return specs
    return [TensorSpec(s.name, config.dtype, s.shape) if s.dtype == "float32" else s for s in specs]


def cancellation_summary(config: ConvertConfig, policy: ColorPolicy,
                         calibration: Calibration | None) -> dict[str, object] | None:
    """The cancellation guard's bound and counts (manifest, inspect); None when it did not run."""
    if calibration is None or not (config.range_guards and config.cancellation_guard):
        return None
    return calibration.cancellation_json(policy.cancellation_bound())


def _calibrate(config: ConvertConfig, prepared: PreparedModel, inputs: list[TensorSpec]) -> Calibration:
    """Activation peaks on --calibration arrays, else on the seeded inputs diff uses (read from
    prepare's check-numerics run when it made one on the same inputs)."""
    model = prepared.model
    if config.calibration:
        feeds = load_inputs(config.calibration, inputs, "--calibration")
        check_input_shapes(feeds, inputs, f"--calibration {config.calibration}")
        return activation_peaks(model, feeds, source=config.calibration)
    feeds = generate_inputs(inputs, model, seed=0)
    return activation_peaks(model, feeds, source="generated (seed 0)", values=prepared.checked_tensors(feeds))


def convert_model(
    config: ConvertConfig, output_dir: str, on_stage: StageCallback | None = None, *, emit_ir: str | None = None
) -> tuple[BuildResult, dict[str, Any]]:
    """Build and export to ``output_dir`` atomically; returns the build, its sources released
    (``BuildResult.release_sources``: a convert needs them no more once the manifest is made), and
    its manifest."""
    check_output_dir(output_dir)
    result = build_model(config, on_stage=on_stage, emit_ir=emit_ir)
    return result, export_build(result, output_dir, on_stage, release_sources=True)


def export_build(
    result: BuildResult,
    output_dir: str,
    on_stage: StageCallback | None = None,
    *,
    extra_manifest: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str] | None = None,
    release_sources: bool = False,
) -> dict[str, Any]:
    """Write ``result`` (library, manifest plus ``extra_manifest`` keys, ``extra_files`` as
    name → text) to ``output_dir`` atomically; returns the manifest. ``release_sources``: the
    manifest is made first, then ``result.release_sources()`` runs before the library is written."""
    if on_stage:
        on_stage("export")
    manifest: dict[str, Any] = {}

    def write(tmp: str) -> None:
        import os  # noqa: PLC0415

        manifest.update(result.manifest())  # its timings_s, with the export's, again below
        manifest.update(extra_manifest or {})
        if release_sources:
            result.release_sources()
        start = time.perf_counter()
        _tvm.export_library(result.executable, os.path.join(tmp, LIBRARY_NAME), cross_compiler(result.target_spec))
        for name, text in (extra_files or {}).items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        result.timings_s["export"] = time.perf_counter() - start
        manifest["timings_s"] = timings_json(result.timings_s)
        write_manifest(tmp, manifest)

    write_artifact(output_dir, write)
    return manifest


def timings_json(timings: Mapping[str, float]) -> dict[str, float]:
    """A report's ``timings_s``: seconds per stage, to 0.1 ms."""
    return {k: round(v, 4) for k, v in timings.items()}


def _compile(mod: Any, target_spec: dict[str, Any]) -> Any:
    try:
        return compiler.compile_module(mod, target_spec)
    except Exception as err:
        raise RuntimeError(f"TVM failed to compile the converted module: {err}") from err


def _tensor_cores(executable: Any) -> dict[str, Any]:
    """CUDA kernels with / without tensor-core instructions (see amptool.compiler.cuda_inspect)."""
    from amptool.compiler.cuda_inspect import tensor_core_kernels  # noqa: PLC0415

    return tensor_core_kernels(executable)
