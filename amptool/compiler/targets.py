"""Target registry: a name → how to build for it, and whether this machine can.

A registry is a plain mapping of names to frozen specs behind ``get_target(name)``;
``resolve_target`` adds the per-build choices (``--cuda-arch``, ``--target-options``) and
returns the dict spec TVM takes (0.27 rejects ``"llvm -mcpu=…"`` strings).

Capability is checked up front, so a target that this TVM cannot build stops with one line
naming what is missing (exit 3) before any work is done. ``--lower-only`` needs no codegen:
lowering and scheduling work for every known target, so a model can be checked for Vulkan or
CUDA before the toolchain is installed.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from amptool import _tvm
from amptool.errors import TargetUnavailableError, UserError

#: CUDA arch when no GPU is visible at build time: Hopper (H100/H200). Code built for sm_90
#: does not run on older GPUs; pass --cuda-arch for them (sm_80 A100, sm_89 L4/4090, …).
DEFAULT_CUDA_ARCH = "sm_90"
_ARCH = re.compile(r"sm_(\d{2,3})[a-z]?")
#: LLVM options --target-options understands, and the target-dict key each sets.
LLVM_OPTIONS = {"-mcpu": "mcpu", "-mattr": "mattr", "-mtriple": "mtriple"}


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    device: str
    build_spec: Callable[[], dict[str, Any]]  # the default spec
    missing: Callable[[], str | None]  # None when buildable here, else what is missing and how to get it


@dataclass(frozen=True)
class ResolvedTarget:
    """One build's target: the dict spec TVM takes, the device it runs on, and where the
    CUDA arch came from (``--cuda-arch``, ``local GPU`` or ``default``)."""

    name: str
    spec: dict[str, Any]
    device: str
    arch: str | None = None
    arch_source: str | None = None
    options: tuple[str, ...] = ()


def host_llvm_spec() -> dict[str, Any]:
    """This host's CPU by LLVM's name, and the features it has that the name does not say (or says
    wrongly: a VM's reported model can be another CPU's). Plain "llvm" is generic x86-64 without
    F16C: float16 is then 12–16× slower than float32; naming the CPU enables F16C/AVX-512."""
    cpu, corrections = _host_cpu_and_corrections()
    return {"kind": "llvm", "mcpu": cpu, **({"mattr": list(corrections)} if corrections else {})}


@functools.cache
def _host_cpu_and_corrections() -> tuple[str, tuple[str, ...]]:
    cpu = _tvm.host_cpu()
    return cpu, tuple(_tvm.host_feature_corrections(cpu))


def _llvm_missing() -> str | None:
    return None if _tvm.has_global_func("target.build.llvm") else "this TVM has no LLVM codegen"


def _vulkan_missing() -> str | None:
    if not _tvm.has_global_func("target.build.vulkan"):
        return (
            "this TVM was built without Vulkan codegen (target.build.vulkan is missing); "
            "install a TVM built from source with USE_VULKAN=ON (the PyPI wheel has none)"
        )
    return None


def _cuda_missing() -> str | None:
    if not _tvm.has_global_func("target.build.cuda"):
        return (
            "this TVM was built without CUDA codegen (target.build.cuda is missing); "
            "install a TVM built with USE_CUDA=ON (the apache-tvm PyPI wheel has it)"
        )
    return None


TARGETS: dict[str, TargetSpec] = {
    "llvm": TargetSpec("llvm", "CPU via LLVM, tuned to this host's CPU", "cpu", host_llvm_spec, _llvm_missing),
    "cuda": TargetSpec("cuda", "NVIDIA GPU", "cuda", lambda: {"kind": "cuda", "arch": DEFAULT_CUDA_ARCH},
                       _cuda_missing),
    "vulkan": TargetSpec("vulkan", "Vulkan GPU", "vulkan", lambda: {"kind": "vulkan", "supports_float16": True},
                         _vulkan_missing),
}


def known_target(name: str) -> TargetSpec:
    """The spec for ``name`` without the capability check; UserError when unknown."""
    spec = TARGETS.get(name)
    if spec is None:
        available = [n for n, t in TARGETS.items() if t.missing() is None]
        raise UserError(
            f"Unknown target '{name}'. Available here: {', '.join(available)}.",
            f"Known targets: {', '.join(TARGETS)}.",
        )
    return spec


def get_target(name: str) -> TargetSpec:
    """The spec for ``name``; raises UserError (unknown) or TargetUnavailableError (exit 3)."""
    spec = known_target(name)
    reason = spec.missing()
    if reason is not None:
        raise TargetUnavailableError(
            f"Target '{name}' is not available here: {reason}",
            f"Use --target llvm here, or check the model for {name} with --lower-only (no codegen needed).",
        )
    return spec


def resolve_target(name: str, cuda_arch: str | None = None, options: Sequence[str] = (), *,
                   lower_only: bool = False) -> ResolvedTarget:
    """The target for one build. Flags that do not apply to ``name`` are user errors; a target
    this TVM cannot build is TargetUnavailableError unless ``lower_only``."""
    check_target_flags(name, cuda_arch, options)
    target = known_target(name) if lower_only else get_target(name)
    spec = target.build_spec()
    if name == "cuda":
        arch, source = (check_cuda_arch(cuda_arch), "--cuda-arch") if cuda_arch else local_cuda_arch()
        return ResolvedTarget(name, {**spec, "arch": arch}, target.device, arch, source)
    if name == "llvm" and options:
        parsed = parse_llvm_options(options)
        if "mtriple" in parsed and "mcpu" not in parsed:
            spec = {k: v for k, v in spec.items() if k != "mcpu"}  # this host's CPU means nothing on another arch
        if "mcpu" in parsed or "mtriple" in parsed:
            spec.pop("mattr", None)  # this host's feature corrections are about this host's CPU only
        elif "mattr" in parsed:
            parsed = {**parsed, "mattr": [*spec.get("mattr", []), *parsed["mattr"]]}  # the user's come last, and win
        spec = {**spec, **parsed}
        _check_llvm_spec(spec)
        if not lower_only:
            cross_compiler(spec)  # exit 3 now, not after the compile, when the linker is missing
    return ResolvedTarget(name, spec, target.device, options=tuple(options))


def require_device(target: ResolvedTarget, device: str | None = None) -> None:
    """TargetUnavailableError (exit 3) unless the device ``target`` runs on is here."""
    triple = target.spec.get("mtriple")
    if triple and triple_arch(triple) != host_arch():
        raise TargetUnavailableError(f"-mtriple={triple} builds here but cannot run on this {host_arch()} machine",
                                     "Run it on such a device with --rpc/--rpc-server (docs/remote.md); "
                                     "'amptool convert' alone needs none.")
    use = device or target.device
    if use == "cpu":
        return
    try:
        _tvm.open_device(use)
    except LookupError as err:
        raise TargetUnavailableError(f"Target '{target.name}' builds here but cannot run: {err}",
                                     "Run on a machine with that device; 'amptool convert' alone needs none.") from err


def check_target_flags(name: str, cuda_arch: str | None, options: Sequence[str]) -> None:
    """The checks that need no TVM: a known name, flags that apply to it, their syntax."""
    known_target(name)
    if cuda_arch is not None and name != "cuda":
        raise UserError(f"--cuda-arch {cuda_arch}: only used with --target cuda (got --target {name})")
    if options and name != "llvm":
        raise UserError(f"--target-options: only used with --target llvm (got --target {name})",
                        "For CUDA choose the architecture with --cuda-arch sm_XX.")
    if cuda_arch is not None:
        check_cuda_arch(cuda_arch)
    parse_llvm_options(options)


#: TVM's CUDA tensor intrinsics (248 TVMScript functions, ~4 s to import on 2 cores): DLight's
#: tensor-core rule imports them for the first float16/bfloat16 GEMM of a build for sm_70+.
CUDA_TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin.cuda"


def slow_imports(name: str, cuda_arch: str | None, dtype: str) -> tuple[str, ...]:
    """The TVM modules beyond TVM itself that a ``dtype`` build for target ``name`` will import and
    that take seconds: convert imports them in the background beside load and prepare
    (``_tvm.import_in_background``). An arch not given is taken as sm_70+ (the default and every
    GPU of the last years)."""
    if name != "cuda" or dtype == "float32":
        return ()
    return (CUDA_TENSOR_INTRINSICS,) if arch_version(cuda_arch or DEFAULT_CUDA_ARCH) >= 70 else ()


def arch_version(arch: str) -> int:
    """80 for ``sm_80`` (90 for ``sm_90a``); -1 for anything that is no CUDA arch."""
    match = _ARCH.fullmatch(arch)
    return int(match.group(1)) if match else -1


def check_cuda_arch(text: str) -> str:
    """``sm_XX`` (``sm_90a`` too), or a UserError."""
    match = _ARCH.fullmatch(text)
    if match is None or int(match.group(1)) < 50:
        raise UserError(f"--cuda-arch '{text}' is not a CUDA architecture sm_50 or newer, like sm_80 or sm_90",
                        "Write sm_ and the compute capability without the dot (8.6 → sm_86); "
                        "nvidia-smi --query-gpu=compute_cap shows it.")
    return text


def local_cuda_arch() -> tuple[str, str]:
    """(arch, source): the local GPU's compute capability, else ``DEFAULT_CUDA_ARCH``."""
    version = _tvm.cuda_compute_version() or _nvidia_smi_compute_cap()
    if version:
        return "sm_" + version.replace(".", ""), "local GPU"
    return DEFAULT_CUDA_ARCH, "default"


def _nvidia_smi_compute_cap() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    return first if re.fullmatch(r"\d+\.\d+", first) else None


def parse_llvm_options(options: Sequence[str]) -> dict[str, Any]:
    """``-mcpu=NAME``, ``-mattr=+f1,-f2`` and ``-mtriple=ARCH-VENDOR-OS`` (space-separated in one or
    more strings) → target-dict keys."""
    found: dict[str, Any] = {}
    for token in (t for text in options for t in text.split()):
        flag, sep, value = token.partition("=")
        key = LLVM_OPTIONS.get(flag)
        if key is None or not sep or not value:
            raise UserError(f"--target-options: '{token}' is not one of -mcpu=NAME, -mattr=+FEATURE,-FEATURE, "
                            "-mtriple=TRIPLE",
                            "e.g. --target-options '-mcpu=skylake-avx512 -mattr=+avx2,-avx512f'.")
        if key == "mattr":
            features = [f for f in value.split(",") if f]
            bad = [f for f in features if f[0] not in "+-" or len(f) < 2]
            if bad:
                raise UserError(f"--target-options -mattr: '{bad[0]}' needs a + or - before the feature name",
                                "e.g. -mattr=+avx2,-avx512f.")
            found["mattr"] = [*found.get("mattr", []), *features]
        else:
            found[key] = value
    return found


def _check_llvm_spec(spec: dict[str, Any]) -> None:
    """LLVM accepts unknown CPUs and features silently (and builds generic code): refuse them."""
    triple = spec.get("mtriple")
    if triple and not _tvm.llvm_is_valid_cpu("generic", triple):
        raise UserError(f"--target-options -mtriple={triple}: LLVM does not know this triple",
                        "Write ARCH-VENDOR-OS, e.g. -mtriple=aarch64-linux-gnu or -mtriple=x86_64-linux-gnu.")
    if "mcpu" in spec and not _tvm.llvm_is_valid_cpu(spec["mcpu"], triple):
        hint = (f"'llc -mtriple={triple} -mcpu=help' lists the names." if triple
                else f"This machine's CPU is {_tvm.host_cpu()}; 'llc -mcpu=help' lists the names.")
        raise UserError(f"--target-options -mcpu={spec['mcpu']}: LLVM does not know this CPU", hint)
    unknown = _tvm.llvm_unknown_features(spec) if spec.get("mattr") else []
    if unknown:
        raise UserError(f"--target-options -mattr: LLVM does not know feature(s) {', '.join(unknown)}",
                        "'llc -mattr=help' lists the names (e.g. avx2, avx512f, f16c, avx512bf16).")


def triple_arch(triple: str) -> str:
    """The architecture part of a target triple, with its aliases folded (arm64 → aarch64)."""
    arch = triple.split("-", 1)[0].lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(arch, arch)


def host_arch() -> str:
    """This machine's architecture as a triple names it (``platform.machine()``, no TVM needed)."""
    import platform  # noqa: PLC0415

    return triple_arch(platform.machine())


def cross_compiler(spec: dict[str, Any]) -> str | None:
    """The C++ compiler that links a library for ``spec``'s ``mtriple`` when that is another
    architecture than this host's; None for a native build. TargetUnavailableError (exit 3)
    when it is not installed: TVM's LLVM emits the object code, but the shared library needs
    the target's linker and C runtime (Debian: ``apt-get install g++-aarch64-linux-gnu``)."""
    triple = spec.get("mtriple")
    if not triple or triple_arch(triple) == host_arch():
        return None
    arch = triple_arch(triple)
    names = [f"{triple}-g++", f"{triple}-gcc", f"{arch}-linux-gnu-g++", f"{arch}-linux-gnu-gcc"]
    for name in dict.fromkeys(names):
        found = shutil.which(name)
        if found:
            return found
    raise TargetUnavailableError(
        f"Cannot link for -mtriple={triple}: no cross compiler ({' or '.join(dict.fromkeys(names[::2]))}) on PATH",
        f"Install one (Debian/Ubuntu: apt-get install g++-{arch}-linux-gnu), "
        "or check the model with --lower-only (no linker needed).",
    )