"""amptool inspect: colour and dtype per node without compiling; agrees with convert."""

from __future__ import annotations

from tests.conftest import read_json, single_error


def test_inspect_json_has_the_contract_keys(zoo_model, run_cli, tmp_path):
    path = tmp_path / "inspect.json"
    result = run_cli("inspect", zoo_model("tiny_cnn"), "--json", str(path))
    assert result.exit_code == 0, result.output
    data = read_json(path)
    for key in ("nodes", "unknown_ops", "guarded_constants", "casts_inserted", "timings_s"):
        assert key in data
    assert {"import", "mixed_precision"} <= set(data["timings_s"])
    assert "compile" not in data["timings_s"]  # inspect never compiles
    convs = [n for n in data["nodes"] if n["op_type"] == "Conv"]
    assert len(convs) == 2 and all(n["color"] == "always" and n["dtype"] == "float16" for n in convs)
    assert {"name", "op_type", "color", "dtype"} <= set(convs[0])
    assert "ONNX op type" in result.output


def test_node_override_shows_in_inspect_and_in_the_compiled_module(zoo_model, run_cli, tmp_path):
    colors = tmp_path / "colors.yaml"
    colors.write_text('version: 1\nextends: builtin:default\nnodes:\n  - {match: "/features/4/Conv", color: never}\n')
    model = zoo_model("tiny_cnn")
    path = tmp_path / "inspect.json"
    assert run_cli("inspect", model, "--colors", str(colors), "--json", str(path)).exit_code == 0
    nodes = {n["name"]: n for n in read_json(path)["nodes"]}
    assert nodes["/features/4/Conv"]["color"] == "never" and nodes["/features/4/Conv"]["dtype"] == "float32"
    assert nodes["/features/0/Conv"]["dtype"] == "float16"

    out = tmp_path / "art"
    assert run_cli("convert", model, "--colors", str(colors), "-o", str(out)).exit_code == 0
    conv = read_json(out / "manifest.json")["ops_by_dtype"]["relax.nn.conv2d"]
    assert conv == {"float16": 1, "float32": 1}


def test_inspect_reports_guarded_constants(zoo_model, run_cli, tmp_path):
    path = tmp_path / "inspect.json"
    assert run_cli("inspect", zoo_model("scale_beyond_fp16"), "--json", str(path)).exit_code == 0
    guarded = read_json(path)["guarded_constants"]
    assert guarded and "exceeds float16 max" in guarded[0]["reason"]


def test_inspect_bad_input_is_one_line(run_cli, tmp_path):
    result = run_cli("inspect", str(tmp_path / "missing.onnx"))
    assert result.exit_code == 2 and single_error(result.output)
