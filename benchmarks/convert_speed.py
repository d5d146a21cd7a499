"""How long ``amptool convert`` takes, stage by stage, for ResNet-50, MobileNetV2 and BERT-base.

Issue 18, point 3: converting ResNet-50 for llvm should take ≤ 5 s on an idle 2-core machine.
Each run is a fresh ``amptool convert`` process (so Python's imports count, as they do for a
user), timed from outside: wall time and the CPU time of the process and its children (the
linker). The per-stage seconds are the manifest's ``timings_s``; "startup + rest" is the wall
time no stage accounts for (interpreter start, imports, the manifest, exit). The table shows the
fastest of ``--repeat`` runs per model (the least disturbed by other processes); on a shared
machine compare CPU seconds rather than wall time.

    .venv/bin/python benchmarks/convert_speed.py                       # all three, float32, 3 runs
    .venv/bin/python benchmarks/convert_speed.py --models resnet50 --dtype float16 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models

BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": models.resnet50,
    "mobilenet_v2": models.mobilenet_v2,
    "bert_base": models.bert_base,
}
STAGES = ("load", "prepare", "import", "calibrate", "concretize", "prefold", "mixed_precision", "fold", "compile",
          "export")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def convert_once(model: str, dtype: str, out: str) -> dict[str, float]:
    """One ``amptool convert`` process: wall and CPU seconds, and the manifest's stage times."""
    exe = os.path.join(os.path.dirname(sys.executable), "amptool")
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([exe, "convert", model, "--dtype", dtype, "-o", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as handle:
        timings: dict[str, float] = json.load(handle)["timings_s"]
    return {**timings, "startup + rest": wall - sum(timings.values()), "wall": wall, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(BUILDERS), help=f"comma-separated, of {', '.join(BUILDERS)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILDERS)}")
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="amptool-convert-speed-") as tmp:
        for name in names:
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(BUILDERS[name](), path)
            runs = [convert_once(path, args.dtype, os.path.join(tmp, f"{name}-{i}")) for i in range(args.repeat)]
            best[name] = min(runs, key=lambda r: r["wall"])
            walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
            print(f"{name}: wall {walls} s", file=sys.stderr, flush=True)
    rows = [s for s in STAGES if any(s in r for r in best.values())] + ["startup + rest", "wall", "cpu"]
    load = os.getloadavg()[0]
    print(f"amptool convert --dtype {args.dtype}, fastest of {args.repeat} run(s); {os.cpu_count()} CPUs, "
          f"load average {load:.2f} at the end\n")
    print("| stage (s) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        cells = [f"{best[n][row]:.2f}" if row in best[n] else "–" for n in names]
        label = f"**{row}**" if row in ("wall", "cpu") else row
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
