"""Task-level agreement over a dataset: how often does the converted model's decision change?

Error statistics say how far values moved; users of classifiers ask whether the answer moved.
Per output, by shape:

- class scores — ``[C]``, ``[N, C]`` or ``[N, T, C]`` floats, ``C ≥ 2`` (logits or
  probabilities; every row a decision): the **top-1 flip rate**, the fraction of rows whose
  argmax differs from the reference's, and the **top-5 flip rate**, the fraction whose set of
  five highest classes differs (``C > 5`` only);
- segmentation maps — ``[N, C, H, W]`` floats with ``2 ≤ C ≤ 1024`` and ``H, W > 1``: the
  **pixel agreement**, the fraction of pixels whose argmax over ``C`` matches;
- label maps — ``[N, H, W]`` or ``[N, 1, H, W]`` integers with ``H, W > 1`` (a segmenter that
  ends in its own ArgMax): the same pixel agreement, the fraction of equal labels. Integer
  outputs must otherwise match exactly; with ``--min-pixel-agreement`` a label map is judged by
  its agreement instead, since a near-tie pixel flips in any low dtype.

Rows holding NaN or Inf on either side count as flipped: a decision read from them is no
decision. Counts accumulate over samples, so rates weigh every row alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool.dtypes import numeric_kind

CLASSES = "classes"
PIXELS = "pixels"
LABELS = "labels"
MAX_SEGMENTATION_CLASSES = 1024


def is_label_map(array: np.ndarray) -> bool:
    """Integer ``[N, H, W]`` or ``[N, 1, H, W]`` with ``H, W > 1``: one label per pixel."""
    shape = np.shape(array)
    spatial = (len(shape) == 3) or (len(shape) == 4 and shape[1] == 1)
    return spatial and numeric_kind(np.asarray(array).dtype) in "iu" and min(shape[-2:]) > 1


def decision_kind(reference: np.ndarray) -> str | None:
    """``classes``, ``pixels``, ``labels`` or None: which decision an output's shape carries."""
    array = np.asarray(reference)
    if array.size == 0:
        return None
    if is_label_map(array):
        return LABELS
    if array.dtype.kind != "f":
        return None
    if 1 <= array.ndim <= 3 and array.shape[-1] >= 2:
        return CLASSES
    if array.ndim == 4 and 2 <= array.shape[1] <= MAX_SEGMENTATION_CLASSES and min(array.shape[2:]) > 1:
        return PIXELS
    return None


@dataclass
class Agreement:
    """One output's decision counts, summed over samples."""

    kind: str
    rows: int = 0
    top1_flips: int = 0
    top5_rows: int = 0
    top5_flips: int = 0

    def add(self, reference: np.ndarray, converted: np.ndarray) -> None:
        r = np.asarray(reference, dtype=np.float64)
        o = np.asarray(converted, dtype=np.float64)
        if r.shape != o.shape:
            return  # the shape check fails the output; no decision to compare
        if self.kind == LABELS:
            self.rows += r.size
            self.top1_flips += int(np.count_nonzero(r != o))
            return
        if self.kind == PIXELS:
            r, o = np.moveaxis(r, 1, -1), np.moveaxis(o, 1, -1)
        classes = r.shape[-1]
        r2, o2 = r.reshape(-1, classes), o.reshape(-1, classes)
        finite = np.isfinite(r2).all(axis=1) & np.isfinite(o2).all(axis=1)
        flips = (np.argmax(r2, axis=1) != np.argmax(o2, axis=1)) | ~finite
        self.rows += len(r2)
        self.top1_flips += int(flips.sum())
        if self.kind == CLASSES and classes > 5:
            top_r = np.sort(np.argpartition(-r2, 5, axis=1)[:, :5], axis=1)
            top_o = np.sort(np.argpartition(-o2, 5, axis=1)[:, :5], axis=1)
            self.top5_rows += len(r2)
            self.top5_flips += int(((top_r != top_o).any(axis=1) | ~finite).sum())

    def as_json(self) -> dict[str, Any]:
        if self.kind in (PIXELS, LABELS):
            return {"kind": self.kind, "pixels": self.rows,
                    "pixel_agreement": 1.0 - self.top1_flips / self.rows if self.rows else None}
        return {
            "kind": CLASSES,
            "rows": self.rows,
            "top1_flips": self.top1_flips,
            "top1_flip_rate": self.top1_flips / self.rows if self.rows else None,
            "top5_flips": self.top5_flips if self.top5_rows else None,
            "top5_flip_rate": self.top5_flips / self.top5_rows if self.top5_rows else None,
        }


class DecisionTracker:
    """Agreement per output over every sample fed to ``add``."""

    def __init__(self) -> None:
        self.outputs: dict[str, Agreement] = {}

    def add(self, reference: Mapping[str, np.ndarray], converted: Mapping[str, np.ndarray],
            names: Iterable[str]) -> None:
        for name in names:
            if name not in self.outputs:
                kind = decision_kind(reference[name])
                if kind is None:
                    continue
                self.outputs[name] = Agreement(kind)
            self.outputs[name].add(reference[name], converted[name])

    def summary(self) -> dict[str, Any]:
        """Per output counts, and the worst rate of each kind over outputs (None without one)."""
        per_output = {name: a.as_json() for name, a in self.outputs.items()}
        return {
            "top1_flip_rate": _worst(per_output, "top1_flip_rate", max),
            "top5_flip_rate": _worst(per_output, "top5_flip_rate", max),
            "pixel_agreement": _worst(per_output, "pixel_agreement", min),
            "per_output": per_output,
        }


def _worst(per_output: Mapping[str, Mapping[str, Any]], key: str, pick: Any) -> float | None:
    values = [v[key] for v in per_output.values() if v.get(key) is not None]
    return pick(values) if values else None
