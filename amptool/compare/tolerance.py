"""Tolerances: per-dtype defaults, global and per-output overrides, and their flag syntax.

An output passes when cosine ≥ ``min_cosine``, ``scale_error`` ≤ ``max_scale_error`` and the
chosen error statistic ≤ ``atol + rtol·scale`` (see ``stats``). Magnitude alone cannot separate
a correct conversion from a systematic 1 % scale: on trained models fp16 rounding reaches
1–2 % of max|ref| (PP-OCRv4 rec), as large as the scale. Correlation can: rounding noise is
uncorrelated with the reference (gain ≈ 1), a scale is proportional to it (gain 1.01). So rtol
is sized for rounding and ``max_scale_error`` catches the scale. Defaults were measured with
``diff`` on seven trained models from PyPI wheels (ddddocr, magika, nudenet, RapidOCR's
PP-OCRv4 det/rec and cls), seven PyTorch exports and the test zoo, 5 seeds each:

* float16 — atol 1e-3, rtol 1e-2, min cosine 0.999, max scale error 5e-3. Correct
  conversions: max_abs ≤ 4.1e-3·max|ref| (ddddocr det; ≤ 0.45 of the bound), cosine
  ≥ 0.99995, scale_error ≤ 9.4e-4 (magika, a one-row softmax whose gain rests on a few
  entries; ≤ 3e-4 elsewhere). A 1.01-scaled reference gives scale_error ≥ 9.6e-3, 2× over
  the bound, while its max_abs stays inside rtol 1e-2. PP-OCRv4 rec is the exception:
  a 6625-class softmax on random inputs, whose mid-range probabilities amplify logit
  rounding to max_abs 1.1–5.9e-2·max|ref| and scale_error 1.2–5.2e-3 (p99 ≤ 2e-5, top-1
  agreement 1.0); it needs ``--check-error-stat p99`` or fp32 fallback, not a looser default.
* bfloat16 — atol 1e-2, rtol 5e-2, min cosine 0.99, max scale error 5e-2: 8-bit significand
  (3.9e-3 per op). Correct conversions reached max_abs 6.7e-2·max|ref| on magika's softmax
  (0.81 of the bound), cosine ≥ 0.9988 and scale_error 3.4e-2 (on outputs that are not
  a peaked softmax: ≤ 1.3e-3): a 1 % scale is inside bf16's rounding and cannot be told apart.
* float32 — 1e-4 / 1e-4 / 0.99999, max scale error 1e-3: only reassociation differs from
  onnxruntime (max_abs ≤ 0.3 of the bound, scale_error ≤ 2.8e-5 on PP-OCRv4 rec); rtol 1e-4
  already fails any real scale, the scale check only must not fire first.

Flags take ``VALUE`` (every output) or ``NAME:VALUE`` (one output, repeatable). Output
names may themselves contain ``:`` (``Identity:0``), so the value is after the *last* colon.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from amptool.errors import UserError

CHECK_STATS = ("max", "elemwise", "mean", "median", "p99")


@dataclass(frozen=True)
class Tolerance:
    """How strictly one output is judged. ``max_scale_error`` defaults to inf (not checked)
    for hand-built tolerances; the per-dtype defaults set it."""

    atol: float
    rtol: float
    min_cosine: float
    check_stat: str = "max"
    max_scale_error: float = math.inf

    def __post_init__(self) -> None:
        if self.check_stat not in CHECK_STATS:
            raise ValueError(f"check_stat must be one of {CHECK_STATS}, got {self.check_stat!r}")

    def as_json(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine,
                "check_error_stat": self.check_stat, "max_scale_error": self.max_scale_error}


DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999, max_scale_error=1e-3),
    "float16": Tolerance(atol=1e-3, rtol=1e-2, min_cosine=0.999, max_scale_error=5e-3),
    "bfloat16": Tolerance(atol=1e-2, rtol=5e-2, min_cosine=0.99, max_scale_error=5e-2),
}


def default_tolerance(dtype: str) -> Tolerance:
    return DEFAULT_TOLERANCES[dtype]


@dataclass(frozen=True)
class ToleranceOverride:
    """Fields to replace in a Tolerance; None keeps the value underneath."""

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    check_stat: str | None = None
    max_scale_error: float | None = None
    source: str = field(default="", compare=False)  # the first flag that named it, for errors

    def apply(self, base: Tolerance) -> Tolerance:
        return replace(
            base,
            atol=base.atol if self.atol is None else self.atol,
            rtol=base.rtol if self.rtol is None else self.rtol,
            min_cosine=base.min_cosine if self.min_cosine is None else self.min_cosine,
            check_stat=base.check_stat if self.check_stat is None else self.check_stat,
            max_scale_error=base.max_scale_error if self.max_scale_error is None else self.max_scale_error,
        )


@dataclass(frozen=True)
class TolerancePolicy:
    """Per-dtype default ← global override ← per-output override."""

    default: ToleranceOverride = ToleranceOverride()
    per_output: tuple[tuple[str, ToleranceOverride], ...] = ()

    def resolve(self, dtype: str, name: str | None = None) -> Tolerance:
        tol = self.default.apply(default_tolerance(dtype))
        override = dict(self.per_output).get(name) if name is not None else None
        return override.apply(tol) if override else tol

    def check_names(self, output_names: Sequence[str]) -> None:
        """Every per-output override must name a model output."""
        for name, override in self.per_output:
            if name not in output_names:
                raise UserError(
                    f"{override.source} names unknown output '{name}'",
                    f"Model outputs: {', '.join(output_names) or '(none)'}. Write NAME:VALUE, or VALUE for all.",
                )


_FLAGS = {"atol": "--atol", "rtol": "--rtol", "min_cosine": "--min-cosine", "check_stat": "--check-error-stat",
          "max_scale_error": "--max-scale-error"}


def parse_tolerance_flags(
    atol: Sequence[str] = (), rtol: Sequence[str] = (), min_cosine: Sequence[str] = (),
    check_stat: Sequence[str] = (), max_scale_error: Sequence[str] = (),
) -> TolerancePolicy:
    """``--atol 1e-3 --atol logits:1e-2 …`` → a policy. A later value for the same target wins."""
    default: dict[str, Any] = {}
    named: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    flags = (("atol", atol), ("rtol", rtol), ("min_cosine", min_cosine), ("check_stat", check_stat),
             ("max_scale_error", max_scale_error))
    for key, values in flags:
        for raw in values:
            name, text = split_named(raw)
            value = _parse_value(key, raw, text)
            if name is None:
                default[key] = value
            else:
                named.setdefault(name, {})[key] = value
                sources.setdefault(name, f"{_FLAGS[key]} {raw}")
    return TolerancePolicy(
        default=ToleranceOverride(**default),
        per_output=tuple((n, ToleranceOverride(**v, source=sources[n])) for n, v in named.items()),
    )


def split_named(raw: str) -> tuple[str | None, str]:
    """``NAME:VALUE`` → (NAME, VALUE); a bare ``VALUE`` → (None, VALUE). Splits at the last colon."""
    name, sep, text = raw.rpartition(":")
    return (name, text.strip()) if sep and name else (None, raw.strip())


def _parse_value(key: str, raw: str, text: str) -> float | str:
    flag = _FLAGS[key]
    if key == "check_stat":
        if text not in CHECK_STATS:
            raise UserError(f"{flag} '{raw}': '{text}' is not a statistic",
                            f"Choose one of: {', '.join(CHECK_STATS)} (optionally NAME:STAT for one output).")
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = (-1.0, 1.0) if key == "min_cosine" else (0.0, math.inf)
    if not (math.isfinite(value) and low <= value <= high):
        example = "0.999" if key == "min_cosine" else "1e-3"
        bounds = "a number in [-1, 1]" if key == "min_cosine" else "a finite number ≥ 0"
        raise UserError(f"{flag} '{raw}': '{text}' is not {bounds}",
                        f"Write {flag} VALUE for every output or {flag} NAME:VALUE for one, e.g. {flag} {example}.")
    return value
