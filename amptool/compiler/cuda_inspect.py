"""Which CUDA kernels of a build run on tensor cores: read from the generated source.

A kernel uses tensor cores when its body issues warp-level matrix instructions: WMMA
(``nvcuda::wmma::mma_sync``), PTX ``mma.sync`` / ``wgmma`` or ``ldmatrix`` loads. GEMM
kernels are recognised by name: TVM names a fused kernel after the Relax ops it holds
(``fused_matmul_add_kernel``, ``fused_conv2d_add_relu_kernel``). A GEMM kernel whose
parameters are half or bfloat16 and that issues none of those instructions runs on the FMA
units: ``gemm_without_tensor_cores`` lists them (GEMVs — one output row — land there by design).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TENSOR_CORE_MARKERS = ("wmma::mma_sync", "mma.sync", "wgmma", "ldmatrix")
GEMM_NAME = re.compile(r"(?:^|_)(?:matmul|conv\d?d|dense|batch_matmul)(?:\d*)(?:_|$)")
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(')


@dataclass(frozen=True)
class Kernel:
    name: str
    tensor_cores: bool
    gemm: bool
    low_precision: bool  # takes half or bfloat16 buffers


def cuda_sources(executable: Any) -> list[str]:
    """The CUDA source of every CUDA module in ``executable``'s import tree."""
    found: list[str] = []

    def walk(mod: Any) -> None:
        if str(mod.kind) == "cuda":
            found.append(str(mod.inspect_source("")))
        for child in mod.imports:
            walk(child)

    walk(executable.mod if hasattr(executable, "mod") else executable)
    return found


def kernels(source: str) -> list[Kernel]:
    """Each ``__global__`` kernel defined (not just declared) in ``source``."""
    matches = list(_KERNEL.finditer(source))
    found: list[Kernel] = []
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(source)
        text = source[match.end():end]
        brace, semi = text.find("{"), text.find(";")
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration
        params, body = text[:brace], text[brace:]
        name = match.group(1)
        found.append(Kernel(
            name=name,
            tensor_cores=any(marker in body for marker in TENSOR_CORE_MARKERS),
            gemm=GEMM_NAME.search(name.removesuffix("_kernel")) is not None,
            low_precision="half" in params or "bfloat16" in params,
        ))
    return found


def tensor_core_kernels(executable: Any) -> dict[str, Any]:
    """Counts and names of the build's CUDA kernels with and without tensor-core instructions."""
    found = [k for source in cuda_sources(executable) for k in kernels(source)]
    return {
        "kernels": len(found),
        "with_tensor_cores": sorted(k.name for k in found if k.tensor_cores),
        "without": sorted(k.name for k in found if not k.tensor_cores),
        "gemm_kernels": sum(1 for k in found if k.gemm),
        "gemm_without_tensor_cores": sorted(
            k.name for k in found if k.gemm and k.low_precision and not k.tensor_cores
        ),
        "code": "CUDA source, compiled by the TVM runtime when the library is loaded",
    }
