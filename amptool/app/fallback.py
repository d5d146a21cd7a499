"""Automatic fp32 fallback: the few ONNX nodes to keep in float32 so the diff tolerance holds.

Blind bisection over node segments (onnxconverter-common's ``auto_convert_mixed_precision``)
needs one build per probe and, on real models, tens to hundreds of them. Here one compile
gives both the model outputs, which decide pass/fail, and every node's error
(``amptool.app.per_layer``), which ranks what to try next. Pass/fail is read from the unprobed
``main``: the probed copy is fused differently, and on PP-OCRv4 rec that moved the output's
max_abs by 0.0027 against a bound of 0.010 — enough to pass a search that the export fails.

    measure(colours)        rewrite (the import is reused) → one compile of ``main`` and,
                            beside it, the probed copy (``amptool.app.probe``) → run on every
                            search set → outputs of ``main`` (the kernels a normal build has)
                            vs onnxruntime decide pass/fail (all sets must pass); the probed
                            copy gives per-layer errors on the set that fails worst
    rank(measurement)       nodes computing in the low dtype, by the error they add: new
                            NaN/Inf first, then ``rms_growth`` (RMS relative error over their
                            inputs': unlike the max-based growth it is not inflated when an op
                            shrinks its tensor's range, as a Clip does); a node that is float32
                            already (a softmax amplifying its inputs' error) passes its score to
                            the low-precision nodes feeding it, and a probed node shares its
                            score with unprobed low-precision producers
    search                  keep the top 1, 2, 4, … ranked nodes (re-ranked on the latest
                            failing build, which shows where error now comes from) until the
                            outputs pass; then bisect the last batch for the shortest prefix
                            that still passes, with plain builds (no ranking follows). With one
                            measurement left, every remaining candidate is kept, so a budget that
                            allows ≥ 2 measurements ends passing whenever float32 itself passes.
    final build             the passing colours compiled normally (a passing plain build from
                            the bisection is reused) and checked again on the search sets
    held-out check          the final build run, no compile, on sets the search never saw:
                            --validation's, else the 4 seeds after the search's (amptool.app.fallback_verify)

The search sets are ``--calibration``'s inputs when given, else seeds ``seed … seed+N-1``
(N = ``iterations``, default 4). ``max_compiles`` counts every compile, the final one included
(default 10; the doubling reaches 127 kept nodes in 8). The result is a colour list — the
user's (or builtin:default) plus ``nodes: {match: NODE, color: never}`` rules — ``fallback.yaml``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import yaml

from amptool.app.convert import (
    BuildResult,
    ConvertConfig,
    Rewritten,
    compile_rewritten,
    rewrite_model,
    rewrite_with_policy,
)
from amptool.app.fallback_verify import InputSet, Model, Verdict, check_outputs, input_sets, judge
from amptool.app.per_layer import LayerReport, compare_layers
from amptool.app.probe import compile_probed
from amptool.colors.loader import BUILTIN_PREFIX
from amptool.colors.policy import Color, ColorPolicy, NodeRule, literal_pattern
from amptool.compare.aggregate import severity, worst_case
from amptool.compare.tolerance import TolerancePolicy
from amptool.errors import UserError
from amptool.fileio import finite_only
from amptool.frontend.input_values import shape_text, value_text
from amptool.frontend.signature import TensorSpec, graph_inputs
from amptool.passes import stats
from amptool.runtime.inputs import MAX_ITERATIONS

FALLBACK_FILE = "fallback.yaml"
DEFAULT_MAX_COMPILES = 10
DEFAULT_SEARCH_SEEDS = 4
DEFAULT_HELD_OUT_SEEDS = 4


@dataclass(frozen=True)
class FallbackConfig:
    convert: ConvertConfig
    tolerance: TolerancePolicy = TolerancePolicy()
    max_compiles: int = DEFAULT_MAX_COMPILES
    seed: int = 0
    iterations: int | None = None  # search seeds seed … seed+N-1 as diff's; None: 4, or --calibration's inputs
    held_out: int = DEFAULT_HELD_OUT_SEEDS  # held-out seeds, after the search's (unless ``validation``)
    validation: str | None = None  # .npz of held-out inputs (--validation), instead of seeds
    #: Search on until every output's error is under this fraction of its tolerance (--target-margin).
    target_margin: float | None = None
    pareto: bool = False  # also build, check and time every step (amptool.app.pareto)

    def __post_init__(self) -> None:
        if self.target_margin is not None and not 0.0 < self.target_margin <= 1.0:
            raise UserError(f"--target-margin {self.target_margin}: a fraction of the tolerance in (0, 1]",
                            "E.g. --target-margin 0.5 searches until errors are at most half the tolerance.")
        if self.convert.dtype == "float32":
            raise UserError("--auto-fallback needs a low-precision --dtype (float16 or bfloat16)",
                            "float32 has nothing to fall back from.")
        if self.iterations is not None and not 1 <= self.iterations <= MAX_ITERATIONS:
            raise UserError(f"--iterations {self.iterations}: need 1 to {MAX_ITERATIONS}",
                            "Each iteration runs both models once; a few (the default 4) find most fallbacks.")
        if self.iterations is not None and self.convert.calibration:
            raise UserError(f"--iterations {self.iterations} generates the search's input sets, but "
                            f"--calibration {self.convert.calibration} gives them",
                            "Drop --iterations (the search runs on the --calibration inputs), or drop --calibration.")
        if self.held_out < 1:
            raise UserError(f"held_out {self.held_out}: need at least 1 held-out seed")
        if self.max_compiles < 3:
            raise UserError(f"--max-compiles {self.max_compiles}: auto-fallback needs at least 3 "
                            "(measure, try, final build)", "Use --max-compiles 3 or more (default 10).")

    @property
    def search_seeds(self) -> list[int]:
        """The seeds the search judges on; none when it runs on --calibration's inputs."""
        if self.convert.calibration:
            return []
        return list(range(self.seed, self.seed + (self.iterations or DEFAULT_SEARCH_SEEDS)))

    @property
    def held_out_seeds(self) -> list[int]:
        """Seeds the search never saw (the ones after its own); none with --validation."""
        if self.validation:
            return []
        first = self.seed + len(self.search_seeds)
        return list(range(first, first + self.held_out))


@dataclass
class Measurement:
    """One probe build: which nodes were kept float32, and what came out."""

    kept: tuple[str, ...]
    rewritten: Rewritten
    outputs: list[dict[str, Any]]
    layers: LayerReport | None  # None: measured without probes
    seconds: float
    build: BuildResult | None = None  # a normal build (no probes), ready to export
    margin: float | None = None  # --target-margin: passing also needs every tolerance ratio under it

    @property
    def passed(self) -> bool:
        return all(o["passed"] for o in self.outputs) and within_margin(self.outputs, self.margin)

    @property
    def worst(self) -> dict[str, Any]:
        return max(self.outputs, key=severity)

    @property
    def failure(self) -> str | None:
        """Why it did not pass: its worst output's failure, or the margin it missed."""
        worst = self.worst
        if worst["failure"] or self.passed:
            return worst["failure"]
        return f"tolerance ratio {worst['tolerance_ratio']:.3g} > --target-margin {self.margin:g}"

    def summary(self) -> dict[str, Any]:
        worst = self.worst
        return {"kept": len(self.kept), "passed": self.passed, "worst_output": worst["name"],
                "tolerance_ratio": worst["tolerance_ratio"], "failure": self.failure,
                "first_jump": self.layers.first_jump if self.layers else None, "probed": self.layers is not None,
                "seconds": round(self.seconds, 3)}


@dataclass
class FallbackResult:
    build: BuildResult  # the final (normal, probe-free) build
    kept: list[str]
    passed: bool  # on the search sets and on the held-out ones
    compiles: int
    fraction_low_precision: float
    fraction_low_precision_before: float
    fraction_ops_low_precision: float
    final_outputs: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    yaml_text: str
    search: Verdict  # the final build on the search sets (``final_outputs``)
    held_out: Verdict  # … and on sets the search never saw
    timings_s: dict[str, float] = field(default_factory=dict)
    target_margin: float | None = None
    pareto: dict[str, Any] | None = None  # amptool.app.pareto's report, with --pareto

    def manifest_section(self) -> dict[str, Any]:
        worst = max(self.final_outputs, key=severity)
        return finite_only({
            "compiles": self.compiles,
            "nodes_kept_fp32": self.kept,
            "fraction_low_precision": self.fraction_low_precision,
            "fraction_low_precision_before": self.fraction_low_precision_before,
            "fraction_ops_low_precision": self.fraction_ops_low_precision,
            "passed": self.passed,
            "tolerance": self.final_outputs[0]["tolerance"] if self.final_outputs else None,
            "final": worst,
            "attempts": self.attempts,
            "colors_file": FALLBACK_FILE,
            "search": self.search.as_json(),
            "held_out": self.held_out.as_json(),
            "target_margin": self.target_margin,
            "target_margin_met": (within_margin(self.search.outputs, self.target_margin)
                                  and within_margin(self.held_out.outputs, self.target_margin)),
            "pareto_steps": len(self.pareto["steps"]) if self.pareto else None,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
        })


def auto_fallback(config: FallbackConfig, on_stage: Callable[[str], None] | None = None) -> FallbackResult:
    """Search for the nodes to keep float32; returns the final build and the colour list."""
    notify = on_stage or (lambda _name: None)
    start = time.perf_counter()
    base = rewrite_model(config.convert, on_stage=notify)
    dtype = config.convert.dtype
    declared = {s.name: s.dtype for s in graph_inputs(base.loaded.model)}
    pinned = [TensorSpec(s.name, declared.get(s.name, s.dtype), s.shape) for s in base.inputs]
    output_names = [o.name for o in base.prepared.graph.output]
    config.tolerance.check_names(output_names)
    notify("reference")
    model = Model(pinned, base.loaded.model, base.prepared, base.fixed_inputs)
    sets = input_sets(model, config.search_seeds, config.convert.calibration, "--calibration")
    held_out_sets = input_sets(model, config.held_out_seeds, config.validation, "--validation")
    search = _Search(config, base, sets, output_names, notify)

    current = search.measure(())
    before = stats.compute_fraction(current.rewritten.passes.mod, current.rewritten.passes.report.decisions, dtype)
    best = current if current.passed else None
    kept: tuple[str, ...] = ()
    step = 1
    while best is None and search.compiles < config.max_compiles - 1:
        ranked = rank_nodes(current, base.prepared, dtype, exclude=set(kept))
        if not ranked:
            break
        last_chance = search.compiles == config.max_compiles - 2
        batch = ranked if last_chance else ranked[:step]
        trial = search.measure(kept + tuple(batch))
        if trial.passed:
            best = trial
            # Bisect the batch: the shortest prefix that still passes, while compiles remain.
            low, high = 0, len(batch)
            # No ranking follows, so these builds need no probes, and a passing one is exported.
            while high - low > 1 and search.compiles < config.max_compiles - (1 if best.build else 0):
                mid = (low + high) // 2
                probe = search.measure(kept + tuple(batch[:mid]), probes=False)
                if probe.passed:
                    best, high = probe, mid
                else:
                    low = mid
            break
        kept, current, step = trial.kept, trial, step * 2
    chosen = best or current
    build = chosen.build
    if build is None:
        notify("compile")
        build = compile_rewritten(config.convert, chosen.rewritten)
        search.compiles += 1
    compiled = build.compiled()
    searched = judge(compiled.run, sets, output_names, config.tolerance, dtype)
    timings = {"search": time.perf_counter() - start}
    notify(f"auto-fallback: held-out check ({len(held_out_sets)} input set(s))")
    held_out = judge(compiled.run, held_out_sets, output_names, config.tolerance, dtype)
    timings["held_out"] = time.perf_counter() - start - timings["search"]
    pareto = None
    if config.pareto:
        pareto = _pareto(config, search, chosen, build, held_out_sets, output_names, notify)
        timings["pareto"] = time.perf_counter() - start - timings["search"] - timings["held_out"]
    mod, decisions = chosen.rewritten.passes.mod, chosen.rewritten.passes.report.decisions
    return FallbackResult(
        build=build,
        kept=list(chosen.kept),
        passed=searched.passed and held_out.passed,
        compiles=search.compiles,
        fraction_low_precision=stats.compute_fraction(mod, decisions, dtype),
        fraction_low_precision_before=before,
        fraction_ops_low_precision=stats.fraction_ops(decisions, dtype),
        final_outputs=list(searched.outputs),
        attempts=[m.summary() for m in search.history],
        yaml_text=fallback_yaml(config, list(chosen.kept), searched, held_out),
        search=searched,
        held_out=held_out,
        timings_s=timings,
        target_margin=config.target_margin,
        pareto=pareto,
    )


def within_margin(outputs: Sequence[dict[str, Any]], margin: float | None) -> bool:
    """Every output's tolerance ratio at most ``margin`` (exactly compared outputs have none)."""
    if margin is None:
        return True
    return all(o.get("tolerance_ratio") is None or o["tolerance_ratio"] <= margin for o in outputs)


def _pareto(config: FallbackConfig, search: _Search, chosen: Measurement, final: BuildResult,
            held_out: Sequence[InputSet], output_names: Sequence[str],
            notify: Callable[[str], None]) -> dict[str, Any]:
    """Every colouring the search measured, in order (the final build for the chosen one)."""
    from amptool.app.pareto import Rung, pareto_report  # noqa: PLC0415 - imports bench's worker machinery

    rungs: dict[tuple[str, ...], Rung] = {}
    for measurement in search.history:
        build = final if measurement.kept == chosen.kept else measurement.build
        rungs.setdefault(measurement.kept, Rung(f"{len(measurement.kept)} kept", measurement.kept,
                                                measurement.rewritten, build))
    return pareto_report(config.convert, list(rungs.values()), chosen.kept, held_out, output_names,
                         config.tolerance, notify)


class _Search:
    """Measurements share one import and the search's input sets with their onnxruntime references."""

    def __init__(self, config: FallbackConfig, base: Rewritten, sets: Sequence[InputSet],
                 output_names: Sequence[str], notify: Callable[[str], None]) -> None:
        self.config, self.base, self.sets = config, base, list(sets)
        self.output_names, self.notify = list(output_names), notify
        self.compiles = 0
        self.history: list[Measurement] = []
        self.target_spec, self.device = _target(config.convert)
        # The probe builds differ by a few nodes' colours: each compiles only the kernels that changed.
        from amptool.compiler.kernel_cache import KernelCache  # noqa: PLC0415 - imports TVM

        self.kernels = KernelCache()

    def measure(self, kept: tuple[str, ...], probes: bool = True) -> Measurement:
        start = time.perf_counter()
        convert = self.config.convert
        self.notify(f"auto-fallback: build {self.compiles + 1} ({len(kept)} node(s) kept float32)")
        rewritten = self.base if not kept else rewrite_with_policy(
            self.base, convert, with_fp32_nodes(self.base.policy, kept))
        if not probes:
            build = compile_rewritten(convert, rewritten)
            self.compiles += 1
            compiled = build.compiled()
            results = worst_case([self._check(compiled.run(s.feeds), s.reference) for s in self.sets])
            plain = Measurement(kept, rewritten, results, None, time.perf_counter() - start, build,
                                self.config.target_margin)
            self.history.append(plain)
            return plain
        passes = rewritten.passes
        probed = compile_probed(passes.mod, passes.report.decisions, rewritten.prepared,
                                rewritten.imported.provenance if rewritten.imported else {},
                                rewritten.inputs, self.output_names, convert.dtype, self.target_spec, self.device,
                                beside=True, kernels=self.kernels)
        self.compiles += 1
        # Outputs from main on every set; the probed function only on the set ranked on — the one whose
        # worst output is worst, where error must come down (it is run once, not once per set).
        assert probed.plain is not None
        per_set = [self._check(probed.outputs(probed.plain.run(s.feeds)), s.reference) for s in self.sets]
        results = worst_case(per_set)
        worst = self.sets[max(range(len(per_set)), key=lambda i: severity(max(per_set[i], key=severity)))]
        reference = worst.reference
        _, converted = probed.run(worst.feeds, with_outputs=False)
        layers = compare_layers(rewritten.prepared, probed.probes, reference, converted, convert.dtype,
                                self.config.tolerance.resolve(convert.dtype), probed.skipped)
        measurement = Measurement(kept, rewritten, results, layers, time.perf_counter() - start,
                                  margin=self.config.target_margin)
        self.history.append(measurement)
        return measurement

    def _check(self, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        return check_outputs(outputs, reference, self.output_names, self.config.tolerance, self.config.convert.dtype)


def _target(config: ConvertConfig) -> tuple[dict[str, Any], str]:
    """The spec and device ``config`` builds for (with --cuda-arch / --target-options)."""
    from amptool.app.convert import resolve  # noqa: PLC0415

    target = resolve(config)
    return target.spec, target.device


# --------------------------------------------------------------------------- ranking


def rank_nodes(measurement: Measurement, model: onnx.ModelProto, dtype: str,
               exclude: set[str] | None = None) -> list[str]:
    """Low-precision nodes by the error they add (largest first); all of them, so the list
    ends with those that add none."""
    assert measurement.layers is not None, "ranking needs a probed measurement"
    decisions = measurement.rewritten.passes.report.decisions
    candidates = {d.node for d in decisions if d.node and d.dtype == dtype} - (exclude or set())
    producer = {t: node.name for node in model.graph.node for t in node.output if t}
    nodes = {node.name: node for node in model.graph.node}
    order = {node.name: i for i, node in enumerate(model.graph.node)}
    probed = {layer["output"] for layer in measurement.layers.layers}
    score: dict[str, float] = dict.fromkeys(candidates, 0.0)

    def blame(start: str) -> set[str]:
        """Candidates answerable for error seen at ``start``'s output: itself if it is one, plus
        unprobed candidates upstream; a float32 node passes it on to the nodes feeding it,
        probed or not (it did not round, so its inputs brought the error)."""
        found: set[str] = set()
        seen: set[str] = set()
        stack = [(start, True)]
        while stack:
            name, through = stack.pop()
            if name in seen or name not in nodes:
                continue
            seen.add(name)
            if name in candidates:
                found.add(name)
                through = False
            for tensor in nodes[name].input:
                parent = producer.get(tensor)
                if parent is not None and (through or tensor not in probed):
                    stack.append((parent, through))
        return found

    for layer in measurement.layers.layers:
        if layer["jump_reason"] == "nonfinite":
            value = math.inf
        elif layer["new_nonfinite"]:
            value = 0.0  # downstream of a NaN/Inf: its finite part says nothing
        else:
            value = layer["rms_growth"] or 0.0
        for name in blame(layer["node"]):
            score[name] = max(score[name], value)
    return sorted(candidates, key=lambda n: (-score[n], order.get(n, 0)))


def with_fp32_nodes(policy: ColorPolicy, nodes: Sequence[str]) -> ColorPolicy:
    """``policy`` with a NEVER rule per node, ahead of its own rules."""
    rules = tuple(NodeRule(literal_pattern(n), Color.NEVER) for n in nodes)
    return dataclasses.replace(policy, node_rules=rules + policy.node_rules)


# --------------------------------------------------------------------------- the colour list


def fallback_yaml(config: FallbackConfig, kept: Sequence[str], search: Verdict, held_out: Verdict) -> str:
    """The colour list to pass back with ``--colors``: the user's colours plus one NEVER rule per
    kept node. A user file is copied (``extends`` only takes built-in presets). Its header says
    whether the colours passed the search and the held-out sets: one that did not generalise
    is still written, and says so."""
    colors = config.convert.colors
    rules = [{"match": literal_pattern(n), "color": Color.NEVER.value} for n in kept]
    if colors and not colors.startswith(BUILTIN_PREFIX):
        with open(colors, encoding="utf-8") as handle:
            data = dict(yaml.safe_load(handle) or {})
        data["nodes"] = rules + list(data.get("nodes") or [])
    else:
        data = {"version": 1, "extends": colors or f"{BUILTIN_PREFIX}default", "nodes": rules}
    flags = [f"--dtype {config.convert.dtype}"]
    flags += [f"--input-shape {f'{n}:' if n else ''}{shape_text(d)}" for n, d in config.convert.input_shapes.items()]
    flags += [f"--fixed-input {n}={value_text(v)}" for n, v in config.convert.fixed_inputs.items()]
    if not config.convert.range_guards:
        flags.append("--no-range-guards")
    elif not config.convert.cancellation_guard:
        flags.append("--no-cancellation-guard")
    if not config.convert.prepare:
        flags.append("--no-prepare")
    if not config.convert.concretize:
        flags.append("--no-concretize")
    if config.convert.low_precision_io:
        flags.append("--low-precision-io")
    header = [
        f"# amptool convert --auto-fallback: {len(kept)} ONNX node(s) kept float32.",
        f"# Search ({search.source}): {search.sentence(fails='still FAILS')}.",
        f"# Held-out ({held_out.source}): {held_out.sentence()}"
        + ("." if held_out.passed or not search.passed else
           " -- these colours did not generalise beyond the search's inputs."),
        f"# Reproduce: amptool convert MODEL {' '.join(flags)} --colors {FALLBACK_FILE} -o OUTDIR",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)
