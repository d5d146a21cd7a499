"""Per-layer times of amptool beside onnxruntime's or OpenVINO's own profiles: which layers a runtime wins.

    .venv/bin/python benchmarks/layer_compare.py model.onnx --dtype float32 --against onnxruntime
    .venv/bin/python benchmarks/layer_compare.py model.onnx --dtype bfloat16 --against openvino --threads 2

Each side runs in a worker process of its own (no other thread pool around), on the same seeded
inputs: amptool's kernels through the VM's instrument hook (``kernel_times.py``), onnxruntime's nodes
through its profiler (``enable_profiling``), OpenVINO's through its performance counters
(``PERF_COUNT``; ``INFERENCE_PRECISION_HINT`` bf16 for a bfloat16 comparison, as ``amptool bench``).
Every call keeps its minimum over the rounds. The table lists both in execution order, side by
side — not matched: runtimes fuse and order layers differently (onnxruntime runs a ResNet's
shortcut conv at another point), so read it by the layer shapes — with each side's sum of minima.
The sums are the figure to compare; a whole run's latency is ``amptool bench``'s.

Where it helped: ResNet-50 float32 against onnxruntime put the gap in the weight-heavy convs at 28²
to 7²; MobileNetV2 bfloat16 against OpenVINO in the stem and a 32 → 16 1×1 conv (benchmarks/README.md,
twenty-sixth session).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _feeds(model_path: str) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input (floats a standard normal, integers ones, as kernel_times)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        if "float" in spec.type:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feeds[spec.name] = np.ones(shape, dtype=np.int64 if "int64" in spec.type else np.int32)
    return feeds


def _onnxruntime_layers(model_path: str, threads: int, rounds: int) -> list[tuple[str, float]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "profile")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feeds = _feeds(model_path)
    for _ in range(rounds + 2):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[float]] = collections.defaultdict(list)
    labels: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"][: -len("_kernel_time")]
            shape = event["args"].get("output_type_shape") or [{}]
            labels.setdefault(name, f"{event['args'].get('op_name')} {next(iter(shape[0].values()), '')}")
            times[name].append(event["dur"] / 1e3)
    return [(labels[name], min(values[2:] or values)) for name, values in times.items()]


def _openvino_layers(model_path: str, threads: int, rounds: int, dtype: str) -> list[tuple[str, float]]:
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERF_COUNT": True,
              "INFERENCE_PRECISION_HINT": "bf16" if dtype == "bfloat16" else "f32"}
    compiled = ov.Core().compile_model(model_path, "CPU", config)
    request = compiled.create_infer_request()
    feeds = _feeds(model_path)
    best: dict[str, float] = {}
    labels: dict[str, str] = {}
    for round_ in range(rounds + 2):
        request.infer(feeds)
        for info in request.profiling_info:
            if info.status.name != "EXECUTED":
                continue
            labels.setdefault(info.node_name, f"{info.node_type} {info.exec_type}")
            if round_ >= 2:
                best[info.node_name] = min(best.get(info.node_name, 1e9), info.real_time.total_seconds() * 1e3)
    return [(labels[name], best[name]) for name in labels if name in best]


def _amptool_layers(build: str, threads: int, rounds: int) -> list[tuple[str, float]]:
    from kernel_times import KernelClock, _minima, prepared

    from amptool import _tvm

    _tvm.set_num_threads(threads)
    model, call = prepared(build)
    clock = KernelClock()
    model.vm.set_instrument(clock)
    runs = []
    for round_ in range(rounds + 2):
        clock.calls = []
        call()
        if round_ >= 2:
            runs.append(clock.calls)
    return [(name, seconds * 1e3) for name, seconds in _minima(runs)]


def _worker(args: argparse.Namespace) -> None:
    if args.worker == "amptool":
        layers = _amptool_layers(args.build, args.threads, args.rounds)
    elif args.worker == "onnxruntime":
        layers = _onnxruntime_layers(args.model, args.threads, args.rounds)
    else:
        layers = _openvino_layers(args.model, args.threads, args.rounds, args.dtype)
    print(json.dumps(layers))


def _run_worker(kind: str, args: argparse.Namespace, build: str = "") -> list[tuple[str, float]]:
    command = [sys.executable, __file__, args.model, "--worker", kind, "--build", build, "--dtype", args.dtype,
               "--threads", str(args.threads), "--rounds", str(args.rounds)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{kind} worker failed: {done.stderr.strip().splitlines()[-1:]}")
    return [tuple(row) for row in json.loads(done.stdout.strip().splitlines()[-1])]  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an .onnx model with static input shapes")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--against", default="onnxruntime", choices=["onnxruntime", "openvino"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--build", default="", help="an amptool convert output to time instead of converting")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    build = args.build
    if not build:
        build = str(Path(tempfile.mkdtemp()) / "build")
        subprocess.run([sys.executable, "-m", "amptool", "convert", args.model, "--dtype", args.dtype, "-o", build],
                       check=True, capture_output=True)
    ours = _run_worker("amptool", args, build)
    theirs = _run_worker(args.against, args)
    print(f"| # | {args.against} layer | ms | amptool kernel | ms |")
    print("|---:|---|---:|---|---:|")
    for i in range(max(len(ours), len(theirs))):
        left = theirs[i] if i < len(theirs) else ("", None)
        right = ours[i] if i < len(ours) else ("", None)
        cells = [f"{name[:48]} | {ms:.3f}" if ms is not None else " | " for name, ms in (left, right)]
        print(f"| {i} | {cells[0]} | {cells[1]} |")
    mine, other = sum(ms for _, ms in ours), sum(ms for _, ms in theirs)
    print(f"\nsums of per-call minima ({args.dtype}, {args.threads} threads): {args.against} {other:.2f} ms, "
          f"amptool {mine:.2f} ms; amptool / {args.against} {mine / other:.3f}x")


if __name__ == "__main__":
    main()
