"""Whole-run latency of two amptool builds, paired call by call, in both load orders.

    .venv/bin/python benchmarks/paired_runs.py BUILD_A BUILD_B [--seconds 60] [--threads 2]

kernel_times.py compares per-kernel minima; a change that moves how threads share the work (or
how much a slow vCPU costs) shows in the medians instead, and on a shared VM a median moves 10–25%
within minutes. Here A and B run alternately, call after call (which goes first flips every
round), so both see the same minute; the figure is the median of the per-pair ratios B/A. The
build loaded first into a process was sometimes faster by up to ~5% (kernel sums of identical
code moved that much with the order), so the pairing runs twice, each order in a process of its
own, and prints both and their geometric mean.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _pairs(first: str, second: str, seconds: float, threads: int) -> dict[str, list[float]]:
    """Per-call seconds of both builds (keyed by directory), loaded in this order, alternated for ``seconds``."""
    import kernel_times

    from amptool import _tvm

    _tvm.set_num_threads(threads)
    calls = [kernel_times.prepared(directory)[1] for directory in (first, second)]
    for call in calls * 3:  # warm: pools, caches, lazily loaded code
        call()
    times: list[list[float]] = [[], []]
    end, round_ = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for i in (0, 1) if round_ % 2 == 0 else (1, 0):
            start = time.perf_counter()
            calls[i]()
            times[i].append(time.perf_counter() - start)
        round_ += 1
    return {first: times[0], second: times[1]}


def _order(a: str, b: str, first: str, second: str, seconds: float, threads: int) -> float:
    """The median paired ratio B/A with ``first`` loaded first, run in a process of its own."""
    out = subprocess.run([sys.executable, __file__, "--worker", first, second, "--seconds", str(seconds),
                          "--threads", str(threads)], capture_output=True, text=True, check=True).stdout
    times = {key: np.array(value) * 1e3 for key, value in json.loads(out.strip().splitlines()[-1]).items()}
    ratios = times[b] / times[a]
    print(f"loaded {Path(first).name} first: {len(ratios)} pairs; {Path(a).name} median {np.median(times[a]):.2f} "
          f"min {times[a].min():.2f} ms, {Path(b).name} median {np.median(times[b]):.2f} min {times[b].min():.2f} ms; "
          f"B/A per pair: median {np.median(ratios):.3f} (p10 {np.percentile(ratios, 10):.3f}, "
          f"p90 {np.percentile(ratios, 90):.3f})")
    return float(np.median(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs=2, help="two amptool output directories, A and B")
    parser.add_argument("--seconds", type=float, default=60.0, help="pairing time per load order")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    a, b = args.builds
    if args.worker:
        print(json.dumps(_pairs(a, b, args.seconds, args.threads)))
        return
    forward = _order(a, b, a, b, args.seconds, args.threads)
    backward = _order(a, b, b, a, args.seconds, args.threads)
    print(f"B/A paired median, geometric mean of both load orders: {np.sqrt(forward * backward):.3f}")


if __name__ == "__main__":
    main()
