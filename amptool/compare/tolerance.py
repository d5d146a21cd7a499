"""Tolerances: per-dtype defaults, global and per-output overrides, and their flag syntax.

An output passes the error check when its chosen statistic is within ``atol + rtol·scale``
(see ``stats``). Defaults are per dtype and were measured, not guessed:

* float16 — atol 1e-3, rtol 5e-3, min cosine 0.999. fp16 rounds at 4.9e-4 relative per op;
  on the test models (CNNs, a transformer encoder, the onnx wheel's 120+ backend models)
  a correct conversion reached max_abs ≤ 1.5e-3·max|ref| and SNR ≥ 60 dB. rtol 5e-3 leaves
  3× headroom over that and still catches a systematic 1 % drift (a scale, a wrong
  epsilon), which cosine cannot see.
* bfloat16 — atol 1e-2, rtol 5e-2, min cosine 0.99: 8-bit significand (3.9e-3 per op);
  measured drift reached 1.2e-2·max|ref| on the transformer's pooled output.
* float32 — 1e-4 / 1e-4 / 0.99999: only reassociation differs from onnxruntime.

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
    atol: float
    rtol: float
    min_cosine: float
    check_stat: str = "max"

    def __post_init__(self) -> None:
        if self.check_stat not in CHECK_STATS:
            raise ValueError(f"check_stat must be one of {CHECK_STATS}, got {self.check_stat!r}")

    def as_json(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine,
                "check_error_stat": self.check_stat}


DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999),
    "float16": Tolerance(atol=1e-3, rtol=5e-3, min_cosine=0.999),
    "bfloat16": Tolerance(atol=1e-2, rtol=5e-2, min_cosine=0.99),
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
    source: str = field(default="", compare=False)  # the first flag that named it, for errors

    def apply(self, base: Tolerance) -> Tolerance:
        return replace(
            base,
            atol=base.atol if self.atol is None else self.atol,
            rtol=base.rtol if self.rtol is None else self.rtol,
            min_cosine=base.min_cosine if self.min_cosine is None else self.min_cosine,
            check_stat=base.check_stat if self.check_stat is None else self.check_stat,
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


_FLAGS = {"atol": "--atol", "rtol": "--rtol", "min_cosine": "--min-cosine", "check_stat": "--check-error-stat"}


def parse_tolerance_flags(
    atol: Sequence[str] = (), rtol: Sequence[str] = (), min_cosine: Sequence[str] = (),
    check_stat: Sequence[str] = (),
) -> TolerancePolicy:
    """``--atol 1e-3 --atol logits:1e-2 …`` → a policy. A later value for the same target wins."""
    default: dict[str, Any] = {}
    named: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for key, values in (("atol", atol), ("rtol", rtol), ("min_cosine", min_cosine), ("check_stat", check_stat)):
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
