"""Arrays in and out of ``diff``: seeded inputs, and .npz files of inputs and outputs.

Random integers are not valid token ids, and random floats are not masks. So integer
inputs that feed a ``Gather`` (through casts/reshapes) as indices get ``[0, rows)`` of
the gathered table; integer inputs named like masks get ones; other integers ``[0, 10)``;
bool inputs get random booleans; floats a standard normal. ``--val-range NAME:LO,HI``
replaces that for one input — floats uniform in ``[LO, HI)``, integers uniform in
``[LO, HI)`` — and ``--val-range LO,HI`` for every float input (integer inputs keep their
index ranges unless named: a blanket float range would make token ids invalid).

Files are .npz, one array per name. Every file read is checked against the model — missing
or unknown names, dtypes, shapes — and every problem is a one-line UserError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from amptool.dtypes import is_ml_dtype, numeric_kind, numpy_dtype
from amptool.errors import UserError
from amptool.fileio import atomic_write, check_regular_file
from amptool.frontend.signature import TensorSpec

#: Ops an index may pass through on its way to Gather without changing its values.
_TRANSPARENT = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
DEFAULT_INT_HIGH = 10
#: Most seeded input sets one diff or auto-fallback search compares on (each runs both models once):
#: a mistyped 10**20 would otherwise build its seed list until the machine ran out of memory.
MAX_ITERATIONS = 10_000
#: ``--save-outputs`` writes the reference under each output's name and the converted
#: model's output under this prefix; ``--reference-outputs`` ignores keys with the prefix.
CONVERTED_PREFIX = "converted/"
#: Key of ``--val-range`` values that apply to every float input.
ALL_INPUTS = "*"

ValRanges = Mapping[str, tuple[float, float]]


#: Ops whose input 1 indexes their input 0 along ``axis`` (a table, when that is a constant).
TABLE_INDEXING = frozenset({"Gather", "GatherElements", "ScatterElements"})


def index_ranges(model: onnx.ModelProto, ops: frozenset[str] = frozenset({"Gather"})) -> dict[str, int]:
    """Input name → exclusive upper bound for inputs used as indices of ``ops`` over a constant table
    (through casts and reshapes): the smallest table's rows along the indexed axis. Seeded inputs draw
    Gather indices from it; a build keeps it for all of ``TABLE_INDEXING`` (manifest ``index_inputs``),
    and a run refuses values outside ``[-rows, rows)`` (``tvm_runner.check_index_inputs``)."""
    graph = model.graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    bounds: dict[str, int] = {}
    for value in graph.input:
        frontier, seen = [value.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                if node.op_type in _TRANSPARENT:
                    frontier.extend(node.output)
                elif node.op_type in ops and len(node.input) > 1 and node.input[1] == name:
                    table = shapes.get(node.input[0])
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if table:
                        rows = int(table[axis])
                        bounds[value.name] = min(bounds.get(value.name, rows), rows)
    return bounds


def parse_val_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``NAME:LO,HI`` (or ``LO,HI`` for every input; brackets allowed) → {name: (lo, hi)}."""
    ranges: dict[str, tuple[float, float]] = {}
    for raw in values:
        name, sep, text = raw.rpartition(":")
        if not (sep and name):
            name, text = ALL_INPUTS, raw
        parts = text.strip().strip("[]()").split(",")
        try:
            lo, hi = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
        except ValueError:
            lo, hi = math.nan, math.nan
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise UserError(f"--val-range '{raw}': '{text}' is not a range LO,HI with LO ≤ HI",
                            "Write --val-range NAME:LO,HI for one input or --val-range LO,HI for all, e.g. x:0,1.")
        ranges[name] = (lo, hi)
    return ranges


def check_val_ranges(ranges: ValRanges, specs: Sequence[TensorSpec]) -> None:
    """Names must be model inputs; integer inputs need integer bounds their dtype holds; no bools."""
    by_name = {s.name: s for s in specs}
    for name, (lo, hi) in ranges.items():
        if name == ALL_INPUTS:
            targets = [s for s in specs if np.dtype(s.dtype).kind == "f"]
        elif name not in by_name:
            raise UserError(f"--val-range names unknown input '{name}'",
                            f"Model inputs: {', '.join(by_name) or '(none)'}.")
        else:
            targets = [by_name[name]]
        for spec in targets:
            dtype = np.dtype(spec.dtype)
            if dtype.kind == "b":
                raise UserError(f"--val-range: input '{name}' is bool; ranges apply to numeric inputs",
                                "Drop --val-range for it (bool inputs get random booleans).")
            if dtype.kind in "iu":
                info = np.iinfo(dtype)
                if lo != int(lo) or hi != int(hi) or lo >= hi or lo < info.min or hi - 1 > info.max:
                    raise UserError(
                        f"--val-range {lo:g},{hi:g} does not suit {dtype} input '{spec.name}'",
                        f"Integer inputs take whole bounds LO < HI (values in [LO, HI)) within "
                        f"[{info.min}, {int(info.max) + 1}].",
                    )


def generate_inputs(
    specs: Sequence[TensorSpec], model: onnx.ModelProto, seed: int = 0, ranges: ValRanges | None = None
) -> dict[str, np.ndarray]:
    """One array per spec. Each input draws from its own stream of ``seed``, so a range given
    for one input leaves the others' values unchanged."""
    bounds = index_ranges(model)
    ranges = ranges or {}
    arrays: dict[str, np.ndarray] = {}
    streams = np.random.SeedSequence(seed).spawn(len(specs))
    for spec, stream in zip(specs, streams):
        rng = np.random.default_rng(stream)
        shape = tuple(int(d) for d in (spec.shape or ()))
        dtype = numpy_dtype(spec.dtype)  # bfloat16, float8, int4 …: ml_dtypes
        kind = numeric_kind(dtype)
        given = ranges.get(spec.name, ranges.get(ALL_INPUTS) if kind == "f" else None)
        if kind == "f":
            if given is None:
                arrays[spec.name] = rng.standard_normal(shape).astype(dtype)
            else:
                arrays[spec.name] = rng.uniform(given[0], given[1], shape).astype(dtype)
        elif kind == "b":
            # np.asarray: for a 0-d shape the comparison yields a numpy scalar, which
            # onnxruntime rejects as a feed (an If condition is usually such an input).
            arrays[spec.name] = np.asarray(rng.random(shape) < 0.5)
        elif kind in "iu":
            if given is not None:
                arrays[spec.name] = rng.integers(int(given[0]), int(given[1]), shape).astype(dtype)
            elif spec.name in bounds:
                arrays[spec.name] = rng.integers(0, max(bounds[spec.name], 1), shape).astype(dtype)
            elif "mask" in spec.name.lower():
                arrays[spec.name] = np.ones(shape, dtype=dtype)
            else:  # int2's largest value is 1: stay inside the type
                high = min(DEFAULT_INT_HIGH, _largest(dtype) + 1)
                arrays[spec.name] = rng.integers(0, high, shape).astype(dtype)
        else:
            raise UserError(f"Input '{spec.name}' has dtype {spec.dtype}, which amptool cannot generate")
    return arrays


def read_npz(path: str, flag: str) -> dict[str, np.ndarray]:
    """Every array of an .npz file, or a UserError naming the flag and the file."""
    check_regular_file(path, f"{flag}: file", "Pass an .npz written by numpy.savez.")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except Exception as err:
        raise UserError(f"{flag}: {path} is not a readable .npz file ({type(err).__name__})",
                        "Write it with numpy.savez(path, name=array, ...) (no object arrays).") from err


def _check_names(path: str, found: Sequence[str], expected: Sequence[str], what: str, flag: str) -> None:
    missing = [n for n in expected if n not in found]
    extra = [n for n in found if n not in expected]
    if missing or extra:
        problem = "; ".join(
            part for part in (
                f"no array for {what}(s) {', '.join(repr(n) for n in missing)}" if missing else "",
                f"unknown {what}(s) {', '.join(repr(n) for n in extra)}" if extra else "",
            ) if part
        )
        raise UserError(f"{flag} {path}: {problem}",
                        f"The file needs exactly one array per model {what}: {', '.join(expected) or '(none)'}.")


def load_inputs(path: str, specs: Sequence[TensorSpec], flag: str = "--inputs") -> dict[str, np.ndarray]:
    """Arrays from an .npz (given with ``flag``): exactly the model's inputs, each with the model's dtype."""
    return check_input_arrays(read_npz(path, flag), specs, flag, path)


def check_input_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], flag: str,
                       path: str = "") -> dict[str, np.ndarray]:
    """Exactly one array per model input, each with the input's dtype (Python callers pass dicts)."""
    names = [s.name for s in specs]
    _check_names(path or "(arrays)", list(arrays), names, "input", flag)
    for spec in specs:
        want = np.dtype(spec.dtype)
        got = np.asarray(arrays[spec.name]).dtype
        if got != want:
            raise UserError(
                f"{flag} {path + ': ' if path else ''}array '{spec.name}' is {got}, the model expects {want}",
                f"Save it with .astype('{want}').",
            )
    return {n: np.asarray(arrays[n]) for n in names}


def check_input_shapes(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], source: str) -> None:
    """Arrays must have the shapes the compiled model was built for."""
    for spec in specs:
        got = [int(d) for d in np.shape(arrays[spec.name])]
        want = list(spec.shape or [])
        if got != want:
            raise UserError(
                f"{source}: array '{spec.name}' has shape {got}, the compiled model takes {want}",
                "Pass arrays of that shape, or convert again with --input-shape NAME:DIMS.",
            )


def load_reference_outputs(path: str, output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Stored reference outputs: one array per model output (``converted/…`` keys are ignored)."""
    arrays = {k: v for k, v in read_npz(path, "--reference-outputs").items() if not k.startswith(CONVERTED_PREFIX)}
    _check_names(path, list(arrays), list(output_names), "output", "--reference-outputs")
    return {n: arrays[n] for n in output_names}


def save_arrays(path: str, arrays: Mapping[str, np.ndarray], what: str = "") -> None:
    """Write an .npz atomically (temporary file, then rename)."""
    with atomic_write(path, "wb", what) as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]


def save_outputs(path: str, reference: Mapping[str, np.ndarray], converted: Mapping[str, np.ndarray]) -> None:
    """Reference outputs under their names (so the file works as --reference-outputs),
    the converted model's under ``converted/NAME``."""
    save_arrays(path, {**reference, **{f"{CONVERTED_PREFIX}{k}": v for k, v in converted.items()}}, "--save-outputs")


def _largest(dtype: np.dtype) -> int:
    """The largest value of an integer dtype, ml_dtypes' int4/int2 included."""
    import ml_dtypes  # noqa: PLC0415

    return int(ml_dtypes.iinfo(dtype).max) if is_ml_dtype(dtype) else int(np.iinfo(dtype).max)
