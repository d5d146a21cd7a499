"""Run configs/models.yaml's matrix through `amptool diff`; exit 1 if any combination fails.

    .venv/bin/python configs/check_models.py [--matrix configs/models.yaml] [--out out/check-models]

Each combination's JSON report lands in --out; the table at the end names each verdict. Exit 3
from amptool (the target cannot run here) counts as skipped, not failed: CI machines have no GPU.

With ``--rpc HOST:PORT --rpc-key KEY`` (``make check-models-remote RPC=… KEY=…``) every diff runs its
converted model on a device of that TVM RPC tracker: as many diffs at once as the tracker has free
devices under KEY (or ``--jobs``), so the tracker spreads the models over its devices; the table
names the device each ran on. Builds and onnxruntime stay on this machine (docs/remote.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
    parser.add_argument("--rpc", metavar="HOST:PORT", help="run every diff on a device of this TVM RPC tracker")
    parser.add_argument("--rpc-key", metavar="KEY", help="the tracker key of the devices (with --rpc)")
    parser.add_argument("--rpc-timeout", type=float, default=300.0, help="amptool's --rpc-timeout (default 300 s: "
                        "a diff may wait in the tracker's queue while the others run)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="diffs at once (default 1; with --rpc: the tracker's free devices)")
    args = parser.parse_args()
    if bool(args.rpc) != bool(args.rpc_key):
        parser.error("--rpc and --rpc-key go together")
    args.out.mkdir(parents=True, exist_ok=True)
    remote = ["--rpc", args.rpc, "--rpc-key", args.rpc_key, "--rpc-timeout", str(args.rpc_timeout)] if args.rpc else []
    jobs = args.jobs or (_free_devices(args.rpc, args.rpc_key) if args.rpc else 1)
    cases = combinations(args.matrix)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(lambda case: _diff(case, args.out, remote), cases))
    failed = [r for r in rows if r[3] not in ("PASSED", "SKIPPED")]
    print("\n| model | dtype | target | verdict | s | device | last line |\n|---|---|---|---|---:|---|---|")
    for name, dtype, target, verdict, seconds, last, device in rows:
        print(f"| {name} | {dtype} | {target} | {verdict} | {seconds:.1f} | {device} | {last.replace('|', '/')} |")
    print(f"\nCHECK_MODELS | {len(rows) - len(failed)}/{len(rows)} passed or skipped | "
          f"{len(failed)} failed{': ' + ', '.join(f'{r[0]} {r[1]} {r[2]}' for r in failed) if failed else ''}")
    return 1 if failed else 0


def _diff(case: tuple[Path, str, str, list[str]], out: Path, remote: list[str]) -> tuple[str, str, str, str, float,
                                                                                       str, str]:
    """One ``amptool diff``: (model, dtype, target, verdict, seconds, last line, device it ran on)."""
    model, dtype, target, flags = case
    report = out / f"{model.stem}-{dtype}-{target}.json"
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "amptool", "-q", "diff", str(model), "--dtype", dtype, "--target",
                           target, *flags, *remote, "--json", str(report)], capture_output=True, text=True, cwd=ROOT)
    lines = (done.stdout + done.stderr).strip().splitlines()
    verdict = VERDICTS.get(done.returncode, f"exit {done.returncode}")
    errors = [line for line in lines if line.startswith(("error:", "internal error:"))]
    last = errors[0] if errors else lines[-1] if lines else ""
    device = "here"
    if remote and report.is_file():
        where = json.loads(report.read_text()).get("remote") or {}
        device = f"{where.get('device', '?')} at {where.get('server', '?')}"
    seconds = time.perf_counter() - start
    print(f"{verdict:>14}  {model.name} {dtype} {target}  ({seconds:.1f} s, {device})", file=sys.stderr, flush=True)
    return model.name, dtype, target, verdict, seconds, last, device


def _free_devices(address: str, key: str) -> int:
    """How many servers the tracker has free under ``key`` now (at least 1: the rest queue)."""
    from amptool._tvm.rpc import tracker_summary  # noqa: PLC0415 - only with --rpc

    host, _, port = address.rpartition(":")
    try:
        queue = tracker_summary(host, int(port), 10.0)["queue_info"]
    except (OSError, ValueError) as err:
        raise SystemExit(f"--rpc {address}: cannot read the tracker's queue ({err})") from err
    return max(1, int(queue.get(key, {}).get("free", 0)))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
