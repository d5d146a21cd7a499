"""What one iteration of a loop decided at run time costs: amptool's recursive functions against
onnxruntime's Loop, each runtime timed alone in a process of its own.

    .venv/bin/python benchmarks/loop_overhead.py [--trips 10,1010] [--runs 30] [--threads 2]

The model is ``v ← v + 1`` for M iterations, M an input's value (so nothing unrolls): the body is
one tiny kernel, and what is timed is the loop machinery. The cost of an iteration is the slope
between two trip counts (median latencies), which takes out the fixed cost of a call (amptool's
hand-over to its deep-stack thread among it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def counter_model(path: str) -> None:
    f, i64, boolean = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

    def vi(name: str, dtype: int, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [vi("i", i64, []), vi("cond_in", boolean, []), vi("v_in", f, [1, 4])],
        [vi("cond_out", boolean, []), vi("v_out", f, [1, 4])],
        [numpy_helper.from_array(np.ones([1, 4], np.float32), "one")])
    nodes = [helper.make_node("ReduceMax", ["n"], ["m"], keepdims=0),
             helper.make_node("Loop", ["m", "", "x"], ["y"], body=body)]
    graph = helper.make_graph(nodes, "count", [vi("x", f, [1, 4]), vi("n", i64, [1])], [vi("y", f, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _worker(runtime: str, model: str, artifact: str, trips: list[int], runs: int, threads: int) -> None:
    """Median seconds per call for each trip count, as one JSON line."""
    if runtime == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

        def run(feeds: dict[str, np.ndarray]) -> None:
            session.run(None, feeds)
    else:
        from amptool import _tvm
        from amptool.app.artifact import load_artifact

        _tvm.set_num_threads(threads)
        compiled = load_artifact(artifact)[1]

        def run(feeds: dict[str, np.ndarray]) -> None:
            compiled.run(feeds)
    medians = {}
    for n in trips:
        feeds = {"x": np.zeros((1, 4), np.float32), "n": np.array([n], np.int64)}
        run(feeds)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            run(feeds)
            times.append(time.perf_counter() - start)
        medians[n] = float(np.median(times))
    print(json.dumps(medians))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", default="10,1010")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=3, metavar=("RUNTIME", "MODEL", "ARTIFACT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    trips = [int(t) for t in args.trips.split(",")]
    if args.worker:
        _worker(*args.worker, trips, args.runs, args.threads)
        return
    with tempfile.TemporaryDirectory() as work:
        model, artifact = f"{work}/count.onnx", f"{work}/count"
        counter_model(model)
        subprocess.run([sys.executable, "-m", "amptool", "convert", model, "-o", artifact], check=True,
                       capture_output=True)
        slopes = {}
        for runtime in ("onnxruntime", "amptool"):
            out = subprocess.run([sys.executable, __file__, "--worker", runtime, model, artifact, "--trips", args.trips,
                                  "--runs", str(args.runs), "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True).stdout
            medians = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
            low, high = min(trips), max(trips)
            slopes[runtime] = (medians[high] - medians[low]) / (high - low)
            print(f"{runtime:12s} " + "  ".join(f"{n} trips {medians[n] * 1e3:.3f} ms" for n in trips)
                  + f"  → {slopes[runtime] * 1e6:.2f} µs an iteration")
        print(f"amptool / onnxruntime per iteration: {slopes['amptool'] / slopes['onnxruntime']:.1f}×")


if __name__ == "__main__":
    main()
