"""One JSON convention and CI outputs: ``--json PATH|-`` on every verb, ``schema_version`` and
``versions`` in every document, diff's tolerance policy, ``--junit-xml``, GitHub annotations,
shell completion.

Two zoo models are converted once per module (tiny_cnn with a bare ``--json``, transformer_encoder
with ``--json PATH``); each diff then runs against the artifact and skips the compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result

from amptool.app.versions import SCHEMA_VERSION, versions
from amptool.cli.main import cli
from amptool.compare.tolerance import DEFAULT_TOLERANCES
from amptool.testing import model_zoo
from tests.conftest import read_json

VERSION_KEYS = {"amptool", "apache-tvm", "apache-tvm-ffi", "onnx", "onnxruntime", "numpy"}
REPO = Path(__file__).resolve().parent.parent


def _invoke(*args: str, github: bool = False) -> Result:
    """amptool in-process with GITHUB_ACTIONS set or unset (CI itself may set it)."""
    env = {"GITHUB_ACTIONS": "true" if github else None}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def _stamped(document: dict[str, Any]) -> None:
    assert document["schema_version"] == SCHEMA_VERSION
    assert set(document["versions"]) >= VERSION_KEYS
    assert document["versions"]["onnx"] == onnx.__version__
    assert document["versions"]["numpy"] == np.__version__


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both models saved and converted to float16; the convert Results and the --json file kept."""
    root = tmp_path_factory.mktemp("ci")
    found: dict[str, Any] = {"root": root}
    for name, json_args in (("tiny_cnn", ("--json",)), ("transformer_encoder", ("--json", str(root / "m.json")))):
        model = root / f"{name}.onnx"
        onnx.save(model_zoo.ALL_BUILDERS[name](), model)
        # --json last: a bare flag, and PATH as its value
        result = _invoke("convert", str(model), "-o", str(root / name), *json_args)
        found[name] = (str(model), str(root / name), result)
    return found


# --------------------------------------------------------------------------- --json on every verb


@pytest.mark.parametrize("verb", ["convert", "diff", "inspect", "bench", "run"])
def test_every_verb_takes_json_path_or_dash(verb: str) -> None:
    option = next(p for p in cli.commands[verb].params if "--json" in getattr(p, "opts", ()))
    assert isinstance(option, click.Option)
    assert not option.is_flag and option.flag_value == "-", "a bare --json means stdout"
    assert option.name == "json_path"


def test_convert_bare_json_prints_only_the_manifest(built: dict[str, Any]) -> None:
    _model, artifact, result = built["tiny_cnn"]
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # the whole of stdout: no table, no "wrote" line
    _stamped(document)
    manifest = read_json(Path(artifact) / "manifest.json")
    assert document["dtype"] == manifest["dtype"] == "float16"
    assert document["ops_by_dtype"] == manifest["ops_by_dtype"]
    assert document["versions"]["apache-tvm"] == manifest["versions"]["apache-tvm"]


def test_convert_json_path_writes_a_file_and_keeps_the_tables(built: dict[str, Any]) -> None:
    _model, artifact, result = built["transformer_encoder"]
    assert result.exit_code == 0, result.output
    assert f"wrote {artifact}/" in result.stdout
    document = read_json(built["root"] / "m.json")
    _stamped(document)
    assert document["dtype"] == "float16" and document["target"] == "llvm"


def test_diff_json_dash_owns_stdout(built: dict[str, Any]) -> None:
    model, artifact, _ = built["tiny_cnn"]
    result = _invoke("diff", model, "--json", "-", "--artifact", artifact)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    _stamped(document)
    assert document["passed"] is True and [o["name"] for o in document["outputs"]] == ["probs"]
    assert result.stderr.strip().splitlines()[-1].startswith("PASSED | float16 on llvm"), "the verdict moved to stderr"
    # a bare --json followed by another option is stdout too
    bare = _invoke("diff", model, "--json", "--artifact", artifact)
    assert bare.exit_code == 0, bare.output
    assert json.loads(bare.stdout)["outputs"][0]["name"] == "probs"
    assert not (Path.cwd() / "-").exists()


def test_diff_json_carries_the_tolerance_policy(built: dict[str, Any], tmp_path: Path) -> None:
    model, artifact, _ = built["transformer_encoder"]
    path = tmp_path / "d.json"
    result = _invoke("diff", model, "--artifact", artifact, "--atol", "2e-3", "--rtol", "pooled:0.5",
                     "--json", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("PASSED |"), "a file leaves stdout to the tables"
    document = read_json(path)
    _stamped(document)
    policy = document["tolerance_policy"]
    base = DEFAULT_TOLERANCES["float16"]
    assert policy["dtype_default"]["atol"] == base.atol and policy["dtype_default"]["rtol"] == base.rtol
    assert policy["overrides"] == {"default": {"atol": 2e-3}, "per_output": {"pooled": {"rtol": 0.5}}}
    assert policy["default"]["atol"] == 2e-3 and policy["default"]["rtol"] == base.rtol
    assert set(policy["per_output"]) == {"pooled"}
    assert policy["per_output"]["pooled"]["atol"] == 2e-3 and policy["per_output"]["pooled"]["rtol"] == 0.5
    assert set(document["tolerance"]) >= {"atol", "rtol", "per_output"}, "the old key stays"


def test_inspect_json_dash_owns_stdout(built: dict[str, Any]) -> None:
    model, _, _ = built["tiny_cnn"]
    result = _invoke("inspect", model, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    _stamped(document)
    assert document["dtype"] == "float16" and document["ops_converted"] > 0
    assert "summary" in result.stderr, "the tables went to stderr"


def test_run_json_reports_outputs_device_and_times(built: dict[str, Any], tmp_path: Path) -> None:
    _, artifact, _ = built["tiny_cnn"]
    manifest = read_json(Path(artifact) / "manifest.json")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", **{i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"])
                                    for i in manifest["inputs"]})
    result = _invoke("run", artifact, "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"),
                     "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    _stamped(document)
    with np.load(tmp_path / "y.npz") as written:
        assert document["outputs"] == [{"name": name, "dtype": written[name].dtype.name,
                                        "shape": list(written[name].shape)} for name in written.files]
    assert document["device"] == "cpu" and document["artifact"] == artifact
    assert document["output"] == str(tmp_path / "y.npz")
    assert document["load_ms"] >= 0 and document["run_ms"] > 0
    assert f"wrote {tmp_path / 'y.npz'}: " in result.stderr, "the summary line went to stderr"


def test_versions_come_from_the_installed_distributions() -> None:
    found = versions()
    assert set(found) == VERSION_KEYS
    assert found["onnx"] == onnx.__version__ and found["numpy"] == np.__version__
    assert found["apache-tvm"] == metadata.version("apache-tvm")


# --------------------------------------------------------------------------- JUnit XML, annotations


def _failing_pooled(*extra: str, github: bool = False, built: dict[str, Any]) -> Result:
    """transformer_encoder with a zero tolerance for 'pooled' only: it fails, last_hidden_state passes."""
    model, artifact, _ = built["transformer_encoder"]
    return _invoke("diff", model, "--artifact", artifact, "--atol", "pooled:0", "--rtol", "pooled:0", *extra,
                   github=github)


def test_junit_xml_one_testcase_per_output_and_a_failure(built: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    result = _failing_pooled("--junit-xml", str(path), built=built)
    assert result.exit_code == 1, result.output
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "2" and root.get("failures") == "1"
    cases = root.findall("./testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("transformer_encoder.onnx", "last_hidden_state"), ("transformer_encoder.onnx", "pooled")]
    assert all(float(c.get("time", "-1")) >= 0 for c in cases)
    passing, failing = cases
    assert passing.find("failure") is None
    failure = failing.find("failure")
    assert failure is not None
    report_line = next(line for line in result.stdout.splitlines() if line.startswith("FAIL pooled: "))
    assert failure.get("message") == report_line.removeprefix("FAIL pooled: ")
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("FAILED | ") and root.findtext("./testsuite/system-out") == verdict


def test_github_actions_gets_one_error_per_failing_output(built: dict[str, Any]) -> None:
    result = _failing_pooled(github=True, built=built)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1, result.stdout
    assert errors[0].startswith("::error title=amptool diff::output 'pooled': ")
    assert result.stdout.strip().splitlines()[-1].startswith("FAILED | "), "the verdict stays the last line"

    quiet = _failing_pooled(github=False, built=built)
    assert quiet.exit_code == 1 and "::error" not in quiet.output


def test_github_annotations_leave_stdout_to_json_dash(built: dict[str, Any]) -> None:
    result = _failing_pooled("--json", "-", github=True, built=built)
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["passed"] is False
    assert [o["name"] for o in document["outputs"] if not o["passed"]] == ["pooled"]
    assert sum(line.startswith("::error title=amptool diff::output 'pooled': ")
               for line in result.stderr.splitlines()) == 1


# --------------------------------------------------------------------------- shell completion


def test_bash_completion_script() -> None:
    env = {**os.environ, "_AMPTOOL_COMPLETE": "bash_source"}
    done = subprocess.run([sys.executable, "-m", "amptool.cli.main"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "_amptool_completion()" in done.stdout
    assert "complete -o nosort -F _amptool_completion amptool" in done.stdout
