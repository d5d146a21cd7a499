"""Run a compiled library on a remote device through TVM's RPC (``--rpc``, ``--rpc-server``).

Where: a tracker hands out a free server registered under a key (``--rpc HOST:PORT --rpc-key
KEY``), or one server is named directly (``--rpc-server HOST:PORT``). The library is uploaded
into that server's session directory under a name of its own, loaded there into a VirtualMachine
on the device the artifact was built for, and run or timed there; the outputs come back as numpy.

Why a worker process: TVM's C++ client reads its socket with no timeout, so a server whose host
died, or a network that drops packets, would hang amptool for ever. The session therefore lives
in a spawned child, and the parent waits for each answer at most ``timeout_s``; on a timeout or
the child's death the child is killed and the caller gets TargetUnavailableError (exit 3) naming
the server and the step. A server process that dies closes its socket, which the child reports
as an error at once.

Cleanup: the uploaded library is removed (``remote.remove``) before the session closes, also
after an error in a run; TVM's server additionally deletes its per-session directory when the
session ends, so a killed client leaves nothing behind either.

  child → parent   ("started",) | ("connected",) | ("ready", info) | ("outputs", [array, …]) | ("times", [s, …])
                   | ("stopped", removed) | ("error", message)
  parent → child   ("run", [array, …]) | ("time", [array, …], number, repeat) | ("stop",)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from amptool.dtypes import as_float_dtype
from amptool.errors import TargetUnavailableError, UserError
from amptool.runtime.child_signals import sigint_ignored
from amptool.runtime.tvm_runner import CompiledModel

DEFAULT_TIMEOUT_S = 60.0
#: Spawning the child and importing TVM there is local work, not the remote's: bounded apart.
START_LIMIT_S = 120.0
STOP_GRACE_S = 5.0
_HINT = ("See docs/remote.md: is the server up (a tracker lists its servers: python -m tvm.exec.query_rpc_tracker), "
         "with this TVM version and the device? --rpc-timeout bounds each wait.")


@dataclass(frozen=True)
class RemoteSpec:
    """Where to run: through a tracker (``key`` set) or on one server (``key`` None)."""

    host: str
    port: int
    key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.host or not 0 < self.port < 65536:
            raise UserError(f"RPC address '{self.host}:{self.port}' is not HOST:PORT with a port in 1-65535")
        if not self.timeout_s > 0:
            raise UserError(f"--rpc-timeout {self.timeout_s}: must be more than 0 seconds")

    @property
    def label(self) -> str:
        """How messages name it: ``tracker 10.0.0.5:9190 key 'rasp4'`` or ``server 10.0.0.7:9090``."""
        if self.key is not None:
            return f"tracker {self.host}:{self.port} key '{self.key}'"
        return f"server {self.host}:{self.port}"

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "key": self.key, "timeout_s": self.timeout_s}


def parse_address(text: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6) → (host, port); UserError naming ``flag`` otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} '{text}' is not HOST:PORT", f"e.g. {flag} 127.0.0.1:9190 (a port in 1-65535).")
    return host, int(port)


class RemoteModel(CompiledModel):
    """A library loaded on a remote device: a ``CompiledModel`` whose ``run`` happens there, plus ``time``."""

    def __init__(self, spec: RemoteSpec, process: BaseProcess, conn: Connection, input_names: Sequence[str],
                 output_names: Sequence[str], device: str, input_dtypes: Sequence[str] | None) -> None:
        super().__init__(vm=None, input_names=list(input_names), output_names=list(output_names), device=device,
                         input_dtypes=input_dtypes)
        self.spec, self.process, self.conn = spec, process, conn
        self.info: dict[str, Any] = {}
        self.removed: bool | None = None  # after close: whether the uploaded library was removed
        self._closing = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run 'main' once on the device; the outputs by name."""
        outputs = self._ask(("run", self._arrays(feeds)), "outputs", "run")
        if len(outputs) != len(self.output_names):
            raise RuntimeError(f"remote module returned {len(outputs)} outputs, expected {len(self.output_names)}")
        return dict(zip(self.output_names, outputs))

    def time(self, feeds: Mapping[str, np.ndarray], number: int, repeat: int) -> list[float]:
        """Milliseconds per call, one mean of ``number`` calls per repeat, clocked on the device."""
        seconds = self._ask(("time", self._arrays(feeds), number, repeat), "times", "timing")
        return [s * 1e3 for s in seconds]

    def _arrays(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        arrays = [np.asarray(feeds[n]) for n in self.input_names]
        if self.input_dtypes is not None:
            arrays = [as_float_dtype(a, d) for a, d in zip(arrays, self.input_dtypes)]
        return arrays

    def _ask(self, request: tuple[Any, ...], kind: str, step: str) -> Any:
        try:
            self.conn.send(request)
        except OSError as err:
            raise self._lost(step, f"the RPC worker is gone ({err})") from err
        return _expect(self, kind, step, self.spec.timeout_s)

    def _lost(self, step: str, why: str, *, graceful: bool = False) -> TargetUnavailableError:
        """The error for a failed step; the child is ended first: asked (it still removes the library)
        when it reported the error itself, killed when it went silent or died."""
        if graceful and not self._closing:
            self.close()
        else:
            self.kill()
        return TargetUnavailableError(f"Remote {self.spec.label}: {step} failed: {why}", _HINT)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(2.0)

    def close(self) -> None:
        """Remove the uploaded library and end the session (bounded: a dead server is not waited for)."""
        if self._closing:
            return
        self._closing = True
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(("stop",))
            with contextlib.suppress(TargetUnavailableError):
                self.removed = bool(_expect(self, "stopped", "cleanup", min(self.spec.timeout_s, STOP_GRACE_S)))
            self.process.join(STOP_GRACE_S)
        self.kill()
        self.conn.close()


def _expect(model: RemoteModel, kind: str, step: str, timeout_s: float) -> Any:
    """The payload of the child's next message, which must be ``kind``, within ``timeout_s``."""
    try:
        ready = model.conn.poll(timeout_s)
        message = model.conn.recv() if ready else None
    except (EOFError, OSError):
        model.process.join(1.0)
        raise model._lost(step, f"the RPC worker died (exit code {model.process.exitcode})") from None
    if message is None:
        raise model._lost(step, f"no answer within {timeout_s:g} s")
    if message[0] == "error":
        raise model._lost(step, message[1], graceful=True)
    if message[0] != kind:
        raise RuntimeError(f"the RPC worker answered {message[0]!r}, not {kind!r}")
    return message[1] if len(message) > 1 else None


@contextlib.contextmanager
def open_remote(spec: RemoteSpec, library: str, device: str, input_names: Sequence[str],
                output_names: Sequence[str], input_dtypes: Sequence[str] | None = None) -> Iterator[RemoteModel]:
    """The library at ``library`` (a local file) loaded on ``device`` of the remote; removed from
    the remote, and the session ended, when the block ends."""
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    process = context.Process(target=_serve, args=(child_end, spec, os.path.abspath(library), device),
                              name="amptool-rpc", daemon=True)
    with sigint_ignored():  # inherited through the spawn: Ctrl-C is the parent's, which then ends the child
        process.start()
    child_end.close()  # ours closed: the child's death reads as EOF
    model = RemoteModel(spec, process, parent_end, input_names, output_names, device, input_dtypes)
    try:
        _expect(model, "started", "start", START_LIMIT_S)
        # The child gives up on a tracker's queue after timeout_s itself and says why: wait a little longer.
        _expect(model, "connected", "connect", spec.timeout_s + (5.0 if spec.key is not None else 0.0))
        model.info = dict(_expect(model, "ready", "upload and load", spec.timeout_s))
        yield model
    finally:
        model.close()


def _serve(conn: Connection, spec: RemoteSpec, library: str, device: str) -> None:
    """The child: connect, upload, load, answer run/time requests, remove the library on stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it ends us
    from amptool._tvm import rpc  # noqa: PLC0415 - the child's TVM, imported after the fork point

    conn.send(("started",))
    session = name = None
    try:
        session, address = _connect(spec)
        conn.send(("connected",))
        dev = rpc.remote_device(session, device)
        if not rpc.device_exists(dev):
            raise LookupError(f"the server at {address[0]}:{address[1]} has no {device} device")
        name = f"amptool-{uuid.uuid4().hex[:12]}{os.path.splitext(library)[1] or '.so'}"
        rpc.upload(session, library, name)
        vm = rpc.remote_vm(session, name, dev)
        conn.send(("ready", {"server": f"{address[0]}:{address[1]}", "device": device, "uploaded": name}))
        while True:
            request = conn.recv()
            if request[0] == "run":
                conn.send(("outputs", rpc.run_remote(vm, dev, request[1])))
            elif request[0] == "time":
                conn.send(("times", rpc.time_remote(vm, dev, request[1], request[2], request[3])))
            else:
                break
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass
    except Exception as err:  # noqa: BLE001 - any RPC failure goes back to the parent as one line
        with contextlib.suppress(OSError):
            conn.send(("error", _one_line(err)))
    removed = False
    if session is not None and name is not None:
        with contextlib.suppress(Exception):  # a dead server: its session directory went with it
            removed = rpc.remove(session, name)
    with contextlib.suppress(OSError):
        conn.send(("stopped", removed))


def _connect(spec: RemoteSpec) -> tuple[Any, tuple[str, int]]:
    from amptool._tvm import rpc  # noqa: PLC0415

    if spec.key is None:
        return rpc.connect_server(spec.host, spec.port), (spec.host, spec.port)
    deadline = time.monotonic() + spec.timeout_s
    try:
        return rpc.request_from_tracker(spec.host, spec.port, spec.key, spec.timeout_s)
    except TimeoutError as err:
        waited = spec.timeout_s - max(0.0, deadline - time.monotonic())
        raise TimeoutError(f"no free device with key '{spec.key}' after {waited:.0f} s") from err
    except OSError as err:
        raise OSError(f"cannot reach the tracker: {err.strerror or err}") from err


def _one_line(err: BaseException) -> str:
    """The line of a TVM error that says what happened (after its backtrace), shortened."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[-1] if lines else type(err).__name__
    if "Connect to" in text and "failed" in text:
        text = text[text.index("Connect to"):] + " (nothing listening there?)"
    elif "Failed to load dynamic shared library" in text:
        text = ("the server cannot load the library: built for another architecture (manifest 'triple') "
                "or another TVM version than the server's?")
    elif "kShutdown" in text or "connection reset" in text.lower():
        text = "the server closed the connection (it died or was stopped)"
    return text[:300]
