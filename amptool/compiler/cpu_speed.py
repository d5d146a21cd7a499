"""Is a low dtype fast on the CPU a build targets? One warning when it is not.

A CPU computes float16 or bfloat16 quickly only with the instructions for it; without them the
build still runs, through conversions, and users find out from a slow deployment. Measured with
``amptool bench`` on resnet_like (the test zoo's ResNet, 1 thread, one run, znver4 with the
features switched off by ``--target-options -mattr=-F``; ratios against float32 of that target):

================================  ====================  =========================================
target CPU                        float16 / float32      bfloat16 / float32
================================  ====================  =========================================
no F16C (-mattr=-f16c)            33.6× (software cvt)   0.95×
F16C, no AVX512-FP16 (znver4)     1.01× (no speed-up)    —
no AVX512-BF16 (-mattr=-avx512bf16)  —                   1.02× (no speed-up)
AVX512-BF16 (znver4)              —                      0.76×
AVX512-BF16, slow (emeraldrapids)  —                     1.03× (FMA kernels; ResNet-50, 2 threads)
AVX2 only (znver3, an EPYC VM)     1.02× / 1.04× / 0.96×  0.95× / 0.75× / 0.87×
AMX-BF16 (a Sapphire Rapids VM)    1.12× / 1.06× / 1.00×  0.20× / 0.53× / 0.23× (AMX: ``cpu_amx``)
================================  ====================  =========================================

(The AVX2 and AMX rows: ResNet-50 / MobileNetV2 / BERT-base, 2 threads, ``cpu_speed.py`` medians,
2026-12-04 and 2026-12-05; the AVX2 row with bfloat16 weights read as pairs of vectors
(``bf16_pairs``) — before them bfloat16 was 1.05–1.09× float32 there. The pairs apply to AVX-512
CPUs without a fast ``vdpbf16ps`` too; the 1.02× and 1.03× rows above predate them.)

(Issue 17 also saw 12–16× on BERT/ResNet-50 without F16C.) Native float16 arithmetic needs
AVX512-FP16 (Sapphire Rapids and later), which amptool's kernels do not use (they accumulate in
float32): float16 is never faster than float32 on a CPU, and the note says so there too.
amptool's bfloat16 matmuls and stride-1 convs run on AMX tiles where the target has AMX-BF16
(``cpu_amx``; a Sapphire/Emerald Rapids VM often has AMX off while its LLVM CPU name lists it:
the host's flags correct the name, ``_tvm.host_feature_corrections``), and no note is due; other
bfloat16 dot products are AVX512-BF16's ``vdpbf16ps`` (``cpu_intrinsics``), and where that is
slower than two FMAs (``SLOW_BF16_DOT_CPUS``) float32 FMAs, and the note says bfloat16 is no faster.
Only x86 CPUs are judged: other architectures' LLVM feature names differ, and no note is better
than a wrong one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from amptool import _tvm

log = logging.getLogger(__name__)

_FEATURES = ("f16c", "avx512fp16", "avx512bf16", "avx512f", "sse2", "amx-bf16", "amx-tile")
_warned: set[tuple[str, str]] = set()

#: LLVM CPU names whose ``vdpbf16ps`` does fewer products per cycle than their float32 FMAs: Intel's
#: server cores issue two 512-bit FMAs per cycle but one ``vdpbf16ps`` every two. Measured on an
#: Emerald Rapids VM (back-to-back independent instructions): 0.19 ns per ``vfmadd231ps``, 0.76 ns
#: per ``vdpbf16ps`` — per product 2× slower. Sapphire Rapids is the same core; Cooper Lake and
#: Granite Rapids have the same two-FMA port layout (not measured). AMD's Zen 4 is the opposite: its
#: ``vdpbf16ps`` made ResNet-50 bfloat16 0.46× its float32 time.
SLOW_BF16_DOT_CPUS = frozenset({"cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d"})


#: bfloat16 / float32 latency there with the FMA kernels: ResNet-50 1.03×, BERT-base 1.15× (its
#: casts), 2 threads, alternated in one process; with ``vdpbf16ps`` they had been 1.39× and 1.67×.
SLOW_BF16_MEASURED = "1.03-1.15x"


#: LLVM CPU names whose conv register tiles are bound by weights streamed from L2, not by L1 loads:
#: Golden Cove server cores load three times a cycle (Ice Lake twice), so a tile's broadcast loads
#: cost less beside its two FMAs, and a weight panel larger than L1 is what the FMAs wait on
#: (``cpu_kernels.tile_vectors``). AMX-BF16 added to another CPU name marks such a core too (as in
#: ``bf16_dot_pays``).
L2_BOUND_TILE_CPUS = frozenset({"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d"})


def l2_bound_tiles(mcpu: str | None, mattr: Sequence[str] = ()) -> bool:
    """Whether conv tiles on CPU ``mcpu`` with features ``mattr`` should be chosen for the L2 bytes
    of a weight panel that L1 cannot hold (``L2_BOUND_TILE_CPUS``)."""
    return _server_core(mcpu, mattr, L2_BOUND_TILE_CPUS)


def bf16_dot_pays(mcpu: str | None, mattr: Sequence[str] = ()) -> bool:
    """Whether bfloat16 products should use ``vdpbf16ps`` on CPU ``mcpu`` with features ``mattr``
    (the target having AVX512-BF16 is the caller's check); elsewhere they are float32 FMAs on
    converted values. AMX-BF16 added to another CPU name marks an Intel server core too: a VM
    whose reported model LLVM takes for a client CPU ('rocketlake', with +amx-bf16 from the host's
    flags — ``_tvm.host_feature_corrections``)."""
    return not _server_core(mcpu, mattr, SLOW_BF16_DOT_CPUS)


def _server_core(mcpu: str | None, mattr: Sequence[str], names: frozenset[str]) -> bool:
    """Whether ``mcpu`` is one of the Intel server cores ``names``, or any CPU name with AMX-BF16
    added (a VM's misreported model, ``_tvm.host_feature_corrections``): AMX is server-core only."""
    return (mcpu or "") in names or "+amx-bf16" in [str(f) for f in mattr]


def low_precision_speed_note(dtype: str, spec: dict[str, Any]) -> str | None:
    """Why ``dtype`` will not be fast on the CPU of ``spec`` (an llvm target dict), or None."""
    if spec.get("kind") != "llvm" or dtype not in ("float16", "bfloat16"):
        return None
    has = _tvm.llvm_cpu_features(spec, _FEATURES)
    if not has["sse2"]:
        return None  # not x86 (or an unknown CPU): the features below mean nothing there
    cpu = spec.get("mcpu") or "generic x86-64"
    if dtype == "float16":
        if not has["f16c"]:
            return (f"CPU {cpu} lacks F16C: every float16 value converts in software, measured 34x slower than "
                    "float32 (resnet_like, 1 thread); use --dtype bfloat16 or float32 for it, or name a newer "
                    "CPU with --target-options -mcpu=NAME")
        if not has["avx512fp16"]:
            return (f"CPU {cpu} has no AVX512-FP16: float16 computes in float32 after conversion, measured 1.01x "
                    "float32 latency (weights take half the memory; no speed-up)")
        # amptool has no native float16 kernels: float32 accumulation over thousands of terms is what
        # diff's verdicts assume, and AVX512-FP16's FMAs would accumulate in float16.
        return (f"CPU {cpu} has AVX512-FP16, but amptool's CPU kernels compute float16 in float32 after conversion, "
                "measured 1.06x float32 latency (ResNet-50, 2 threads; weights take half the memory; no speed-up)")
    if has["amx-bf16"] and has["amx-tile"]:
        return None  # matmuls and convs on AMX tiles (cpu_amx): measured 0.20-0.53x float32
    if not has["avx512bf16"]:
        if not has["avx512f"]:
            return None  # AVX2 only: measured 0.75-0.95x float32 (the table above) — no warning due
        return (f"CPU {cpu} has no AVX512-BF16: bfloat16 computes in float32 after conversion, "
                "measured 1.02x float32 latency (weights take half the memory; no speed-up)")
    if not bf16_dot_pays(spec.get("mcpu"), spec.get("mattr") or ()):
        return (f"CPU {cpu} runs vdpbf16ps at half its float32 FMA rate: bfloat16 products are float32 FMAs "
                f"after conversion, measured {SLOW_BF16_MEASURED} float32 latency (weights take half the memory; "
                "no speed-up)")
    return None


def warn_if_slow(dtype: str, spec: dict[str, Any]) -> str | None:
    """Log the note once per process and (dtype, CPU, features); return it for reports."""
    note = low_precision_speed_note(dtype, spec)
    key = (dtype, f"{spec.get('mcpu')}|{spec.get('mattr')}")
    if note and key not in _warned:
        _warned.add(key)
        log.warning("%s", note)
    return note
