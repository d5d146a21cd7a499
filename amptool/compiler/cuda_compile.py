"""Compile amptool's generated CUDA with nvcc here, to prove it builds for the target's arch.

TVM 0.27's CUDA codegen always stores the kernels as CUDA *source* (module format 'cuda');
the CUDA runtime compiles them when the library is loaded on the GPU machine, through the
global ``tvm_callback_cuda_compile`` (``import tvm.support.nvcc`` registers it: NVRTC via the
``cuda-bindings`` package, or nvcc with ``TVM_CUDA_COMPILE_MODE=nvcc``). The runtime's binary
formats (cubin/fatbin) need its CUDA module, which loads only where libcuda (a driver) is, so a
machine without a GPU cannot embed a binary. What it can do is run nvcc over the same source:
a kernel that would fail to compile on load (a bad intrinsic for the arch, a bf16 operator)
fails here instead, with nvcc's message.

No ``--use_fast_math`` (TVM's own nvcc path adds it): approximate exp/div/sqrt would add error
that amptool's accuracy report would then blame on the low-precision conversion.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

_NVCC_FLAGS = (
    "-O3",
    "-w",  # TVM's source trips hundreds of unused-variable warnings; errors stay visible
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
)


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME / $CUDA_PATH / /usr/local/cuda; None if absent."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def sm_number(arch: str) -> str:
    """'sm_90' → '90' (also 'sm_90a' → '90a')."""
    if not arch.startswith("sm_") or not arch[3:5].isdigit():
        raise ValueError(f"not a CUDA arch: {arch!r} (expected sm_XX)")
    return arch[3:]


@dataclass(frozen=True)
class NvccResult:
    """A fatbin built from the source: SASS for the arch plus its PTX."""

    fatbin: bytes
    seconds: float
    command: tuple[str, ...]


def compile_fatbin(source: str, arch: str, nvcc: str | None = None) -> NvccResult:
    """Compile CUDA ``source`` for ``arch``; raises RuntimeError with nvcc's output on failure."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda)")
    num = sm_number(arch)  # sm_90a needs compute_90a: arch-specific features have no generic PTX
    with tempfile.TemporaryDirectory(prefix="amptool-nvcc-") as tmp:
        src, out = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.fatbin")
        with open(src, "w", encoding="utf-8") as handle:
            handle.write(source)
        cmd = (nvcc, "--fatbin", *_NVCC_FLAGS,
               "-gencode", f"arch=compute_{num},code=sm_{num}",
               "-gencode", f"arch=compute_{num},code=compute_{num}",
               "-o", out, src)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {arch}:\n{(proc.stdout + proc.stderr)[-4000:]}")
        with open(out, "rb") as handle:
            return NvccResult(handle.read(), seconds, cmd)
