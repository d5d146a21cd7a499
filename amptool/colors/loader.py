"""Load and validate colour-list YAML (schema ``version: 1``).

Every error names the file, the key and the bad value, and offers close matches, because
a misspelt op silently falling through to "unknown" is exactly the bug users cannot see.

Schema::

    version: 1
    extends: builtin:default          # optional: a preset, or another colour-list file (relative
                                      # to this one) to start from
    always: [Conv, relax.matmul]      # a list replaces the preset's list …
    follow: {add: [...], remove: [...]}   # … add/remove edits it
    never: [...]
    accumulation: {Conv: float32}     # per-op accumulation dtype for ALWAYS ops
    nodes: [{match: "/encoder/*", color: never}]   # glob, or /regex/, on ONNX node names
    unknown_ops: warn | error | silent
    activation_max: 4096              # activation range guard bound; auto = dtype max / 16
    cancellation_limit: 16            # cancellation guard bound (operands / result); auto = 16

List entries are op names, or ``{op: NAME, why: TEXT}`` (the presets document every entry).
An op named in two colours of one file is an error; an op added to one colour is taken out
of the others it had in the preset.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import yaml

from amptool.colors.policy import Color, ColorPolicy, NodeRule
from amptool.dtypes import DTYPES
from amptool.errors import UserError
from amptool.fileio import check_regular_file

SCHEMA_VERSION = 1
BUILTIN_PREFIX = "builtin:"
TOP_KEYS = (
    "version", "extends", "always", "follow", "never", "accumulation", "nodes", "unknown_ops", "activation_max",
    "cancellation_limit",
)
UNKNOWN_POLICIES = ("warn", "error", "silent")
ACCUMULATION_DTYPES = tuple(sorted(DTYPES, key=lambda d: d != "float32"))  # float32 first in messages


#: What to read when a file is malformed.
_FORMAT_HINT = "See docs/colours.md for the format; configs/ holds working examples."

def builtin_presets() -> list[str]:
    folder = resources.files("amptool.colors") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_policy(path_or_preset: str | None = None) -> ColorPolicy:
    """A policy from a YAML file, or from ``builtin:<name>``; the default preset if None."""
    source = path_or_preset or f"{BUILTIN_PREFIX}default"
    raw, label = _read(source, context="--colors")
    return _resolve(raw, label, chain=(_identity(label),))


def check_policy_source(path_or_preset: str | None) -> None:
    """Raise what ``load_policy`` would for a missing file, bad YAML or unknown preset, without TVM:
    a convert checks these before any work and the op names (TVM's registry) once TVM is imported."""
    _read(path_or_preset or f"{BUILTIN_PREFIX}default", context="--colors")


def with_exclusions(policy: ColorPolicy, ops: Sequence[str] = (), nodes: Sequence[str] = ()) -> ColorPolicy:
    """``policy`` with ``ops`` coloured NEVER and ``nodes`` (globs or /regex/) kept float32 by node
    rules ahead of the list's own: ``--exclude-op``/``--exclude-node`` without writing a YAML.
    Op names are checked as the loader checks them (with did-you-mean)."""
    if not ops and not nodes:
        return policy
    relax_colors, onnx_colors = dict(policy.relax_colors), dict(policy.onnx_colors)
    reasons = dict(policy.reasons)
    for raw in ops:
        op = _canonical_op(raw, "--exclude-op names")
        (relax_colors if op in _relax_op_names() else onnx_colors)[op] = Color.NEVER
        reasons[op] = "--exclude-op"
    rules = _node_rules([{"match": pattern, "color": Color.NEVER.value} for pattern in nodes], "--exclude-node")
    sources = [*(f"--exclude-op {op}" for op in ops), *(f"--exclude-node {pattern}" for pattern in nodes)]
    return dataclasses.replace(policy, relax_colors=relax_colors, onnx_colors=onnx_colors, reasons=reasons,
                               node_rules=(*rules, *policy.node_rules), sources=(*policy.sources, *sources))


def unmatched_node_rules(policy: ColorPolicy, node_names: Iterable[str]) -> list[str]:
    """Patterns of ``policy``'s node rules that match none of ``node_names``: a misspelt node name
    would otherwise change nothing, silently."""
    names = list(node_names)
    return [rule.match for rule in policy.node_rules if not any(rule.matches(name) for name in names)]


def _identity(source: str) -> str:
    """What makes two ``extends`` names the same list (for cycle detection)."""
    return source if source.startswith(BUILTIN_PREFIX) else os.path.realpath(source)


# --------------------------------------------------------------------------- reading


#: A colour list is a few KB; anything this large is the wrong file.
_MAX_YAML_BYTES = 16 << 20


def _read(source: str, context: str) -> tuple[dict[str, Any], str]:
    """(parsed YAML, label); ``context`` says where ``source`` was named, for errors."""
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX):]
        presets = builtin_presets()
        if name not in presets:
            raise UserError(
                f"{context}: unknown colour preset '{source}'{_did_you_mean(name, presets)}",
                f"Built-in presets: {', '.join(BUILTIN_PREFIX + p for p in presets)}.",
            )
        text = (resources.files("amptool.colors") / "presets" / f"{name}.yaml").read_text()
        return _parse(text, source), source
    check_regular_file(source, "Colour list file", "Check the --colors path.", max_bytes=_MAX_YAML_BYTES)
    try:
        with open(source, encoding="utf-8") as handle:
            return _parse(handle.read(), source), source
    except UnicodeDecodeError as err:
        raise UserError(f"{source}: not UTF-8 text (byte {err.start})", "A colour list is a YAML text file.") from err
    except OSError as err:
        raise UserError(f"Colour list file {source} cannot be read: {err.strerror or err}",
                        "Pass a readable YAML file, or builtin:NAME (amptool colors lists them).") from err


def _parse(text: str, label: str) -> dict[str, Any]:
    data = copy.deepcopy(_parsed(text, label))
    if not isinstance(data, dict):
        raise UserError(f"{label}: expected a mapping with 'version: 1' at the top", _FORMAT_HINT)
    return data


#: libyaml's loader where PyYAML was built with it: the pure-Python one parses the default preset
#: (8.6 KB) in 40 ms at best (0.26 s for a convert's two parses in a profile), libyaml in 2 ms,
#: to the same data; and the preset is parsed once per process (checked before TVM loads, then used).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=8)
def _parsed(text: str, label: str) -> Any:
    """``text`` parsed once per process (callers get a copy: ``_resolve`` may not change it)."""
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)  # a safe loader: libyaml's or PyYAML's
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{label}:{where} is not valid YAML ({problem})", _FORMAT_HINT) from err


# --------------------------------------------------------------------------- resolving


def _resolve(raw: dict[str, Any], label: str, chain: tuple[str, ...]) -> ColorPolicy:
    for key in raw:
        if key not in TOP_KEYS:
            raise UserError(f"{label}: unknown key '{key}'{_did_you_mean(str(key), TOP_KEYS)}", _FORMAT_HINT)
    version = raw.get("version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise UserError(
            f"{label}: 'version' must be {SCHEMA_VERSION}, got {version!r}",
            "Add 'version: 1' at the top of the file.",
        )
    base: ColorPolicy | None = None
    if "extends" in raw:
        parent = raw["extends"]
        if not isinstance(parent, str) or not parent.strip():
            raise UserError(
                f"{label}: 'extends' must be 'builtin:<preset>' or a colour-list file, got {parent!r}",
                f"Built-in presets: {', '.join(BUILTIN_PREFIX + p for p in builtin_presets())}.",
            )
        if not parent.startswith(BUILTIN_PREFIX):  # a file, relative to the file that extends it
            given, parent = parent, os.path.normpath(os.path.join(os.path.dirname(label), os.path.expanduser(parent)))
            if not os.path.isfile(parent):
                raise UserError(
                    f"{label}: 'extends' names {given!r}, which is neither 'builtin:<preset>' nor a file ({parent})",
                    f"Built-in presets: {', '.join(BUILTIN_PREFIX + p for p in builtin_presets())}; "
                    "a file path is relative to the file that extends it.",
                )
        if _identity(parent) in chain:
            cycle = " → ".join(chain + (_identity(parent),))
            raise UserError(f"{label}: 'extends' forms a cycle ({cycle})", _FORMAT_HINT)
        parent_raw, parent_label = _read(parent, context=f"{label}: 'extends'")
        base = _resolve(parent_raw, parent_label, chain + (_identity(parent_label),))

    colors: dict[str, Color] = {}
    reasons: dict[str, str] = dict(base.reasons) if base else {}
    if base:
        colors.update(base.relax_colors)
        colors.update(base.onnx_colors)
    own: dict[str, Color] = {}
    for color in Color:
        if color.value not in raw:
            continue
        replace, add, remove = _list_edit(raw[color.value], label, color.value)
        if replace is not None:
            for op in [op for op, c in colors.items() if c is color]:
                del colors[op]
            add = replace
        for op in remove:
            if colors.get(op) is color:
                del colors[op]
        for op, why in add:
            if op in own and own[op] is not color:
                raise UserError(
                    f"{label}: op '{op}' is in both '{own[op].value}' and '{color.value}'",
                    "Give each op one colour.",
                )
            own[op] = color
            colors[op] = color
            if why:
                reasons[op] = why

    relax_names = _relax_op_names()
    relax_colors = {op: c for op, c in colors.items() if op in relax_names}
    onnx_colors = {op: c for op, c in colors.items() if op not in relax_names}

    accumulation = dict(base.accumulation) if base else {}
    acc_raw = raw.get("accumulation", {}) or {}
    if not isinstance(acc_raw, dict):
        raise UserError(f"{label}: 'accumulation' must map op names to dtypes", _FORMAT_HINT)
    for op, dtype in acc_raw.items():
        name = _canonical_op(str(op), f"{label}: 'accumulation' names")
        if dtype not in ACCUMULATION_DTYPES:
            raise UserError(
                f"{label}: accumulation of '{op}' is {dtype!r}{_did_you_mean(str(dtype), ACCUMULATION_DTYPES)}",
                f"Use one of: {', '.join(ACCUMULATION_DTYPES)}.",
            )
        accumulation[name] = str(dtype)

    rules = list(base.node_rules) if base else []
    rules = _node_rules(raw.get("nodes", []), label) + rules  # the file's own rules win

    unknown = raw.get("unknown_ops", base.unknown_ops if base else "warn")
    if unknown not in UNKNOWN_POLICIES:
        raise UserError(
            f"{label}: 'unknown_ops' is {unknown!r}{_did_you_mean(str(unknown), UNKNOWN_POLICIES)}",
            f"Use one of: {', '.join(UNKNOWN_POLICIES)}.",
        )
    activation_max = _activation_max(raw.get("activation_max", base.activation_max if base else None), label)
    cancellation = _cancellation_limit(raw.get("cancellation_limit", base.cancellation_limit if base else None), label)
    sources = (base.sources if base else ()) + (label,)
    return ColorPolicy(
        relax_colors=relax_colors,
        onnx_colors=onnx_colors,
        accumulation=accumulation,
        node_rules=tuple(rules),
        unknown_ops=str(unknown),
        sources=sources,
        reasons=reasons,
        activation_max=activation_max,
        cancellation_limit=cancellation,
    )


def _activation_max(value: Any, label: str) -> float | None:
    """``activation_max: 4096`` (a positive number) or ``auto``/absent for the default."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):  # PyYAML reads 1e9 and 1.0e9 as strings (YAML 1.1)
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UserError(
            f"{label}: 'activation_max' is {value!r}; it must be a positive number or 'auto'",
            "e.g. activation_max: 4096 keeps ops whose calibrated |x| exceeds 4096 in float32.",
        )
    return float(value)


def _cancellation_limit(value: Any, label: str) -> float | None:
    """``cancellation_limit: 16`` (a number ≥ 1; .inf never trips) or ``auto``/absent for the default."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):  # PyYAML reads 1e3 as a string (YAML 1.1)
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise UserError(
            f"{label}: 'cancellation_limit' is {value!r}; it must be a number >= 1 or 'auto'",
            "e.g. cancellation_limit: 16 keeps Add/Sub ops whose result is 16x below their operands in float32.",
        )
    return float(value)


def _list_edit(
    value: Any, label: str, key: str
) -> tuple[list[tuple[str, str]] | None, list[tuple[str, str]], list[str]]:
    """(replacement or None, additions, removals) for one colour key."""
    if value is None:
        return [], [], []
    if isinstance(value, list):
        return _entries(value, label, key), [], []
    if isinstance(value, dict):
        for sub in value:
            if sub not in ("add", "remove"):
                raise UserError(
                    f"{label}: '{key}.{sub}' is not allowed{_did_you_mean(str(sub), ('add', 'remove'))}",
                    f"'{key}' takes a list, or a mapping with 'add' and/or 'remove'.",
                )
        add = _entries(value.get("add") or [], label, f"{key}.add")
        remove = [op for op, _ in _entries(value.get("remove") or [], label, f"{key}.remove")]
        return None, add, remove
    raise UserError(f"{label}: '{key}' must be a list of op names or {{add: [...], remove: [...]}}", _FORMAT_HINT)


def _entries(items: Any, label: str, key: str) -> list[tuple[str, str]]:
    if not isinstance(items, list):
        raise UserError(f"{label}: '{key}' must be a list of op names", _FORMAT_HINT)
    out: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, dict) and "op" in item:
            out.append((_canonical_op(str(item["op"]), f"{label}: '{key}' names"), str(item.get("why", ""))))
        elif isinstance(item, str):
            out.append((_canonical_op(item, f"{label}: '{key}' names"), ""))
        else:
            raise UserError(f"{label}: '{key}' has an entry {item!r} that is not an op name", _FORMAT_HINT)
    return out


def _node_rules(items: Any, label: str) -> list[NodeRule]:
    if not isinstance(items, list):
        raise UserError(f"{label}: 'nodes' must be a list of {{match: PATTERN, color: COLOUR}}", _FORMAT_HINT)
    rules: list[NodeRule] = []
    colours = [c.value for c in Color]
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"match", "color"} or "match" not in item:
            raise UserError(f"{label}: nodes[{i}] must be {{match: PATTERN, color: COLOUR}}, got {item!r}",
                            _FORMAT_HINT)
        color = item.get("color")
        if color not in colours:
            raise UserError(
                f"{label}: nodes[{i}].color is {color!r}{_did_you_mean(str(color), colours)}",
                f"Use one of: {', '.join(colours)}.",
            )
        pattern = str(item["match"])
        if len(pattern) >= 2 and pattern.startswith("/") and pattern.endswith("/"):
            import re  # noqa: PLC0415

            try:
                re.compile(pattern[1:-1])
            except re.error as err:
                where = label if label.startswith("--") else f"{label}: nodes[{i}].match"  # a flag, or a file's key
                raise UserError(f"{where} {pattern!r} is not a valid regex ({err})",
                                "Write the pattern as /REGEX/ with Python's re syntax, or as a glob.") from err
        rules.append(NodeRule(pattern, Color(color)))
    return rules


# --------------------------------------------------------------------------- op names


@functools.lru_cache(maxsize=1)
def _relax_op_names() -> frozenset[str]:
    from amptool._tvm import registered_relax_ops  # noqa: PLC0415

    return frozenset(registered_relax_ops())


@functools.lru_cache(maxsize=1)
def onnx_op_types() -> frozenset[str]:
    """ONNX op types amptool recognises: the standard schemas plus the frontend's converters."""
    import onnx  # noqa: PLC0415

    names = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    try:
        from amptool.frontend.importer import supported_op_types  # noqa: PLC0415

        names |= set(supported_op_types())
    except ImportError:  # pragma: no cover
        pass
    return frozenset(names)


def _canonical_op(name: str, where: str) -> str:
    """Validate an op name; accept Relax names with or without the 'relax.' prefix. ``where`` starts
    the error line (``FILE: 'always' names``)."""
    relax_names = _relax_op_names()
    if name in relax_names or name in onnx_op_types():
        return name
    if f"relax.{name}" in relax_names:
        return f"relax.{name}"
    candidates = sorted(relax_names | onnx_op_types())
    raise UserError(
        f"{where} unknown op '{name}'{_did_you_mean(name, candidates)}",
        "Use an ONNX op type (Softmax) or a Relax op name (relax.nn.softmax).",
    )


def _did_you_mean(word: str, choices: Any) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=3, cutoff=0.6)]
    return f" — did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
