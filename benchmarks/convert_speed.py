"""How long ``amptool convert`` takes, stage by stage, for ResNet-50, MobileNetV2 and BERT-base.

Issue 18, point 3: converting ResNet-50 should take ≤ 5 s for llvm and ≤ 15 s for CUDA sm_90
on an idle 2-core machine (a CUDA build needs no GPU: ``--target cuda --cuda-arch sm_90``).
Each run is a fresh ``amptool convert`` process (so Python's imports count, as they do for a
user), timed from outside: wall time and the CPU time of the process and its children (the
linker). The per-stage seconds are the manifest's ``timings_s``; "startup + rest" is the wall
time no stage accounts for (interpreter start, imports, the manifest, exit). The table shows the
fastest of ``--repeat`` runs per model (the least disturbed by other processes); on a shared
machine compare CPU seconds rather than wall time.

    .venv/bin/python benchmarks/convert_speed.py                       # all three, float32, 3 runs
    .venv/bin/python benchmarks/convert_speed.py --models resnet50 --dtype float16 --repeat 5
    .venv/bin/python benchmarks/convert_speed.py --models mobilenet_v2 --fallback-atol 0.005
    .venv/bin/python benchmarks/convert_speed.py --models resnet50 --dtype float16 --target cuda --cuda-arch sm_90
    .venv/bin/python benchmarks/convert_speed.py --models lstm_300,loop_300 --repeat 1   # unrolled recurrences

``--model-file NAME=PATH`` adds an exported model (a transformers export, say: its mask and
embedding subgraphs take paths the built-in models do not). ``--against TREE`` times another amptool
source tree too (a ``git worktree add --detach /tmp/base <rev>`` of an earlier revision, run by this
interpreter with the tree first on its path), alternating the two run by run, and prints each
model's fastest wall and CPU seconds side by side with their ratios.

    .venv/bin/python benchmarks/convert_speed.py --models bert_base --model-file bert_hf=/tmp/bert.onnx \
        --dtype float16 --against /tmp/base

With ``--fallback-atol A`` (issue 18: each auto-fallback step ≤ 1.5× a plain convert) each model
is also converted to ``--dtype`` (float16 when float32 is asked) with ``--auto-fallback --atol A
--rtol 0``, after its plain converts, and every search step's seconds (the manifest's
``auto_fallback.attempts``) are printed beside the fastest plain convert of that dtype, as ratios.
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
from typing import Any

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models

BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": models.resnet50,
    "mobilenet_v2": models.mobilenet_v2,
    "bert_base": models.bert_base,
    "lstm_300": models.lstm_long,  # not in the default set: convert time of unrolled recurrences
    "loop_300": models.loop_long,
}
DEFAULT_MODELS = ("resnet50", "mobilenet_v2", "bert_base")
STAGES = ("load", "prepare", "import", "calibrate", "concretize", "prefold", "mixed_precision", "fold", "compile",
          "export")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def convert_once(model: str, dtype: str, out: str, *flags: str, verdict: bool = False,
                 tree: str | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """One ``amptool convert`` process: wall and CPU seconds with the manifest's stage times, and
    the manifest. ``verdict``: exit 1 (an auto-fallback search that did not reach its tolerance,
    artifact and manifest written) is a result too. ``tree``: run the amptool of that source tree
    (``python -m amptool`` from it, so it comes first on the path) instead of the installed one."""
    installed = os.path.join(os.path.dirname(sys.executable), "amptool")
    command = [sys.executable, "-m", "amptool"] if tree else [installed]
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run([*command, "convert", model, "--dtype", dtype, "-o", out, *flags], cwd=tree,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if done.returncode not in ((0, 1) if verdict else (0,)):
        raise subprocess.CalledProcessError(done.returncode, done.args)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as handle:
        manifest: dict[str, Any] = json.load(handle)
    timings: dict[str, float] = manifest["timings_s"]
    return {**timings, "startup + rest": wall - sum(timings.values()), "wall": wall, "cpu": cpu}, manifest


def fallback_steps(model: str, name: str, dtype: str, atol: float, plain_wall: float, out: str,
                   target_flags: list[str]) -> None:
    """One ``convert --auto-fallback`` process; each search step's seconds against ``plain_wall``."""
    timings, manifest = convert_once(model, dtype, out, *target_flags, "--auto-fallback", "--atol", str(atol),
                                     "--rtol", "0", verdict=True)
    found = manifest["auto_fallback"]
    print(f"\n{name} --dtype {dtype} --auto-fallback --atol {atol} --rtol 0: {timings['wall']:.1f} s in all, "
          f"{found['compiles']} compiles, {len(found['nodes_kept_fp32'])} node(s) kept float32, "
          f"passed {found['passed']}; plain convert {plain_wall:.2f} s\n")
    print("| step | nodes kept | probed | passed | seconds | × plain convert |")
    print("|---:|---:|---|---|---:|---:|")
    for i, step in enumerate(found["attempts"], 1):
        probed = "yes" if step.get("probed") else "–"
        print(f"| {i} | {step['kept']} | {probed} | {step['passed']} | {step['seconds']:.2f} | "
              f"{step['seconds'] / plain_wall:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, of {', '.join(BUILDERS)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", default="llvm", help="llvm or cuda (builds without a GPU)")
    parser.add_argument("--cuda-arch", default=None, metavar="sm_XX")
    parser.add_argument("--fallback-atol", type=float, default=None, metavar="A",
                        help="also time each step of --auto-fallback --atol A --rtol 0 (see above)")
    parser.add_argument("--model-file", action="append", default=[], metavar="NAME=PATH",
                        help="also time this ONNX file (repeatable)")
    parser.add_argument("--against", default=None, metavar="TREE",
                        help="another amptool source tree to time alternately with this one (see above)")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILDERS)}")
    files = dict(item.split("=", 1) for item in args.model_file if "=" in item)
    if len(files) != len(args.model_file) or not all(os.path.isfile(p) for p in files.values()):
        parser.error("--model-file takes NAME=PATH of an existing file")
    if args.against is not None and not os.path.isdir(os.path.join(args.against, "amptool")):
        parser.error(f"--against {args.against}: not an amptool source tree (no amptool/ in it)")
    if args.against is not None:
        compare_trees(names, files, args)
        return
    names += list(files)
    best: dict[str, dict[str, float]] = {}
    target_flags = ["--target", args.target] + (["--cuda-arch", args.cuda_arch] if args.cuda_arch else [])
    fallback_dtype = "float16" if args.dtype == "float32" else args.dtype
    with tempfile.TemporaryDirectory(prefix="amptool-convert-speed-") as tmp:
        for name in names:
            path = files.get(name) or os.path.join(tmp, f"{name}.onnx")
            if name not in files:
                onnx.save(BUILDERS[name](), path)
            runs = [convert_once(path, args.dtype, os.path.join(tmp, f"{name}-{i}"), *target_flags)[0]
                    for i in range(args.repeat)]
            best[name] = min(runs, key=lambda r: r["wall"])
            walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
            print(f"{name}: wall {walls} s", file=sys.stderr, flush=True)
            if args.fallback_atol is not None:
                plain = best[name]["wall"] if fallback_dtype == args.dtype else min(
                    convert_once(path, fallback_dtype, os.path.join(tmp, f"{name}-plain-{i}"), *target_flags)[0]["wall"]
                    for i in range(args.repeat))
                fallback_steps(path, name, fallback_dtype, args.fallback_atol, plain, os.path.join(tmp, f"{name}-fb"),
                               target_flags)
    rows = [s for s in STAGES if any(s in r for r in best.values())] + ["startup + rest", "wall", "cpu"]
    load = os.getloadavg()[0]
    print(f"amptool convert --dtype {args.dtype} {' '.join(target_flags)}, fastest of {args.repeat} run(s); "
          f"{os.cpu_count()} CPUs, load average {load:.2f} at the end\n")
    print("| stage (s) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        cells = [f"{best[n][row]:.2f}" if row in best[n] else "–" for n in names]
        label = f"**{row}**" if row in ("wall", "cpu") else row
        print(f"| {label} | " + " | ".join(cells) + " |")


def compare_trees(names: list[str], files: dict[str, str], args: argparse.Namespace) -> None:
    """Each model converted by this tree and by ``args.against``, alternately, ``args.repeat`` times
    each; the fastest of each side, and the ratios this / other."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target_flags = ["--target", args.target] + (["--cuda-arch", args.cuda_arch] if args.cuda_arch else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="amptool-convert-speed-") as tmp:
        for name in [*names, *files]:
            path = files.get(name) or os.path.join(tmp, f"{name}.onnx")
            if name not in files:
                onnx.save(BUILDERS[name](), path)
            runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
            for i in range(args.repeat):
                for side, tree in (("this", here), ("other", args.against)) if i % 2 == 0 else (
                        ("other", args.against), ("this", here)):
                    out = os.path.join(tmp, f"{name}-{side}-{i}")
                    runs[side].append(convert_once(path, args.dtype, out, *target_flags, tree=tree)[0])
            best = {side: min(r, key=lambda t: t["wall"]) for side, r in runs.items()}
            print(f"{name}: this {[round(r['wall'], 2) for r in runs['this']]}, "
                  f"other {[round(r['wall'], 2) for r in runs['other']]} s", file=sys.stderr, flush=True)
            rows.append((name, best))
    print(f"amptool convert --dtype {args.dtype} {' '.join(target_flags)}: this tree against {args.against}, "
          f"alternated, fastest of {args.repeat} each; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print("| model | wall s (this / other) | × | CPU s (this / other) | × | slowest stage of the other: this / other |")
    print("|---|---:|---:|---:|---:|---|")
    for name, best in rows:
        this, other = best["this"], best["other"]
        stage = max((s for s in STAGES if s in other), key=lambda s: other[s])
        print(f"| {name} | {this['wall']:.2f} / {other['wall']:.2f} | {this['wall'] / other['wall']:.2f}× | "
              f"{this['cpu']:.2f} / {other['cpu']:.2f} | {this['cpu'] / other['cpu']:.2f}× | "
              f"{stage} {this.get(stage, 0.0):.2f} / {other[stage]:.2f} |")


if __name__ == "__main__":
    main()
