"""bfloat16 weights as pairs of SIMD vectors in uint32 words, for CPUs that compute bfloat16 in
float32 (no ``vdpbf16ps``, or one slower than two FMAs).

What: a packed weight's last axis — a block of ``B`` output channels, ``B / L`` vectors of ``L``
lanes — becomes ``B / 2`` uint32 words: vectors ``2i`` and ``2i + 1`` share words ``i·L … i·L +
L - 1``, the first in the low halves. A kernel decodes vector ``2i`` with a shift left by 16 and
vector ``2i + 1`` with an and of the high halves; both are exact.

Why: a bfloat16 vector loaded alone is ``vpmovzxwd`` + ``vpslld`` — two uops on the pipes an AVX2
core's FMAs share — and a load per vector; a pair from one load costs one shift and one and (LLVM
emits a blend with zero): half the uops and half the loads. ResNet-50 bfloat16 on an AVX2 EPYC
(kernel sums, 2 threads, alternated): 51.99 → 46.67 ms, below its float32 47.89
(benchmarks/README.md, eighteenth session).

When not: tiles of an odd number of vectors (nothing to pair), float16 (its conversion is one
``vcvtph2ps``), and the ``vdpbf16ps`` kernels (their own pair layout). Preserves: every weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pack_pairs(blocked: np.ndarray, lanes: int) -> np.ndarray:
    """``[…, B]`` bfloat16 (B a multiple of ``2 * lanes``) → ``[…, B/2]`` uint32 words."""
    *lead, block = blocked.shape
    bits = np.ascontiguousarray(blocked).view(np.uint16).astype(np.uint32)
    halves = bits.reshape(*lead, block // (2 * lanes), 2, lanes)
    words = halves[..., 0, :] | (halves[..., 1, :] << 16)
    return np.ascontiguousarray(words.reshape(*lead, block // 2))


def read(packed: Any, lead: tuple[Any, ...], channel: Any, lanes: int) -> Any:
    """The float32 weight of ``channel`` (its place in the block) at ``packed[*lead, …]``, a
    ``pack_pairs`` buffer: the low half of its word shifted up for an even vector of the block, the
    high half for an odd one (a constant once the vector loop is unrolled)."""
    from tvm import tirx  # noqa: PLC0415

    word = packed[(*lead, channel // (2 * lanes) * lanes + channel % lanes)]
    bits = tirx.if_then_else((channel // lanes) % 2 == 0, tirx.shift_left(word, tirx.const(16, "uint32")),
                             tirx.bitwise_and(word, tirx.const(0xFFFF0000, "uint32")))
    return tirx.reinterpret("float32", bits)


def block_of(buffer: Any) -> int:
    """Output channels per block of a packed weight buffer: its last axis, twice that for pairs."""
    return int(buffer.shape[-1]) * (2 if str(buffer.dtype) == "uint32" else 1)
