"""Error statistics between a reference and a converted output, computed in float64.

Both sides are cast up to float64 before anything is computed (fp16 differences computed
in fp16 are themselves rounded); ml_dtypes' bfloat16/float8 count as floats and int4/uint4
as integers (numpy's kind for them is 'V', or 'f' for float8_e5m2). Every key is always
present; None where it does not apply.

The verdict (``passed``) requires, in this order (``failed_check`` names the first that failed):
  * ``shape`` — the same shape;
  * ``nonfinite`` — NaN/±Inf exactly where the reference has them. A non-finite value on
    one side only always fails, whatever the tolerance;
  * ``exact`` — integer/bool outputs (indices, counts, masks) identical; ``values`` for
    non-numeric outputs;
  * ``cosine`` — cosine similarity ≥ ``min_cosine`` (catches outputs wrong everywhere);
  * ``scale_error`` — ``|gain − 1| ≤ max_scale_error``, where ``gain = <converted, ref> /
    <ref, ref>`` is the least-squares factor mapping the reference onto the converted output.
    Magnitude cannot tell a systematic 1 % scale (a wrong epsilon, a dropped factor) from
    fp16 rounding of the same size; correlation can: rounding noise is uncorrelated with
    the reference (gain ≈ 1), a scale error is proportional to it (gain 1.01);
  * ``tolerance`` — the chosen statistic within tolerance. ``max`` (the default) checks
    ``max_abs ≤ atol + rtol · max|reference|`` — scaled by the output's own magnitude,
    because fp16 error is relative to the values being carried; ``mean``/``median``/``p99``
    check that statistic of |error| against the same bound; ``elemwise`` is numpy's
    ``|a − b| ≤ atol + rtol·|b|`` for every element. ``tolerance_ratio`` is the checked
    value over its bound (≤ 1 passes), so outputs can be ranked by how close they came.

``cosine`` and ``scale_error`` describe directions, so they are judged only when there is
something above the absolute tolerance to describe: the reference exceeds atol somewhere
(``max|ref| > atol``) and so does the error (``max_abs > atol``). Otherwise every difference
that matters is below atol, and the direction of such differences is rounding noise: a
sigmoid map that is ~1e-5 everywhere on random inputs has cosine 0.85–0.99 after a correct
fp16 conversion, and one pixel at 1.3e-3 does not make that cosine meaningful. Such an
output is judged by its absolute error alone; both statistics are still reported, and
``unchecked`` lists the checks that did not apply. Neither applies to a one-value output either:
its cosine is ±1 and its least-squares gain its relative error, which the tolerance judges (a
scalar 1.4% off was reported as "systematic, not rounding").

``topk_agree`` is informational, never part of the verdict. It is computed for float
outputs of rank 1–3 whose last axis has ≥ 2 entries — the shapes of class scores
([classes], [batch, classes], [batch, tokens, vocab]); shape alone cannot tell logits from
a hidden state, so read it only where the last axis indexes classes. Per row of the last
axis, ``top1`` is the fraction of rows where the converted output's largest entry is the
reference's arg-max, ``top5`` the fraction where the reference's arg-max is among the
converted output's five largest (None when the axis has ≤ 5 entries); ties count as agreement.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amptool.compare.labels import is_label_map
from amptool.compare.tolerance import CHECK_STATS, DEFAULT_TOLERANCES, Tolerance, default_tolerance
from amptool.dtypes import is_ml_dtype, numeric_kind

__all__ = ["CHECK_STATS", "DEFAULT_TOLERANCES", "STAT_KEYS", "Tolerance", "compare_output", "default_tolerance"]

#: The statistics of an output (all always present; None where they do not apply).
STAT_KEYS = (
    "max_abs", "mean_abs", "median_abs", "p90_abs", "p99_abs", "std_abs", "max_rel", "mean_rel",
    "max_abs_index", "max_rel_index", "cosine", "snr_db", "psnr_db", "scale_error", "topk_agree",
    "min_tolerance", "tolerance_ratio",
)
COUNT_KEYS = ("nan", "inf", "nan_reference", "inf_reference")
_TINY = np.finfo(np.float64).tiny


def compare_output(name: str, reference: np.ndarray, converted: np.ndarray, tol: Tolerance,
                   min_label_agreement: float | None = None) -> dict[str, Any]:
    """All statistics for one output plus ``passed``, ``failure`` (why) and ``failed_check``.
    ``min_label_agreement`` (``--min-pixel-agreement``) judges an integer label map by the fraction
    of equal labels instead of exact equality (labels.is_label_map)."""
    ref = np.asarray(reference)
    out = np.asarray(converted)
    result: dict[str, Any] = {
        "name": name,
        "shape": list(ref.shape),
        "converted_shape": list(out.shape),
        "dtype": str(out.dtype),
        "reference_dtype": str(ref.dtype),
        "tolerance": tol.as_json(),
    }
    result.update(dict.fromkeys(STAT_KEYS))
    result.update(dict.fromkeys(COUNT_KEYS, 0))
    result["unchecked"] = []
    result["reference_below_atol"] = False
    result["reference_max_abs"] = None
    if ref.shape != out.shape:
        return _verdict(result, "shape", f"shape {list(out.shape)} != reference {list(ref.shape)}")
    ref_kind, out_kind = numeric_kind(ref.dtype), numeric_kind(out.dtype)  # ml_dtypes' bfloat16/float8/int4 too
    numeric = ref_kind in "fiub" and out_kind in "fiub"
    exact = ref_kind in "iub" and out_kind in "iub"  # indices, counts, masks
    if not numeric:
        if "V" in (ref_kind, out_kind) and ref.dtype != out.dtype:  # raw bytes: np.load of a bfloat16 .npz entry
            return _verdict(result, "values", f"cannot compare {ref.dtype} with {out.dtype} (an .npz keeps "
                            "bfloat16/float8 arrays as raw bytes: store them as float32)")
        same = bool(np.array_equal(ref, out))
        return _verdict(result, None if same else "values", None if same else "values differ")
    r = np.asarray(ref, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    result["nan"], result["inf"] = int(np.isnan(o).sum()), int(np.isinf(o).sum())
    result["nan_reference"], result["inf_reference"] = int(np.isnan(r).sum()), int(np.isinf(r).sum())
    if r.size == 0:
        return _verdict(result, None, None)
    finite = np.isfinite(o) & np.isfinite(r)
    diff = np.abs(o[finite] - r[finite])
    ref_abs = np.abs(r)[finite]
    scale = float(ref_abs.max()) if ref_abs.size else 0.0
    if diff.size:
        result.update(_error_stats(diff, ref_abs, finite))
        result["cosine"] = _cosine(r[finite], o[finite])
        result["snr_db"] = _snr_db(r[finite], o[finite])
        result["psnr_db"] = _psnr_db(r[finite], o[finite])
        result["tolerance_ratio"] = _ratio(diff, ref_abs, scale, tol)
    gain = None
    if ref_kind == "f" and out_kind == "f":
        result["topk_agree"] = _topk_agree(r, o)
        gain = _gain(r[finite], o[finite])
        result["scale_error"] = None if gain is None else abs(gain - 1.0)
    result["min_tolerance"] = _min_tolerance(diff, ref_abs, scale, tol)
    # An output whose every value is within atol of zero passes whatever comes back, zeros included:
    # said beside the verdict (random weights that shrink logits to 1e-7, an underflow to zeros).
    result["reference_below_atol"] = bool(ref_abs.size) and ref_kind == "f" and 0 < scale <= tol.atol
    result["reference_max_abs"] = scale if ref_abs.size else None
    below_noise = bool(diff.size) and (scale <= tol.atol or result["max_abs"] <= tol.atol)
    # Nothing above the noise floor, or one value (its cosine is ±1, its gain its relative error):
    # the element-wise tolerance judges alone.
    if below_noise or diff.size == 1:
        result["unchecked"] = ["cosine", "scale_error"]

    nonfinite = _nonfinite_mismatch(r, o)
    if nonfinite:
        return _verdict(result, "nonfinite", nonfinite)
    if exact and min_label_agreement is not None and is_label_map(ref):
        differing = int(np.count_nonzero(_integers(ref) != _integers(out)))
        agreement = 1.0 - differing / ref.size
        result["unchecked"] = ["cosine", "scale_error", "tolerance"]  # labels: equal or not, no distance
        # "of tolerance" becomes the share of labels that differ over the share allowed (≤ 1 passes)
        allowed = 1.0 - min_label_agreement
        differ = 1.0 - agreement
        result["tolerance_ratio"] = differ / allowed if allowed > 0 else (0.0 if differ == 0 else math.inf)
        if agreement < min_label_agreement:
            return _verdict(result, "pixel_agreement", f"label agreement {agreement:.2%} < --min-pixel-agreement "
                            f"{min_label_agreement:.2%} ({differing} of {ref.size} labels differ)")
        return _verdict(result, None, None)
    if exact:
        ref_int, out_int = _integers(ref), _integers(out)
        if not np.array_equal(ref_int, out_int):
            return _verdict(result, "exact", f"{int(np.sum(ref_int != out_int))} integer/bool elements differ "
                            "(must match exactly)")
    judged = [c for c in ("cosine", "scale_error") if result[c] is not None and c not in result["unchecked"]]
    if "cosine" in judged and result["cosine"] < tol.min_cosine:
        return _verdict(result, "cosine", f"cosine {result['cosine']:.6f} < min_cosine {tol.min_cosine:g}")
    if "scale_error" in judged and not result["scale_error"] <= tol.max_scale_error:  # NaN fails too
        return _verdict(result, "scale_error", f"scale_error {result['scale_error']:.4g} > max_scale_error "
                        f"{tol.max_scale_error:g} (converted ≈ {gain:.4g} × reference: systematic, not rounding)")
    if diff.size and not _within(diff, ref_abs, scale, tol):
        return _verdict(result, "tolerance", _tolerance_failure(result, diff, ref_abs, scale, tol))
    return _verdict(result, None, None)


def _integers(array: np.ndarray) -> np.ndarray:
    """Integer/bool values in a numpy integer dtype (ml_dtypes' int4 compares unreliably as is)."""
    return array.astype(np.int64) if is_ml_dtype(array.dtype) else array


def _verdict(result: dict[str, Any], check: str | None, failure: str | None) -> dict[str, Any]:
    result.update(passed=failure is None, failure=failure, failed_check=check)
    return result


def _nonfinite_mismatch(r: np.ndarray, o: np.ndarray) -> str | None:
    """Describe NaN/Inf present on one side only (or of another kind/sign); None if they match."""
    r_finite, o_finite = np.isfinite(r), np.isfinite(o)
    new = ~o_finite & r_finite
    lost = o_finite & ~r_finite
    other = ~o_finite & ~r_finite & ((np.isnan(o) != np.isnan(r)) | (np.sign(o) != np.sign(r)))
    other &= ~(np.isnan(o) & np.isnan(r))
    parts = []
    if new.any():
        nan, inf = int(np.isnan(o[new]).sum()), int(np.isinf(o[new]).sum())
        parts.append(f"{nan} NaN / {inf} Inf where the reference is finite")
    if lost.any():
        parts.append(f"{int(lost.sum())} finite where the reference has "
                     f"{int(np.isnan(r[lost]).sum())} NaN / {int(np.isinf(r[lost]).sum())} Inf")
    if other.any():
        parts.append(f"{int(other.sum())} NaN/Inf of another kind or sign than the reference's")
    return "; ".join(parts) or None


def _error_stats(diff: np.ndarray, ref_abs: np.ndarray, finite: np.ndarray) -> dict[str, Any]:
    """Distribution of |converted − reference| over the elements finite on both sides."""
    positions = np.argwhere(finite)  # diff/rel are in this order
    # Relative error against a zero reference is ~1/tiny; sums of such values overflow to inf.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        rel = diff / np.maximum(ref_abs, _TINY)
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


def _unit(x: np.ndarray) -> np.ndarray:
    # Scale first: float64 inputs near 1e300 would overflow squares and dot products.
    return x / max(float(np.max(np.abs(x))), _TINY)


def _cosine(r: np.ndarray, o: np.ndarray) -> float:
    r, o = _unit(r), _unit(o)
    nr, no = float(np.linalg.norm(r)), float(np.linalg.norm(o))
    if nr == 0.0 and no == 0.0:
        return 1.0
    if nr == 0.0 or no == 0.0:
        return 0.0
    return float(np.clip(np.dot(r.ravel(), o.ravel()) / (nr * no), -1.0, 1.0))


def _gain(r: np.ndarray, o: np.ndarray) -> float | None:
    """Least-squares gain <o, r> / <r, r>; None for an all-zero reference."""
    peak = float(np.max(np.abs(r))) if r.size else 0.0
    if peak == 0.0:
        return None
    r, o = r / peak, o / peak  # scale-free; keeps squares of values near 1e300 finite
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.dot(o.ravel(), r.ravel()) / np.dot(r.ravel(), r.ravel()))


def _snr_db(r: np.ndarray, o: np.ndarray) -> float | None:
    scale = max(float(np.max(np.abs(r))), _TINY)
    r, o = r / scale, o / scale  # the ratio is scale-free; this keeps it finite
    with np.errstate(over="ignore"):  # an output 1e200× the reference: noise is inf, SNR -inf
        noise = float(np.sum((o - r) ** 2))
    signal = float(np.sum(r**2))
    if noise == 0.0:
        return math.inf if signal > 0 else None
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _psnr_db(r: np.ndarray, o: np.ndarray) -> float | None:
    """10·log10(peak² / MSE) with peak = max|reference|; None for an all-zero reference."""
    peak = float(np.max(np.abs(r)))
    if peak == 0.0:
        return None
    with np.errstate(over="ignore"):
        mse = float(np.mean(((o - r) / peak) ** 2))
    return math.inf if mse == 0.0 else -10.0 * math.log10(mse)


def _topk_agree(r: np.ndarray, o: np.ndarray) -> dict[str, Any] | None:
    if not 1 <= r.ndim <= 3 or r.shape[-1] < 2:
        return None
    classes = r.shape[-1]
    r2, o2 = r.reshape(-1, classes), o.reshape(-1, classes)
    rows = np.isfinite(r2).all(axis=1) & np.isfinite(o2).all(axis=1)
    if not rows.any():
        return None
    r2, o2 = r2[rows], o2[rows]
    label = np.argmax(r2, axis=1)
    picked = o2[np.arange(len(label)), label]
    rank = np.sum(o2 > picked[:, None], axis=1)  # entries the converted output ranks strictly higher
    return {
        "top1": float(np.mean(rank < 1)),
        "top5": float(np.mean(rank < 5)) if classes > 5 else None,
        "rows": int(rows.sum()),
    }


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


def _ratio(diff: np.ndarray, ref_abs: np.ndarray, scale: float, tol: Tolerance) -> float:
    """Checked value / its bound: ≤ 1 passes."""
    if tol.check_stat == "elemwise":
        value, bound = diff, tol.atol + tol.rtol * ref_abs
    else:
        value, bound = np.array([_stat(diff, tol.check_stat)]), np.array([tol.atol + tol.rtol * scale])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(value == 0.0, 0.0, value / bound)
    return float(np.max(ratios))


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
        return (f"elemwise: {count} elements exceed atol {tol.atol:g} + rtol {tol.rtol:g}·|ref| "
                f"(max_abs {result['max_abs']:.4g})")
    value = _stat(diff, tol.check_stat)
    bound = tol.atol + tol.rtol * scale
    return f"{tol.check_stat}_abs {value:.4g} > atol {tol.atol:g} + rtol {tol.rtol:g}·max|ref| = {bound:.4g}"
