"""Per-kernel times of amptool builds, alternated in one process: where a change moved the time.

    .venv/bin/python benchmarks/kernel_times.py out/r50-before out/r50-after --rounds 12 --top 25
    .venv/bin/python benchmarks/kernel_times.py out/bert-fp32 out/bert-bf16 --threads 1

Each argument is an artifact directory (``amptool convert -o DIR``) of the same model. The VM's
instrument hook times every kernel call (``vm.builtin.*`` calls are left out); each round runs every
build once, in turn, so load that comes and goes slows them alike, and each call keeps its minimum
over the rounds. A kernel called several times (the same fused conv in several blocks) counts per
call. The table lists the calls that take the most time in the first build, matched by position
when the builds call the same number of kernels (else aligned by the kernels' main op), with each later build's ratio to
the first, and the sums of the minima — the figure to compare, less noisy than whole-run medians.

Inputs: floats a seeded standard normal, integers ones (valid token ids and masks). Not a
substitute for ``cpu_speed.py``: timings of one process, with TVM's pool shared, and the hook's own
cost (about a microsecond a call) included.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amptool import _tvm
from amptool.app.artifact import load_artifact


def _inputs(manifest: dict[str, Any], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in manifest["inputs"]:
        shape = tuple(int(d) for d in spec["shape"])
        dtype = np.dtype("uint16" if spec["dtype"] == "bfloat16" else spec["dtype"])
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(np.ones(shape, dtype=dtype))
    return arrays


class KernelClock:
    """The VM instrument: per call position in one run, (symbol, seconds)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self._started = 0.0

    def __call__(self, func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if symbol.startswith("vm.builtin"):
            return 0
        if before:
            self._started = time.perf_counter()
        else:
            self.calls.append((symbol, time.perf_counter() - self._started))
        return 0


def prepared(directory: str) -> tuple[Any, Any]:
    """(the loaded model, a call of it on its seed-0 inputs) for the build in ``directory``."""
    manifest, model = load_artifact(directory)
    return model, _tvm.prepared_call(model.vm, _inputs(manifest, 0), model.device)


def _minima(runs: list[list[tuple[str, float]]]) -> list[tuple[str, float]]:
    first = runs[0]
    return [(first[i][0], min(run[i][1] for run in runs)) for i in range(len(first))]



#: Fused-name tokens of epilogues and casts, which a bfloat16 build adds or moves between kernels.
_EPILOGUE_TOKENS = {"fused", "add", "relu", "cast", "inplace", "multiply", "subtract", "divide", "clip", "compute"}


def _first_op(symbol: str) -> str:
    """``fused_amp_conv2d_nhwc16_add9_relu7_inplace0`` → ``amp_conv2d_nhwc``: the kernel less its
    numbering and epilogue, to align two builds' calls by."""
    tokens = re.sub(r"(?<=[a-z])\d+(?=_|$)", "", symbol).split("_")
    return "_".join(t for t in tokens if t not in _EPILOGUE_TOKENS)


def _aligned(first: list[tuple[str, float]], other: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """``other``'s calls under the labels of the ``first`` build's calls they align with."""
    matcher = difflib.SequenceMatcher(a=[_first_op(s) for s, _ in first], b=[_first_op(s) for s, _ in other],
                                      autojunk=False)
    rows = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            i = block.a + k
            rows.append((f"{i} {first[i][0][:56]}", other[block.b + k][1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help="artifact directories (amptool convert -o DIR)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--top", type=int, default=20, help="rows of the table (the first build's costliest calls)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="TVM's pool (its own default is half the logical CPUs)")
    args = parser.parse_args()
    _tvm.set_num_threads(args.threads)

    loaded = []
    for directory in args.builds:
        model, call = prepared(directory)
        clock = KernelClock()
        model.vm.set_instrument(clock)
        loaded.append((directory, call, clock))
    runs: list[list[list[tuple[str, float]]]] = [[] for _ in loaded]
    for round_ in range(args.warmup + args.rounds):
        for index, (_, call, clock) in enumerate(loaded):
            clock.calls = []
            call()
            if round_ >= args.warmup:
                runs[index].append(clock.calls)
        print(f"\rround {round_ + 1}/{args.warmup + args.rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    minima = [_minima(r) for r in runs]
    names = [Path(d).name for d, _, _ in loaded]
    if len({len(m) for m in minima}) == 1:
        # Labelled with the first build's names: a float16 build's kernels carry other cast tokens.
        rows = [[(f"{i} {minima[0][i][0][:56]}", m[i][1]) for i in range(len(m))] for m in minima]
        matched = "by call position"
    else:  # the builds fused differently (a bfloat16 build's casts): calls aligned by their first op
        rows = [[(f"{i} {m[i][0][:56]}", m[i][1]) for i in range(len(m))] for m in minima[:1]]
        rows += [_aligned(minima[0], m) for m in minima[1:]]
        matched = "aligned by first op; a later build's kernels without a match left out"
    first = rows[0]
    later = [dict(r) for r in rows[1:]]
    print(f"| kernel ({matched}) | " + " | ".join(f"{n} ms" for n in names)
          + "".join(f" | {n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for label, seconds in sorted(first, key=lambda row: -row[1])[: args.top]:
        times = [seconds] + [other.get(label, float("nan")) for other in later]
        cells = [f"{t * 1e3:.3f}" for t in times] + [f"{t / times[0]:.2f}×" for t in times[1:]]
        print(f"| {label} | " + " | ".join(cells) + " |")
    sums = [sum(s for _, s in m) for m in minima]
    print("\nsum of per-call minima: " + ", ".join(f"{n} {s * 1e3:.2f} ms" for n, s in zip(names, sums))
          + "".join(f"; {n} / {names[0]} {s / sums[0]:.3f}×" for n, s in zip(names[1:], sums[1:]))
          + f"  ({len(minima[0])} calls in the first)")


if __name__ == "__main__":
    main()
