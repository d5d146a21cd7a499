"""Run configs/models.yaml's matrix through `amptool diff`; exit 1 if any combination fails.

    .venv/bin/python configs/check_models.py [--matrix configs/models.yaml] [--out out/check-models]

Each combination's JSON report lands in --out; the table at the end names each verdict. Exit 3
from amptool (the target cannot run here) counts as skipped, not failed: CI machines have no GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import onnx
import yaml

ROOT = Path(__file__).resolve().parent.parent
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
VERDICTS = {0: "PASSED", 1: "FAILED", 2: "REFUSED", 3: "SKIPPED", 70: "INTERNAL ERROR"}


def model_path(text: str) -> Path:
    return ONNX_DATA / text[5:] if text.startswith("onnx:") else ROOT / text


def combinations(matrix_path: Path) -> list[tuple[Path, str, str, list[str]]]:
    data = yaml.safe_load(matrix_path.read_text())
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("matrix"), list):
        raise SystemExit(f"{matrix_path}: expected 'version: 1' and a 'matrix' list")
    found = []
    for entry in data["matrix"]:
        for dtype in entry.get("dtypes", ["float16"]):
            for target in entry.get("targets", ["llvm"]):
                found.append((model_path(entry["model"]), dtype, target, [str(f) for f in entry.get("flags", [])]))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", type=Path, default=ROOT / "configs" / "models.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "check-models")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    amptool = [sys.executable, "-m", "amptool"]
    rows = []
    for model, dtype, target, flags in combinations(args.matrix):
        report = args.out / f"{model.stem}-{dtype}-{target}.json"
        start = time.perf_counter()
        done = subprocess.run([*amptool, "-q", "diff", str(model), "--dtype", dtype, "--target", target, *flags,
                               "--json", str(report)], capture_output=True, text=True, cwd=ROOT)
        lines = (done.stdout + done.stderr).strip().splitlines()
        verdict = VERDICTS.get(done.returncode, f"exit {done.returncode}")
        errors = [line for line in lines if line.startswith(("error:", "internal error:"))]
        last = errors[0] if errors else lines[-1] if lines else ""
        rows.append((model.name, dtype, target, verdict, time.perf_counter() - start, last))
        print(f"{verdict:>14}  {model.name} {dtype} {target}  ({rows[-1][4]:.1f} s)", file=sys.stderr, flush=True)
    failed = [r for r in rows if r[3] not in ("PASSED", "SKIPPED")]
    print("\n| model | dtype | target | verdict | s | last line |\n|---|---|---|---|---:|---|")
    for name, dtype, target, verdict, seconds, last in rows:
        print(f"| {name} | {dtype} | {target} | {verdict} | {seconds:.1f} | {last.replace('|', '/')} |")
    print(f"\nCHECK_MODELS | {len(rows) - len(failed)}/{len(rows)} passed or skipped | "
          f"{len(failed)} failed{': ' + ', '.join(f'{r[0]} {r[1]} {r[2]}' for r in failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
