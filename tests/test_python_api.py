"""The Python API: docs/python-api.md's example runs as written, and the API matches the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import amptool

DOC = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"


def test_the_documented_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PASSED | float16 on llvm" in done.stdout
    assert (tmp_path / "out" / "model-fp16" / "manifest.json").is_file()


def test_import_loads_neither_tvm_nor_onnxruntime():
    probe = "import sys, amptool; print('tvm' in sys.modules, 'onnxruntime' in sys.modules, amptool.__version__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split()[:2] == ["False", "False"]


def test_convert_in_memory_and_from_disk_give_the_cli_outputs(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    assert run_cli("convert", model, "-o", str(tmp_path / "cli")).exit_code == 0
    in_memory = amptool.convert(model, dtype="float16")
    assert in_memory.output is None
    on_disk = amptool.load(tmp_path / "cli")
    spec = on_disk.inputs[0]
    feeds = {spec["name"]: np.random.default_rng(1).standard_normal(spec["shape"]).astype(np.float32)}
    np.testing.assert_array_equal(in_memory.run(feeds)["probs"], on_disk.run(feeds)["probs"])
    cli_manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert in_memory.manifest["ops_by_dtype"] == cli_manifest["ops_by_dtype"]


def test_diff_report_matches_the_cli_verdict(zoo_model, run_cli):
    model = zoo_model("tiny_cnn")
    report = amptool.diff(model, dtype="float16", seed=3)
    cli = run_cli("diff", model, "--dtype", "float16", "--seed", "3")
    assert report.passed is True and cli.exit_code == 0
    assert report.verdict == cli.output.strip().splitlines()[-1]


def test_diff_takes_arrays_and_typed_tolerances(zoo_model):
    model = zoo_model("tiny_cnn")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    report = amptool.diff(model, inputs={"input": x}, per_output={"probs": {"atol": 0.0, "rtol": 0.0}})
    assert report.to_json()["inputs"]["source"] == "arrays"
    assert report.passed is False  # float16 is not bit-exact
    assert report.outputs[0]["tolerance"]["atol"] == 0.0


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: amptool.convert(m, colours="x.yaml"), "unknown option(s) colours"),
    (lambda m: amptool.convert(m, input_shapes=("input:1x3x32x32",)), "input_shapes takes a mapping"),
    (lambda m: amptool.diff(m, per_output={"probs": {"atoll": 1}}), "unknown tolerance key(s) atoll"),
    (lambda m: amptool.convert(m, dtype="float8"), "Unknown dtype 'float8'"),
])
def test_bad_arguments_are_user_errors(zoo_model, call, message):
    with pytest.raises(amptool.UserError, match=re.escape(message)):
        call(zoo_model("tiny_cnn"))


def test_load_refuses_a_directory_that_is_no_artifact(tmp_path):
    with pytest.raises(amptool.UserError, match="not an amptool artifact"):
        amptool.load(tmp_path)


def test_the_wheel_ships_the_package_data_and_no_test_code(tmp_path):
    import shutil
    import zipfile

    root = DOC.parent.parent
    source = tmp_path / "src"
    shutil.copytree(root / "amptool", source / "amptool", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("amptool-*.whl"))).namelist()
    assert "amptool/py.typed" in names and "amptool/colors/presets/default.yaml" in names
    assert "amptool/api.py" in names and "amptool/compiler/__init__.py" in names
    assert not [n for n in names if n.startswith("amptool/testing/")]


def test_a_script_that_fails_before_tvm_is_needed_exits_cleanly(tmp_path):
    """convert imports TVM in a background thread; a script whose convert fails on its input (before
    TVM is used) must still exit normally, not tear down under that thread's native initialisation."""
    script = ("from amptool import api\n"
              "try:\n"
              f"    api.convert({str(tmp_path / 'missing.onnx')!r}, output={str(tmp_path / 'out')!r})\n"
              "except Exception as err:\n"
              "    print('refused:', err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: Model file not found" in done.stdout
    assert "Fatal" not in done.stderr and "Traceback" not in done.stderr


def test_an_artifact_converted_again_into_the_same_directory_loads_anew(tmp_path):
    """The dynamic loader returns the library it already mapped for a path it has seen: loading
    the directory again after a second convert ran the first model. Each file now loads as itself;
    the first one's VM keeps working."""
    import onnx
    from onnx import TensorProto, helper

    x = np.array([-1.0, 0.5, 2.0, -3.0], np.float32)
    model, out = tmp_path / "m.onnx", tmp_path / "out"
    vms = []
    for op in ("Relu", "Neg", "Relu"):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
        amptool.convert(model, output=out)
        vms.append(amptool.load(out))
    want = [np.maximum(x, 0), -x, np.maximum(x, 0)]
    for vm, expected in zip(vms, want, strict=True):
        np.testing.assert_array_equal(vm.run({"x": x})["y"], expected)
