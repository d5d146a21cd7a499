"""``make conformance``: amptool on every ONNX backend node case, a verdict per case, a per-op table.

Per case: onnxruntime first (a case it cannot run leaves the denominator, and amptool float32 is
judged on it apart, against the stored outputs), then amptool float32, then
float16 and bfloat16 when the inputs/outputs are float and float32 passed — each compared with the
case's stored outputs (float32: isclose rtol 1e-3 atol 1e-4, shapes exact, as onnx's backend runner;
the low dtypes at amptool's default tolerance for each).
Verdicts: pass / wrong / refused (a UserError: the CLI's exit 2, its first line kept) / crash
(any other exception, the CLI's exit 70, or the worker killed by a signal) / timeout.
Cases run in long-lived worker processes (conformance/worker.py), one per job; a worker that
dies or hangs is replaced and only its current case is charged. Results go to
out/conformance/results.json; the per-op table to docs/conformance.md (full runs only, unless
--docs names a file).

    python -m conformance.run [--jobs 2] [--ops Add,Conv] [--filter REGEX] [--timeout 180]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.cases import Case, generate
from conformance.report import render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESTART_EVERY = 150  # requests per worker before a fresh one: bounds what TVM accumulates in a process


@dataclass
class Outcome:
    name: str
    op: str
    float_io: bool
    ort: str = ""
    ort_detail: str = ""
    f32: str = ""
    f32_detail: str = ""
    f16: str = ""
    f16_detail: str = ""
    bf16: str = ""
    bf16_detail: str = ""
    seconds: float = 0.0


class Worker:
    """A conformance.worker process with a per-request timeout; restarted after a crash or hang."""

    def __init__(self, slot: int, log_dir: str, timeout: float) -> None:
        self.log = os.path.join(log_dir, f"worker-{slot}.log")
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.served = 0

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, TVM_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "conformance.worker"], cwd=ROOT, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.served = 0
        return self.proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None or self.served >= RESTART_EVERY:
            self.stop()
            self._start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        self.served += 1
        try:
            proc.stdin.write((json.dumps(payload) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        deadline = time.monotonic() + self.timeout
        buffer = b""
        fd = proc.stdout.fileno()
        while not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                return {"verdict": "timeout", "detail": f"no result in {self.timeout:.0f} s"}
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return self._died()
                buffer += chunk
        return dict(json.loads(buffer))

    def _died(self) -> dict[str, Any]:
        assert self.proc is not None
        code = self.proc.wait()
        self.proc = None
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        return {"verdict": "crash", "detail": f"worker died ({why}): {_last_line(self.log)}"}


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


@dataclass
class Progress:
    total: int
    every: int
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.done += 1
            self.counts[f"ort {outcome.ort}"] += 1
            if outcome.f32 and outcome.ort == "pass":  # the headline counts onnxruntime's passes only
                self.counts[f"f32 {outcome.f32}"] += 1
            if self.done % self.every == 0 or self.done == self.total:
                c = self.counts
                elapsed = time.monotonic() - self.started
                print(f"[{self.done:4d}/{self.total}] {elapsed / 60:5.1f} min · ort pass {c['ort pass']} "
                      f"(fails {c['ort fails'] + c['ort wrong']}) · f32 pass "
                      f"{c['f32 pass']} wrong {c['f32 wrong']} refused {c['f32 refused']} crash {c['f32 crash']} "
                      f"timeout {c['f32 timeout']}", flush=True)


def run_case(worker: Worker, case: Case, float16: bool, bfloat16: bool = False) -> Outcome:
    start = time.monotonic()
    out = Outcome(case.name, case.op, case.float_io)
    ort = worker.request({"kind": "ort", "path": case.path})
    out.ort, out.ort_detail = ort["verdict"], ort["detail"]
    if out.ort == "fails":  # onnxruntime cannot run it (sub-byte types, new opsets): the stored outputs still judge
        f32 = worker.request({"kind": "amptool", "path": case.path, "dtype": "float32"})
        out.f32, out.f32_detail = f32["verdict"], f32["detail"]
    elif out.ort == "pass":
        f32 = worker.request({"kind": "amptool", "path": case.path, "dtype": "float32"})
        out.f32, out.f32_detail = f32["verdict"], f32["detail"]
        for wanted, dtype, field_name in ((float16, "float16", "f16"), (bfloat16, "bfloat16", "bf16")):
            if wanted and case.float_io and out.f32 == "pass":
                low = worker.request({"kind": "amptool", "path": case.path, "dtype": dtype})
                setattr(out, field_name, low["verdict"])
                setattr(out, f"{field_name}_detail", low["detail"])
    out.seconds = round(time.monotonic() - start, 2)
    return out


def run_all(cases: list[Case], *, jobs: int, timeout: float, float16: bool, log_dir: str,
            every: int = 50, bfloat16: bool = False) -> list[Outcome]:
    """Every case, ``jobs`` at a time, in the order given; results in that order."""
    os.makedirs(log_dir, exist_ok=True)
    progress = Progress(len(cases), every)
    results: list[Outcome | None] = [None] * len(cases)
    next_index = iter(range(len(cases)))
    lock = threading.Lock()

    def slot(number: int) -> None:
        worker = Worker(number, log_dir, timeout)
        try:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                results[i] = run_case(worker, cases[i], float16, bfloat16)
                progress.add(results[i])
        finally:
            worker.stop()

    threads = [threading.Thread(target=slot, args=(n,), daemon=True) for n in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def select_cases(cases: list[Case], ops: str | None, pattern: str | None) -> list[Case]:
    if ops:
        wanted = {o.strip().lower() for o in ops.split(",") if o.strip()}
        cases = [c for c in cases if c.op.lower() in wanted]
    if pattern:
        regex = re.compile(pattern)
        cases = [c for c in cases if regex.search(c.name)]
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")), help="worker processes")
    parser.add_argument("--ops", help="only these op types, comma-separated (e.g. Add,Conv)")
    parser.add_argument("--filter", help="only cases whose name matches this regex")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case and runtime")
    parser.add_argument("--no-float16", action="store_true", help="skip the float16 runs")
    parser.add_argument("--no-bfloat16", action="store_true", help="skip the bfloat16 runs")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "conformance"), help="results directory")
    parser.add_argument("--docs", help="write the table here (default: docs/conformance.md on a full run)")
    parser.add_argument("--every", type=int, default=50, help="a progress line every N cases")
    args = parser.parse_args(argv)
    if args.filter:
        try:
            re.compile(args.filter)
        except re.error as err:
            parser.error(f"--filter {args.filter!r} is not a regular expression: {err}")
    print("Generating the node cases from the installed onnx …", flush=True)
    cases = generate(os.path.join(args.out, "cases"))
    chosen = select_cases(cases, args.ops, args.filter)
    if not chosen:
        parser.error("no case matches --ops/--filter")
    full = len(chosen) == len(cases)
    print(f"{len(chosen)} of {len(cases)} cases, {args.jobs} jobs, {args.timeout:.0f} s timeout", flush=True)
    started = time.time()
    outcomes = run_all(chosen, jobs=args.jobs, timeout=args.timeout, float16=not args.no_float16,
                       bfloat16=not args.no_bfloat16, log_dir=os.path.join(args.out, "logs"),
                       every=max(1, min(args.every, len(chosen))))
    minutes = (time.time() - started) / 60
    name = "results.json" if full else "results-subset.json"
    path = os.path.join(args.out, name)
    with open(path + ".tmp", "w") as f:
        json.dump({"cases": [asdict(o) for o in outcomes], "minutes": round(minutes, 1), "jobs": args.jobs}, f,
                  indent=1)
    os.replace(path + ".tmp", path)
    text, summary = render(outcomes, minutes=minutes, jobs=args.jobs, full=full)
    print(summary)
    docs = args.docs or (os.path.join(ROOT, "docs", "conformance.md") if full else None)
    if docs:
        with open(docs + ".tmp", "w") as f:
            f.write(text)
        os.replace(docs + ".tmp", docs)
        print(f"Table: {docs}")
    print(f"Results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
