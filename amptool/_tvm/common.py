"""What every part of amptool._tvm shares: the lazy TVM import, native-stderr silencing, global-function lookups."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def tvm_module() -> Any:
    """Import TVM lazily (it takes ~1 s and 250 MB)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: F401,PLC0415

    return tvm


_BACKGROUND_IMPORT: list[threading.Thread] = []


def import_in_background() -> None:
    """Start TVM's import (``tvm_module``) in a daemon thread, once per process.

    Why: the import takes ~1 s of CPU, and the load and prepare stages before the first TVM call
    are mostly native code (protobuf, onnxruntime). Sharing the GIL with them the import takes ~2 s
    of wall time instead of ~1, and a ResNet-50 convert still reaches its import stage ~0.45 s
    sooner (traced, 2 cores). The thread only imports: a later ``import tvm`` in any thread waits
    for it (Python's per-module import lock), and an import that fails there fails again, with
    its message, where TVM is used.
    """
    if "tvm.relax" in sys.modules or _BACKGROUND_IMPORT:
        return

    def run() -> None:
        with contextlib.suppress(Exception):
            tvm_module()

    thread = threading.Thread(target=run, name="amptool-import-tvm", daemon=True)
    _BACKGROUND_IMPORT.append(thread)
    thread.start()
    # An interpreter that exits (an error before TVM was needed) would tear down under a thread still
    # inside TVM's native initialisation: exit waits for the import first (the CLI's os._exit skips this).
    atexit.register(thread.join)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence C++ LOG(WARNING) lines that TVM writes straight to fd 2.

    Exporting and loading a VM executable prints one 'Scope Saving/Loaded' line per
    function; they carry no information for users. Python exceptions are unaffected.
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def has_global_func(name: str) -> bool:
    import tvm  # noqa: PLC0415

    return tvm.get_global_func(name, allow_missing=True) is not None
