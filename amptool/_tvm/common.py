"""What every part of amptool._tvm shares: the lazy TVM import, native-stderr silencing, global-function lookups."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from amptool._tvm.script import cheap_frame_stack
from amptool._tvm.swap import SwappedAttributes

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def tvm_module() -> Any:
    """Import TVM lazily (it takes ~1 s and 250 MB), listing TVM's global functions once per change
    of their number rather than once per ``_ffi_api`` module (``_cached_function_names``)."""
    with _CACHED_FUNCTION_NAMES.block():
        import tvm  # noqa: PLC0415
        from tvm import relax  # noqa: F401,PLC0415

    return tvm


def _cached_function_names(registry: Any) -> dict[str, Any]:
    """``tvm_ffi.registry.list_global_func_names`` answered from a list kept while the number of
    global functions stays the same.

    Why: each of TVM's ~50 ``_ffi_api`` modules lists all ~2,100 names at import, one FFI call per
    name: 106,000 calls, 0.3 s of an idle import. Each call releases and retakes the GIL, and while
    another thread runs Python (a convert's load and prepare, beside the background import) each
    retake waits up to the 5 ms switch interval: the import took 1.9 s instead of 0.9 s inside a
    ResNet-50 convert, and 30 s beside a busy Python loop (measured). Functions are only added
    while TVM imports, so their number tells when the list changed.
    """
    original = registry.list_global_func_names
    lists: dict[int, list[str]] = {}
    lock = threading.Lock()

    def list_global_func_names() -> list[str]:
        count = int(registry.get_global_func("ffi.FunctionListGlobalNamesFunctor")()(-1))
        with lock:
            if count not in lists:
                lists.clear()
                lists[count] = original()
            return list(lists[count])

    return {"list_global_func_names": list_global_func_names}


_CACHED_FUNCTION_NAMES = SwappedAttributes(lambda: importlib.import_module("tvm_ffi.registry"), _cached_function_names)


_BACKGROUND_IMPORTS: set[str] = set()


def import_in_background(*modules: str) -> None:
    """Start TVM's import (``tvm_module``), then that of ``modules`` (slow TVM parts a build will
    import), in a daemon thread; modules imported or already started are skipped.

    Why: the import takes ~1 s of CPU, and the load and prepare stages before the first TVM call
    are mostly native code (protobuf, onnxruntime). Sharing the GIL with them the import takes ~2 s
    of wall time instead of ~1, and a ResNet-50 convert still reaches its import stage ~0.45 s
    sooner (traced, 2 cores). ``modules`` import under ``script.cheap_frame_stack`` (TVM's tensor
    intrinsics are TVMScript). The thread only imports: a later ``import`` of the same module in
    any thread waits for it (Python's per-module import lock), and an import that fails there fails
    again, with its message, where it is used.
    """
    wanted = [name for name in ("tvm.relax", *modules) if name not in sys.modules and name not in _BACKGROUND_IMPORTS]
    if not wanted:
        return
    _BACKGROUND_IMPORTS.update(wanted)

    def run() -> None:
        with contextlib.suppress(Exception):
            tvm_module()
            with cheap_frame_stack():
                for name in modules:
                    importlib.import_module(name)

    thread = threading.Thread(target=run, name="amptool-import-tvm", daemon=True)
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
