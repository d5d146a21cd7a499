"""Loading and running compiled modules: devices, the VM, thread pools. Everything here works
under a runtime-only TVM (no compiler library), which ``amptool run`` relies on."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from amptool._tvm.common import has_global_func, quiet_native_stderr


def set_num_threads(count: int) -> int:
    """Size TVM's CPU thread pool for this thread's later runs; returns the count in effect.

    The runtime reads ``TVM_NUM_THREADS`` when it creates a pool (on x86 its default is half
    the logical CPUs); ``runtime.config_threadpool`` resizes an existing pool, but never above
    the size it was created with. Threads are not pinned to cores unless ``TVM_BIND_THREADS``
    says so: pinning also pins the calling thread, and with it every thread onnxruntime creates
    afterwards.
    """
    import tvm  # noqa: PLC0415

    if count < 1:
        raise ValueError("thread count must be >= 1")
    os.environ["TVM_NUM_THREADS"] = str(count)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    big_cores = 1  # threading::ThreadGroup::kBig; no CPU list: max concurrency re-read from env
    tvm.get_global_func("runtime.config_threadpool")(big_cores, count)
    return num_threads()


def num_threads() -> int:
    """Threads TVM's pool uses for this thread's parallel loops."""
    import tvm  # noqa: PLC0415

    return int(tvm.get_global_func("runtime.NumThreads")())


def load_vm(path: str, device: str = "cpu") -> Any:
    """A VirtualMachine over an exported library.

    Runtime only (``tvm.runtime.vm``, not ``tvm.relax``): an artifact loads under a TVM without
    the compiler library (no ``lib/libtvm_compiler.so``, or ``TVM_USE_RUNTIME_LIB=1``)."""
    import tvm  # noqa: PLC0415
    from tvm.runtime.vm import VirtualMachine  # noqa: PLC0415

    dev = open_device(device)
    with quiet_native_stderr():
        lib = tvm.runtime.load_module(_loadable_path(path))
        return VirtualMachine(lib, dev)


#: Per library path loaded in this process: the file (device, inode, size, mtime) loaded under it.
_LOADED_FILES: dict[str, tuple[int, int, int, int]] = {}
_ALIAS_DIR: list[str] = []


def _loadable_path(path: str) -> str:
    """``path``, or an alias of its current file when another file was loaded from that path
    earlier in this process.

    Why: the dynamic loader hands back the library it already mapped for a path it has seen,
    without looking at the file, so ``amptool.load`` of an artifact converted again into the same
    directory ran the first model (seen: a Neg model returning the Relu model's outputs). The
    alias is a hard link (a copy across file systems) named after the file's identity, in a
    directory of this process's, removed at exit; the same file keeps the same name."""
    import atexit  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    real = os.path.realpath(path)
    try:
        info = os.stat(real)
    except OSError:
        return path  # TVM's own error names the path
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    first = _LOADED_FILES.setdefault(real, identity)
    if first == identity:
        return path
    if not _ALIAS_DIR:
        _ALIAS_DIR.append(tempfile.mkdtemp(prefix="amptool-libs-"))
        atexit.register(shutil.rmtree, _ALIAS_DIR[0], True)
    alias = os.path.join(_ALIAS_DIR[0], "{}-{}-{}-{}".format(*identity) + os.path.splitext(real)[1])
    if not os.path.exists(alias):
        try:
            os.link(real, alias)
        except OSError:
            shutil.copyfile(real, alias)
    return alias


def runtime_only() -> bool:
    """Whether this TVM runs without its compiler library (a deployment install)."""
    import tvm  # noqa: PLC0415

    return bool(tvm.base._RUNTIME_ONLY)


def open_device(device: str) -> Any:
    """The TVM device for ``cpu``, ``cuda:1``…; LookupError saying what is missing when it is
    not there (no driver, no such GPU)."""
    import tvm  # noqa: PLC0415

    kind, _, index = device.partition(":")
    if kind != "cpu":
        _load_device_runtime(kind)
    dev = tvm.device(kind, int(index or 0))
    if kind != "cpu" and not dev.exist:
        raise LookupError(f"no {kind} device {int(index or 0)} is visible to TVM")
    return dev


def _load_device_runtime(kind: str) -> None:
    """A runtime-only TVM does not autoload its device backends: load ``libtvm_runtime_<kind>``
    (its DeviceAPI) and, for CUDA, the nvcc/NVRTC callback that JIT-compiles kernels shipped
    as source."""
    import tvm  # noqa: PLC0415

    if kind == "cuda":
        import tvm.support.nvcc  # noqa: PLC0415

        _no_target_scope_without_compiler()
    if has_global_func(f"device_api.{kind}"):
        return
    from pathlib import Path  # noqa: PLC0415

    from tvm_ffi.libinfo import load_lib_ctypes  # noqa: PLC0415

    loaded = tvm.base._LOADED_LIBS
    runtime_dir = Path(loaded["tvm_runtime"]._name).resolve().parent
    try:
        loaded[f"tvm_runtime_{kind}"] = load_lib_ctypes("tvm", f"tvm_runtime_{kind}", "RTLD_LOCAL",
                                                        extra_lib_paths=[runtime_dir])
    except (OSError, RuntimeError, TypeError) as err:
        raise LookupError(f"TVM's {kind} runtime does not load here ({error_line(err)})") from err


def _no_target_scope_without_compiler() -> None:
    """The CUDA JIT callback (``tvm.support.nvcc``) asks ``Target.current()`` for the arch and
    falls back to the GPU's compute capability when there is no target scope. A runtime-only
    TVM lacks the FFI function behind ``Target.current`` (AttributeError, so the kernels would
    not compile on load); without the compiler there are no target scopes, so answer None."""
    from tvm.target import _ffi_api as target_api  # noqa: PLC0415

    if runtime_only() and not hasattr(target_api, "TargetCurrent"):
        target_api.TargetCurrent = lambda allow_none=True: None


def error_line(err: BaseException) -> str:
    """The last non-empty line of an exception's text (TVM puts the message after a backtrace)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def cuda_compute_version() -> str | None:
    """The first CUDA GPU's compute capability ('9.0'), or None without a GPU or driver."""
    try:
        dev = open_device("cuda:0")
    except LookupError:
        return None
    return str(dev.compute_version)


def device_info(device: str) -> tuple[str, str]:
    """(name, compute version) of a GPU device, e.g. ('NVIDIA H200', '9.0')."""
    dev = open_device(device)
    return str(dev.device_name), str(dev.compute_version)


def vm_from_executable(executable: Any, device: str = "cpu") -> Any:
    from tvm.runtime.vm import VirtualMachine  # noqa: PLC0415

    _jit_in_parallel(executable)
    return VirtualMachine(executable, open_device(device))


#: A name no kernel has: looking it up makes an LLVM module JIT-compile itself, then fails.
_NO_SUCH_FUNCTION = "__amptool_jit_now__"


def _jit_in_parallel(executable: Any) -> None:
    """JIT-compile the executable's LLVM modules (``compiler.split_codegen`` splits the kernels over
    several) each in a thread of its own, before the VM runs them.

    Why: an in-memory build runs through LLVM's JIT, which compiles a module to machine code on
    its first function lookup — for the VM, one module after the other on one core. A ResNet-50's
    first run after an in-memory build (``diff``, every ``--auto-fallback`` step) took 1.9 s; with
    its two modules compiled side by side, 1.05 s (measured on 2 cores). TVM's calls release the GIL.
    """
    import concurrent.futures  # noqa: PLC0415
    import contextlib  # noqa: PLC0415

    modules = [m for m in getattr(getattr(executable, "mod", None), "imports", ()) if m.kind == "llvm"]
    if len(modules) < 2:
        return

    def compile_now(module: Any) -> None:
        with contextlib.suppress(AttributeError):  # the expected answer, once the module is compiled
            module.get_function(_NO_SUCH_FUNCTION, False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(modules)) as pool:
        list(pool.map(compile_now, modules))


def _device(device: str) -> Any:
    import tvm  # noqa: PLC0415

    kind, _, index = device.partition(":")
    return tvm.device(kind, int(index or 0))


def run_vm(vm: Any, arrays: list[np.ndarray], device: str = "cpu", deep_stack: bool = False) -> list[np.ndarray]:
    """Run 'main' on numpy inputs; returns the flattened outputs as numpy arrays. ``deep_stack``:
    the module holds run-time loops, run where their recursion fits (``on_deep_stack``)."""
    import tvm  # noqa: PLC0415

    dev = _device(device)
    # np.ascontiguousarray would turn a 0-d array into 1-d; np.require keeps the rank.
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]
    main = vm["main"]
    result = on_deep_stack(main, *args) if deep_stack else main(*args)
    return _flatten_outputs(result)


def prepared_call(vm: Any, arrays: list[np.ndarray], device: str = "cpu", deep_stack: bool = False) -> Any:
    """A no-argument callable running 'main' on ``arrays`` copied to the device once: what a
    deployment calls per inference, for timing. Outputs stay on the device."""
    import tvm  # noqa: PLC0415

    dev = _device(device)
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]
    main = vm["main"]
    sync = dev.sync if device != "cpu" else None

    def run() -> Any:
        result = main(*args)
        if sync is not None:
            sync()
        return result

    return (lambda: on_deep_stack(run)) if deep_stack else run


#: Stack of the thread that runs modules holding run-time loops: the VM recurses once per iteration
#: (a few KB a level), and frontend/loop_function.py bounds loops at 100,000 iterations.
DEEP_STACK_BYTES = 1 << 30
_DEEP_STACK: list[concurrent.futures.ThreadPoolExecutor] = []


def on_deep_stack(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a thread with a ``DEEP_STACK_BYTES`` stack (pages are committed as touched).

    Why: the main thread's 8 MB held ~2,500 iterations before the VM overflowed it (a segfault,
    where onnxruntime runs the loop); a thread's stack size is set when it starts."""
    if not _DEEP_STACK:
        previous = threading.stack_size(DEEP_STACK_BYTES)
        try:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="amptool-deep-stack")
            pool.submit(lambda: None).result()  # the thread starts now, under this stack size
        finally:
            threading.stack_size(previous)
        _DEEP_STACK.append(pool)
    return _DEEP_STACK[0].submit(fn, *args).result()


def _flatten_outputs(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [np.asarray(value.numpy())]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        out: list[np.ndarray] = []
        for item in value:
            out.extend(_flatten_outputs(item))
        return out
    return [np.asarray(value)]
