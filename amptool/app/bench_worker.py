"""Bench's isolated workers: every runtime that ``amptool.app.bench`` times runs in a process of its own.

Why: TVM's and onnxruntime's thread pools spin for a while after each run. In one process the
pool of the runtime timed last can keep the cores busy while the next one is timed (issue 13, a
BERT-mini export at 2 threads: onnxruntime 9.6 ms interleaved with TVM, 2.4 ms alone). A process per
runtime, busy one at a time, gives each runtime the machine a user would give it — provided
the previous worker's pool has stopped spinning when the next turn starts. A fixed pause does
not know how long that is (measured at 2 threads on BERT-mini: onnxruntime's pool spins ~35 ms
of CPU after a run, TVM's keeps spinning and yielding for 150+ ms of CPU, longer in wall time on
a busy machine), so a worker ends its turn only once its own process is quiet (``_wait_quiet``).

Parent side: ``isolated_workers(specs)`` spawns one process per ``WorkerSpec`` (the 'spawn'
context: a fresh interpreter, nothing inherited from the parent's thread pools), waits until
each has loaded its model, and yields a ``Worker`` per spec; ``Worker.time(untimed, runs)``
has that worker make ``untimed`` calls and then ``runs`` timed ones, and returns their
milliseconds once the worker is quiet again (``Worker.settle_ms`` keeps how long that took).
Leaving the block, normally or by an exception (Ctrl-C included), stops every worker: asked
first, then terminated, then killed. Workers are spawned with SIGINT ignored,
so Ctrl-C reaches the parent alone and the parent decides when they go.

Worker side (``_serve``): size the thread pool, load one runtime, report ready, then answer
until told to stop or until the parent's end of the pipe closes (the parent died). Every answer
waits until the worker's threads are idle. Messages:

  worker → parent   ("ready", info) | ("times", [ms, …], settle_ms) | ("error", kind, message, hint)
  parent → worker   ("time", untimed, runs) | ("stop",)

Nothing heavy is imported at the top of this module: an onnxruntime worker never loads TVM.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal

import numpy as np

from amptool.errors import TargetUnavailableError, UserError, error_summary
from amptool.runtime.child_signals import sigint_ignored
from amptool.runtime.onnxruntime_runner import session

Runtime = Literal["onnxruntime", "tvm", "openvino"]
ONNXRUNTIME_RUNTIME: Runtime = "onnxruntime"
TVM_RUNTIME: Runtime = "tvm"
OPENVINO_RUNTIME: Runtime = "openvino"
#: OpenVINO's INFERENCE_PRECISION_HINT for each amptool dtype.
OPENVINO_PRECISION = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
STOP_GRACE_S = 5.0  # a worker asked to stop may be finishing a timed turn first
#: Quiet: two windows in a row in which all the worker's threads together used under 10% of one
#: CPU. Process CPU time has nanosecond resolution, so 10 ms windows are enough to see a spinner.
QUIET_WINDOW_S = 0.01
QUIET_WINDOWS = 2
QUIET_CPU_FRACTION = 0.1
QUIET_LIMIT_S = 2.0  # a pool that never sleeps should not stall the bench; the settle times show it


@dataclass(frozen=True)
class WorkerSpec:
    """One runtime to time: an ONNX file for onnxruntime, an artifact directory for TVM."""

    name: str
    runtime: Runtime
    path: str
    threads: int
    feeds: Mapping[str, np.ndarray] = field(default_factory=dict)
    provider: str = "CPUExecutionProvider"  # onnxruntime only
    precision: str = "float32"  # openvino only: the inference precision to ask for
    device: str | None = None  # TVM only; None: the device the artifact was built for


class Worker:
    """The parent's handle on one running worker process."""

    def __init__(self, spec: WorkerSpec, process: BaseProcess, conn: Connection) -> None:
        self.spec = spec
        self.process = process
        self.conn = conn
        self.info: dict[str, Any] = {}
        self.settle_ms: list[float] = []  # per turn: how long its threads took to go idle

    def time(self, untimed: int, runs: int) -> list[float]:
        """Milliseconds of ``runs`` timed calls, made right after ``untimed`` untimed ones; returns
        when the worker has gone quiet, so the next worker's turn starts on idle cores."""
        self.conn.send(("time", untimed, runs))
        times, settle_ms = self.expect("times")
        self.settle_ms.append(float(settle_ms))
        return [float(ms) for ms in times]

    def expect(self, kind: str) -> Any:
        """The payload of the next message, which must be ``kind``; a worker's error is raised here."""
        try:
            message = self.conn.recv()
        except EOFError as err:
            self.process.join(1.0)
            raise RuntimeError(f"the bench worker for {self.spec.name} died "
                               f"(exit code {self.process.exitcode})") from err
        if message[0] == "error":
            _, error_kind, text, hint = message
            if error_kind == "bug":
                raise RuntimeError(f"the bench worker for {self.spec.name} failed:\n{text}")
            raise (TargetUnavailableError if error_kind == "target" else UserError)(text, hint)
        if message[0] != kind:
            raise RuntimeError(f"the bench worker for {self.spec.name} answered {message[0]!r}, not {kind!r}")
        return message[1] if len(message) == 2 else message[1:]


@contextlib.contextmanager
def isolated_workers(specs: Sequence[WorkerSpec]) -> Iterator[list[Worker]]:
    """One loaded worker per spec, all stopped when the block ends (see the module docstring)."""
    context = multiprocessing.get_context("spawn")
    workers: list[Worker] = []
    try:
        for spec in specs:
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_serve, args=(child_end, spec), name=f"amptool-bench {spec.name}",
                                      daemon=True)
            with sigint_ignored():  # the child keeps SIG_IGN through exec: Ctrl-C is the parent's to handle
                process.start()
            child_end.close()  # ours closed, the worker's death reads as EOF
            workers.append(Worker(spec, process, parent_end))
        for worker in workers:
            worker.info = dict(worker.expect("ready"))
        yield workers
    finally:
        _stop(workers)


def _stop(workers: Sequence[Worker]) -> None:
    """Ask each worker to exit, give them STOP_GRACE_S together, then terminate and kill."""
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.conn.send(("stop",))
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(1.0)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()


def _serve(conn: Connection, spec: WorkerSpec) -> None:
    """The worker process: load, say ready, time on request, exit on "stop" or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        call, info = _load(spec)
        _wait_quiet()  # loading may have started a pool (onnxruntime's session does)
        conn.send(("ready", info))
        while True:
            try:
                request = conn.recv()
            except EOFError:
                return
            if request[0] != "time":
                return
            times = _timed(call, request[1], request[2])
            conn.send(("times", times, _wait_quiet() * 1e3))
    except (BrokenPipeError, ConnectionResetError):
        return
    except TargetUnavailableError as err:
        _send_error(conn, "target", err.message, err.hint)
    except UserError as err:
        _send_error(conn, "user", err.message, err.hint)
    except Exception:  # noqa: BLE001 - a bug in the worker returns to the parent with its traceback
        _send_error(conn, "bug", traceback.format_exc(), None)


def _send_error(conn: Connection, kind: str, text: str, hint: str | None) -> None:
    with contextlib.suppress(OSError):
        conn.send(("error", kind, text, hint))


def _timed(call: Callable[[], Any], untimed: int, runs: int) -> list[float]:
    for _ in range(untimed):
        call()
    times: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _wait_quiet() -> float:
    """Seconds until this process's threads stop using CPU (its pools asleep), at most QUIET_LIMIT_S."""
    start = time.perf_counter()
    quiet = 0
    while quiet < QUIET_WINDOWS and time.perf_counter() - start < QUIET_LIMIT_S:
        cpu = time.process_time()
        time.sleep(QUIET_WINDOW_S)
        quiet = quiet + 1 if time.process_time() - cpu < QUIET_WINDOW_S * QUIET_CPU_FRACTION else 0
    return time.perf_counter() - start


def _load(spec: WorkerSpec) -> tuple[Callable[[], Any], dict[str, Any]]:
    if spec.runtime == ONNXRUNTIME_RUNTIME:
        return _onnxruntime_call(spec)
    if spec.runtime == TVM_RUNTIME:
        return _tvm_call(spec)
    if spec.runtime == OPENVINO_RUNTIME:
        return _openvino_call(spec)
    raise ValueError(f"unknown runtime {spec.runtime!r}")


def _onnxruntime_call(spec: WorkerSpec) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A session as a user would open one: ``threads`` intra-op threads, the default spinning."""
    try:
        handle = session(spec.path, threads=spec.threads, providers=(spec.provider,))
    except Exception as err:
        raise UserError(f"onnxruntime cannot run the model: {error_summary(err)}") from err
    names = {i.name for i in handle.get_inputs()}
    inputs = {k: v for k, v in spec.feeds.items() if k in names}
    return (lambda: handle.run(None, inputs)), {"provider": handle.get_providers()[0]}


def _tvm_call(spec: WorkerSpec) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The artifact's VM on its device, inputs copied there once; a GPU call ends synchronised."""
    from amptool import _tvm  # noqa: PLC0415
    from amptool.app.artifact import load_artifact  # noqa: PLC0415
    from amptool.dtypes import as_float_dtype  # noqa: PLC0415

    threads = _tvm.set_num_threads(spec.threads)  # before the pool exists: TVM sizes it once
    _manifest, compiled = load_artifact(spec.path, spec.device)
    dtypes: Sequence[str | None] = compiled.input_dtypes or [None] * len(compiled.input_names)
    arrays = [as_float_dtype(spec.feeds[n], d) for n, d in zip(compiled.input_names, dtypes)]
    call = _tvm.prepared_call(compiled.vm, arrays, compiled.device, deep_stack=compiled.deep_stack)
    return call, {"tvm_threads": threads, "device": compiled.device}


#: A line of an OpenVINO error that only names a place in its sources.
_OPENVINO_SOURCE_LINE = re.compile(r"^(Exception from|Check '.*' failed at) src/")


def openvino_error_summary(err: BaseException) -> str:
    """One line of an OpenVINO exception: its conversion summary ("Conversion is failed for:
    AveragePool-18") when it has one, else its first line that is not a source location — its
    first line is one ("Exception from src/inference/src/cpp/core.cpp:84:")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    failed = [line.lstrip("- ") for line in lines if line.lstrip("- ").startswith("Conversion is failed for")]
    told = failed or [line for line in lines if not _OPENVINO_SOURCE_LINE.match(line)]
    return told[0][:300] if told else error_summary(err)


def _openvino_call(spec: WorkerSpec) -> tuple[Callable[[], Any], dict[str, Any]]:
    """OpenVINO's CPU plugin as its docs tune it for one request at a time: the LATENCY hint, one
    stream, ``threads`` inference threads, the requested precision; the model reshaped to the
    feeds' static shapes (dynamic dims run slower). ``info`` records the precision OpenVINO
    actually chose — a CPU without bf16 support silently runs f32."""
    import openvino as ov  # noqa: PLC0415 - an optional extra, loaded by its worker only

    core = ov.Core()
    try:
        model = core.read_model(spec.path)
        names = {port.get_any_name() for port in model.inputs}
        model.reshape({name: list(np.shape(spec.feeds[name])) for name in names if name in spec.feeds})
        compiled = core.compile_model(model, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(spec.threads),
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[spec.precision]})
    except Exception as err:
        raise UserError(f"OpenVINO cannot run the model: {openvino_error_summary(err)}") from err
    request = compiled.create_infer_request()
    inputs = {name: np.ascontiguousarray(spec.feeds[name]) for name in names}
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    chosen = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)  # "bf16", "f32"
    return (lambda: request.infer(inputs)), {"openvino": ov.__version__, "precision": chosen}
