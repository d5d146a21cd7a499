"""Trust: amptool never loses a user's file, never reports a crash as a verdict, and refuses
inputs that would exhaust the machine before allocating them (issue 13)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import Result
from onnx import TensorProto, helper

from amptool.app import outdir
from amptool.errors import EXIT_INTERNAL_ERROR, EXIT_USER_ERROR

AMPTOOL = [sys.executable, "-m", "amptool"]


def _one_line_error(result: Result, code: int) -> str:
    """The CLI exited with ``code`` through sys.exit (not an exception), printing no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result.output


def _relu_model(path: Path, shape: list[int | str]) -> str:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


# ---- output directories -------------------------------------------------------------------


def test_directory_with_a_user_file_is_refused_untouched(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    target = tmp_path / "results"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    output = _one_line_error(run_cli("convert", model, "-o", str(target)), EXIT_USER_ERROR)
    assert "notes.txt" in output and "not an amptool artifact" in output
    assert sorted(os.listdir(target)) == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "mine"


def test_output_next_to_the_input_model_keeps_it(run_cli, tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    model = _relu_model(folder / "m.onnx", [1, 4])
    before = Path(model).read_bytes()
    _one_line_error(run_cli("convert", model, "-o", str(folder)), EXIT_USER_ERROR)
    assert Path(model).read_bytes() == before
    assert os.listdir(folder) == ["m.onnx"]


def test_dot_in_a_non_empty_working_directory_is_refused(zoo_model, run_cli, tmp_path, monkeypatch):
    model = zoo_model("tiny_cnn")  # tmp_path holds the model: not empty
    monkeypatch.chdir(tmp_path)
    listing = sorted(os.listdir(tmp_path))
    _one_line_error(run_cli("convert", model, "-o", "."), EXIT_USER_ERROR)
    assert sorted(os.listdir(tmp_path)) == listing


def test_convert_twice_into_one_directory_then_run(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    target = tmp_path / "out"
    for dtype in ("float16", "float32"):
        result = run_cli("convert", model, "--dtype", dtype, "-o", str(target))
        assert result.exit_code == 0, result.output
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["dtype"] == "float32"
    assert sorted(manifest["files"]) == sorted(os.listdir(target)) == ["manifest.json", "model.so"]
    assert not [n for n in os.listdir(tmp_path) if ".amptool-tmp-" in n]
    spec = manifest["inputs"][0]
    np.savez(tmp_path / "x.npz", **{spec["name"]: np.ones(spec["shape"], np.float32)})
    result = run_cli("run", str(target), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "y.npz") as outputs:
        assert outputs[manifest["outputs"][0]["name"]].shape == tuple(manifest["outputs"][0]["shape"])


def test_an_empty_directory_is_written(zoo_model, run_cli, tmp_path):
    target = tmp_path / "empty"
    target.mkdir()
    assert run_cli("convert", zoo_model("tiny_cnn"), "-o", str(target)).exit_code == 0
    assert sorted(os.listdir(target)) == ["manifest.json", "model.so"]


def test_leftovers_of_a_killed_run_are_removed_and_tvm_temporaries_stay_inside(
        zoo_model, run_cli, tmp_path, monkeypatch):
    import tempfile

    from amptool import _tvm

    dead = _dead_pid()
    leftover = tmp_path / f".out.amptool-tmp-{dead}-abc123"
    leftover.mkdir()
    (leftover / "model.so").write_bytes(b"half")
    seen: list[tuple[str, str]] = []
    real_export = _tvm.export_library

    def recording_export(executable, path, *rest):
        seen.append((tempfile.gettempdir(), os.environ.get("TMPDIR", "")))
        return real_export(executable, path, *rest)

    monkeypatch.setattr(_tvm, "export_library", recording_export)
    assert run_cli("convert", zoo_model("tiny_cnn"), "-o", str(tmp_path / "out")).exit_code == 0
    assert not leftover.exists()
    (temp_dir, env_dir), = seen
    assert ".out.amptool-tmp-" in temp_dir and temp_dir == env_dir
    assert tempfile.gettempdir() != temp_dir  # restored afterwards


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _write_versions(target: str, writer: int, count: int) -> None:
    for version in range(count):
        def write(tmp: str, version: int = version) -> list[str]:
            with open(os.path.join(tmp, "model.so"), "w") as handle:
                handle.write(f"{writer}-{version}")
            with open(os.path.join(tmp, "manifest.json"), "w") as handle:
                json.dump({"inputs": [], "outputs": [], "files": ["model.so", "manifest.json"],
                           "tag": f"{writer}-{version}"}, handle)
            return ["model.so", "manifest.json"]

        outdir.write_directory(target, write)


def test_concurrent_writers_and_a_reader_never_see_a_missing_or_mixed_artifact(tmp_path):
    target = str(tmp_path / "out")
    _write_versions(target, 0, 1)
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_versions, args=(target, w, 40)) for w in (1, 2, 3)]
    for process in writers:
        process.start()
    missing = mixed = reads = 0
    while any(p.is_alive() for p in writers):
        try:
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            missing += 1
            continue
        try:
            with open(f"/proc/self/fd/{fd}/manifest.json") as handle:
                tag = json.load(handle)["tag"]
            with open(f"/proc/self/fd/{fd}/model.so") as handle:
                mixed += handle.read() != tag
            reads += 1
        except FileNotFoundError:
            pass  # this version was replaced and removed between the two opens: the next read sees the new one
        finally:
            os.close(fd)
    for process in writers:
        process.join()
    assert [p.exitcode for p in writers] == [0, 0, 0]
    assert missing == 0 and mixed == 0 and reads > 0
    assert sorted(os.listdir(target)) == ["manifest.json", "model.so"]
    assert [n for n in os.listdir(tmp_path) if n != "out"] == []


# ---- temporary files ----------------------------------------------------------------------


def test_planted_symlinks_at_temporary_names_leave_their_targets_unchanged(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    names = ["report.json", "inputs.npz", "outputs.npz", "ir.py"]
    for name in names:  # the names amptool used before, and the mkstemp pattern's prefix with no suffix
        os.symlink(victim, tmp_path / f".{name}.tmp")
        os.symlink(victim, tmp_path / f".{name}.amptool-tmp")
    result = run_cli("diff", model, "--json", str(tmp_path / "report.json"), "--save-inputs",
                     str(tmp_path / "inputs.npz"), "--save-outputs", str(tmp_path / "outputs.npz"))
    assert result.exit_code == 0, result.output
    assert run_cli("convert", model, "-o", str(tmp_path / "out"), "--emit-ir", str(tmp_path / "ir.py")).exit_code == 0
    assert victim.read_text() == "precious"
    for name in names:
        assert (tmp_path / f".{name}.tmp").is_symlink() and (tmp_path / name).is_file()
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".amptool-tmp") and not os.path.islink(tmp_path / n)]
    assert leftovers == []


def test_a_symlink_at_the_target_is_replaced_not_written_through(zoo_model, run_cli, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "report.json")
    assert run_cli("inspect", zoo_model("tiny_cnn"), "--json", str(tmp_path / "report.json")).exit_code == 0
    assert victim.read_text() == "precious"
    assert not (tmp_path / "report.json").is_symlink()
    assert "ops_converted" in json.loads((tmp_path / "report.json").read_text())


def test_a_full_disk_is_one_line_and_leaves_nothing(zoo_model, run_cli, tmp_path, monkeypatch):
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    model = zoo_model("tiny_cnn")
    monkeypatch.setattr(os, "fsync", full)
    output = _one_line_error(run_cli("inspect", model, "--json", str(tmp_path / "r.json")), EXIT_USER_ERROR)
    assert "No space left on device" in output and "r.json" in output
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".r.json")] and not (tmp_path / "r.json").exists()


def test_an_unwritable_json_path_is_one_line(zoo_model, run_cli):
    output = _one_line_error(run_cli("inspect", zoo_model("tiny_cnn"), "--json", "/proc/amptool/r.json"),
                             EXIT_USER_ERROR)
    assert "/proc/amptool/r.json" in output


def test_a_read_only_output_parent_is_one_line(zoo_model, run_cli):
    output = _one_line_error(run_cli("convert", zoo_model("tiny_cnn"), "-o", "/proc/amptool-out"), EXIT_USER_ERROR)
    assert "/proc/amptool-out" in output


# ---- crashes are not verdicts -------------------------------------------------------------


def test_a_compiler_failure_is_exit_70_one_line_and_no_outdir(zoo_model, run_cli, tmp_path, monkeypatch):
    import tvm

    def broken(*_args, **_kwargs):
        raise RuntimeError("injected failure in tvm.compile")

    monkeypatch.setattr(tvm, "compile", broken)
    target = tmp_path / "out"
    output = _one_line_error(run_cli("-q", "convert", zoo_model("tiny_cnn"), "-o", str(target)), EXIT_INTERNAL_ERROR)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("internal error:") and "injected failure" in lines[0]
    assert "please report" in lines[0]
    assert not target.exists() and not [n for n in os.listdir(tmp_path) if "amptool-tmp" in n]
    loud = _one_line_error(run_cli("convert", zoo_model("tiny_cnn"), "-o", str(target)), EXIT_INTERNAL_ERROR)
    not_progress = [line for line in loud.splitlines() if line.strip() and not re.match(r"^\[\s*[\d.]+s\]", line)]
    assert not_progress == lines  # without -q only the stage lines (CI progress) come before it


@pytest.mark.parametrize(("dynamic", "code"), [(False, EXIT_INTERNAL_ERROR), (True, EXIT_USER_ERROR)])
def test_a_tvm_pass_failing_is_a_user_error_only_where_shapes_are_symbolic(run_cli, tmp_path, monkeypatch,
                                                                           dynamic, code):
    """TVM's FoldConstant failing on a module of static shapes is amptool's bug (exit 70: a bfloat16
    op with no TVM kernel failed it that way); with a symbolic dim (NonZero's count), a dynamic shape
    chain the pin hint is about (2)."""
    from amptool.passes import pipeline

    def broken(_mod):
        raise RuntimeError("injected failure in FoldConstant")

    monkeypatch.setattr(pipeline, "fold_constants", broken)
    nodes = [helper.make_node("NonZero", ["x"], ["where"]), helper.make_node("Cast", ["where"], ["y"], to=1)] \
        if dynamic else [helper.make_node("Relu", ["x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    output = _one_line_error(run_cli("-q", "convert", str(path), "-o", str(tmp_path / "out")), code)
    assert "injected failure" in output
    assert ("--input-shape" in output) == dynamic


def test_verbose_shows_the_traceback_of_an_internal_error(zoo_model, run_cli, tmp_path, monkeypatch):
    import tvm

    monkeypatch.setattr(tvm, "compile", lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("injected")))
    result = run_cli("-v", "convert", zoo_model("tiny_cnn"), "-o", str(tmp_path / "out"))
    assert result.exit_code == EXIT_INTERNAL_ERROR
    assert "Traceback" in result.output and "injected" in result.output


# ---- resource guards ----------------------------------------------------------------------


def _peak_rss_run(args: list[str], timeout: float = 60) -> tuple[int, str, float, int]:
    """(exit code, output, seconds, peak RSS in bytes) of ``amptool ARGS`` in a fresh process."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        f"done = subprocess.run({[*AMPTOOL, *args]!r}, capture_output=True, text=True, timeout={timeout})\n"
        "print(done.returncode, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(done.stdout + done.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout + 30)
    head, _, output = done.stdout.partition("\n")
    code, seconds, rss_kb = head.split()
    return int(code), output, float(seconds), int(rss_kb) * 1024


@pytest.mark.parametrize("shape", [[1, 3, 100000, 100000], [1, 2**31], [2**62, 4]],
                         ids=["1x3x100000x100000", "2^31", "2^62"])
@pytest.mark.parametrize("verb", ["inspect", "diff"])
def test_huge_declared_inputs_are_refused_quickly_in_little_memory(tmp_path, verb, shape):
    model = _relu_model(tmp_path / "huge.onnx", shape)
    code, output, seconds, peak = _peak_rss_run([verb, model])
    assert code == EXIT_USER_ERROR, output
    assert "Traceback" not in output and "--max-input-size" in output
    assert seconds < 30 and peak < 1 << 30, (seconds, peak)


def test_the_input_limit_can_be_raised_and_lowered(run_cli, tmp_path):
    model = _relu_model(tmp_path / "m.onnx", [1, 3, 64, 64])  # 48 KiB
    output = _one_line_error(run_cli("inspect", model, "--max-input-size", "16KiB"), EXIT_USER_ERROR)
    assert "over the 16384 bytes limit" in output
    assert run_cli("inspect", model, "--max-input-size", "1MiB").exit_code == 0
    _one_line_error(run_cli("inspect", model, "--max-input-size", "lots"), EXIT_USER_ERROR)


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/proc"])
def test_a_model_path_that_is_not_a_regular_file_is_refused_at_once(run_cli, path):
    start = time.perf_counter()
    output = _one_line_error(run_cli("inspect", path), EXIT_USER_ERROR)
    assert time.perf_counter() - start < 10
    assert path in output


def test_colour_lists_and_input_files_that_are_devices_are_refused(zoo_model, run_cli):
    model = zoo_model("tiny_cnn")
    assert "not a regular file" in _one_line_error(run_cli("inspect", model, "--colors", "/dev/zero"),
                                                   EXIT_USER_ERROR)
    assert "not a regular file" in _one_line_error(run_cli("diff", model, "--inputs", "/dev/zero"), EXIT_USER_ERROR)


def test_binary_colour_list_is_one_line(zoo_model, run_cli, tmp_path):
    garbage = tmp_path / "colors.yaml"
    garbage.write_bytes(bytes(range(256)))
    _one_line_error(run_cli("inspect", zoo_model("tiny_cnn"), "--colors", str(garbage)), EXIT_USER_ERROR)



def test_an_output_symlink_to_a_directory_stays_a_link(zoo_model, run_cli, tmp_path):
    real = tmp_path / "disk" / "out"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "out")
    for dtype in ("float16", "float32"):
        assert run_cli("convert", zoo_model("tiny_cnn"), "--dtype", dtype, "-o", str(tmp_path / "out")).exit_code == 0
    assert (tmp_path / "out").is_symlink() and os.readlink(tmp_path / "out") == str(real)
    assert sorted(os.listdir(real)) == ["manifest.json", "model.so"]
    assert sorted(os.listdir(tmp_path / "disk")) == ["out"]
