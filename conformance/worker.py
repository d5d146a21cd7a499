"""One worker process: runs cases sent as JSON lines on stdin, one JSON result line per case.

The harness (run.py) keeps a few of these alive so TVM is imported once per worker, not once
per case, and restarts one that dies or hangs — the case it was on is then a crash or a
timeout, and the run goes on. Results go to a private copy of the original stdout; fd 1 itself
is pointed at stderr, so whatever TVM or onnxruntime print cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
import warnings
from typing import Any

import numpy as np

RTOL, ATOL = 1e-3, 1e-4  # the verdict of onnx's backend test runner
#: Low-dtype runs: amptool's default tolerance for each (amptool/compare/tolerance.py), element-wise
LOW_TOLERANCE = {"float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}
F16_RTOL, F16_ATOL = LOW_TOLERANCE["float16"]


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def _arrays(value: Any) -> Any:
    """A case's stored value as arrays: Cast's cases keep float8/int4/bfloat16 data as TensorProtos,
    which onnxruntime cannot take (and which the wheel's ``.pb`` files hold as the same protos)."""
    import onnx  # noqa: PLC0415 - workers only

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, np.generic):  # a 0-d input stored as a numpy scalar: onnxruntime takes arrays only
        return np.asarray(value)
    if isinstance(value, list):
        return [_arrays(v) for v in value]
    return value


def _load(path: str) -> tuple[Any, dict[str, Any], list[Any], list[str]]:
    import onnx  # noqa: PLC0415 - workers only

    model = onnx.load(os.path.join(path, "model.onnx"))
    with open(os.path.join(path, "data.pkl"), "rb") as f:
        data = pickle.load(f)
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    feeds = {n: _arrays(v) for n, v in zip(names, data["inputs"], strict=False)}
    return model, feeds, _arrays(data["outputs"]), [o.name for o in model.graph.output]


def compare(expected: Any, actual: Any, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None when ``actual`` matches ``expected`` (shapes exactly, values isclose); else why not."""
    if isinstance(expected, list):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return "sequence length differs"
        for e, a in zip(expected, actual, strict=True):
            why = compare(e, a, rtol, atol)
            if why:
                return why
        return None
    if expected is None or actual is None:
        return None if expected is None and actual is None else "optional presence differs"
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if e.dtype.kind in "fc" or str(e.dtype) == "bfloat16" or e.dtype.kind == "V":
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            bad = int((~close).sum())
            return f"{bad}/{close.size} values differ (max |d| {np.nanmax(np.abs(a64 - e64)):.3g})"
        return None
    if e.dtype.kind in "OUS":
        return None if np.array_equal(e.astype(str), a.astype(str)) else "strings differ"
    return None if np.array_equal(e, a.astype(e.dtype)) else "integer values differ"


def run_ort(path: str) -> dict[str, Any]:
    import onnxruntime as ort  # noqa: PLC0415 - workers only

    model, feeds, expected, names = _load(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        actual = session.run(names, feeds)
    except Exception as err:  # noqa: BLE001 - onnxruntime refusing a case excludes it; the reason is recorded
        return {"verdict": "fails", "detail": _first_line(f"{type(err).__name__}: {err}")}
    for name, e, a in zip(names, expected, actual, strict=False):
        why = compare(e, a)
        if why:
            return {"verdict": "wrong", "detail": f"{name}: {why}"}
    return {"verdict": "pass", "detail": ""}


def run_amptool(path: str, dtype: str) -> dict[str, Any]:
    import amptool  # noqa: PLC0415 - workers only
    from amptool.frontend.shape_inputs import pins_from_arrays  # noqa: PLC0415 - workers only
    from amptool.frontend.signature import graph_inputs  # noqa: PLC0415 - workers only

    model, feeds, expected, names = _load(path)
    try:
        # As `amptool diff --inputs` does: inputs whose values decide output shapes are fixed to the case's values
        pins = pins_from_arrays(model, graph_inputs(model), feeds)
        fixed = {name: value for name, (value, _use) in pins.items()}
        result = amptool.convert(os.path.join(path, "model.onnx"), dtype=dtype, fixed_inputs=fixed)
        actual = result.run(feeds)
    except amptool.UserError as err:
        return {"verdict": "refused", "detail": _first_line(err.message)}
    except Exception as err:  # noqa: BLE001 - a bug in amptool or TVM is this case's verdict (the CLI's exit 70)
        tail = traceback.format_exc().strip().splitlines()[-1]
        return {"verdict": "crash", "detail": _first_line(f"{type(err).__name__}: {err}") or tail}
    rtol, atol = (RTOL, ATOL) if dtype == "float32" else LOW_TOLERANCE[dtype]
    for name, e in zip(names, expected, strict=False):
        if name not in actual:
            return {"verdict": "wrong", "detail": f"{name}: missing from the outputs"}
        why = compare(e, actual[name], rtol, atol)
        if why:
            return {"verdict": "wrong", "detail": f"{name}: {why}"}
    return {"verdict": "pass", "detail": ""}


def main() -> None:
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    for line in sys.stdin:
        request = json.loads(line)
        if request["kind"] == "ort":
            result = run_ort(request["path"])
        else:
            result = run_amptool(request["path"], request["dtype"])
        results.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
