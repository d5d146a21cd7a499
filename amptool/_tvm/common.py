"""What every part of amptool._tvm shares: the lazy TVM import, native-stderr silencing, global-function lookups."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from amptool._tvm.script import cheap_frame_stack
from amptool._tvm.swap import SwappedAttributes

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def tvm_module() -> Any:
    """Import TVM lazily (it takes ~1 s and 250 MB), listing TVM's global functions once per change
    of their number rather than once per ``_ffi_api`` module (``_cached_function_names``), and
    answering the type keys and operator names TVM's Python asks for and its libraries lack without
    a C++ error (``_type_indices_without_errors``, ``_op_registry_without_errors``)."""
    with (_CACHED_FUNCTION_NAMES.block(), _TYPE_INDICES_WITHOUT_ERRORS.block(), _OP_REGISTRY_WITHOUT_ERRORS.block(),
          _device_backends_as_wanted()):
        import tvm  # noqa: PLC0415
        from tvm import relax  # noqa: F401,PLC0415

    ir_api = getattr(getattr(tvm, "ir", None), "_ffi_api", None)
    for name in ("GetOp", "RegisterOpAttr"):  # TVM's own functions again (a runtime-only TVM has neither)
        wrapped = getattr(getattr(ir_api, name, None), "__wrapped__", None)
        if wrapped is not None:
            setattr(ir_api, name, wrapped)
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


def _type_indices_without_errors(core: Any) -> dict[str, Any]:
    """``tvm_ffi.core._object_type_key_to_index`` that answers None for a type key no loaded library
    registered, read from ``ffi.GetRegisteredTypeKeys``, instead of asking the C++ table for it.

    Why: the C++ lookup of an unknown key fails by raising an error, and the process's first C++
    error collects a backtrace for which libbacktrace reads the DWARF of the loaded libraries (9 MB
    of it in this machine's libpython): 0.29-0.32 s (measured). ``import tvm`` asks for one such key
    (``tvm.runtime.disco`` registers ``runtime.disco.DRef``, from a library the wheel does not load);
    see ``_op_registry_without_errors`` for the rest. The answers are the same; a key registered
    since the set was read is read again.
    """
    original = core._object_type_key_to_index
    registered_keys = core._get_global_func("ffi.GetRegisteredTypeKeys", True)
    if registered_keys is None:  # an apache-tvm-ffi without it: TVM's own lookups
        return {}
    known: set[str] = set()
    lock = threading.Lock()

    def object_type_key_to_index(type_key: str) -> int | None:
        if type_key not in known:
            with lock:
                known.update(str(key) for key in registered_keys())
            if type_key not in known:
                return None
        return original(type_key)

    return {"_object_type_key_to_index": object_type_key_to_index}


_TYPE_INDICES_WITHOUT_ERRORS = SwappedAttributes(lambda: importlib.import_module("tvm_ffi.core"),
                                                 _type_indices_without_errors)


def _op_registry_without_errors(registry: Any) -> dict[str, Any]:
    """``tvm_ffi.registry.get_global_func`` handing out, for ``ir.GetOp`` and ``ir.RegisterOpAttr``,
    functions that raise the error type TVM's C++ raises (AttributeError) for an operator name not
    registered, or for a string attribute set again to the value it has, without asking C++.
    ``tvm_module`` puts TVM's own functions back once TVM is imported.

    Why: TVM's import asks for ~110 operator names it does not have and sets one printer name to
    the name it already has (``tirx.script.builder.ir`` names every intrinsic of every backend, in
    ``try`` blocks that ignore the errors). Each C++ error collects a backtrace, and the process's
    first one reads the DWARF of every loaded library: 0.3 s of a 0.9 s ``import tvm`` (measured;
    0.6 s without the errors). The attributes end with the same values; only a repeated one keeps
    the priority it had. Operators are only ever added, so their list is read again when their
    number changed (32 µs to count).
    """
    original = registry.get_global_func
    known_ops: set[str] = set()
    lock = threading.Lock()

    def registered(op_name: str) -> bool:
        if op_name not in known_ops:
            listed = original("ir.ListOpNames")()
            with lock:
                if len(listed) != len(known_ops):
                    known_ops.update(str(name) for name in listed)
        return op_name in known_ops

    def get_op(c_get_op: Any) -> Callable[..., Any]:
        def looked_up(op_name: str) -> Any:
            if not registered(op_name):
                raise AttributeError(f"Operator {op_name} is not registered")
            return c_get_op(op_name)

        return looked_up

    def register_op_attr(c_register: Any) -> Callable[..., Any]:
        has_attr, get_attr = original("ir.OpHasAttr"), original("ir.OpGetAttr")

        def set_attr(op_name: str, attr_key: str, value: Any, level: int) -> Any:
            if isinstance(value, str) and op_name in known_ops:
                op = original("ir.GetOp")(op_name)
                if has_attr(op, attr_key) and get_attr(op, attr_key) == value:
                    raise AttributeError(f"Attribute {attr_key} of {op_name} is already registered as {value!r}")
            result = c_register(op_name, attr_key, value, level)
            with lock:
                known_ops.add(op_name)  # C++ registers an operator it did not have
            return result

        return set_attr

    wrappers = {"ir.GetOp": get_op, "ir.RegisterOpAttr": register_op_attr}

    def get_global_func(name: str, allow_missing: bool = False) -> Any:
        found = original(name, allow_missing)
        if found is None or name not in wrappers or original("ir.ListOpNames", True) is None:
            return found
        wrapped = wrappers[name](found)
        wrapped.__wrapped__ = found  # type: ignore[attr-defined]
        return wrapped

    return {"get_global_func": get_global_func}


_OP_REGISTRY_WITHOUT_ERRORS = SwappedAttributes(lambda: importlib.import_module("tvm_ffi.registry"),
                                                _op_registry_without_errors)


#: Whether TVM's import loads its device backends' Python (``without_device_backends``).
_DEVICE_BACKENDS = {"wanted": True}
_BACKEND_AUTOLOAD = "TVM_DEVICE_BACKEND_AUTOLOAD"


def without_device_backends() -> None:
    """Have this process's TVM import skip the device backends (CUDA, Vulkan, Metal, ROCm, …):
    for a process that builds and runs for the CPU only (the CLI's ``convert`` and ``diff`` building
    for llvm here). Nothing once TVM is imported.

    Why: ``import tvm`` loads every in-tree backend's Python hooks (TVMScript namespaces, device
    intrinsics, target tags, runtime sidecar libraries): 0.17 s of a 0.53 s import (measured), all
    of it Python that holds the GIL the convert's load and prepare stages need. TVM itself offers
    ``TVM_DEVICE_BACKEND_AUTOLOAD=0``; it is set only while TVM imports.
    """
    if "tvm" not in sys.modules:
        _DEVICE_BACKENDS["wanted"] = False


@contextlib.contextmanager
def _device_backends_as_wanted() -> Iterator[None]:
    if _DEVICE_BACKENDS["wanted"] or "tvm" in sys.modules or _BACKEND_AUTOLOAD in os.environ:
        yield
        return
    os.environ[_BACKEND_AUTOLOAD] = "0"
    try:
        yield
    finally:
        os.environ.pop(_BACKEND_AUTOLOAD, None)
    if "tvm" in sys.modules:
        _load_runtime_extra()


def _load_runtime_extra() -> None:
    """Load ``libtvm_runtime_extra`` as TVM's backend autoload would: it registers the CPU's contrib
    kernels (``tvm.contrib.sort.argsort`` among them), not a device backend.

    Why: without it, a module calling one — a TopK whose k is known only at run time, a sort — failed
    to run ("Cannot find function tvm.contrib.sort.argsort") in a process whose TVM was imported
    without device backends: the CLI's convert and diff, or a Python session that ran one first."""
    try:
        from pathlib import Path  # noqa: PLC0415

        from tvm.base import _LOADED_LIBS  # noqa: PLC0415
        from tvm_ffi.libinfo import load_lib_ctypes  # noqa: PLC0415

        if "tvm_runtime_extra" in _LOADED_LIBS or "tvm_runtime" not in _LOADED_LIBS:
            return
        runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        _LOADED_LIBS["tvm_runtime_extra"] = load_lib_ctypes(package="tvm", target_name="tvm_runtime_extra",
                                                            extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
    except (ImportError, OSError, RuntimeError, AttributeError):  # a TVM without it: nothing to load
        pass


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
