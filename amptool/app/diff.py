"""``diff``: converted model vs a reference on the same inputs (library API).

Backends (runtime/) know nothing of comparison; the comparator (compare/) knows nothing of
backends; this module wires them: inputs → reference → converted → statistics → verdict.

The reference is onnxruntime float32 on CPU, or stored outputs (``reference_outputs``).
Inputs come from a file, a dataset (a directory of .npz files, or one .npz with a sample
axis: ``runtime.samples``), or are generated from ``seed`` — ``iterations`` sets, seeds
``seed, seed+1, …``; the report keeps per output the worst case over them (see
``compare.aggregate``) plus the per-iteration results and their mean, and over every set the
decision agreement of classifier and segmentation outputs (``compare.labels``): top-1/top-5
flip rates and pixel agreement, which ``max_top1_flip`` and friends can gate on. Every user-supplied
name, file and range is checked before anything is built, and files are written only
once the comparison is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from amptool.app.artifact import load_artifact
from amptool.app.convert import ConvertConfig, build_model, resolve, timings_json
from amptool.app.remote import remote_artifact, remote_build, remote_json
from amptool.compare.aggregate import mean_over, severity, worst_case
from amptool.compare.labels import DecisionTracker
from amptool.compare.stats import compare_output
from amptool.compare.tolerance import Tolerance, ToleranceOverride, TolerancePolicy, default_tolerance
from amptool.compiler.targets import require_device
from amptool.errors import UserError
from amptool.fileio import finite_only
from amptool.frontend.gradient import has_gradients
from amptool.frontend.input_values import fixed_input_arrays
from amptool.frontend.load import load_model
from amptool.frontend.prepare import reference_model
from amptool.frontend.shape_inputs import pins_from_arrays, value_preview
from amptool.frontend.signature import TensorSpec, graph_inputs, graph_outputs
from amptool.runtime.inputs import (
    check_input_arrays,
    check_input_shapes,
    check_val_ranges,
    generate_inputs,
    load_inputs,
    load_reference_outputs,
    save_arrays,
    save_outputs,
)
from amptool.runtime.onnxruntime_runner import OnnxruntimeRunner
from amptool.runtime.remote import RemoteModel, RemoteSpec
from amptool.runtime.samples import SOURCE_DIRECTORY, SOURCE_SAMPLE_AXIS, Samples, open_samples
from amptool.runtime.tvm_runner import CompiledModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiffConfig:
    """What to compare and how strictly: ``tolerance`` overrides the dtype's default tolerances,
    for every output or for single ones."""

    convert: ConvertConfig
    artifact: str | None = None
    inputs_path: str | None = None
    input_arrays: Mapping[str, np.ndarray] | None = None  # the Python API's inputs={name: array}
    save_inputs: str | None = None
    seed: int = 0
    iterations: int = 1
    val_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    reference_outputs: str | None = None
    save_outputs: str | None = None
    tolerance: TolerancePolicy = field(default_factory=TolerancePolicy)
    per_layer: bool = False  # also compare every ONNX node's output (amptool.app.per_layer)
    sample_axis: int | None = None  # inputs_path is one .npz stacking samples along this axis
    max_top1_flip: float | None = None  # fail when more rows than this fraction change their argmax
    max_top5_flip: float | None = None
    min_pixel_agreement: float | None = None
    remote: RemoteSpec | None = None  # run the converted model on a device behind TVM's RPC (app/remote.py)

    def __post_init__(self) -> None:
        if self.per_layer and self.remote is not None:
            raise UserError("--per-layer runs every node here, not on the remote device",
                            "Drop --per-layer, or drop --rpc/--rpc-server to find the node on this machine.")
        for flag, value in (("--max-top1-flip", self.max_top1_flip), ("--max-top5-flip", self.max_top5_flip),
                            ("--min-pixel-agreement", self.min_pixel_agreement)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise UserError(f"{flag} {value}: a fraction between 0 and 1", f"E.g. {flag} 0.01 for 1%.")
        if self.sample_axis is not None and not self.inputs_path:
            raise UserError("--sample-axis splits the .npz given with --inputs, but there is none",
                            "Pass --inputs FILE.npz whose arrays stack samples along that axis.")
        if self.per_layer and (self.artifact or self.reference_outputs):
            flag = "--artifact" if self.artifact else "--reference-outputs"
            raise UserError(f"--per-layer converts the model itself and runs onnxruntime, so it cannot use {flag}",
                            f"Drop {flag}; per-layer builds from MODEL with the same conversion flags.")
        if self.iterations < 1:
            raise UserError(f"--iterations {self.iterations}: need at least 1")
        if self.iterations > 1:
            single = [flag for flag, value in (
                ("--inputs", self.inputs_path or self.input_arrays), ("--reference-outputs", self.reference_outputs),
                ("--save-inputs", self.save_inputs), ("--save-outputs", self.save_outputs)) if value]
            if single:
                raise UserError(
                    f"--iterations {self.iterations} generates {self.iterations} input sets, "
                    f"but {', '.join(single)} work with one set",
                    "Drop --iterations, or drop those flags (--seed S --iterations N is reproducible by itself).",
                )
        if self.val_ranges and (self.inputs_path or self.input_arrays):
            raise UserError("--val-range shapes generated inputs, but --inputs gives them",
                            "Drop --val-range, or drop --inputs.")

    def policy(self) -> TolerancePolicy:
        return self.tolerance


@dataclass
class DiffReport:
    passed: bool
    dtype: str
    target: str
    tolerance: Tolerance
    outputs: list[dict[str, Any]]
    seed: int | None
    model: str
    reference: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    iterations: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    #: Every input set together: count, worst sample, decision flip rates, threshold failures.
    dataset: dict[str, Any] = field(default_factory=dict)
    #: Output name → (reference, converted) arrays of its worst iteration; for plots, not JSON.
    samples: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    layers: Any = None  # amptool.app.per_layer.LayerReport, with --per-layer
    #: The overrides the tolerances were resolved from (flags or the API's tolerance_policy).
    policy: TolerancePolicy = field(default_factory=TolerancePolicy)
    remote: dict[str, Any] | None = None  # where the converted model ran, with --rpc/--rpc-server

    @property
    def verdict(self) -> str:
        """The grep-friendly last line diff prints: ``PASSED | …`` or ``FAILED | …``."""
        return verdict_line(self)

    def to_json(self) -> dict[str, Any]:
        """What ``amptool diff --json`` writes."""
        return self.as_json()

    @property
    def worst(self) -> dict[str, Any] | None:
        """The worst output: a failing one if any (most basic check failed first), else the one
        closest to its tolerance."""
        return max(self.outputs, key=severity) if self.outputs else None

    @property
    def reference_label(self) -> str:
        if self.reference.get("path"):
            return f"reference {self.reference['path']}"
        if self.reference.get("source") == "onnxruntime+finite-differences":
            return "onnxruntime float32 + float64 finite differences"
        return "onnxruntime float32"

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-safe data: non-finite statistics (an SNR of identical outputs,
        an error against an Inf) are null; the ``nan``/``inf`` counts say what happened."""
        per_output = {o["name"]: o["tolerance"] for o in self.outputs
                      if o.get("tolerance") and o["tolerance"] != self.tolerance.as_json()}
        return finite_only({
            "passed": self.passed,
            "dtype": self.dtype,
            "target": self.target,
            "model": self.model,
            "seed": self.seed,
            "reference": self.reference,
            "inputs": self.inputs,
            "tolerance": {**self.tolerance.as_json(), "per_output": per_output},
            "tolerance_policy": self.policy_json(),
            "outputs": self.outputs,
            "iterations": self.iterations,
            "dataset": self.dataset,
            "guarded": self.manifest.get("guarded", []),
            "unknown_ops": self.manifest.get("unknown_ops", {}),
            "timings_s": timings_json(self.timings_s),
            "remote": self.remote,
            **(self.layers.as_json() if self.layers is not None else {}),
        })


    def policy_json(self) -> dict[str, Any]:
        """The policy used: the dtype's defaults, the overrides given (for every output, per output)
        and what they resolved to — ``default`` for every output, ``per_output`` for the named ones."""
        named = dict(self.policy.per_output)
        return {
            "dtype_default": default_tolerance(self.dtype).as_json(),
            "overrides": {"default": _override_json(self.policy.default),
                          "per_output": {name: _override_json(o) for name, o in named.items()}},
            "default": self.tolerance.as_json(),
            "per_output": {name: self.policy.resolve(self.dtype, name).as_json() for name in named},
        }


def _pin_shape_inputs(config: DiffConfig, model: Any, specs: list[TensorSpec], arrays: Mapping[str, np.ndarray],
                      ) -> tuple[ConvertConfig, dict[str, np.ndarray]]:
    """The build's config with the inputs whose given values decide output shapes fixed to them
    (Relax needs those values at import; see frontend/shape_inputs.py), and those values."""
    pins = pins_from_arrays(model, specs, arrays, already=config.convert.fixed_inputs)
    for name, (value, use) in pins.items():
        log.warning("input '%s' decides output shapes (%s); pinned to its --inputs value %s for this build",
                    name, ", ".join(use.labels), value_preview(value))
    if not pins:
        return config.convert, {}
    fixed = {name: value for name, (value, _use) in pins.items()}
    return dataclasses.replace(config.convert, fixed_inputs={**config.convert.fixed_inputs, **fixed}), fixed


def _check_auto_fixed(feeds: Mapping[str, np.ndarray], fixed: Mapping[str, np.ndarray], source: str) -> None:
    """Every input set must give an auto-fixed input the value the build was made for."""
    for name, value in fixed.items():
        if name in feeds and not np.array_equal(np.asarray(feeds[name]), value):
            raise UserError(
                f"{source}: input '{name}' is {value_preview(feeds[name])}, but decides output shapes and the build "
                f"was pinned to {value_preview(value)} (the first set's value)",
                "Split the sets by that input's value and diff each group separately.",
            )


def _override_json(override: ToleranceOverride) -> dict[str, Any]:
    """Only the fields an override sets, under the names ``Tolerance.as_json`` uses."""
    fields = {"atol": override.atol, "rtol": override.rtol, "min_cosine": override.min_cosine,
              "check_error_stat": override.check_stat, "max_scale_error": override.max_scale_error}
    return {key: value for key, value in fields.items() if value is not None}


def diff_model(config: DiffConfig, on_stage: Callable[[str], None] | None = None) -> DiffReport:
    """Convert (or load ``artifact``), run both sides on the same inputs, compare."""
    with contextlib.ExitStack() as remote_session:  # with --rpc: ends the session, removes the library
        return _diff_model(config, on_stage, remote_session)


def _diff_model(config: DiffConfig, on_stage: Callable[[str], None] | None,
                remote_session: contextlib.ExitStack) -> DiffReport:
    notify = on_stage or (lambda _name: None)
    timings: dict[str, float] = {"reference": 0.0, "run": 0.0}
    loaded = load_model(config.convert.model)
    specs = graph_inputs(loaded.model)
    output_names = [s.name for s in graph_outputs(loaded.model)]
    policy = config.policy()
    policy.check_names(output_names)
    check_val_ranges(config.val_ranges, specs)
    fixed = fixed_input_arrays(config.convert.fixed_inputs, specs)
    specs = [s for s in specs if s.name not in fixed]  # fixed inputs are constants of the build
    samples = open_samples(config.inputs_path, specs, config.sample_axis) if config.inputs_path else None
    if samples is not None and len(samples) > 1:
        _check_single_set_flags(config, len(samples))
    arrays = (check_input_arrays(config.input_arrays, specs, "inputs") if config.input_arrays is not None
              else samples.load(0) if samples is not None
              else load_inputs(config.inputs_path, specs) if config.inputs_path else None)
    stored = load_reference_outputs(config.reference_outputs, output_names) if config.reference_outputs else None
    auto_fixed: dict[str, np.ndarray] = {}
    convert_config = config.convert
    if arrays is not None and not config.artifact:  # values that decide shapes: fixed for this build
        convert_config, auto_fixed = _pin_shape_inputs(config, loaded.model, specs, arrays)
        fixed = {**fixed, **auto_fixed}
        specs = [s for s in specs if s.name not in auto_fixed]
        arrays = {name: value for name, value in arrays.items() if name not in auto_fixed}
    if config.per_layer and has_gradients(loaded.model):
        raise UserError("--per-layer runs every node in onnxruntime, which cannot run Gradient nodes",
                        "Drop --per-layer; diff compares the gradients against float64 finite differences.")

    if config.artifact:
        manifest, compiled = (load_artifact(config.artifact) if config.remote is None
                              else remote_session.enter_context(remote_artifact(config.remote, config.artifact)))
        dtype, target = manifest["dtype"], manifest["target"]
        pinned = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in manifest["inputs"]]
        declared = {s.name: s for s in graph_inputs(loaded.model)}
        fixed = {name: np.asarray(value, dtype=declared[name].dtype)
                 for name, value in manifest.get("fixed_inputs", {}).items() if name in declared}
    else:
        if config.remote is None:
            require_device(resolve(convert_config))  # exit 3 before building for a GPU that is not here
        build = build_model(convert_config, arrays=arrays, on_stage=notify, loaded=loaded)
        timings.update(build.timings_s)
        manifest, compiled = build.manifest(), (build.compiled() if config.remote is None else
                                                remote_session.enter_context(remote_build(config.remote, build)))
        dtype, target, pinned = config.convert.dtype, config.convert.target, build.inputs
    # Inputs are made and checked in the model's own dtypes; a --low-precision-io module
    # casts its float feeds itself (CompiledModel.run).
    model_dtypes = {s.name: s.dtype for s in specs}
    pinned = [TensorSpec(p.name, model_dtypes.get(p.name, p.dtype), p.shape) for p in pinned]
    if arrays is not None:
        check_input_shapes(arrays, pinned, f"--inputs {config.inputs_path or '(arrays)'}")

    runner = None
    if stored is None:
        notify("reference")
        start = time.perf_counter()
        runner = _reference_runner(loaded.model)
        timings["reference"] += time.perf_counter() - start

    count = len(samples) if samples is not None else 1 if arrays is not None else config.iterations
    seeds: list[int | None] = [None] * count if arrays is not None else [config.seed + i for i in range(count)]
    loop = _Iterations(compiled, runner, stored, policy, dtype, notify, timings, config.min_pixel_agreement)
    for index, seed in enumerate(seeds):
        if samples is not None:
            feeds = samples.load(index)
            _check_auto_fixed(feeds, auto_fixed, f"--inputs {config.inputs_path} ({samples.labels[index]})")
            check_input_shapes(feeds, pinned, f"--inputs {config.inputs_path} ({samples.labels[index]})")
        else:
            feeds = arrays if arrays is not None else generate_inputs(
                pinned, loaded.model, seed=int(seed or 0), ranges=config.val_ranges)
        feeds = {**feeds, **fixed}  # the reference needs them; the build ignores them
        loop.run(feeds, f" {index + 1}/{len(seeds)}" if len(seeds) > 1 else "")
    runs, worst_arrays, (feeds, reference, converted) = loop.runs, loop.samples, loop.last

    if config.save_inputs:
        save_arrays(config.save_inputs, feeds, "--save-inputs")
    if config.save_outputs:
        save_outputs(config.save_outputs, reference, converted)

    layers = None
    if config.per_layer:  # on the last input set; --artifact/--reference-outputs are refused above
        from amptool.app.per_layer import per_layer_report  # noqa: PLC0415

        start = time.perf_counter()
        layers = per_layer_report(build, feeds, policy.resolve(dtype), notify)
        timings["per_layer"] = time.perf_counter() - start

    outputs = worst_case(runs)
    dataset = _dataset_section(config, samples, seeds, runs, loop.decisions)
    return DiffReport(
        passed=all(o["passed"] for o in outputs) and not dataset["failures"],
        dtype=dtype,
        target=target,
        tolerance=policy.resolve(dtype),
        outputs=outputs,
        seed=None if arrays is not None else config.seed,
        model=config.convert.model,
        reference={"source": "file" if stored is not None else _reference_source(loaded.model),
                   "path": config.reference_outputs},
        inputs={
            "source": ("arrays" if config.input_arrays is not None else samples.source if samples is not None
                       else "file" if arrays is not None else "generated"),
            "path": config.inputs_path,
            "val_range": {name: list(bounds) for name, bounds in config.val_ranges.items()},
        },
        iterations={
            "count": len(seeds),
            "seeds": seeds,
            "labels": _set_labels(samples, seeds),
            "failed": [i for i, run in enumerate(runs) if not all(r["passed"] for r in run)],
            "mean": mean_over(runs),
            "runs": [{"index": i, "seed": s, "passed": all(r["passed"] for r in run), "outputs": run}
                     for i, (s, run) in enumerate(zip(seeds, runs))],
        },
        timings_s=timings,
        manifest=manifest,
        samples=worst_arrays,
        dataset=dataset,
        layers=layers,
        policy=policy,
        remote=remote_json(compiled) if isinstance(compiled, RemoteModel) else None,
    )


def _check_single_set_flags(config: DiffConfig, count: int) -> None:
    """Flags that write or read one input set cannot take a dataset of ``count``."""
    single = [flag for flag, value in (("--reference-outputs", config.reference_outputs),
                                       ("--save-inputs", config.save_inputs), ("--save-outputs", config.save_outputs),
                                       ("--per-layer", config.per_layer)) if value]
    if single:
        raise UserError(f"--inputs {config.inputs_path} holds {count} samples, but {', '.join(single)} work with one "
                        "input set", "Drop those flags, or pass a single sample's .npz.")


def _set_labels(samples: Samples | None, seeds: list[int | None]) -> list[str]:
    """What reports call each input set: its file or index in a dataset, else its seed."""
    if samples is not None:
        return list(samples.labels)
    return ["input file" if seed is None else f"seed {seed}" for seed in seeds]


def _dataset_section(config: DiffConfig, samples: Samples | None, seeds: list[int | None],
                     runs: list[list[dict[str, Any]]], decisions: DecisionTracker) -> dict[str, Any]:
    """All input sets together: how many, the worst one by name, decision agreement, and which
    ``--max-top1-flip``-style thresholds failed (each a line for the report)."""
    labels = _set_labels(samples, seeds)
    worst = max(range(len(runs)), key=lambda i: max((severity(r) for r in runs[i]), default=(False, 0, 0.0, 0.0)))
    agreement = decisions.summary()
    failures = []
    for flag, key, limit, worse in (("--max-top1-flip", "top1_flip_rate", config.max_top1_flip, float.__gt__),
                                    ("--max-top5-flip", "top5_flip_rate", config.max_top5_flip, float.__gt__),
                                    ("--min-pixel-agreement", "pixel_agreement", config.min_pixel_agreement,
                                     float.__lt__)):
        if limit is None:
            continue
        value = agreement[key]
        if value is None:
            raise UserError(f"{flag}: no output of this model is shaped like "
                            f"{'a segmentation map' if key == 'pixel_agreement' else 'class scores'}",
                            "Class scores are [C], [N, C] or [N, T, C] floats; segmentation maps [N, C, H, W] "
                            "floats or [N, H, W] / [N, 1, H, W] integer labels.")
        if worse(float(value), float(limit)):
            failures.append(f"{key.replace('_', ' ')} {value:.2%} {'>' if worse is float.__gt__ else '<'} "
                            f"{flag} {limit:.2%}")
    return {
        "source": samples.source if samples is not None else "file" if seeds[0] is None else "generated",
        "path": samples.path if samples is not None else None,
        "samples": len(runs),
        "worst_sample": labels[worst] if runs else None,
        "worst_sample_index": worst if runs else None,
        **agreement,
        "thresholds": {"max_top1_flip": config.max_top1_flip, "max_top5_flip": config.max_top5_flip,
                       "min_pixel_agreement": config.min_pixel_agreement},
        "failures": failures,
    }


class _Reference(Protocol):
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def _reference_runner(model: Any) -> _Reference:
    """onnxruntime float32; for models with Gradient nodes (which onnxruntime cannot run), its
    forward outputs plus float64 central finite differences for the gradients."""
    if has_gradients(model):
        from amptool.app.gradient_reference import GradientReference  # noqa: PLC0415

        return GradientReference(model)
    return OnnxruntimeRunner(reference_model(model))


def _reference_source(model: Any) -> str:
    return "onnxruntime+finite-differences" if has_gradients(model) else "onnxruntime"


class _Iterations:
    """Runs both sides on one input set at a time; keeps each output's worst arrays (for plots)."""

    def __init__(self, compiled: CompiledModel, runner: _Reference | None,
                 stored: Mapping[str, np.ndarray] | None, policy: TolerancePolicy, dtype: str,
                 notify: Callable[[str], None], timings: dict[str, float],
                 min_label_agreement: float | None = None) -> None:
        self.compiled, self.runner, self.stored = compiled, runner, stored
        self.policy, self.dtype, self.notify, self.timings = policy, dtype, notify, timings
        self.min_label_agreement = min_label_agreement  # --min-pixel-agreement: integer label maps by agreement
        self.runs: list[list[dict[str, Any]]] = []
        self.samples: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.last: tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {}, {})
        self._worst: dict[str, dict[str, Any]] = {}
        self.decisions = DecisionTracker()

    def run(self, feeds: dict[str, np.ndarray], suffix: str) -> None:
        if self.runner is not None:
            self.notify(f"reference{suffix}")
            start = time.perf_counter()
            reference = self.runner.run(feeds)
            self.timings["reference"] += time.perf_counter() - start
        else:
            reference = dict(self.stored or {})
        self.notify(f"run{suffix}")
        start = time.perf_counter()
        converted = self.compiled.run(feeds)
        self.timings["run"] += time.perf_counter() - start
        # A --low-precision-io module returns fp16/bf16: compare as the floats they are.
        converted = {k: _as_float32(v) for k, v in converted.items()}
        results = [
            compare_output(name, reference[name], converted[name], self.policy.resolve(self.dtype, name),
                           self.min_label_agreement)
            for name in self.compiled.output_names
        ]
        for result in results:
            name = result["name"]
            if name not in self._worst or severity(result) > severity(self._worst[name]):
                self._worst[name] = result
                self.samples[name] = (np.asarray(reference[name]), np.asarray(converted[name]))
        self.runs.append(results)
        self.decisions.add(reference, converted, self.compiled.output_names)
        self.last = (feeds, reference, converted)


def _as_float32(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind == "V" or str(array.dtype) in ("bfloat16", "float16"):
        return array.astype(np.float32)
    return array


def verdict_line(report: DiffReport) -> str:
    """The grep-friendly last line: ``PASSED | …`` or ``FAILED | …``, naming the worst output
    and the statistic that decided."""
    worst = report.worst
    head = f"{report.dtype} on {report.target}"
    if report.remote:
        head += f" at {report.remote['server']}"
    if report.reference.get("path"):
        head += f" vs {report.reference['path']}"
    count = report.iterations.get("count", 1)
    sets = f" × {count} {'samples' if _from_dataset(report) else 'input sets'}" if count > 1 else ""
    gated = any(v is not None for v in report.dataset.get("thresholds", {}).values())
    # Shape cannot tell a class-score or segmentation output from hidden states or a flow field:
    # decisions lead the line only on a dataset or when a threshold asks for them (JSON has them always).
    decisions = _decisions_text(report.dataset) if _from_dataset(report) or gated else ""
    if worst is None:
        return f"PASSED | {head} | no outputs"
    threshold_failures = report.dataset.get("failures", [])
    if threshold_failures and all(o["passed"] for o in report.outputs):
        return f"FAILED | {head}{sets} | {'; '.join(threshold_failures)}{decisions}"
    if report.passed:
        check = worst["tolerance"]["check_error_stat"] if worst.get("tolerance") else "max"
        ratio = worst.get("tolerance_ratio")
        of_tol = f"{ratio:.2f}× tolerance" if ratio is not None else ""
        labels = "tolerance" in worst.get("unchecked", ())  # an integer label map judged by its agreement
        if ratio is None:
            detail = "compared exactly (no finite numeric elements)"
        elif labels:
            detail = f"label map with {ratio:.2f}× the differing labels --min-pixel-agreement allows"
        elif check == "elemwise":
            detail = f"elemwise error up to {of_tol} (max_abs {fmt_number(worst.get('max_abs'))})"
        else:
            detail = f"{check}_abs {fmt_number(worst.get(f'{check}_abs'))} = {of_tol}"
        if worst.get("cosine") is not None and not labels:
            detail += f", cosine {worst['cosine']:.7f}"
        if worst.get("scale_error") is not None:
            detail += f", scale_error {worst['scale_error']:.2g}"
        detail = f"worst output '{worst['name']}': {detail}"
        n = len(report.outputs)
        return f"PASSED | {head} | {n} output{'s' if n != 1 else ''}{sets} | {detail}{decisions}"
    failed = sum(1 for o in report.outputs if not o["passed"])
    where = ""
    if count > 1:
        index = worst.get("worst_iteration", 0)
        seed = report.iterations["seeds"][index]
        label = f"seed {seed}" if seed is not None else report.iterations.get("labels", [""] * count)[index]
        where = f" (input set {index + 1}/{count}, {label})"
    return (
        f"FAILED | {head} | {failed}/{len(report.outputs)} outputs failed{sets} | "
        f"output '{worst['name']}'{where}: {worst['failure']}"
    )


def _from_dataset(report: DiffReport) -> bool:
    return report.dataset.get("source") in (SOURCE_DIRECTORY, SOURCE_SAMPLE_AXIS)


def _decisions_text(dataset: dict[str, Any]) -> str:
    """`` | top-1 flips 2/16 (12.5%)`` and friends, for the verdict line; empty without decisions."""
    parts = []
    for output in dataset.get("per_output", {}).values():
        if output.get("top1_flip_rate") is not None:
            parts.append(f"top-1 flips {output['top1_flips']}/{output['rows']} ({output['top1_flip_rate']:.1%})")
        if output.get("pixel_agreement") is not None:
            parts.append(f"pixel agreement {output['pixel_agreement']:.2%}")
    return f" | {', '.join(dict.fromkeys(parts))}" if parts else ""


def fmt_number(value: Any, digits: int = 4) -> str:
    """A statistic for reports: 4 significant digits, "—" where it does not apply."""
    return "—" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)
