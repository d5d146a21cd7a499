"""Every version-sensitive Apache TVM call lives here (measured on apache-tvm 0.27.0.post1).

TVM's Python API moved a lot between 0.19 and 0.27 (Relay removed, ``struct_info`` became
``ty``, ``tir`` became ``tirx``, targets must be dicts). Keeping the calls in one module means
an upgrade touches one file. TVM is imported lazily so ``amptool --help`` stays instant.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def tvm_module() -> Any:
    """Import TVM lazily (it takes ~1 s and 250 MB)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: F401,PLC0415

    return tvm


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


# --------------------------------------------------------------------------- types


def tensor_dtype(expr: Any) -> str | None:
    """The dtype of a tensor-typed Relax expression, or None for anything else.

    Hot: the mixed-precision pass asks several times per binding. Reading ``PrimType.dtype``
    builds a ``tvm_ffi.dtype`` (~1.5 µs); TVM interns PrimType nodes (one per dtype), so the
    string is memoised per node, the node kept alive with it so its handle stays its own.
    """
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, _relax_tensor_type()):
        return None
    prim = ty.dtype
    if prim is None:
        return None
    hit = _DTYPE_NAMES.get(prim.__chandle__())
    if hit is None:
        if len(_DTYPE_NAMES) > 256:  # PrimTypes built outside TVM's interning: stay bounded
            _DTYPE_NAMES.clear()
        hit = _DTYPE_NAMES[prim.__chandle__()] = (prim, str(prim) or None)
    return hit[1]


#: PrimType handle → (the PrimType, its dtype string or None).
_DTYPE_NAMES: dict[int, tuple[Any, str | None]] = {}


@functools.cache
def _relax_tensor_type() -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax.TensorType


def is_tuple_type(ty: Any) -> bool:
    from tvm import relax  # noqa: PLC0415

    return isinstance(ty, relax.TupleType)


def is_tuple_expr(expr: Any) -> bool:
    """Whether ``expr`` is a ``relax.Tuple`` literal (not a tuple-typed variable)."""
    return isinstance(expr, _relax_classes().Tuple)


@functools.cache
def _relax_classes() -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax


def is_constant(expr: Any) -> bool:
    import tvm  # noqa: PLC0415

    return isinstance(expr, tvm.ir.GenericConst)


def constant_numpy(expr: Any) -> np.ndarray:
    """The value of a Relax tensor constant as a numpy array (bf16 via ml_dtypes)."""
    import ml_dtypes  # noqa: F401,PLC0415

    return np.asarray(expr.value.numpy())


def constant_view(expr: Any) -> np.ndarray:
    """A read-only, zero-copy view of a constant's value (DLPack); a copy where numpy lacks
    the dtype. For checks that only read: ~0.5 µs instead of ~10 µs for ``constant_numpy``."""
    try:
        view = np.from_dlpack(expr.value)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return constant_numpy(expr)
    view.flags.writeable = False
    return view


def var_name(var: Any) -> str:
    return str(var.name)


def op_name(call: Any) -> str | None:
    """'relax.nn.conv2d' for a call to a registered op; None for calls to functions.

    Hot (once or more per binding in the mixed-precision pass): ops are interned, so each
    op's name is read once and memoised by handle, the op kept alive with it."""
    op = getattr(call, "op", None)
    if op is None:
        return None
    hit = _OP_NAMES.get(op.__chandle__())
    if hit is not None:
        return hit[1]
    if not isinstance(op, _ir_op_type()):
        return None
    _OP_NAMES[op.__chandle__()] = (op, str(op.name))
    return _OP_NAMES[op.__chandle__()][1]


#: Op handle → (the Op, its name).
_OP_NAMES: dict[int, tuple[Any, str]] = {}


@functools.cache
def _ir_op_type() -> Any:
    import tvm  # noqa: PLC0415

    return tvm.ir.Op


def registered_relax_ops() -> list[str]:
    import tvm  # noqa: PLC0415

    return sorted(n for n in tvm.ir.Op.list_op_names() if n.startswith("relax."))


def relax_functions(mod: Any) -> list[tuple[Any, Any]]:
    """(GlobalVar, relax.Function) pairs of a module; PrimFuncs are skipped."""
    from tvm import relax  # noqa: PLC0415

    return [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]


# --------------------------------------------------------------------------- passes


def fold_constant(mod: Any) -> Any:
    """Fold constant subexpressions (weight casts become low-precision constants)."""
    from tvm import relax  # noqa: PLC0415

    with quiet_native_stderr():
        return relax.transform.FoldConstant()(mod)


def assert_well_formed(mod: Any, after: str) -> None:
    """Postcondition of every pass: raise (a bug, not a user error) if ``mod`` is ill-formed."""
    from tvm import relax  # noqa: PLC0415

    try:
        relax.analysis.well_formed(mod)
    except Exception as err:
        raise RuntimeError(f"module is ill-formed after {after}: {err}") from err


def module_script(mod: Any) -> str:
    """The module as TVMScript text without ANSI colour."""
    return str(mod.script(show_meta=False))


# --------------------------------------------------------------------------- build & run


def host_cpu() -> str:
    """LLVM's name for this CPU ('znver4'); 'native' is silently ignored by LLVM 22."""
    import tvm  # noqa: PLC0415

    return str(tvm.target.codegen.llvm_get_system_cpu())


def make_target(spec: dict[str, Any]) -> Any:
    """A Target from a dict spec; 0.27 rejects the old 'llvm -mcpu=…' strings."""
    import tvm  # noqa: PLC0415

    return tvm.target.Target(spec)


def has_global_func(name: str) -> bool:
    import tvm  # noqa: PLC0415

    return tvm.get_global_func(name, allow_missing=True) is not None


#: Build pipelines: amptool's (fusion + packed kernels + schedules; LLVM only, other targets
#: fall back to TVM's) and TVM's own default (``tvm.compile``: unfused, unscheduled on CPU).
PIPELINES = ("amptool", "tvm")


def compile_module(mod: Any, target_spec: dict[str, Any], *, pipeline: str = "amptool") -> Any:
    """A Relax VM executable for ``target_spec``; see ``amptool.build.cpu`` for the CPU pipeline."""
    import tvm  # noqa: PLC0415

    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {PIPELINES}")
    target = make_target(target_spec)
    with quiet_native_stderr():
        if pipeline == "amptool" and str(target.kind.name) == "llvm":
            from amptool.build import cpu  # noqa: PLC0415

            executable, _timings = cpu.build(mod, target)
            return executable
        if pipeline == "amptool" and str(target.kind.name) in GPU_KINDS:
            from amptool.build import gpu  # noqa: PLC0415

            executable, _timings = gpu.build(mod, target)
            return executable
        return tvm.compile(mod, target=target)


#: Target kinds built by ``amptool.build.gpu`` (TVM's default CUDA pipeline segfaults on fp16).
GPU_KINDS = ("cuda", "vulkan")


def lower_module(mod: Any, target_spec: dict[str, Any]) -> Any:
    """The scheduled IRModule that codegen would take for ``target_spec`` (``--lower-only``):
    Relax lowered to VM calls, every PrimFunc scheduled. Needs no codegen for the target, so a
    Vulkan or CUDA target can be checked on a machine whose TVM cannot build for it."""
    import tvm  # noqa: PLC0415

    target = make_target(target_spec)
    kind = str(target.kind.name)
    with quiet_native_stderr():
        if kind == "llvm":
            from amptool.build import cpu  # noqa: PLC0415

            with target:
                for _name, passes in cpu.stage_passes(target):
                    mod = tvm.transform.Sequential(passes)(mod)
            return mod
        if kind in GPU_KINDS:
            from amptool.build import gpu  # noqa: PLC0415

            return gpu.lower(mod, target)
    raise ValueError(f"no lowering for target kind {kind!r}")


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


def export_library(executable: Any, path: str) -> None:
    with quiet_native_stderr():
        executable.export_library(path)


def load_vm(path: str, device: str = "cpu") -> Any:
    """A VirtualMachine over an exported library.

    Runtime only (``tvm.runtime.vm``, not ``tvm.relax``): an artifact loads under a TVM without
    the compiler library (no ``lib/libtvm_compiler.so``, or ``TVM_USE_RUNTIME_LIB=1``)."""
    import tvm  # noqa: PLC0415
    from tvm.runtime.vm import VirtualMachine  # noqa: PLC0415

    dev = open_device(device)
    with quiet_native_stderr():
        lib = tvm.runtime.load_module(path)
        return VirtualMachine(lib, dev)


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
        import tvm.support.nvcc  # noqa: F401,PLC0415

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


def llvm_is_valid_cpu(cpu: str, triple: str | None = None) -> bool:
    import tvm  # noqa: PLC0415

    codegen = tvm.target.codegen
    return bool(codegen.llvm_is_valid_cpu(cpu, triple or codegen.llvm_get_system_triple()))


def llvm_unknown_features(spec: dict[str, Any]) -> list[str]:
    """Features in ``spec['mattr']`` LLVM does not know. LLVM only warns on stderr
    ("'+x' is not a recognized feature for this target") and ignores them; read that warning."""
    import tempfile  # noqa: PLC0415

    import tvm  # noqa: PLC0415

    target = make_target(spec)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            tvm.target.codegen.llvm_get_cpu_features(target)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    return re.findall(r"'[+-]?([^']+)' is not a recognized feature", text)


def vm_from_executable(executable: Any, device: str = "cpu") -> Any:
    from tvm.runtime.vm import VirtualMachine  # noqa: PLC0415

    return VirtualMachine(executable, open_device(device))


def _device(device: str) -> Any:
    import tvm  # noqa: PLC0415

    kind, _, index = device.partition(":")
    return tvm.device(kind, int(index or 0))


def run_vm(vm: Any, arrays: list[np.ndarray], device: str = "cpu") -> list[np.ndarray]:
    """Run 'main' on numpy inputs; returns the flattened outputs as numpy arrays."""
    import tvm  # noqa: PLC0415

    dev = _device(device)
    # np.ascontiguousarray would turn a 0-d array into 1-d; np.require keeps the rank.
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]
    result = vm["main"](*args)
    return _flatten_outputs(result)


def prepared_call(vm: Any, arrays: list[np.ndarray], device: str = "cpu") -> Any:
    """A no-argument callable running 'main' on ``arrays`` copied to the device once: what a
    deployment calls per inference, for timing. Outputs stay on the device."""
    import tvm  # noqa: PLC0415

    dev = _device(device)
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]
    main = vm["main"]
    sync = dev.sync if device != "cpu" else None

    def call() -> Any:
        result = main(*args)
        if sync is not None:
            sync()
        return result

    return call


def _flatten_outputs(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [np.asarray(value.numpy())]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        out: list[np.ndarray] = []
        for item in value:
            out.extend(_flatten_outputs(item))
        return out
    return [np.asarray(value)]


def versions() -> dict[str, str]:
    import tvm  # noqa: PLC0415

    found = {"apache-tvm": str(tvm.__version__)}
    try:
        import tvm_ffi  # noqa: PLC0415

        found["apache-tvm-ffi"] = str(getattr(tvm_ffi, "__version__", "unknown"))
    except ImportError:  # pragma: no cover
        pass
    return found


def count_prim_funcs(mod: Any) -> int:
    """Kernels (TIR PrimFuncs) in a lowered module."""
    import tvm  # noqa: PLC0415

    return sum(1 for _gv, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc))


def toolchain_versions(target_spec: dict[str, Any]) -> dict[str, str]:
    """The code generator's toolchain for a build: LLVM's major version, the CUDA toolkit's."""
    import tvm  # noqa: PLC0415

    found = {"llvm": str(tvm.target.codegen.llvm_version_major(allow_none=True))}
    if target_spec.get("kind") == "cuda":
        try:
            from tvm.support import nvcc  # noqa: PLC0415

            found["cuda"] = ".".join(str(part) for part in nvcc.get_cuda_version())
        except Exception:  # no toolkit: the library carries CUDA source, JIT-compiled on load
            found["cuda"] = "not found"
    return found


# --------------------------------------------------------------------------- op rebuilding

#: Ops whose accumulation dtype is their ``out_dtype`` attribute.
OUT_DTYPE_OPS = (
    "relax.nn.conv1d",
    "relax.nn.conv2d",
    "relax.nn.conv3d",
    "relax.nn.conv1d_transpose",
    "relax.nn.conv2d_transpose",
    "relax.nn.conv3d_transpose",
    "relax.matmul",
)

_ATTR_METHODS = frozenset({"id_", "is_", "same_as", "get_int", "get_int_tuple", "get_str"})


#: Attribute names per attrs class: ``dir()`` costs ~20 µs, once per class is enough.
_ATTR_NAMES: dict[type, tuple[str, ...]] = {}


def attrs_dict(call: Any) -> dict[str, Any]:
    """An op call's attributes as keyword arguments of its Python constructor."""
    import tvm  # noqa: PLC0415

    attrs = call.attrs
    if attrs is None:
        return {}
    names = _ATTR_NAMES.get(type(attrs))
    if names is None:
        names = tuple(k for k in dir(attrs) if not k.startswith("_") and k not in _ATTR_METHODS)
        if not isinstance(attrs, tvm.ir.DictAttrs):  # a DictAttrs' keys vary per instance
            _ATTR_NAMES[type(attrs)] = names
    return {k: getattr(attrs, k) for k in names}


def call_with_out_dtype(call: Any, args: list[Any], out_dtype: str) -> Any:
    """Rebuild a conv/matmul call on new args with a new ``out_dtype`` (its accumulation).

    Uses the op's Python constructor: building ``relax.Call`` with a dict of attrs
    segfaults in 0.27.
    """
    from tvm import relax  # noqa: PLC0415

    name = op_name(call)
    assert name in OUT_DTYPE_OPS, name
    ctor: Any = relax.op
    for part in name.split(".")[1:]:
        ctor = getattr(ctor, part)
    kwargs = attrs_dict(call)
    kwargs["out_dtype"] = out_dtype
    return ctor(*args, **kwargs)


def call_with_args(call: Any, args: list[Any]) -> Any:
    """``call`` with new arguments, its result type left for the builder to infer."""
    import tvm  # noqa: PLC0415

    return _constructors().call(tvm.ir.Type.missing(), call.op, args, call.attrs, call.ty_args, call.span)


def array_items(array: Any) -> list[Any]:
    """The elements of a TVM Array (``call.args``…) as a list: one FFI call per element, where
    iterating the Python wrapper makes two plus index checks (~1 µs per element saved)."""
    size, get = _constructors().array_size, _constructors().array_get
    return [get(array, i) for i in range(size(array))]


def var_binding(var: Any, value: Any) -> Any:
    """``relax.VarBinding(var, value)`` through its FFI constructor."""
    return _constructors().var_binding(var, value, None)


def astype(expr: Any, dtype: str) -> Any:
    """``relax.op.astype`` through its FFI constructor (one per cast the pass emits)."""
    return _constructors().astype(expr, dtype)


def new_var(name: str, ty: Any, *, dataflow: bool) -> Any:
    """A ``relax.DataflowVar`` (or ``relax.Var``) named ``name`` of type ``ty``."""
    ctors = _constructors()
    return (ctors.dataflow_var if dataflow else ctors.var)(name, ty, None)


@dataclass(frozen=True)
class _Constructors:
    call: Any
    var: Any
    dataflow_var: Any
    astype: Any
    var_binding: Any
    array_size: Any
    array_get: Any


@functools.cache
def _constructors() -> _Constructors:
    """The FFI constructors behind ``relax.Call``, ``relax.Var`` and ``relax.DataflowVar``.

    The mixed-precision pass builds one call and one var per binding. The Python classes
    re-import modules and convert their arguments on every call: ``relax.Call(...)`` costs
    ~10 µs in 0.27, its FFI constructor ~1 µs (same node: ``Call.__init__`` passes
    ``Type.missing()`` as the result type). Same arguments as the Python constructors.
    """
    from tvm.ir import _ffi_api as ir_api  # noqa: PLC0415
    from tvm.relax import _ffi_api as relax_api  # noqa: PLC0415
    from tvm.relax.op import _ffi_api as op_api  # noqa: PLC0415
    from tvm_ffi import _ffi_api as ffi_api  # noqa: PLC0415

    return _Constructors(call=ir_api.Call, var=ir_api.Var, dataflow_var=relax_api.DataflowVar, astype=op_api.astype,
                         var_binding=relax_api.VarBinding, array_size=ffi_api.ArraySize,
                         array_get=ffi_api.ArrayGetItem)
