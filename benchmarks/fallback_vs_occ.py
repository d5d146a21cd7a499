"""amptool ``convert --auto-fallback`` vs onnxconverter-common's ``auto_convert_mixed_precision``.

Same model, same seeded inputs, same tolerance (diff's float16 default: max_abs ≤ atol +
rtol·max|ref| and cosine ≥ min_cosine, judged by ``amptool.compare.stats``), same question:
which nodes must stay float32? Reported per tool: wall time, attempts (amptool: compiles, the
final build included; onnxconverter-common: validation runs, each a float16 model run in
onnxruntime), the fraction of ONNX nodes left in float16, and the final worst-output error.

    .venv/bin/python benchmarks/fallback_vs_occ.py                      # scale_beyond_fp16
    .venv/bin/python benchmarks/fallback_vs_occ.py --model M.onnx --input-shape x:1x3x48x320

onnxconverter-common is not an amptool dependency (``pip install onnxconverter-common``);
without it the benchmark says so and exits 0. The zoo model runs amptool with
``--no-range-guards`` (with the guard there is nothing to search); onnxconverter-common clamps
the 1e5 constant to 65504 instead, which its search must then undo.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np
import onnx

from amptool.app.convert import ConvertConfig
from amptool.app.fallback import FallbackConfig, auto_fallback
from amptool.compare.stats import compare_output
from amptool.compare.tolerance import default_tolerance
from amptool.frontend.input_values import parse_input_shape, resolve_input_shapes
from amptool.frontend.prepare import reference_model
from amptool.frontend.signature import graph_inputs, pin_input_specs
from amptool.runtime.inputs import generate_inputs
from amptool.runtime.onnxruntime_runner import run_onnxruntime
from amptool.testing import model_zoo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an ONNX model (default: the zoo's scale_beyond_fp16)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224")
    parser.add_argument("--no-range-guards", action="store_true", help="for --model: as convert's flag")
    args = parser.parse_args()
    try:
        from onnxconverter_common import auto_mixed_precision  # noqa: F401
    except ImportError:
        print("skipped: onnxconverter-common is not installed (pip install onnxconverter-common)")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            path, guards = args.model, not args.no_range_guards
        else:
            path, guards = os.path.join(tmp, "scale_beyond_fp16.onnx"), False
            onnx.save(model_zoo.scale_beyond_fp16(), path)
        model = onnx.load(path)
        shapes = dict(parse_input_shape(text) for text in args.input_shape)
        declared = graph_inputs(model)
        specs = pin_input_specs(declared, resolve_input_shapes(shapes, [s.name for s in declared]))
        feeds = generate_inputs(specs, model, seed=0)
        reference = run_onnxruntime(reference_model(model), feeds)
        rows = [_amptool(path, shapes, guards), _occ(model, feeds, reference)]
    _print(os.path.basename(path), rows)
    return 0


def _amptool(path: str, shapes: dict[str, tuple[int, ...]], guards: bool) -> dict[str, Any]:
    start = time.perf_counter()
    result = auto_fallback(FallbackConfig(convert=ConvertConfig(model=path, input_shapes=shapes,
                                                                range_guards=guards)))
    seconds = time.perf_counter() - start
    decisions = result.build.passes.report.decisions
    nodes: dict[str, set[str]] = {}
    for d in decisions:
        if d.node:
            nodes.setdefault(d.node, set()).add(d.dtype)
    low = sum(1 for dtypes in nodes.values() if dtypes == {"float16"})
    worst = max(result.final_outputs, key=lambda o: (not o["passed"], o["tolerance_ratio"] or 0.0))
    return {"tool": "amptool --auto-fallback", "seconds": seconds, "attempts": result.compiles,
            "kept": len(result.kept), "nodes_fp16": low / len(nodes) if nodes else 0.0,
            "compute_fp16": result.fraction_low_precision, "worst": worst}


def _occ(model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, Any]:
    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    names = [o.name for o in model.graph.output]
    tol = default_tolerance("float16")
    calls = {"n": 0}

    def validate(res0: list[np.ndarray], res1: list[np.ndarray]) -> bool:
        calls["n"] += 1
        return all(compare_output(n, r0, r1.astype(np.float32), tol)["passed"] for n, r0, r1 in zip(names, res0, res1))

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every attempt
        try:
            converted = auto_convert_mixed_precision(model, dict(feeds), validate_fn=validate, keep_io_types=True)
        except Exception as err:  # noqa: BLE001 - it raises when even its final model fails
            return {"tool": "onnxconverter-common", "seconds": time.perf_counter() - start,
                    "attempts": calls["n"] - 1, "kept": None, "nodes_fp16": None, "compute_fp16": None,
                    "worst": {"name": "-", "passed": False, "failure": f"raised: {err}".splitlines()[0],
                              "tolerance_ratio": None}}
    seconds = time.perf_counter() - start
    outputs = run_onnxruntime(converted, feeds)
    results = [compare_output(n, reference[n], outputs[n].astype(np.float32), tol) for n in names]
    worst = max(results, key=lambda o: (not o["passed"], o["tolerance_ratio"] or 0.0))
    fp16, total = _occ_fp16_nodes(converted)
    return {"tool": "onnxconverter-common", "seconds": seconds, "attempts": calls["n"] - 1,  # one checks fp32
            "kept": total - fp16, "nodes_fp16": fp16 / total if total else 0.0, "compute_fp16": None,
            "worst": worst}


def _occ_fp16_nodes(model: onnx.ModelProto) -> tuple[int, int]:
    """(nodes computing float16, nodes with a float output), Casts it inserted excluded."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.output]}
    fp16 = total = 0
    for node in model.graph.node:
        if node.op_type == "Cast":
            continue
        kinds = {types.get(o) for o in node.output} & {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
        if kinds:
            total += 1
            fp16 += onnx.TensorProto.FLOAT16 in kinds
    return fp16, total


def _print(model: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fp32 fallback search on {model} (float16, diff's default tolerance)", title_justify="left")
    for column in ("tool", "wall s", "attempts", "nodes kept fp32", "nodes fp16", "compute fp16", "worst output",
                   "of tol", "verdict"):
        table.add_column(column, justify="left" if column in ("tool", "worst output", "verdict") else "right")
    for row in rows:
        worst = row["worst"]
        table.add_row(
            row["tool"], f"{row['seconds']:.1f}", str(row["attempts"]), _text(row["kept"]),
            _pct(row["nodes_fp16"]), _pct(row["compute_fp16"]), worst["name"], _text(worst.get("tolerance_ratio")),
            "pass" if worst["passed"] else "FAIL",
        )
    console = Console(width=140)
    console.print(table)
    for row in rows:
        if not row["worst"]["passed"]:
            console.print(f"{row['tool']}: {row['worst'].get('failure')}", markup=False, soft_wrap=True)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _text(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
