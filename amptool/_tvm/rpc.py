"""TVM's RPC client: sessions with a tracker or one server, files in the server's session directory,
a VirtualMachine on a remote device, runs and the time evaluator (measured on apache-tvm 0.27.0.post1).

Everything here blocks: TVM's C++ client reads its socket with no timeout, so the caller
(``amptool.runtime.remote``) calls these from a worker process it can kill. The tracker
conversation is Python sockets, so it gets a real timeout here: ``TrackerSession.request`` would
retry a refused tracker for 60 s and wait in the tracker's queue forever.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from amptool._tvm.runtime import _flatten_outputs


def connect_server(host: str, port: int, key: str = "") -> Any:
    """An RPC session with the server at host:port (``key``: the match key a tracker handed out)."""
    from tvm import rpc  # noqa: PLC0415

    return rpc.connect(host, port, key)


def request_from_tracker(host: str, port: int, key: str, timeout_s: float) -> tuple[Any, tuple[str, int]]:
    """A session with a free server registered under ``key``, and its address.

    TimeoutError when the tracker gives none within ``timeout_s`` (every such server busy, or none
    registered); OSError when the tracker is not there or not a tracker."""
    from tvm.rpc import base  # noqa: PLC0415

    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        _tracker_handshake(sock, host, port)
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", 1])
        value = base.recvjson(sock)
    if not isinstance(value, list) or value[0] != base.TrackerCode.SUCCESS:
        raise OSError(f"the tracker answered {value!r}")
    url, server_port, match_key = value[1]
    return connect_server(str(url), int(server_port), str(match_key)), (str(url), int(server_port))


def tracker_summary(host: str, port: int, timeout_s: float) -> dict[str, Any]:
    """The tracker's queue per key (``{'queue_info': {key: {'free', 'pending'}}, 'server_info': […]}``)."""
    from tvm.rpc import base  # noqa: PLC0415

    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        _tracker_handshake(sock, host, port)
        base.sendjson(sock, [base.TrackerCode.SUMMARY])
        value = base.recvjson(sock)
    if not isinstance(value, list) or value[0] != base.TrackerCode.SUCCESS:
        raise OSError(f"the tracker answered {value!r}")
    summary: dict[str, Any] = value[1]
    return summary


def _tracker_handshake(sock: socket.socket, host: str, port: int) -> None:
    import struct  # noqa: PLC0415

    from tvm.rpc import base  # noqa: PLC0415

    sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
    magic = struct.unpack("<i", base.recvall(sock, 4))[0]
    if magic != base.RPC_TRACKER_MAGIC:
        raise OSError(f"{host}:{port} is not a TVM RPC tracker")


def upload(session: Any, path: str, name: str) -> None:
    """Copy a local file into the server's session directory as ``name``."""
    session.upload(path, name)


def remove(session: Any, name: str) -> bool:
    """Delete ``name`` from the server's session directory; whether it is gone (a download fails)."""
    session.remove(name)
    try:
        session.download(name)
    except Exception:  # noqa: BLE001 - RPCError/InternalError by TVM version: the file is not there
        return True
    return False


def remote_device(session: Any, device: str) -> Any:
    """The remote ``cpu``, ``cuda:1``, … of a session."""
    kind, _, index = device.partition(":")
    return session.device(kind, int(index or 0))


def device_exists(dev: Any) -> bool:
    """Whether the remote device is there (asks the server)."""
    return bool(dev.exist)


def remote_vm(session: Any, name: str, dev: Any) -> Any:
    """A VirtualMachine over the uploaded library ``name``, on the remote device."""
    from tvm.runtime.vm import VirtualMachine  # noqa: PLC0415

    return VirtualMachine(session.load_module(name), dev)


def _device_args(arrays: list[np.ndarray], dev: Any) -> list[Any]:
    import tvm  # noqa: PLC0415

    return [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]


def run_remote(vm: Any, dev: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run 'main' on the remote device; the outputs copied back as numpy arrays."""
    return _flatten_outputs(vm["main"](*_device_args(arrays, dev)))


def time_remote(vm: Any, dev: Any, arrays: list[np.ndarray], number: int, repeat: int) -> list[float]:
    """Seconds per call of 'main', one mean of ``number`` calls per repeat, measured on the device by
    TVM's time evaluator (after one discarded call; a GPU is synchronised before the clock stops)."""
    evaluator = vm.time_evaluator("main", dev, number=number, repeat=repeat)
    return [float(t) for t in evaluator(*_device_args(arrays, dev)).results]
