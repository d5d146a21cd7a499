"""Remote devices through TVM's RPC: a tracker and servers on 127.0.0.1, each started by a fixture
in a process group of its own and stopped by it (the server's listener and session processes
are children, and outlive a killed parent otherwise). TVM's tracker needs tornado and its
server cloudpickle (the ``test`` and ``rpc`` extras); the tests skip without them."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import read_json, single_error

pytestmark = pytest.mark.skipif(
    not (importlib.util.find_spec("tornado") and importlib.util.find_spec("cloudpickle")),
    reason="TVM's RPC tracker/server need tornado and cloudpickle: pip install -e '.[rpc]'",
)

KEY = "amptool-test"
START_LIMIT_S = 90.0  # a loaded 2-core machine takes a while to import TVM in each server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(args: list[str], workdir: Path | None = None) -> subprocess.Popen[bytes]:
    """``python -m ARGS`` in a process group of its own; ``workdir``: its TMPDIR (a server keeps its
    uploads in a temporary directory that a killed server never removes: pytest's then)."""
    env = None if workdir is None else {**os.environ, "TMPDIR": str(workdir)}
    return subprocess.Popen([sys.executable, "-m", *args], start_new_session=True, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """The whole process group: TVM's server forks a listener and a process per session."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(3)
            if sig == signal.SIGTERM:
                time.sleep(0.2)  # let the group's children go too


def _server(port: int, workdir: Path, tracker: int | None = None) -> subprocess.Popen[bytes]:
    args = ["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
            "--silent"]
    if tracker is not None:
        args += ["--tracker", f"127.0.0.1:{tracker}", "--key", KEY]
    return _start(args, workdir)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, "the RPC process exited while starting"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    pytest.fail(f"nothing listened on port {port} after {START_LIMIT_S:.0f} s")


def _wait_registered(tracker: int, count: int) -> None:
    from amptool._tvm.rpc import tracker_summary

    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            queue = tracker_summary("127.0.0.1", tracker, 5.0)["queue_info"]
            if queue.get(KEY, {}).get("free", 0) >= count:
                return
        time.sleep(0.3)
    pytest.fail(f"{count} servers did not register with the tracker after {START_LIMIT_S:.0f} s")


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A tracker with two servers under KEY; yields the tracker's port."""
    port = _free_port()
    processes = [_start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                         "--port-end", str(port + 1), "--silent"])]
    try:
        _wait_listening(port, processes[0])
        processes += [_server(_free_port(), tmp_path_factory.mktemp("rpc-server"), tracker=port) for _ in range(2)]
        _wait_registered(port, 2)
        yield port
    finally:
        for process in processes:
            _stop(process)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One server without a tracker (for --rpc-server); yields its port."""
    port = _free_port()
    process = _server(port, tmp_path_factory.mktemp("rpc-server"))
    try:
        _wait_listening(port, process)
        yield port
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """tiny_cnn, its float16 artifact, and an inputs file for it."""
    import onnx

    from amptool.app.convert import ConvertConfig, convert_model
    from amptool.testing import model_zoo

    root = tmp_path_factory.mktemp("rpc")
    model = root / "tiny_cnn.onnx"
    onnx.save(model_zoo.ALL_BUILDERS["tiny_cnn"](), model)
    convert_model(ConvertConfig(model=str(model), dtype="float16"), str(root / "out"))
    manifest = read_json(root / "out" / "manifest.json")
    rng = np.random.default_rng(0)
    np.savez(root / "x.npz", **{i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"])
                                for i in manifest["inputs"]})
    return model, root / "out", root / "x.npz"


def test_run_through_the_tracker_is_bit_identical_to_a_local_run(artifact, tracker, run_cli, tmp_path):
    _, outdir, inputs = artifact
    local = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "local.npz"))
    assert local.exit_code == 0, local.output
    remote = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "remote.npz"),
                     "--rpc", f"127.0.0.1:{tracker}", "--rpc-key", KEY, "--rpc-timeout", "30",
                     "--json", str(tmp_path / "run.json"))
    assert remote.exit_code == 0, remote.output
    assert f"key '{KEY}'" in remote.output
    a, b = np.load(tmp_path / "local.npz"), np.load(tmp_path / "remote.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name])
    report = read_json(tmp_path / "run.json")["remote"]
    assert report["key"] == KEY and report["server"].startswith("127.0.0.1:")
    assert report["library_removed"] is True  # removed from the device, checked there


def test_diff_through_the_tracker_passes(artifact, tracker, run_cli, tmp_path):
    model, _, _ = artifact
    result = run_cli("-q", "diff", str(model), "--rpc", f"127.0.0.1:{tracker}", "--rpc-key", KEY,
                     "--rpc-timeout", "30", "--iterations", "2", "--json", str(tmp_path / "d.json"))
    assert result.exit_code == 0, result.output
    verdict = result.output.strip().splitlines()[-1]
    assert verdict.startswith("PASSED | float16 on llvm at 127.0.0.1:"), verdict
    report = read_json(tmp_path / "d.json")
    assert report["remote"]["key"] == KEY and report["passed"] is True


def test_diff_of_an_artifact_on_one_server(artifact, server, run_cli):
    model, outdir, _ = artifact
    result = run_cli("-q", "diff", str(model), "--artifact", str(outdir), "--rpc-server", f"127.0.0.1:{server}",
                     "--rpc-timeout", "30")
    assert result.exit_code == 0, result.output
    assert f"at 127.0.0.1:{server} |" in result.output.strip().splitlines()[-1]


def test_bench_reports_times_measured_on_the_device(artifact, server, run_cli, tmp_path):
    _, outdir, _ = artifact
    result = run_cli("-q", "bench", str(outdir), "--rpc-server", f"127.0.0.1:{server}", "--rpc-timeout", "30",
                     "--rounds", "2", "--runs", "3", "--threads", "1", "--json", str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    report = read_json(tmp_path / "b.json")
    timed = {r["variant"]: r for r in report["results"]}
    assert timed["amptool-float16"]["runs"] == 6 and timed["amptool-float16"]["median_ms"] > 0
    assert timed["onnxruntime-float32"]["runs"] == 6
    assert report["host"]["remote_server"] == f"127.0.0.1:{server}"
    assert "time evaluator on the remote device" in report["clock"]
    assert "amptool-float16/onnxruntime-float32" in report["ratios"]


def test_a_server_killed_mid_run_exits_3_within_the_timeout(artifact, tmp_path):
    """diff runs many input sets on the device, one RPC call each; the server dies among them."""
    model, outdir, _ = artifact
    port = _free_port()
    process = _server(port, tmp_path)
    try:
        _wait_listening(port, process)
        timeout_s = 30
        client = subprocess.Popen(
            [sys.executable, "-m", "amptool", "diff", str(model), "--artifact", str(outdir), "--rpc-server",
             f"127.0.0.1:{port}", "--rpc-timeout", str(timeout_s), "--iterations", "10000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert client.stderr is not None
            seen = []
            for line in client.stderr:  # stage lines (not a terminal): wait until it runs on the device
                seen.append(line)
                if "run 3/10000" in line:
                    break
            assert client.poll() is None, "".join(seen)
            _stop(process)
            killed = time.monotonic()
            _, err = client.communicate(timeout=timeout_s + 10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(client.pid, signal.SIGKILL)
        assert client.returncode == 3, err
        assert time.monotonic() - killed < timeout_s
        assert single_error(err) and f"Remote server 127.0.0.1:{port}: run failed" in err, err
    finally:
        _stop(process)


def test_nothing_listening_exits_3_at_once(artifact, run_cli, tmp_path):
    _, outdir, inputs = artifact
    start = time.monotonic()
    result = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"),
                     "--rpc-server", f"127.0.0.1:{_free_port()}", "--rpc-timeout", "20")
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert "nothing listening" in result.output
    assert time.monotonic() - start < 20
    assert not (tmp_path / "y.npz").exists()


def test_a_silent_server_times_out_instead_of_hanging(artifact, run_cli, tmp_path):
    """A listener that never answers (a hung host): TVM's client would wait for ever."""
    _, outdir, inputs = artifact
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        start = time.monotonic()
        result = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"),
                         "--rpc-server", f"127.0.0.1:{silent.getsockname()[1]}", "--rpc-timeout", "3")
        elapsed = time.monotonic() - start
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert "no answer within 3 s" in result.output
    assert elapsed < 3 + 60  # the timeout plus spawning the RPC worker on a loaded machine


def test_a_key_no_server_serves_times_out(artifact, tracker, run_cli, tmp_path):
    _, outdir, inputs = artifact
    result = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"),
                     "--rpc", f"127.0.0.1:{tracker}", "--rpc-key", "no-such-device", "--rpc-timeout", "2")
    assert result.exit_code == 3 and single_error(result.output), result.output
    # "no free device with key …" on an idle machine; on a loaded one the connect itself may time out first
    assert "key 'no-such-device'" in result.output


def test_a_gpu_artifact_on_a_server_without_that_gpu_exits_3(artifact, server, run_cli, tmp_path):
    _, outdir, inputs = artifact
    cuda = tmp_path / "cuda"
    manifest = read_json(outdir / "manifest.json")
    cuda.mkdir()
    (cuda / "model.so").write_bytes((outdir / "model.so").read_bytes())
    (cuda / "manifest.json").write_text(json.dumps({**manifest, "device": "cuda"}))
    result = run_cli("run", str(cuda), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"),
                     "--rpc-server", f"127.0.0.1:{server}", "--rpc-timeout", "30")
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert "has no cuda device" in result.output


@pytest.mark.parametrize(("flags", "message"), [
    (["--rpc", "127.0.0.1:9190"], "needs --rpc-key"),
    (["--rpc-key", "k"], "--rpc-key is only used with --rpc"),
    (["--rpc", "127.0.0.1:9190", "--rpc-key", "k", "--rpc-server", "127.0.0.1:9090"], "both name a remote"),
    (["--rpc-server", "localhost"], "is not HOST:PORT"),
    (["--rpc-server", "127.0.0.1:70000"], "is not HOST:PORT"),
    (["--rpc-server", "127.0.0.1:9090", "--rpc-timeout", "0"], "must be more than 0"),
])
def test_bad_rpc_flags_are_one_line_exit_2(flags, message, artifact, run_cli, tmp_path):
    _, outdir, inputs = artifact
    result = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "y.npz"), *flags)
    assert result.exit_code == 2 and single_error(result.output), result.output
    assert message in result.output


def test_per_layer_is_refused_with_rpc(artifact, run_cli):
    model, _, _ = artifact
    result = run_cli("diff", str(model), "--per-layer", "--rpc-server", "127.0.0.1:9090")
    assert result.exit_code == 2 and single_error(result.output), result.output
    assert "--per-layer runs every node here" in result.output


def test_check_models_spreads_a_matrix_over_the_trackers_devices(tracker, tmp_path):
    """``make check-models-remote``: every diff runs on a device of the tracker, two at once."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\nmatrix:\n  - {model: examples/tiny_cnn.onnx, dtypes: [float16, bfloat16]}\n")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "configs" / "check_models.py"), "--matrix", str(matrix),
                           "--out", str(tmp_path / "out"), "--rpc", f"127.0.0.1:{tracker}", "--rpc-key", KEY,
                           "--rpc-timeout", "60"], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK_MODELS | 2/2 passed or skipped | 0 failed" in done.stdout
    for dtype in ("float16", "bfloat16"):
        assert f"| tiny_cnn.onnx | {dtype} | llvm | PASSED |" in done.stdout
        report = read_json(tmp_path / "out" / f"tiny_cnn-{dtype}-llvm.json")
        assert report["remote"]["key"] == KEY and report["remote"]["server"].startswith("127.0.0.1:")


def test_a_runtime_only_device_host_serves_the_artifact(artifact, run_cli, tmp_path):
    """docs/remote.md's device host: the TVM package without its compiler library, TVM_USE_RUNTIME_LIB=1."""
    import shutil

    import tvm

    _, outdir, inputs = artifact
    source = Path(tvm.__file__).parent
    shutil.copytree(source, tmp_path / "rt" / "tvm",
                    ignore=lambda _d, names: [n for n in names if n in ("libtvm_compiler.so", "__pycache__")])
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "rt"), "TVM_USE_RUNTIME_LIB": "1"}
    check = subprocess.run([sys.executable, "-c", "import tvm; print(tvm.base._RUNTIME_ONLY, tvm.__file__)"],
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert check.stdout.startswith(f"True {tmp_path}"), check.stdout
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port",
                                str(port), "--port-end", str(port + 1), "--silent"], env=env,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, process)
        assert run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "local.npz")).exit_code == 0
        result = run_cli("run", str(outdir), "--inputs", str(inputs), "-o", str(tmp_path / "remote.npz"),
                         "--rpc-server", f"127.0.0.1:{port}", "--rpc-timeout", "30")
        assert result.exit_code == 0, result.output
    finally:
        _stop(process)
    a, b = np.load(tmp_path / "local.npz"), np.load(tmp_path / "remote.npz")
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name])


def test_python_api_diff_on_a_remote(artifact, server):
    import amptool
    from amptool.runtime.remote import RemoteSpec

    model, _, _ = artifact
    report = amptool.diff(str(model), dtype="bfloat16", remote=RemoteSpec("127.0.0.1", server, timeout_s=30))
    assert report.passed and report.remote is not None
    assert report.remote["server"] == f"127.0.0.1:{server}" and report.remote["device"] == "cpu"
    assert report.verdict.startswith(f"PASSED | bfloat16 on llvm at 127.0.0.1:{server} |")
