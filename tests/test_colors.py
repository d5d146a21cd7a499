"""Tests for the colour-list loader (amptool.colors.load_policy) and ColorPolicy."""

from __future__ import annotations

import json
import textwrap
from importlib import resources
from pathlib import Path

import pytest
import yaml

from amptool.colors import Color, ColorPolicy, NodeRule, load_policy
from amptool.colors.loader import builtin_presets
from amptool.errors import EXIT_USER_ERROR, UserError


def _write(tmp_path: Path, text: str, name: str = "colors.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def _load(tmp_path: Path, text: str) -> ColorPolicy:
    return load_policy(_write(tmp_path, text))


def _load_error(tmp_path: Path, text: str) -> tuple[UserError, str]:
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_policy(path)
    return info.value, path


def _full_text(err: UserError) -> str:
    return f"{err.message}\n{err.hint or ''}"


@pytest.fixture(scope="module")
def default() -> ColorPolicy:
    return load_policy("builtin:default")


@pytest.fixture(scope="module")
def aggressive() -> ColorPolicy:
    return load_policy("builtin:aggressive")


# --------------------------------------------------------------------------- presets


def test_builtin_presets_listed():
    assert builtin_presets() == ["aggressive", "default"]


def test_default_preset_colours(default):
    assert default.sources == ("builtin:default",)
    assert default.relax_colors["relax.nn.conv2d"] is Color.ALWAYS
    assert default.relax_colors["relax.matmul"] is Color.ALWAYS
    assert default.relax_colors["relax.nn.softmax"] is Color.NEVER
    assert default.relax_colors["relax.add"] is Color.FOLLOW
    assert default.relax_colors["relax.erf"] is Color.NEVER
    assert default.onnx_colors == {"DFT": Color.NEVER, "STFT": Color.NEVER}  # spectra: every op they import
    assert default.accumulation["relax.nn.conv2d"] == "float32"
    assert default.accumulation["relax.matmul"] == "float32"
    assert default.unknown_ops == "warn"
    assert default.node_rules == ()


def test_none_loads_the_default_preset(default):
    assert load_policy(None) == default
    assert load_policy() == default


def test_aggressive_preset(aggressive, default):
    assert aggressive.sources == ("builtin:default", "builtin:aggressive")
    assert aggressive.relax_colors["relax.erf"] is Color.FOLLOW
    assert aggressive.relax_colors["relax.einsum"] is Color.ALWAYS
    # inherited unchanged
    assert aggressive.relax_colors["relax.nn.softmax"] is Color.NEVER
    assert aggressive.relax_colors["relax.nn.conv2d"] is Color.ALWAYS
    assert aggressive.relax_colors["relax.add"] is Color.FOLLOW
    assert aggressive.accumulation == default.accumulation


def _preset_entries(name: str) -> list[tuple[str, object]]:
    path = resources.files("amptool.colors") / "presets" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    out = []
    for colour in ("always", "follow", "never"):
        value = data.get(colour)
        if isinstance(value, dict):
            value = (value.get("add") or []) + (value.get("remove") or [])
        for entry in value or []:
            out.append((colour, entry))
    return out


@pytest.mark.parametrize("preset", ["default", "aggressive"])
def test_every_preset_entry_has_a_reason(preset):
    entries = _preset_entries(preset)
    assert entries, "preset has no entries"
    missing = [
        (colour, entry)
        for colour, entry in entries
        if not (isinstance(entry, dict) and isinstance(entry.get("why"), str) and entry["why"].strip())
    ]
    assert missing == []


def test_default_preset_reasons_are_loaded(default):
    assert "Relay NEVER" in default.reasons["relax.nn.softmax"]
    assert all(default.reasons.get(op) for op in default.relax_colors)


# --------------------------------------------------------------------------- errors


def test_misspelt_op_suggests_close_match(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        never: [Sofmax]
    """)
    assert path in err.message
    assert "'Sofmax'" in err.message
    assert "did you mean" in err.message
    assert "'Softmax'" in err.message
    assert err.exit_code == EXIT_USER_ERROR


def test_misspelt_op_in_remove_is_an_error(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        extends: builtin:default
        follow: {remove: [relax.ad]}
    """)
    assert path in err.message
    assert "'relax.ad'" in err.message
    assert "did you mean" in err.message


def test_op_in_two_colours_of_one_file(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        always: [relax.matmul]
        never: [relax.matmul]
    """)
    assert path in err.message
    assert "relax.matmul" in err.message
    assert "'always'" in err.message and "'never'" in err.message


def test_op_in_two_colours_detected_across_spellings(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        follow: [nn.softmax]
        never: {add: [relax.nn.softmax]}
    """)
    assert path in err.message
    assert "relax.nn.softmax" in err.message


@pytest.mark.parametrize("version_line", ["", "version: 2", "version: '1'", "version: null"])
def test_missing_or_wrong_version(tmp_path, version_line):
    err, path = _load_error(tmp_path, f"{version_line}\nalways: [relax.matmul]\n")
    assert path in err.message
    assert "'version'" in err.message
    assert "version: 1" in (err.hint or "")


def test_unknown_top_level_key(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        alway: [relax.matmul]
    """)
    assert path in err.message
    assert "unknown key 'alway'" in err.message
    assert "did you mean 'always'" in err.message


def test_bad_unknown_ops_policy(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        unknown_ops: maybe
    """)
    assert path in err.message
    assert "'unknown_ops'" in err.message and "'maybe'" in err.message
    for choice in ("warn", "error", "silent"):
        assert choice in err.hint


def test_bad_accumulation_dtype(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        accumulation: {relax.matmul: float8}
    """)
    assert path in err.message
    assert "relax.matmul" in err.message and "'float8'" in err.message
    assert "did you mean" in err.message
    assert "float32" in err.hint


def test_accumulation_of_unknown_op(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        accumulation: {Convv: float32}
    """)
    assert path in err.message
    assert "'Convv'" in err.message and "'Conv'" in err.message


def test_nodes_bad_colour(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        nodes:
          - {match: "/layer1/*", color: alwys}
    """)
    assert path in err.message
    assert "nodes[0].color" in err.message and "'alwys'" in err.message
    assert "did you mean 'always'" in err.message


def test_nodes_invalid_regex(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        nodes:
          - {match: "/ok/", color: never}
          - {match: "/[/", color: never}
    """)
    assert path in err.message
    assert "nodes[1].match" in err.message
    assert "not a valid regex" in err.message


def test_nodes_entry_with_unknown_field(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        nodes:
          - {match: "/a/*", colour: never}
    """)
    assert path in err.message
    assert "nodes[0]" in err.message


def test_invalid_yaml(tmp_path):
    err, path = _load_error(tmp_path, "version: 1\nalways: [relax.matmul\nnever: [relax.exp]\n")
    assert path in err.message
    assert "not valid YAML" in err.message
    assert "line" in err.message


@pytest.mark.parametrize("text", ["", "- relax.matmul\n", "just a string\n"])
def test_not_a_mapping(tmp_path, text):
    err, path = _load_error(tmp_path, text)
    assert path in err.message
    assert "mapping" in err.message


def test_file_not_found(tmp_path):
    missing = str(tmp_path / "nope" / "colors.yaml")
    with pytest.raises(UserError) as info:
        load_policy(missing)
    assert missing in info.value.message
    assert "not found" in info.value.message


def test_extends_unknown_preset_lists_available(tmp_path):
    err, _ = _load_error(tmp_path, """\
        version: 1
        extends: builtin:nope
    """)
    text = _full_text(err)
    assert "builtin:nope" in err.message
    assert "builtin:default" in text and "builtin:aggressive" in text


def test_extends_unknown_preset_names_the_file(tmp_path):
    err, path = _load_error(tmp_path, """\
        version: 1
        extends: builtin:nope
    """)
    assert path in err.message


def test_unknown_builtin_preset_directly():
    with pytest.raises(UserError) as info:
        load_policy("builtin:defualt")
    assert "builtin:defualt" in info.value.message
    assert "did you mean 'default'" in info.value.message
    assert "builtin:default" in info.value.hint


@pytest.mark.parametrize("parent", ["default", "./other.yaml", "3"])
def test_extends_must_be_builtin_or_a_file(tmp_path, parent):
    err, path = _load_error(tmp_path, f"version: 1\nextends: {parent}\n")
    assert path in err.message
    assert "'extends'" in err.message and "builtin:<preset>" in err.message
    assert "builtin:default" in err.hint and "builtin:aggressive" in err.hint


@pytest.mark.parametrize("body", [
    "always: relax.matmul",                # not a list
    "always: {ad: [relax.matmul]}",        # misspelt add
    "always: [{why: no op}]",              # entry without op
    "always: [3]",                          # entry not a name
    "accumulation: [relax.matmul]",       # not a mapping
    "nodes: {match: a, color: never}",     # not a list
])
def test_malformed_sections(tmp_path, body):
    err, path = _load_error(tmp_path, f"version: 1\n{body}\n")
    assert path in err.message


# --------------------------------------------------------------------------- semantics


def test_minimal_file_without_extends(tmp_path):
    policy = _load(tmp_path, "version: 1\nnever: [relax.exp]\n")
    assert policy.relax_colors == {"relax.exp": Color.NEVER}
    assert policy.color_of("relax.nn.conv2d", None, None) is None
    assert policy.unknown_ops == "warn"
    assert policy.sources == (str(tmp_path / "colors.yaml"),)


def test_add_moves_op_between_colours(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        never: {add: [relax.add]}
    """)
    assert policy.color_of("relax.add", None, None) is Color.NEVER
    assert policy.relax_colors["relax.subtract"] is Color.FOLLOW  # rest of follow untouched


def test_remove_makes_op_unknown(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        follow: {remove: [relax.add]}
    """)
    assert "relax.add" not in policy.relax_colors
    assert policy.color_of("relax.add", None, None) is None
    assert policy.color_of("relax.subtract", None, None) is Color.FOLLOW


def test_remove_from_other_colour_is_a_no_op(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        never: {remove: [relax.add]}
    """)
    assert policy.color_of("relax.add", None, None) is Color.FOLLOW


def test_plain_list_replaces_preset_list(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        always: [relax.matmul]
    """)
    always = sorted(op for op, c in policy.relax_colors.items() if c is Color.ALWAYS)
    assert always == ["relax.matmul"]
    assert policy.color_of("relax.nn.conv2d", None, None) is not Color.ALWAYS
    assert policy.color_of("relax.nn.softmax", None, None) is Color.NEVER


def test_empty_list_clears_a_colour(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        never: []
    """)
    assert Color.NEVER not in policy.relax_colors.values()
    assert policy.color_of("relax.add", None, None) is Color.FOLLOW


def test_onnx_and_relax_names_are_separated(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        always: [Conv, relax.matmul]
        never: [Softmax, relax.exp]
    """)
    assert policy.onnx_colors == {"Conv": Color.ALWAYS, "Softmax": Color.NEVER}
    assert policy.relax_colors == {"relax.matmul": Color.ALWAYS, "relax.exp": Color.NEVER}


def test_names_without_relax_prefix_are_canonicalised(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        never: [nn.softmax, exp]
        accumulation: {matmul: float16}
    """)
    assert policy.relax_colors == {"relax.nn.softmax": Color.NEVER, "relax.exp": Color.NEVER}
    assert policy.accumulation == {"relax.matmul": "float16"}


def test_op_why_entries(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        follow:
          - {op: relax.erf, why: bounded}
          - {op: Gelu, why: "erf inside"}
          - relax.tanh
    """)
    assert policy.relax_colors == {"relax.erf": Color.FOLLOW, "relax.tanh": Color.FOLLOW}
    assert policy.onnx_colors == {"Gelu": Color.FOLLOW}
    assert policy.reasons["relax.erf"] == "bounded"
    assert policy.reasons["Gelu"] == "erf inside"
    assert "relax.tanh" not in policy.reasons


def test_extends_keeps_parent_settings_and_file_overrides(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:aggressive
        unknown_ops: error
        accumulation: {relax.matmul: float16}
    """)
    assert policy.sources == ("builtin:default", "builtin:aggressive", str(tmp_path / "colors.yaml"))
    assert policy.unknown_ops == "error"
    assert policy.accumulation["relax.matmul"] == "float16"
    assert policy.accumulation["relax.nn.conv2d"] == "float32"
    assert policy.color_of("relax.erf", None, None) is Color.FOLLOW


# --------------------------------------------------------------------------- precedence


@pytest.fixture()
def layered(tmp_path) -> ColorPolicy:
    return _load(tmp_path, """\
        version: 1
        extends: builtin:default
        never: {add: [Conv]}
        nodes:
          - {match: "/layer1/*", color: always}
          - {match: "/conv[0-9]+/", color: follow}
    """)


def test_onnx_op_colour_beats_relax_colour(layered):
    # relax.nn.conv2d is ALWAYS by Relax name, but the binding came from an ONNX Conv (NEVER)
    assert layered.color_of("relax.nn.conv2d", "/stem/Conv", "Conv") is Color.NEVER
    assert layered.color_of("relax.nn.conv2d", "/stem/Conv", None) is Color.ALWAYS
    assert layered.color_of("relax.nn.conv2d", None, "MatMul") is Color.ALWAYS  # MatMul uncoloured


def test_glob_node_rule_beats_onnx_colour(layered):
    assert layered.color_of("relax.nn.conv2d", "/layer1/conv/Conv", "Conv") is Color.ALWAYS
    assert layered.color_of("relax.nn.softmax", "/layer1/Softmax", "Softmax") is Color.ALWAYS
    # glob is anchored: /layer10/... and /x/layer1/... do not match it
    assert layered.color_of("relax.nn.softmax", "/x/layer1/Softmax", "Softmax") is Color.NEVER


def test_regex_node_rule_beats_onnx_colour(layered):
    assert layered.color_of("relax.nn.conv2d", "/block/conv12/Conv", "Conv") is Color.FOLLOW
    assert layered.color_of("relax.nn.conv2d", "/block/convX/Conv", "Conv") is Color.NEVER


def test_first_matching_node_rule_wins(layered):
    assert layered.color_of("relax.exp", "/layer1/conv3/Exp", "Exp") is Color.ALWAYS


def test_node_rule_matching():
    catch_all = ColorPolicy({}, {}, {}, node_rules=(NodeRule("*", Color.NEVER),))
    assert catch_all.color_of("relax.add", "/a/Add", None) is Color.NEVER
    assert catch_all.color_of("relax.add", None, None) is None  # no node name, no rule
    assert NodeRule("/^/a//", Color.ALWAYS).matches("/a/Add")
    assert not NodeRule("/a/*", Color.ALWAYS).matches("/b/a/Add")


def test_unknown_op_is_none(layered):
    assert layered.color_of("relax.nonexistent", "/n", "NotAnOp") is None


def test_accumulation_prefers_onnx_op_type(tmp_path):
    policy = _load(tmp_path, """\
        version: 1
        extends: builtin:default
        accumulation: {Conv: float16}
    """)
    assert policy.accumulation_of("relax.nn.conv2d", "Conv") == "float16"
    assert policy.accumulation_of("relax.nn.conv2d", None) == "float32"
    assert policy.accumulation_of("relax.nn.conv2d", "ConvTranspose") == "float32"
    assert policy.accumulation_of("relax.add", None) is None


# --------------------------------------------------------------------------- as_json


def test_as_json_is_serialisable_and_lists_sources(layered, tmp_path):
    data = json.loads(json.dumps(layered.as_json()))
    assert data["sources"] == ["builtin:default", str(tmp_path / "colors.yaml")]
    assert "relax.nn.conv2d" in data["relax_ops"]["always"]
    assert "relax.add" in data["relax_ops"]["follow"]
    assert data["onnx_ops"]["never"] == ["Conv", "DFT", "STFT"]
    assert data["nodes"] == [
        {"match": "/layer1/*", "color": "always"},
        {"match": "/conv[0-9]+/", "color": "follow"},
    ]
    assert data["accumulation"]["relax.matmul"] == "float32"
    assert data["unknown_ops"] == "warn"


def test_as_json_aggressive_sources(aggressive):
    data = json.loads(json.dumps(aggressive.as_json()))
    assert data["sources"] == ["builtin:default", "builtin:aggressive"]
    assert "relax.erf" in data["relax_ops"]["follow"]


def test_version_true_is_rejected(tmp_path):
    with pytest.raises(UserError):
        load_policy(_write(tmp_path, "version: true\nalways: [relax.matmul]\n"))
