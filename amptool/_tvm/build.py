"""Targets and compilation: the target spec, the build and lower entry points, exported
libraries, LLVM and toolchain facts."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from amptool._tvm.common import quiet_native_stderr


def host_cpu() -> str:
    """LLVM's name for this CPU ('znver4'); 'native' is silently ignored by LLVM 22."""
    import tvm  # noqa: PLC0415

    return str(tvm.target.codegen.llvm_get_system_cpu())


#: /proc/cpuinfo flag → LLVM feature, for the x86 features amptool's kernels or LLVM's vectorizer use.
CPUINFO_TO_LLVM = {
    "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512dq": "avx512dq",
    "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512_vbmi2": "avx512vbmi2", "avx512_vnni": "avx512vnni",
    "avx512_bitalg": "avx512bitalg", "avx512_vpopcntdq": "avx512vpopcntdq", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "avx_vnni": "avxvnni", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16",
    "amx_int8": "amx-int8", "amx_fp16": "amx-fp16", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq",
}


def host_feature_corrections(cpu: str, flags: frozenset[str] | None = None) -> list[str]:
    """``mattr`` entries (``+avx512bf16``, ``-avx512f``) where this host's CPU differs from what LLVM
    assumes for its CPU name ``cpu``; [] off x86 Linux.

    Why: LLVM names the CPU from its family and model, and a hypervisor may report a model that
    is not the real one: an AMX server VM here said model 167, which LLVM calls 'rocketlake' (no
    AVX512-BF16, AVX512-FP16 or AMX), and a VM with AVX-512 switched off under a model that has it
    would get code that dies of SIGILL. The kernel's flags list what the CPU really runs.
    """
    flags = _cpuinfo_flags() if flags is None else flags
    if not flags:
        return []
    wanted = {llvm: cpuinfo in flags for cpuinfo, llvm in CPUINFO_TO_LLVM.items()}
    assumed = llvm_cpu_features({"kind": "llvm", "mcpu": cpu}, [*sorted(wanted), "sse2"])
    if not assumed["sse2"]:
        return []  # not an x86 CPU LLVM knows: its feature names mean nothing there
    return [("+" if has else "-") + name for name, has in sorted(wanted.items()) if has != assumed[name]]


def _cpuinfo_flags() -> frozenset[str]:
    """The first CPU's ``flags`` in /proc/cpuinfo (x86 Linux), or empty."""
    return frozenset((cpuinfo_field("flags") or "").split())


def cpuinfo_field(key: str) -> str | None:
    """The first CPU's ``key`` line in /proc/cpuinfo ('model name', 'flags'), None where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(key):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def make_target(spec: dict[str, Any]) -> Any:
    """A Target from a dict spec; 0.27 rejects the old 'llvm -mcpu=…' strings."""
    import tvm  # noqa: PLC0415

    return tvm.target.Target(spec)


def export_library(executable: Any, path: str, cross_cc: str | None = None) -> None:
    """Write the shared library; ``cross_cc`` links it with another architecture's compiler
    (``aarch64-linux-gnu-g++``) for a build whose ``mtriple`` is not this host's."""
    fcompile = None
    if cross_cc:
        from tvm.support import cc  # noqa: PLC0415

        fcompile = cc.cross_compiler(cross_cc)
    with quiet_native_stderr():
        if fcompile is None and _export_llvm_in_parallel(executable.mod, path):
            return
        executable.export_library(path, fcompile=fcompile)


#: The symbol through which TVM's library loader finds an exported library's packed imports.
LIBRARY_BLOB_SYMBOL = "__tvm_ffi__library_bin"


def _export_llvm_in_parallel(module: Any, path: str) -> bool:
    """TVM's ``export_library`` for a module tree whose compiled code is LLVM objects: the CPU
    build's several modules (``compiler.split_codegen`` splits the kernels so) or a GPU build's host
    modules (their device code is imported, packed with the weights), with each object file —
    LLVM's instruction selection, the costly part — written in a thread of its own; False, having
    written nothing, for any other module tree (then TVM's export runs).

    Why: TVM writes the objects one after the other: 0.9 + 0.8 s of a ResNet-50's export on one
    core of two (measured), and LLVM releases the GIL. The link and the packed imports (the VM
    bytecode and weights, ``devc.o``) are TVM's own calls, in TVM's order.
    """
    import concurrent.futures  # noqa: PLC0415
    import functools  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from tvm.runtime import _ffi_api as runtime_api  # noqa: PLC0415
    from tvm.support import cc  # noqa: PLC0415

    from amptool._tvm import elf  # noqa: PLC0415

    objects = module._collect_dso_modules()
    if not objects or any(m.kind != "llvm" for m in objects) or not module.imports:
        return False
    first = objects[0]
    if first.get_function("__tvm_is_system_module")():
        return False
    llvm_target = first.get_function("_get_target_string")()
    prefix = first.get_function("__tvm_get_system_lib_prefix")() or ""
    with tempfile.TemporaryDirectory(prefix="amptool-export-") as workspace:
        files = [os.path.join(workspace, f"lib{i}.o") for i in range(len(objects))]
        packed = os.path.join(workspace, f"{prefix}devc.o")
        machine = elf.host_machine()

        def pack_imports() -> memoryview | None:
            """The VM bytecode and constants as one global, ``__tvm_ffi__library_bin`` (TVM's name for it):
            the bytes TVM's LLVM packer would hold (0.65 s of CPU for 100 MB of weights), in an object of
            our own where this host's ELF is known — with a hole for them, the bytes returned for
            ``elf.fill_symbol`` to write into the linked library; None when TVM's packer wrote them."""
            if machine is None or prefix:
                runtime_api.ModulePackImportsToLLVM(module, False, llvm_target, prefix).write_to_file(packed)
                return None
            blob = np.from_dlpack(runtime_api.ModulePackImportsToTensor(module)).data
            write_blob_object(blob, machine, hole=True)
            return blob

        def write_blob_object(blob: memoryview, machine: int, hole: bool) -> None:
            with open(packed, "wb") as handle:
                elf.write_rodata_object(handle, LIBRARY_BLOB_SYMBOL, blob, machine, hole=hole)

        writes: list[Callable[[], object]] = [
            functools.partial(m.write_to_file, f) for m, f in zip(objects, files, strict=True)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(writes)) as pool:
            written = [pool.submit(write) for write in writes]
            # In this thread: glibc gives another thread's blocks over 64 MB fresh mmaps whatever
            # mallopt says (``cli.main._keep_freed_memory``), and the serialisation's growing buffer
            # faulted in 3.2 GB for BERT-base's 416 MB (8.1 s in a worker, 3.6-3.9 s here; measured).
            blob = pack_imports()
            for done in written:
                done.result()
        # gold links the ~100 MB of a ResNet-50's weights in 0.25 s, GNU ld in 0.43 s, and either spends
        # ~0.2 s of it on a SHA-1 build ID over the weights, which nothing reads (measured): none.
        options = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
        if sys.platform.startswith("linux"):
            options.append("-Wl,--build-id=none")
        cc.create_shared(path, [*files, packed], options=options)
        if blob is not None and machine is not None and not elf.fill_symbol(path, LIBRARY_BLOB_SYMBOL, blob):
            write_blob_object(blob, machine, hole=False)  # a linker that did not keep the symbol whole: link the bytes
            cc.create_shared(path, [*files, packed], options=options)
    return True


def system_triple() -> str:
    """LLVM's triple for this host ('x86_64-pc-linux-gnu'): what a build without -mtriple targets."""
    import tvm  # noqa: PLC0415

    return str(tvm.target.codegen.llvm_get_system_triple())


def llvm_is_valid_cpu(cpu: str, triple: str | None = None) -> bool:
    import tvm  # noqa: PLC0415

    codegen = tvm.target.codegen
    return bool(codegen.llvm_is_valid_cpu(cpu, triple or codegen.llvm_get_system_triple()))


def llvm_cpu_features(spec: dict[str, Any], names: Sequence[str]) -> dict[str, bool]:
    """Which of ``names`` (LLVM feature names: 'f16c', 'avx512bf16') the spec's CPU has, after
    its ``mattr``; for a non-x86 or unknown CPU, every answer is False."""
    import tvm  # noqa: PLC0415

    with quiet_native_stderr():
        target = make_target(spec)
        return {name: bool(tvm.target.codegen.llvm_cpu_has_features([name], target)) for name in names}


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
        except Exception:  # noqa: BLE001 - no toolkit: the library carries CUDA source, JIT-compiled on load
            found["cuda"] = "not found"
    return found
