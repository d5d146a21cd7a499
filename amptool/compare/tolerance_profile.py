"""Tolerance profiles (``diff --tolerances FILE``): a team's tolerances as a versioned YAML file
instead of a line of flags in every Makefile.

    version: 1
    default: {atol: 1e-3, rtol: 1e-2, min_cosine: 0.999, max_scale_error: 5e-3, check_error_stat: max}
    outputs:
      logits: {atol: 1e-2, check_error_stat: p99}

Every key is optional; a value left out keeps the dtype's default. Flags given beside the file
(``--atol …``) win over it, value by value. Validated on load: unknown keys, out-of-range values
and statistics are one-line errors naming the file and the key.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import yaml

from amptool.compare.tolerance import ToleranceOverride, TolerancePolicy, _parse_value
from amptool.errors import UserError
from amptool.fileio import check_regular_file

#: What to read when a file is malformed.
_FORMAT_HINT = "See docs/diff.md (Tolerance profiles); configs/tolerances/ holds working examples."

#: YAML key → ToleranceOverride field (the YAML speaks the CLI's names).
_KEYS = {"atol": "atol", "rtol": "rtol", "min_cosine": "min_cosine", "max_scale_error": "max_scale_error",
         "check_error_stat": "check_stat"}


def load_tolerance_profile(path: str) -> TolerancePolicy:
    """The policy a profile file describes; UserError for anything malformed."""
    check_regular_file(path, "Tolerance profile", "Pass a YAML file (see configs/tolerances/).", max_bytes=1 << 20)
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid YAML ({str(err).splitlines()[0]})", _FORMAT_HINT) from err
    if not isinstance(data, dict) or data.get("version") != 1:
        raise UserError(f"{path}: a tolerance profile is a mapping with 'version: 1' at the top", _FORMAT_HINT)
    unknown = sorted(set(data) - {"version", "default", "outputs"})
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)}", "Keys: version, default, outputs.")
    default = tolerance_override(data.get("default") or {}, f"{path}: default")
    outputs = data.get("outputs") or {}
    if not isinstance(outputs, dict):
        raise UserError(f"{path}: 'outputs' must map output names to tolerances", _FORMAT_HINT)
    named = tuple((str(name), tolerance_override(values or {}, f"{path}: outputs.{name}"))
                  for name, values in outputs.items())
    return TolerancePolicy(default=default, per_output=named)


def tolerance_override(values: Any, where: str) -> ToleranceOverride:
    """A ToleranceOverride from ``{atol: …, check_error_stat: …}`` (the CLI's names; None = unset),
    each value range-checked as its flag would be; used by profiles and the Python API."""
    if not isinstance(values, dict):
        raise UserError(f"{where} must map tolerance keys to values", f"Keys: {', '.join(_KEYS)}.")
    values = {key: value for key, value in values.items() if value is not None}
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown tolerance key(s) {', '.join(map(str, unknown))}",
                        f"Tolerance keys: {', '.join(_KEYS)}.")
    parsed: dict[str, Any] = {_KEYS[key]: _parse_value(_KEYS[key], f"{where}.{key}", str(value))
                              for key, value in values.items()}
    return ToleranceOverride(**parsed, source=where)


def merge(base: TolerancePolicy, over: TolerancePolicy) -> TolerancePolicy:
    """``over``'s values on top of ``base``'s, value by value (flags over a profile)."""
    names = [f.name for f in fields(ToleranceOverride) if f.name != "source"]

    def combine(a: ToleranceOverride, b: ToleranceOverride) -> ToleranceOverride:
        return replace(a, **{n: getattr(b, n) for n in names if getattr(b, n) is not None},
                       source=b.source or a.source)

    outputs = dict(base.per_output)
    for name, override in over.per_output:
        outputs[name] = combine(outputs.get(name, ToleranceOverride()), override)
    return TolerancePolicy(default=combine(base.default, over.default), per_output=tuple(outputs.items()))
