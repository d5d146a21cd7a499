"""Error statistics between a reference and a converted output, computed in float64.

Both sides are cast up to float64 before anything is computed (fp16 differences computed
in fp16 are themselves rounded). Every key is always present; None where it does not apply.

The verdict (``passed``) requires:
  * the same shape;
  * no NaN/Inf in the converted output where the reference has none (always fails);
  * cosine similarity ≥ ``min_cosine`` (catches outputs that are wrong everywhere);
  * the chosen error statistic within tolerance. ``max`` (the default) checks
    ``max_abs ≤ atol + rtol · max|reference|`` — tolerance scaled by the output's own
    magnitude, because fp16 error is relative to the values being carried. ``elemwise``
    is numpy's ``|a − b| ≤ atol + rtol·|b|`` for every element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

CHECK_STATS = ("max", "elemwise", "mean", "median", "p99")


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_cosine: float
    check_stat: str = "max"

    def __post_init__(self) -> None:
        if self.check_stat not in CHECK_STATS:
            raise ValueError(f"check_stat must be one of {CHECK_STATS}, got {self.check_stat!r}")


#: Defaults per dtype, and why. fp16 has an 11-bit significand (rel. rounding 4.9e-4 per
#: op) that compounds over depth; bf16 has 8 bits (3.9e-3). Cosine catches broken outputs
#: (a healthy fp16 conversion scores ≥ 0.9999 on the models measured; a broken one < 0.99).
DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999),
    "float16": Tolerance(atol=1e-3, rtol=1e-2, min_cosine=0.999),
    "bfloat16": Tolerance(atol=1e-2, rtol=5e-2, min_cosine=0.99),
}


def default_tolerance(dtype: str) -> Tolerance:
    return DEFAULT_TOLERANCES[dtype]


def compare_output(name: str, reference: np.ndarray, converted: np.ndarray, tol: Tolerance) -> dict[str, Any]:
    """All statistics for one output plus ``passed`` and ``failure`` (why it failed)."""
    ref = np.asarray(reference)
    out = np.asarray(converted)
    result: dict[str, Any] = {
        "name": name,
        "shape": list(ref.shape),
        "converted_shape": list(out.shape),
        "dtype": str(out.dtype),
    }
    keys = ("max_abs", "mean_abs", "median_abs", "p90_abs", "p99_abs", "std_abs", "max_rel",
            "max_rel_index", "max_abs_index", "mean_rel", "cosine", "snr_db", "min_tolerance")
    result.update(dict.fromkeys(keys))
    result.update({"nan": 0, "inf": 0, "nan_reference": 0, "inf_reference": 0})
    if ref.shape != out.shape:
        result.update(passed=False, failure=f"shape {list(out.shape)} != reference {list(ref.shape)}")
        return result
    numeric = ref.dtype.kind in "fiub" and out.dtype.kind in "fiub"
    exact = ref.dtype.kind in "iub" and out.dtype.kind in "iub"  # indices, counts, masks
    if not numeric:
        same = bool(np.array_equal(ref, out))
        result.update(passed=same, failure=None if same else "values differ")
        return result
    r = ref.astype(np.float64)
    o = out.astype(np.float64)
    result["nan"], result["inf"] = int(np.isnan(o).sum()), int(np.isinf(o).sum())
    result["nan_reference"], result["inf_reference"] = int(np.isnan(r).sum()), int(np.isinf(r).sum())
    # Non-finite values must match exactly: NaN where NaN, +Inf where +Inf, -Inf where -Inf.
    bad_new = (np.isnan(o) != np.isnan(r)) | (np.isinf(o) != np.isinf(r)) | (
        np.isinf(o) & np.isinf(r) & (np.sign(o) != np.sign(r))
    )
    finite = np.isfinite(o) & np.isfinite(r)
    if r.size == 0:
        result.update(passed=True, failure=None)
        return result
    diff = np.abs(o - r)[finite]
    ref_abs = np.abs(r)[finite]
    if diff.size:
        result.update(_error_stats(diff, ref_abs, finite))
        result["cosine"] = _cosine(r[finite], o[finite])
        result["snr_db"] = _snr_db(r[finite], o[finite])
    scale = float(ref_abs.max()) if ref_abs.size else 0.0
    result["min_tolerance"] = _min_tolerance(diff, ref_abs, scale, tol)
    failure = None
    if bad_new.any():
        nan, inf = int(np.isnan(o[bad_new]).sum()), int(np.isinf(o[bad_new]).sum())
        if np.isfinite(r[bad_new]).all():
            failure = f"{nan} NaN / {inf} Inf where the reference is finite"
        else:
            failure = f"{int(bad_new.sum())} non-finite values differ from the reference ({nan} NaN, {inf} Inf)"
    elif exact and not np.array_equal(ref, out):
        failure = f"{int(np.sum(ref != out))} integer/bool elements differ (must match exactly)"
    elif result["cosine"] is not None and result["cosine"] < tol.min_cosine:
        failure = f"cosine {result['cosine']:.6f} < {tol.min_cosine}"
    elif diff.size and not _within(diff, ref_abs, scale, tol):
        failure = _tolerance_failure(result, diff, ref_abs, scale, tol)
    result.update(passed=failure is None, failure=failure)
    return result


def _error_stats(diff: np.ndarray, ref_abs: np.ndarray, finite: np.ndarray) -> dict[str, Any]:
    """Distribution of |converted − reference| over the elements finite on both sides."""
    with np.errstate(over="ignore", divide="ignore"):
        rel = diff / np.maximum(ref_abs, np.finfo(np.float64).tiny)
    positions = np.argwhere(finite)  # diff/rel are in this order
    return {
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "median_abs": float(np.median(diff)),
        "p90_abs": float(np.percentile(diff, 90)),
        "p99_abs": float(np.percentile(diff, 99)),
        "std_abs": float(diff.std()),
        "max_rel": float(rel.max()),
        "mean_rel": float(rel.mean()),
        "max_abs_index": [int(i) for i in positions[int(np.argmax(diff))]],
        "max_rel_index": [int(i) for i in positions[int(np.argmax(rel))]],
    }


def _cosine(r: np.ndarray, o: np.ndarray) -> float:
    # Scale first: float64 inputs near 1e300 would overflow the dot product.
    r = r / max(float(np.max(np.abs(r))), np.finfo(np.float64).tiny)
    o = o / max(float(np.max(np.abs(o))), np.finfo(np.float64).tiny)
    nr, no = float(np.linalg.norm(r)), float(np.linalg.norm(o))
    if nr == 0.0 and no == 0.0:
        return 1.0
    if nr == 0.0 or no == 0.0:
        return 0.0
    return float(np.clip(np.dot(r.ravel(), o.ravel()) / (nr * no), -1.0, 1.0))


def _snr_db(r: np.ndarray, o: np.ndarray) -> float | None:
    scale = max(float(np.max(np.abs(r))), np.finfo(np.float64).tiny)
    r, o = r / scale, o / scale  # the ratio is scale-free; this keeps it finite
    noise = float(np.sum((o - r) ** 2))
    signal = float(np.sum(r**2))
    if noise == 0.0:
        return math.inf if signal > 0 else None
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _stat(diff: np.ndarray, stat: str) -> float:
    if stat == "p99":
        return float(np.percentile(diff, 99))
    if stat == "mean":
        return float(np.mean(diff))
    if stat == "median":
        return float(np.median(diff))
    return float(np.max(diff))


def _within(diff: np.ndarray, ref_abs: np.ndarray, scale: float, tol: Tolerance) -> bool:
    if tol.check_stat == "elemwise":
        return bool(np.all(diff <= tol.atol + tol.rtol * ref_abs))
    return _stat(diff, tol.check_stat) <= tol.atol + tol.rtol * scale


def _min_tolerance(diff: np.ndarray, ref_abs: np.ndarray, scale: float, tol: Tolerance) -> float:
    """The smallest atol that would pass the chosen statistic at the given rtol."""
    if diff.size == 0:
        return 0.0
    if tol.check_stat == "elemwise":
        return float(max(0.0, float(np.max(diff - tol.rtol * ref_abs))))
    return float(max(0.0, _stat(diff, tol.check_stat) - tol.rtol * scale))


def _tolerance_failure(
    result: dict[str, Any], diff: np.ndarray, ref_abs: np.ndarray, scale: float, tol: Tolerance
) -> str:
    if tol.check_stat == "elemwise":
        count = int(np.sum(diff > tol.atol + tol.rtol * ref_abs))
        return f"{count} elements exceed atol {tol.atol:g} + rtol {tol.rtol:g}·|ref| (max_abs {result['max_abs']:.4g})"
    value = _stat(diff, tol.check_stat)
    bound = tol.atol + tol.rtol * scale
    return f"{tol.check_stat}_abs {value:.4g} > atol {tol.atol:g} + rtol {tol.rtol:g}·max|ref| = {bound:.4g}"
