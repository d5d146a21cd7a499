"""Aggregate per-output statistics over several input sets (``diff --iterations N``).

The worst case keeps the meaning of every single-run key: an error statistic is its largest
value over the iterations, ``cosine``/``snr_db``/``psnr_db``/``topk_agree`` their smallest,
NaN/Inf counts their largest; ``max_abs_index``/``max_rel_index`` come from the iteration
that holds the maximum. An output passes only if it passed in every iteration; its
``failure`` and ``failed_check`` are those of its worst iteration (``worst_iteration``):
failed before passed, then the more basic check failed (shape, NaN/Inf, …, cosine,
scale_error before tolerance), then the larger ``tolerance_ratio``, then the lower cosine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

HIGHER_IS_WORSE = (
    "max_abs", "mean_abs", "median_abs", "p90_abs", "p99_abs", "std_abs", "max_rel", "mean_rel",
    "min_tolerance", "tolerance_ratio", "scale_error", "nan", "inf", "nan_reference", "inf_reference",
)
LOWER_IS_WORSE = ("cosine", "snr_db", "psnr_db")
MEAN_KEYS = HIGHER_IS_WORSE + LOWER_IS_WORSE
_CHECK_SEVERITY = {"shape": 7, "values": 6, "nonfinite": 5, "exact": 4, "pixel_agreement": 4, "cosine": 3,
                   "scale_error": 2, "tolerance": 1, None: 0}


def severity(output: dict[str, Any]) -> tuple[bool, int, float, float]:
    """Sort key: larger is worse."""
    ratio = output.get("tolerance_ratio")
    cosine = output.get("cosine")
    return (
        not output["passed"],
        _CHECK_SEVERITY.get(output.get("failed_check"), 0),
        -1.0 if ratio is None else (ratio if not math.isnan(ratio) else math.inf),
        0.0 if cosine is None else -cosine,
    )


def worst_case(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """runs[i][j]: output j in iteration i → per output, the worst over iterations."""
    return [_worst_of([run[j] for run in runs]) for j in range(len(runs[0]))] if runs else []


def _worst_of(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    index = max(range(len(results)), key=lambda i: severity(results[i]))
    worst = dict(results[index])
    worst["worst_iteration"] = index
    worst["passed"] = all(r["passed"] for r in results)
    for key in HIGHER_IS_WORSE + LOWER_IS_WORSE:
        values = [(r[key], i) for i, r in enumerate(results) if r.get(key) is not None]
        if values:
            value, at = (max if key in HIGHER_IS_WORSE else min)(values, key=lambda v: v[0])
            worst[key] = value
            if key in ("max_abs", "max_rel"):
                worst[f"{key}_index"] = results[at][f"{key}_index"]
    agree = [r["topk_agree"] for r in results if r.get("topk_agree")]
    if agree:
        worst["topk_agree"] = {
            "top1": min(a["top1"] for a in agree),
            "top5": None if agree[0]["top5"] is None else min(a["top5"] for a in agree),
            "rows": agree[0]["rows"],
        }
    return worst


def mean_over(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per output, the mean of each numeric statistic over the iterations (None if never defined)."""
    means = []
    for j in range(len(runs[0]) if runs else 0):
        results = [run[j] for run in runs]
        entry: dict[str, Any] = {"name": results[0]["name"]}
        for key in MEAN_KEYS:
            values = [float(r[key]) for r in results if r.get(key) is not None]
            entry[key] = sum(values) / len(values) if values else None
        top1 = [r["topk_agree"]["top1"] for r in results if r.get("topk_agree")]
        entry["top1_agree"] = sum(top1) / len(top1) if top1 else None
        entry["failed_iterations"] = sum(1 for r in results if not r["passed"])
        means.append(entry)
    return means
