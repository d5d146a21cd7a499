"""Input sets for ``convert --auto-fallback``, and the verdicts of the colours it found on them.

A search judged on one input set overfits: on a GoogLeNet export the colours found on seed 0
passed there (0.975× tolerance, 11 nodes kept float32) and failed on unseen seeds at
1.24–1.46×. So ``amptool.app.fallback`` judges every candidate on several sets — the
``--calibration`` inputs when given, else seeds ``seed … seed+N-1`` (N = 4 by default), each
compile run once per set — and then checks the final build on sets the search never saw:
``--validation``'s inputs, or the 4 seeds after the search's. Each group gets a ``Verdict``;
the colours pass only if both do.

Seeded sets are made as ``diff --seed S`` makes them (``generate_inputs`` on the model's
declared input dtypes and the pinned shapes); the reference is onnxruntime float32 on the
prepared model, every tensor exposed (``per_layer.reference_tensors``), which the search's
ranking needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from amptool.app.per_layer import reference_tensors
from amptool.compare.aggregate import severity, worst_case
from amptool.compare.stats import compare_output
from amptool.compare.tolerance import TolerancePolicy
from amptool.dtypes import is_ml_dtype
from amptool.frontend.signature import TensorSpec
from amptool.runtime.inputs import check_input_shapes, generate_inputs, load_inputs


@dataclass(frozen=True)
class InputSet:
    """One set of feeds and onnxruntime's tensors for it; ``label`` names it in messages."""

    label: str  # "seed 7" or "--validation v.npz"
    seed: int | None
    path: str | None  # the .npz it came from
    feeds: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Model:
    """What making input sets needs: pinned input specs (declared dtypes), the model
    ``generate_inputs`` reads index ranges from, the prepared model onnxruntime runs, and
    the inputs baked in as constants (which onnxruntime still needs)."""

    specs: Sequence[TensorSpec]
    model: onnx.ModelProto
    prepared: onnx.ModelProto
    fixed: Mapping[str, np.ndarray]


def input_sets(model: Model, seeds: Sequence[int], path: str | None, flag: str) -> list[InputSet]:
    """The arrays of ``path`` (given with ``flag``) as one set, else one set per seed."""
    if path is not None:
        arrays = load_inputs(path, model.specs, flag)
        check_input_shapes(arrays, model.specs, f"{flag} {path}")
        feeds = {**arrays, **model.fixed}
        return [InputSet(f"{flag} {path}", None, path, feeds, reference_tensors(model.prepared, feeds))]
    sets = []
    for seed in seeds:
        feeds = {**generate_inputs(model.specs, model.model, seed=seed), **model.fixed}
        sets.append(InputSet(f"seed {seed}", seed, None, feeds, reference_tensors(model.prepared, feeds)))
    return sets


def describe(sets: Sequence[InputSet]) -> str:
    """``seed 0``, ``seeds 0-3`` (consecutive), ``seeds 1, 5`` or the file's label."""
    seeds = [s.seed for s in sets if s.seed is not None]
    if len(seeds) != len(sets) or not seeds:
        return ", ".join(s.label for s in sets)
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def check_outputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                  names: Sequence[str], tolerance: TolerancePolicy, dtype: str) -> list[dict[str, Any]]:
    """diff's per-output comparison; fp16/bf16 outputs (--low-precision-io) cast up first."""
    converted = {k: np.asarray(v) for k, v in outputs.items()}
    converted = {k: v.astype(np.float32) if is_ml_dtype(v.dtype) or v.dtype == np.float16 else v
                 for k, v in converted.items()}
    return [compare_output(n, reference[n], converted[n], tolerance.resolve(dtype, n)) for n in names]


@dataclass(frozen=True)
class Verdict:
    """The final build on one group of input sets: per output the worst case over them."""

    source: str  # describe(sets)
    seeds: tuple[int, ...]
    path: str | None  # the file a set came from (--calibration / --validation)
    sets: int
    outputs: tuple[dict[str, Any], ...]
    failed_sets: tuple[str, ...]  # labels of the sets on which some output failed
    worst_set: str  # label of the set holding the worst output's worst case

    @property
    def passed(self) -> bool:
        return not self.failed_sets

    @property
    def worst(self) -> dict[str, Any]:
        return max(self.outputs, key=severity)

    def sentence(self, passes: str = "passes", fails: str = "FAILS") -> str:
        """``output 'y' passes (tolerance ratio 0.41)`` / ``output 'y' FAILS on seed 5: why``."""
        worst = self.worst
        if not self.passed:
            return f"output '{worst['name']}' {fails} on {self.worst_set}: {worst['failure']}"
        ratio = worst["tolerance_ratio"]
        return f"output '{worst['name']}' {passes}" + (f" (tolerance ratio {ratio:.3g})" if ratio is not None else "")

    def as_json(self) -> dict[str, Any]:
        worst = self.worst
        return {"passed": self.passed, "source": self.source, "seeds": list(self.seeds), "path": self.path,
                "sets": self.sets, "worst_output": worst["name"],
                "tolerance_ratio": worst["tolerance_ratio"], "failure": worst["failure"],
                "worst_set": self.worst_set, "failed_sets": list(self.failed_sets)}


def judge(run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]], sets: Sequence[InputSet],
          names: Sequence[str], tolerance: TolerancePolicy, dtype: str) -> Verdict:
    """Run a compiled model on every set and compare each with its reference."""
    runs = [check_outputs(run(s.feeds), s.reference, names, tolerance, dtype) for s in sets]
    outputs = worst_case(runs)
    worst = max(outputs, key=severity)
    return Verdict(
        source=describe(sets),
        seeds=tuple(s.seed for s in sets if s.seed is not None),
        path=next((s.path for s in sets if s.path is not None), None),
        sets=len(sets),
        outputs=tuple(outputs),
        failed_sets=tuple(s.label for s, run_ in zip(sets, runs) if not all(o["passed"] for o in run_)),
        worst_set=sets[worst["worst_iteration"]].label,
    )
