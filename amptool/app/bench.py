"""``bench``: onnxruntime float32, amptool float32 and amptool in low precision, timed side by
side, each runtime in a process of its own (library API; ``amptool bench`` is the shell).

How it times: every variant is built first, here (amptool's own convert path, ``build_model``),
and exported into a private temporary directory (removed afterwards, also on error) as an
artifact. Then each variant — onnxruntime on the (pinned) ONNX model, and every artifact — is
loaded in its own worker process (``amptool.app.bench_worker``), all on the same seeded inputs and
thread count. Isolation is the point: TVM's and onnxruntime's pools spin after a run, and in one
process the spinning pool of one runtime can slow the next one's timed runs (issue 13: a BERT-mini
export at 2 threads reported onnxruntime at 9.6 ms, 2.4 ms alone, flattering amptool's ratios ~4x).

Workers run one at a time, in rounds. Each round visits every variant — in an order that
rotates from round to round, so slow drift of a shared machine hits every variant alike. By
default every round starts fresh worker processes: one process's speed depends on luck it keeps
for its whole life (which core its threads land on, its memory layout). On a 2-vCPU VM one
onnxruntime process ran BERT-mini at 9.7 ms throughout, the next at 5.7 ms, so one process per
variant per bench drew one sample of that luck and a bench's ratio to onnxruntime alone swung
0.77–1.33; a process per round samples it as often as there are rounds. A
visit is one untimed run (it refills caches the others evicted; a worker's first visit adds
``warmup`` more), then ``runs`` timed runs, then a settle gap: the turn ends only when the worker's
threads have gone idle, so the next worker never shares the cores with a spinning pool (TVM's
spins for 150+ ms after a run, far longer than a fixed 20–50 ms pause; the report keeps each
variant's median settle time). Medians and 90th percentiles are over all timed runs. On a shared
machine absolute times drift; ratios of variants timed in the same rounds do not, so reports
lead with ratios.

Threads: TVM's pool and onnxruntime's intra-op pool get the same count, set in each worker
before anything runs (TVM sizes its pool once per thread).

GPU targets: a worker loads its variant on the device it was built for and copies the inputs
there once; every timed call ends with a device synchronize, so a time covers the kernels
finishing, not just their launch. onnxruntime uses its CUDAExecutionProvider when that is
installed (its times include copying the inputs to the GPU), else the CPU; the report names which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from amptool import __version__, _tvm
from amptool.app.artifact import load_artifact
from amptool.app.bench_worker import (
    ONNXRUNTIME_RUNTIME,
    OPENVINO_RUNTIME,
    TVM_RUNTIME,
    Worker,
    WorkerSpec,
    isolated_workers,
)
from amptool.app.convert import BuildResult, ConvertConfig, build_model, export_build
from amptool.app.versions import engine_versions
from amptool.compiler.targets import require_device, resolve_target
from amptool.dtypes import DTYPES
from amptool.errors import UserError
from amptool.frontend.input_values import ONLY_INPUT
from amptool.frontend.load import load_model
from amptool.frontend.prepare import pin_shapes, reference_model
from amptool.frontend.signature import TensorSpec, graph_inputs
from amptool.runtime.inputs import generate_inputs

ONNXRUNTIME = "onnxruntime-float32"
OPENVINO = "openvino"
#: Runtimes ``--against`` can add beside onnxruntime (which is always timed).
AGAINST = (OPENVINO,)
ISOLATION = "process per runtime"
ISOLATION_FRESH = "process per runtime, fresh each round"
StageCallback = Callable[[str], None]
ProgressCallback = Callable[[int, int], None]


def amptool_variant(dtype: str) -> str:
    return f"amptool-{dtype}"


def openvino_variant(dtype: str) -> str:
    return f"openvino-{dtype}"


def max_threads() -> int:
    """The most threads a bench asks of a runtime: 4 per CPU (256 at least, for a remote device).
    A thread pool of 100,000 aborted onnxruntime after minutes at a load of ~1,800."""
    return max(256, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class BenchConfig:
    """What to time. ``model`` is an ONNX file or an ``amptool convert`` output directory."""

    model: str
    dtypes: tuple[str, ...] = ("float16",)
    target: str = "llvm"
    cuda_arch: str | None = None  # --cuda-arch for --target cuda; None: the local GPU's
    batch: int | None = None
    threads: int | None = None  # None: every CPU this process may run on
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # as ConvertConfig's
    colors: str | None = None
    #: Other ConvertConfig fields for the builds (fixed_inputs, low_precision_io, prepare, …);
    #: an artifact carries its own, so they must stay unset for one.
    build: Mapping[str, Any] = field(default_factory=dict)
    rounds: int = 5
    runs: int = 3
    warmup: int = 2
    seed: int = 0
    fresh_workers: bool = True  # new worker processes every round (see the module docstring)
    against: tuple[str, ...] = ()  # other runtimes to time beside onnxruntime: "openvino"

    def __post_init__(self) -> None:
        for dtype in self.dtypes:
            if dtype not in DTYPES:
                raise UserError(f"Unknown dtype '{dtype}'. Choose from: {', '.join(DTYPES)}.")
        for name in ("batch", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name} must be at least 1, got {value}",
                                "Leave --threads out for every CPU available." if name == "threads" else
                                "Give the batch size the model runs at, e.g. --batch 1.")
        if self.threads is not None and self.threads > max_threads():
            raise UserError(f"--threads {self.threads} is more than amptool times ({max_threads()})",
                            f"This machine has {os.cpu_count()} CPUs; threads beyond them only wait on each other.")
        if self.rounds < 1 or self.runs < 1 or self.warmup < 0:
            raise UserError("--rounds and --runs must be at least 1", "E.g. --rounds 5 --runs 3 (the defaults).")
        for runtime in self.against:
            if runtime not in AGAINST:
                raise UserError(f"--against {runtime}: not a runtime amptool can time",
                                f"Choose from: {', '.join(AGAINST)}.")
        if OPENVINO in self.against:
            if self.target != "llvm":
                raise UserError(f"--against openvino times OpenVINO's CPU plugin; --target {self.target} runs "
                                "elsewhere", "Use --target llvm for a CPU comparison.")
            import importlib.util  # noqa: PLC0415

            if importlib.util.find_spec("openvino") is None:
                raise UserError("--against openvino needs OpenVINO, which is not installed",
                                "pip install 'amptool[openvino]' (or pip install openvino).")
        if os.path.isdir(self.model):
            self._check_artifact_options()

    def _check_artifact_options(self) -> None:
        """An artifact was built with its own options: one given here would silently not apply."""
        defaults = {f.name: f.default for f in dataclasses.fields(ConvertConfig)}
        given = {"colors": self.colors, "input_shapes": dict(self.input_shapes) or None, **self.build}
        changed = sorted(name for name, value in given.items()
                         if name in defaults and value not in (defaults[name], None, (), {}))
        if changed:
            raise UserError(f"{self.model} is an artifact, built with its own options; "
                            f"{', '.join(changed)} cannot change it",
                            "Bench the ONNX model with those options, or convert again.")


@dataclass
class VariantTiming:
    variant: str
    times_ms: list[float] = field(default_factory=list)
    settle_ms: list[float] = field(default_factory=list)  # per turn: until its worker's threads were idle
    round_ms: list[float] = field(default_factory=list)  # per round: the median of that round's timed runs
    build_s: float | None = None  # the whole convert path; None when loaded from an artifact
    compile_s: float | None = None  # its TVM compile stage

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_ms)) if self.times_ms else math.nan

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.times_ms, 90)) if self.times_ms else math.nan

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "median_ms": round(self.median_ms, 4),
            "p90_ms": round(self.p90_ms, 4),
            "runs": len(self.times_ms),
            "build_s": None if self.build_s is None else round(self.build_s, 3),
            "compile_s": None if self.compile_s is None else round(self.compile_s, 3),
        }


@dataclass(frozen=True)
class _Variant:
    """A built (or given) artifact directory, for its worker to load."""

    path: str
    device: str
    build_s: float | None  # the whole convert path; None when loaded from an artifact
    compile_s: float | None


@dataclass
class BenchReport:
    model: str
    target: str
    threads: int
    tvm_threads: int
    inputs: list[TensorSpec]
    results: list[VariantTiming]
    host: dict[str, str]
    versions: dict[str, str]
    date: str
    onnxruntime_provider: str = "CPUExecutionProvider"
    clock: str = "wall clock per call"
    isolation: str = ISOLATION
    #: OpenVINO variant → the inference precision OpenVINO chose (it may ignore the hint).
    openvino_precision: dict[str, str] = field(default_factory=dict)

    def timing(self, variant: str) -> VariantTiming | None:
        return next((r for r in self.results if r.variant == variant), None)

    def ratio(self, variant: str, baseline: str) -> float | None:
        """median(variant) / median(baseline), or None when either is missing."""
        a, b = self.timing(variant), self.timing(baseline)
        if a is None or b is None or not b.median_ms > 0:
            return None
        return a.median_ms / b.median_ms

    def paired_ratio(self, variant: str, baseline: str) -> float | None:
        """The median over rounds of median(variant's runs) / median(baseline's runs) in the same
        round, or None when either is missing. Each round times every variant once, close together,
        so slow drift of a shared machine (and a round's process luck) cancels within a pair:
        this moves less from run to run than ``ratio``'s pooled medians (benchmarks/README.md)."""
        a, b = self.timing(variant), self.timing(baseline)
        if a is None or b is None or not a.round_ms or len(a.round_ms) != len(b.round_ms):
            return None
        pairs = [x / y for x, y in zip(a.round_ms, b.round_ms, strict=True) if y > 0]
        return float(np.median(pairs)) if pairs else None

    def ratios(self, paired: bool = False) -> dict[str, float]:
        """``variant/baseline`` → ratio: every amptool variant against onnxruntime, every low dtype
        against amptool float32, and with ``--against openvino`` every amptool variant against
        OpenVINO in its own dtype and in float32 (missing baselines are skipped). ``paired``: the
        per-round ``paired_ratio`` instead of the ratio of pooled medians."""
        found: dict[str, float] = {}
        fp32 = amptool_variant("float32")
        for r in self.results:
            if not r.variant.startswith("amptool-"):
                continue
            dtype = r.variant.removeprefix("amptool-")
            baselines = [ONNXRUNTIME, *([fp32] if r.variant != fp32 else []), openvino_variant(dtype)]
            if dtype != "float32":
                baselines.append(openvino_variant("float32"))
            for baseline in baselines:
                value = self.paired_ratio(r.variant, baseline) if paired else self.ratio(r.variant, baseline)
                if value is not None:
                    found[f"{r.variant}/{baseline}"] = round(value, 4)
        return found

    def to_json(self) -> dict[str, Any]:
        """What ``--json`` writes."""
        return self.as_json()

    def as_json(self) -> dict[str, Any]:
        return {
            "results": [r.as_json() for r in self.results],
            "threads": self.threads,
            "tvm_threads": self.tvm_threads,
            "ratios": self.ratios(),
            "paired_ratios": self.ratios(paired=True),
            "model": self.model,
            "target": self.target,
            "inputs": [s.as_json() for s in self.inputs],
            "host": self.host,
            "onnxruntime_provider": self.onnxruntime_provider,
            "clock": self.clock,
            "isolation": self.isolation,
            **({"openvino_precision": self.openvino_precision} if self.openvino_precision else {}),
            "settle_ms": {r.variant: round(float(np.median(r.settle_ms)), 1) for r in self.results if r.settle_ms},
            "versions": self.versions,
            "date": self.date,
        }


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def bench_model(config: BenchConfig, on_stage: StageCallback | None = None,
                on_progress: ProgressCallback | None = None) -> BenchReport:
    """Build every variant, then time each in its own process, in turns; see the module docstring."""
    notify = on_stage or (lambda _name: None)
    if not os.path.isdir(config.model):
        require_device(resolve_target(config.target, config.cuda_arch))  # no builds for a GPU that is not there
    threads = config.threads or default_threads()
    _tvm.set_num_threads(threads)  # the builds' pool here; each worker sizes its own
    with tempfile.TemporaryDirectory(prefix="amptool-bench-") as scratch:
        if os.path.isdir(config.model):
            variants, specs, model, fixed = _from_artifact(config, notify, scratch)
        else:
            variants, specs, model, fixed = _from_onnx(config, notify, scratch)
        feeds = {**generate_inputs(specs, model, seed=config.seed), **fixed}
        ort_model = pin_shapes(reference_model(model), specs) if (config.batch or config.input_shapes) else model
        ort_path = os.path.join(scratch, "onnxruntime.onnx")
        with open(ort_path, "wb") as handle:
            handle.write(ort_model.SerializeToString())
        provider = _onnxruntime_provider(config.target)
        workers = [WorkerSpec(ONNXRUNTIME, ONNXRUNTIME_RUNTIME, ort_path, threads, feeds, provider=provider),
                   *_openvino_specs(config, ort_path, threads, feeds),
                   *(WorkerSpec(name, TVM_RUNTIME, v.path, threads, feeds) for name, v in variants.items())]
        timings = [VariantTiming(w.name) for w in workers if w.runtime != TVM_RUNTIME]
        timings += [VariantTiming(name, build_s=v.build_s, compile_s=v.compile_s) for name, v in variants.items()]
        notify("loading each variant in its own process")
        infos = time_rounds(workers, timings, config, notify, on_progress)
    devices = {v.device for v in variants.values()}
    return BenchReport(
        model=config.model,
        target=config.target,
        threads=threads,
        tvm_threads=min(int(info["tvm_threads"]) for info in infos if "tvm_threads" in info),
        inputs=specs,
        results=timings,
        host={**host_info(), **_gpu_info(devices)},
        versions={"amptool": __version__, **_tvm.versions(), **engine_versions()},
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        onnxruntime_provider=str(infos[0].get("provider", provider)),
        clock="wall clock per call" if devices == {"cpu"} else "wall clock per call, device synchronised after each",
        isolation=ISOLATION_FRESH if config.fresh_workers else ISOLATION,
        openvino_precision={w.name: str(info["precision"]) for w, info in zip(workers, infos)
                            if w.runtime == OPENVINO_RUNTIME},
    )


def _from_onnx(config: BenchConfig, notify: StageCallback, scratch: str) -> tuple[
        dict[str, _Variant], list[TensorSpec], onnx.ModelProto, dict[str, np.ndarray]]:
    """A build per dtype, each exported to ``scratch`` (for its worker) as soon as it is built."""
    model = load_model(config.model).model
    shapes = _input_shapes(config, graph_inputs(model))
    variants: dict[str, _Variant] = {}
    specs: list[TensorSpec] = []
    fixed: dict[str, np.ndarray] = {}
    for dtype in dict.fromkeys(("float32", *config.dtypes)):
        name = amptool_variant(dtype)
        convert = ConvertConfig(model=config.model, dtype=dtype, colors=config.colors, target=config.target,
                                cuda_arch=config.cuda_arch, input_shapes=shapes, **config.build)
        variants[name], build = _build_variant(convert, name, notify, scratch)
        specs = specs or [TensorSpec(s.name, _declared_dtype(model, s), s.shape) for s in build.inputs]
        fixed = build.fixed_inputs
    return variants, specs, model, fixed


def _build_variant(convert: ConvertConfig, name: str, notify: StageCallback, scratch: str) -> tuple[
        _Variant, BuildResult]:
    """Build, then export to ``scratch/name``: what the variant's worker loads."""
    start = time.perf_counter()
    build = build_model(convert, on_stage=_prefixed(notify, name))
    build_s = time.perf_counter() - start
    path = os.path.join(scratch, name)
    export_build(build, path, _prefixed(notify, name))
    return _Variant(path, build.device, build_s, build.timings_s.get("compile")), build


def artifact_baseline(artifact: str, manifest: Mapping[str, Any], needed_for: str) -> tuple[
        str, onnx.ModelProto, list[TensorSpec], dict[str, np.ndarray]]:
    """The ONNX model an artifact was built from (its path and proto), the artifact's input specs in
    the model's declared dtypes, and its fixed inputs: what onnxruntime's baseline runs on."""
    path = manifest.get("model", {}).get("path", "")
    if not os.path.isfile(path):
        raise UserError(f"{artifact} was built from {path or 'an unrecorded model'}, which is not there",
                        f"bench needs the original ONNX model for {needed_for}.")
    model = load_model(path).model
    declared = {s.name: s for s in graph_inputs(model)}
    specs = [TensorSpec(i["name"], declared[i["name"]].dtype if i["name"] in declared else i["dtype"],
                        tuple(i["shape"])) for i in manifest["inputs"]]
    fixed = {n: np.asarray(v, dtype=declared[n].dtype) for n, v in manifest.get("fixed_inputs", {}).items()
             if n in declared}
    return path, model, specs, fixed


def _from_artifact(config: BenchConfig, notify: StageCallback, scratch: str) -> tuple[
        dict[str, _Variant], list[TensorSpec], onnx.ModelProto, dict[str, np.ndarray]]:
    """The artifact's build next to a fresh float32 build of its model, at its input shapes."""
    notify("load artifact")
    manifest, compiled = load_artifact(config.model)  # loads here to fail early; its worker loads it again
    path, model, specs, fixed = artifact_baseline(config.model, manifest, "the onnxruntime and float32 baselines")
    if config.batch and any(s.shape and s.shape[0] != config.batch for s in specs):
        raise UserError(f"--batch {config.batch} does not match the artifact's input shapes",
                        "An artifact is compiled for fixed shapes; bench the ONNX model instead.")
    shapes = {s.name: tuple(int(d) for d in s.shape or ()) for s in specs}
    fp32 = ConvertConfig(model=path, dtype="float32", colors=None, target=manifest.get("target", config.target),
                         cuda_arch=manifest.get("arch"), target_options=tuple(manifest.get("target_options", ())),
                         input_shapes=shapes, fixed_inputs=fixed)
    variants: dict[str, _Variant] = {}
    if manifest.get("dtype") != "float32":
        variants[amptool_variant("float32")] = _build_variant(fp32, amptool_variant("float32"), notify, scratch)[0]
    variants[amptool_variant(str(manifest.get("dtype")))] = _Variant(config.model, compiled.device, None, None)
    return variants, specs, model, fixed


def _prefixed(notify: StageCallback, prefix: str) -> StageCallback:
    return lambda stage: notify(f"{prefix}: {stage}")


def _declared_dtype(model: onnx.ModelProto, spec: TensorSpec) -> str:
    """The dtype the ONNX model takes (a low-precision-io build may take the low dtype)."""
    return next((s.dtype for s in graph_inputs(model) if s.name == spec.name), spec.dtype)


def _input_shapes(config: BenchConfig, declared: Sequence[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """--input-shape as given, plus ``--batch`` as the first dim of every other input."""
    shapes = dict(config.input_shapes)
    if not config.batch or (ONLY_INPUT in shapes and len(declared) == 1):
        return shapes
    for spec in declared:
        if spec.name in shapes or not spec.shape:
            continue
        rest = spec.shape[1:]
        if not all(isinstance(d, int) for d in rest):
            raise UserError(f"--batch cannot pin input '{spec.name}': dims {list(spec.shape)} are not static",
                            f"Also pass --input-shape {spec.name}:{config.batch}x…")
        shapes[spec.name] = (config.batch, *(int(d) for d in rest))
    return shapes


def _openvino_specs(config: BenchConfig, path: str, threads: int, feeds: Mapping[str, np.ndarray]) -> list[WorkerSpec]:
    """OpenVINO in float32 and in each low dtype asked for, on the same (pinned) ONNX file."""
    if OPENVINO not in config.against:
        return []
    return [WorkerSpec(openvino_variant(dtype), OPENVINO_RUNTIME, path, threads, feeds, precision=dtype)
            for dtype in dict.fromkeys(("float32", *config.dtypes))]


def _onnxruntime_provider(target: str) -> str:
    """onnxruntime's CUDA provider for a CUDA bench when it is installed; the CPU otherwise."""
    import onnxruntime as ort  # noqa: PLC0415

    if target == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return "CUDAExecutionProvider"
    return "CPUExecutionProvider"


def time_rounds(specs: list[WorkerSpec], timings: list[VariantTiming], config: BenchConfig,
                 notify: StageCallback, on_progress: ProgressCallback | None) -> list[dict[str, Any]]:
    """Rounds of turns, one worker busy at a time, in an order that rotates every round.
    Returns the load infos of the first round's workers."""
    total = config.rounds * len(specs)
    done = 0
    infos: list[dict[str, Any]] = []
    with contextlib.closing(_round_workers(specs, config)) as rounds:
        for round_index, (workers, first_visit) in enumerate(rounds):
            if not infos:
                infos = [w.info for w in workers]
                notify("timing")
            shift = round_index % len(specs)
            for index in [*range(shift, len(specs)), *range(shift)]:
                untimed = 1 + (config.warmup if first_visit else 0)  # refills caches evicted by the others
                visit = workers[index].time(untimed, config.runs)  # returns once quiet
                timings[index].times_ms.extend(visit)
                timings[index].round_ms.append(float(np.median(visit)))
                timings[index].settle_ms.append(workers[index].settle_ms[-1])
                done += 1
                if on_progress:
                    on_progress(done, total)
    return infos


def _round_workers(specs: list[WorkerSpec], config: BenchConfig) -> Generator[tuple[list[Worker], bool], None, None]:
    """Per round, the loaded workers and whether this is their first round: new processes every
    round (the previous round's stopped first), or the same ones throughout."""
    if config.fresh_workers:
        for _ in range(config.rounds):
            with isolated_workers(specs) as workers:
                yield workers, True
        return
    with isolated_workers(specs) as workers:
        for round_index in range(config.rounds):
            yield workers, round_index == 0


def host_info() -> dict[str, str]:
    """CPU model name, LLVM's name for it (and the features added to or taken from that name for
    this host, ``llvm_mattr``), the CPU count and the machine, for reports."""
    name = _tvm.cpuinfo_field("model name") or platform.processor() or platform.machine()
    from amptool.compiler.targets import host_llvm_spec  # noqa: PLC0415

    corrections = ",".join(host_llvm_spec().get("mattr", []))  # features the CPU's LLVM name misstates
    return {"cpu": name, "llvm_cpu": _tvm.host_cpu(), "llvm_mattr": corrections, "cpus": str(default_threads()),
            "machine": platform.machine()}


def _gpu_info(devices: set[str]) -> dict[str, str]:
    """The GPU's name and compute capability when a variant runs on one."""
    gpu = next((d for d in sorted(devices) if d != "cpu"), None)
    if gpu is None:
        return {}
    name, version = _tvm.device_info(gpu)
    return {"gpu": name, "gpu_compute": version}
