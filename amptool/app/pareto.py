"""``convert --auto-fallback --pareto FILE.json``: what each fallback step buys, in speed and accuracy.

A single PASS/FAIL hides the trade: every node kept float32 costs some speed and buys some
accuracy. The search already visits a ladder of colourings — nothing kept, then the top 1, 2,
4, … ranked nodes, then the bisection's prefixes — and this module turns each into a row the
user can choose from, ending with the whole model in float32:

    per step        a normal (probe-free) build of that colouring — reused when the search
                    compiled one, else one more compile — checked on the held-out input sets
                    (the search never saw them, so the accuracy is not the search's own
                    optimism), with the share of compute in the low dtype
    latency         every step's build exported and timed as ``amptool bench`` times (a
                    worker process per build, one busy at a time, rotating rounds, fresh
                    workers each round), so steps compare in one run; ratios to the float32
                    build lead, the milliseconds follow

The extra compiles are reported (``pareto_compiles``) and do not count against
``--max-compiles``, which bounds the search alone.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool.app.bench import BenchConfig, VariantTiming, default_threads, time_rounds
from amptool.app.bench_worker import TVM_RUNTIME, WorkerSpec
from amptool.app.convert import BuildResult, ConvertConfig, build_model, compile_rewritten, export_build
from amptool.app.fallback_verify import InputSet, Verdict, judge
from amptool.compare.tolerance import TolerancePolicy
from amptool.fileio import atomic_write, finite_only
from amptool.passes import stats

#: Timing for the steps: enough rounds that a step's median survives one disturbed round.
PARETO_ROUNDS = 3
PARETO_RUNS = 5
ALL_FLOAT32 = "float32"  # the last step's label: the whole model in float32


@dataclass(frozen=True)
class Rung:
    """One colouring on the ladder: its float32 nodes and its build (None until compiled)."""

    label: str
    kept: tuple[str, ...]
    rewritten: Any  # amptool.app.convert.Rewritten; None for the all-float32 build
    build: BuildResult | None


@dataclass
class Step:
    label: str
    kept: tuple[str, ...]
    fraction_low_precision: float
    fraction_ops_low_precision: float
    held_out: Verdict
    chosen: bool
    latency_ms: float = float("nan")
    p90_ms: float = float("nan")

    def as_json(self, fp32_ms: float) -> dict[str, Any]:
        worst = self.held_out.worst
        return {
            "step": self.label,
            "nodes_kept_fp32": len(self.kept),
            "all_float32": self.label == ALL_FLOAT32,
            "nodes": list(self.kept),
            "fraction_low_precision": round(self.fraction_low_precision, 4),
            "fraction_ops_low_precision": round(self.fraction_ops_low_precision, 4),
            "held_out_passed": self.held_out.passed,
            "tolerance_ratio": worst["tolerance_ratio"],
            "worst_output": worst["name"],
            "failure": None if self.held_out.passed else worst["failure"],
            "cosine": worst.get("cosine"),
            "max_abs": worst.get("max_abs"),
            "latency_ms": round(self.latency_ms, 4),
            "p90_ms": round(self.p90_ms, 4),
            "latency_vs_float32": round(self.latency_ms / fp32_ms, 4) if fp32_ms > 0 else None,
            "chosen": self.chosen,
        }


def pareto_report(convert: ConvertConfig, rungs: Sequence[Rung], chosen: tuple[str, ...],
                  held_out: Sequence[InputSet], output_names: Sequence[str], tolerance: TolerancePolicy,
                  notify: Callable[[str], None]) -> dict[str, Any]:
    """Build (where needed), check and time every rung plus an all-float32 build; the JSON."""
    dtype = convert.dtype
    compiles = 0
    steps: list[Step] = []
    builds: list[BuildResult] = []
    for rung in [*rungs, Rung(ALL_FLOAT32, (), None, None)]:
        notify(f"pareto: step '{rung.label}'")
        build = rung.build
        if build is None:
            build = (compile_rewritten(convert, rung.rewritten) if rung.rewritten is not None
                     else build_model(dataclasses.replace(convert, dtype="float32", low_precision_io=False)))
            compiles += 1
        decisions = build.passes.report.decisions
        low = 0.0 if rung.rewritten is None else stats.compute_fraction(build.passes.mod, decisions, dtype)
        ops_low = 0.0 if rung.rewritten is None else stats.fraction_ops(decisions, dtype)
        verdict = judge(build.compiled().run, held_out, output_names, tolerance, dtype)
        is_chosen = rung.rewritten is not None and rung.kept == chosen
        steps.append(Step(rung.label, rung.kept, low, ops_low, verdict, is_chosen))
        builds.append(build)
    threads = default_threads()
    _time_steps(steps, builds, held_out[0].feeds, threads, notify)
    fp32_ms = steps[-1].latency_ms
    return finite_only({
        "model": convert.model,
        "dtype": dtype,
        "target": convert.target,
        "held_out": steps[0].held_out.source,
        "threads": threads,
        "timing": f"{PARETO_ROUNDS} rounds x {PARETO_RUNS} runs, a worker process per build, fresh each round",
        "pareto_compiles": compiles,
        "steps": [s.as_json(fp32_ms) for s in steps],
        "frontier": _frontier(steps),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })


def _time_steps(steps: list[Step], builds: Sequence[BuildResult], feeds: Any, threads: int,
                notify: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="amptool-pareto-") as scratch:
        specs = []
        for index, build in enumerate(builds):
            path = os.path.join(scratch, f"step{index}")
            export_build(build, path)
            specs.append(WorkerSpec(f"step{index}", TVM_RUNTIME, path, threads, dict(feeds)))
        timings = [VariantTiming(s.name) for s in specs]
        config = BenchConfig(model=builds[0].loaded.path, dtypes=(), threads=threads, rounds=PARETO_ROUNDS,
                             runs=PARETO_RUNS)
        notify("pareto: timing")
        time_rounds(specs, timings, config, notify, None)
    for step, timing in zip(steps, timings):
        step.latency_ms = timing.median_ms
        step.p90_ms = float(np.percentile(timing.times_ms, 90))


def _frontier(steps: Sequence[Step]) -> list[str]:
    """Labels of the held-out-passing steps no other passing step beats on both latency and error.

    A failing step is not an option a user can ship, so it never joins the frontier, however fast
    (on a small model the fastest build is decided by timing noise, not by its precision).
    """
    passing = [s for s in steps if s.held_out.passed]

    def error(step: Step) -> float:
        return float(step.held_out.worst["tolerance_ratio"] or 0.0)

    return [s.label for s in passing
            if not any(o is not s and o.latency_ms <= s.latency_ms and error(o) <= error(s)
                       and (o.latency_ms < s.latency_ms or error(o) < error(s)) for o in passing)]


def write_pareto(path: str, report: dict[str, Any]) -> None:
    with atomic_write(path, "w", "--pareto") as handle:
        json.dump(report, handle, indent=2)
        handle.write("\n")
