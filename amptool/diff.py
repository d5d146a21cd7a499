"""``diff``: converted model vs onnxruntime fp32 on the same inputs (library API).

Backends (runtime/) know nothing of comparison; the comparator (compare/) knows nothing of
backends; this module wires them: inputs → reference → converted → statistics → verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amptool.artifact import load_artifact
from amptool.compare.stats import Tolerance, compare_output, default_tolerance
from amptool.convert import ConvertConfig, build_model
from amptool.fileio import finite_only
from amptool.frontend.load import load_model
from amptool.frontend.prepare import reference_model
from amptool.frontend.signature import TensorSpec, graph_inputs
from amptool.runtime.inputs import generate_inputs, load_inputs, save_arrays
from amptool.runtime.onnxruntime_runner import run_onnxruntime


@dataclass(frozen=True)
class DiffConfig:
    convert: ConvertConfig
    artifact: str | None = None
    inputs_path: str | None = None
    save_inputs: str | None = None
    seed: int = 0
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    check_stat: str = "max"

    def tolerance(self, dtype: str) -> Tolerance:
        base = default_tolerance(dtype)
        return Tolerance(
            atol=base.atol if self.atol is None else self.atol,
            rtol=base.rtol if self.rtol is None else self.rtol,
            min_cosine=base.min_cosine if self.min_cosine is None else self.min_cosine,
            check_stat=self.check_stat,
        )


@dataclass
class DiffReport:
    passed: bool
    dtype: str
    target: str
    tolerance: Tolerance
    outputs: list[dict[str, Any]]
    seed: int | None
    model: str
    timings_s: dict[str, float] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def worst(self) -> dict[str, Any] | None:
        """The failing output, or the one with the lowest cosine."""
        failing = [o for o in self.outputs if not o["passed"]]
        if failing:
            return failing[0]
        scored = [o for o in self.outputs if o.get("cosine") is not None]
        return min(scored, key=lambda o: o["cosine"]) if scored else None

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-safe data: non-finite statistics (an SNR of identical outputs,
        an error against an Inf) are null; the ``nan``/``inf`` counts say what happened."""
        return finite_only({
            "passed": self.passed,
            "dtype": self.dtype,
            "target": self.target,
            "model": self.model,
            "seed": self.seed,
            "tolerance": {
                "atol": self.tolerance.atol,
                "rtol": self.tolerance.rtol,
                "min_cosine": self.tolerance.min_cosine,
                "check_error_stat": self.tolerance.check_stat,
            },
            "outputs": self.outputs,
            "guarded": self.manifest.get("guarded", []),
            "unknown_ops": self.manifest.get("unknown_ops", {}),
            "timings_s": {k: round(v, 4) for k, v in self.timings_s.items()},
        })


def diff_model(config: DiffConfig, on_stage: Callable[[str], None] | None = None) -> DiffReport:
    """Convert (or load ``artifact``), run both sides on the same inputs, compare."""
    notify = on_stage or (lambda _name: None)
    timings: dict[str, float] = {}
    loaded = load_model(config.convert.model)
    specs = graph_inputs(loaded.model)
    arrays = load_inputs(config.inputs_path, specs) if config.inputs_path else None

    if config.artifact:
        manifest, compiled = load_artifact(config.artifact)
        dtype, target = manifest["dtype"], manifest["target"]
        pinned = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in manifest["inputs"]]
    else:
        build = build_model(config.convert, arrays=arrays, on_stage=notify)
        timings.update(build.timings_s)
        manifest, compiled = build.manifest(), build.compiled()
        dtype, target, pinned = config.convert.dtype, config.convert.target, build.inputs

    if arrays is None:
        arrays = generate_inputs(pinned, loaded.model, seed=config.seed)
    if config.save_inputs:
        save_arrays(config.save_inputs, arrays)

    notify("reference")
    start = time.perf_counter()
    reference = run_onnxruntime(reference_model(loaded.model), arrays)
    timings["reference"] = time.perf_counter() - start

    notify("run")
    start = time.perf_counter()
    converted = compiled.run(arrays)
    timings["run"] = time.perf_counter() - start

    tolerance = config.tolerance(dtype)
    outputs = [
        compare_output(name, reference[name], converted[name], tolerance)
        for name in compiled.output_names
    ]
    return DiffReport(
        passed=all(o["passed"] for o in outputs),
        dtype=dtype,
        target=target,
        tolerance=tolerance,
        outputs=outputs,
        seed=None if config.inputs_path else config.seed,
        model=config.convert.model,
        timings_s=timings,
        manifest=manifest,
    )

