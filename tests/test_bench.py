"""``amptool bench``: JSON contract, variants, ratios, artifact input, user errors, worker processes.
No absolute timing: one test compares bench's onnxruntime time with onnxruntime alone, as a ratio."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import tempfile

import numpy as np
import onnx
import pytest

from amptool.app import bench
from amptool.app.bench import ONNXRUNTIME, BenchConfig, BenchReport, VariantTiming, bench_model
from amptool.app.bench_worker import ONNXRUNTIME_RUNTIME, WorkerSpec, isolated_workers
from amptool.compiler.targets import host_llvm_spec
from amptool.errors import UserError
from amptool.testing import model_zoo
from benchmarks.bench_isolation import seeded_feeds, standalone_onnxruntime_ms
from tests.conftest import read_json

FAST = ("--rounds", "1", "--runs", "2", "--threads", "1")


def test_json_contract_and_summary_line(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float16", "--dtype", "bfloat16", *FAST,
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    assert data["threads"] == 1
    variants = [r["variant"] for r in data["results"]]
    assert variants == [ONNXRUNTIME, "amptool-float32", "amptool-float16", "amptool-bfloat16"]
    for r in data["results"]:
        assert r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"]
        assert r["runs"] == 2
    assert set(data["ratios"]) == {
        "amptool-float32/onnxruntime-float32",
        "amptool-float16/onnxruntime-float32", "amptool-float16/amptool-float32",
        "amptool-bfloat16/onnxruntime-float32", "amptool-bfloat16/amptool-float32",
    }
    assert all(v > 0 for v in data["ratios"].values())
    assert set(data["paired_ratios"]) == set(data["ratios"]) and all(v > 0 for v in data["paired_ratios"].values())
    assert data["host"]["llvm_cpu"] and data["versions"]["apache-tvm"]
    assert data["host"]["llvm_mattr"] == ",".join(host_llvm_spec().get("mattr", []))
    assert data["isolation"] == "process per runtime, fresh each round" and data["tvm_threads"] == 1
    assert set(data["settle_ms"]) == set(variants)  # how long each worker took to go idle after a turn
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("BENCH | amptool-float32 ") and last.endswith("| threads 1")


def test_float32_is_timed_once(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float32", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [r["variant"] for r in read_json(out)["results"]] == [ONNXRUNTIME, "amptool-float32"]


def test_artifact_is_timed_against_fresh_float32(zoo_model, run_cli, tmp_path):
    artifact = tmp_path / "art"
    assert run_cli("convert", zoo_model("tiny_cnn"), "--dtype", "bfloat16", "-o", str(artifact)).exit_code == 0
    out = tmp_path / "bench.json"
    result = run_cli("bench", str(artifact), *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    assert [r["variant"] for r in data["results"]] == [ONNXRUNTIME, "amptool-float32", "amptool-bfloat16"]
    assert data["results"][2]["build_s"] is None  # loaded, not built


def test_batch_pins_a_dynamic_batch(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("dynamic_batch_cnn"), "--batch", "3", "--dtype", "float32", *FAST,
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out)["inputs"][0]["shape"] == [3, 3, 32, 32]


def test_build_options_reach_the_builds(zoo_model, run_cli, tmp_path):
    """bench takes convert's build options: a fixed input is baked in (no longer an input)."""
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("mlp_with_bool_mask"), "--fixed-input", "mask=1", "--no-concretize",
                     "--low-precision-io", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [i["name"] for i in read_json(out)["inputs"]] == ["x"]


def test_artifact_refuses_build_options(zoo_model, run_cli, tmp_path):
    artifact = tmp_path / "art"
    assert run_cli("convert", zoo_model("tiny_cnn"), "-o", str(artifact)).exit_code == 0
    result = run_cli("bench", str(artifact), "--no-prepare", "--colors", "builtin:aggressive", *FAST)
    assert result.exit_code == 2
    assert "colors, prepare cannot change it" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--threads", "0"), "--threads must be at least 1"),
        (("--dtype", "float8"), "float8"),
        (("--batch", "4"), "declared [1, 3, 32, 32]"),
    ],
)
def test_user_errors_exit_2(zoo_model, run_cli, args, message):
    result = run_cli("bench", zoo_model("tiny_cnn"), *args)
    assert result.exit_code == 2
    assert message in result.output


def test_ratios_are_medians_over_medians():
    def timing(name: str, times: list[float]) -> VariantTiming:
        return VariantTiming(name, times_ms=times)

    report = BenchReport(
        model="m", target="llvm", threads=2, tvm_threads=2, inputs=[],
        results=[timing(ONNXRUNTIME, [2.0, 2.0, 100.0]), timing("amptool-float32", [3.0, 3.0, 3.0]),
                 timing("amptool-float16", [1.5, 1.5, 1.5])],
        host={}, versions={}, date="",
    )
    assert report.ratio("amptool-float32", ONNXRUNTIME) == pytest.approx(1.5)
    assert report.ratios()["amptool-float16/amptool-float32"] == pytest.approx(0.5)
    assert math.isnan(VariantTiming("x").median_ms)


def _bench_workers() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("amptool-bench")]


def _scratch_dirs() -> list[str]:
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("amptool-bench-")]


def test_onnxruntime_time_matches_a_standalone_session(tmp_path):
    """bench's onnxruntime median is onnxruntime's own speed, not one slowed by TVM's spinning
    pool: it agrees with a standalone session (same model, threads, inputs) in a fresh process.
    Issue 13 saw ~4x with every runtime in one process; the band is wide because machines are noisy,
    and the fastest runs are compared: another test's build on the same cores (pytest -n 2) slows some
    runs of either side by as much (a median read 3.6x once), a spinning pool slows every run. A
    measurement outside the band is taken again, up to three times: another test's build on the two
    cores once held every bench run of a round set at 2.03x; a spinning pool fails every attempt."""
    path = str(tmp_path / "encoder.onnx")
    onnx.save(model_zoo.transformer_encoder(vocab=1000, seq=64, d_model=128, heads=4, layers=2), path)
    feeds = seeded_feeds(path)
    seen = []
    for _attempt in range(3):
        alone = standalone_onnxruntime_ms(path, feeds, threads=2, runs=30)
        report = bench_model(BenchConfig(model=path, dtypes=("float32",), threads=2, rounds=4, runs=5))
        alone += standalone_onnxruntime_ms(path, feeds, threads=2, runs=30)
        timing = report.timing(ONNXRUNTIME)
        assert timing is not None and len(timing.times_ms) == 20
        seen.append(f"bench {min(timing.times_ms):.3f} ms vs standalone {min(alone):.3f} ms")
        if 0.5 <= min(timing.times_ms) / min(alone) <= 2.0:
            return
    pytest.fail("onnxruntime in bench is not its standalone speed (fastest runs): " + "; ".join(seen))


def test_workers_and_scratch_are_gone_after_an_error(zoo_model, monkeypatch, tmp_path):
    """A failure while timing still stops every worker and removes the exported variants."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's scratch only (xdist runs others)
    before = _scratch_dirs()

    def fail(*_args: object) -> None:
        assert len(_bench_workers()) == 2  # onnxruntime and amptool-float32, each in its own process
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.Worker, "time", fail)
    with pytest.raises(KeyboardInterrupt):
        bench_model(BenchConfig(model=zoo_model("tiny_cnn"), dtypes=("float32",), threads=1))
    assert _bench_workers() == []
    assert _scratch_dirs() == before


@pytest.mark.parametrize(("fresh", "spawns", "isolation"), [(True, 3, "process per runtime, fresh each round"),
                                                          (False, 1, "process per runtime")])
def test_fresh_workers_every_round(zoo_model, monkeypatch, fresh, spawns, isolation):
    """One process keeps its speed luck for life (core placement, memory layout): by default every
    round loads new workers, and the previous round's are gone before the next ones start."""
    started: list[int] = []
    real = bench.isolated_workers

    @contextlib.contextmanager
    def counting(specs):
        assert _bench_workers() == []  # the previous round's workers have exited
        started.append(len(specs))
        with real(specs) as workers:
            yield workers

    monkeypatch.setattr(bench, "isolated_workers", counting)
    report = bench_model(BenchConfig(model=zoo_model("tiny_cnn"), dtypes=("float32",), threads=1, rounds=3, runs=2,
                                     fresh_workers=fresh))
    assert started == [2] * spawns
    assert report.isolation == isolation
    assert [len(r.times_ms) for r in report.results] == [6, 6]
    assert _bench_workers() == []


def test_same_workers_flag(zoo_model, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "float32", *FAST, "--same-workers", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert read_json(out)["isolation"] == "process per runtime"


def test_a_worker_user_error_reaches_the_parent(tmp_path):
    """onnxruntime failing to load in its worker is the same one-line UserError as in process."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    spec = WorkerSpec(ONNXRUNTIME, ONNXRUNTIME_RUNTIME, str(broken), threads=1)
    with pytest.raises(UserError, match="onnxruntime cannot run the model"), isolated_workers([spec]):
        pass
    assert _bench_workers() == []


def test_workers_take_turns_and_exit(zoo_model):
    spec = WorkerSpec(ONNXRUNTIME, ONNXRUNTIME_RUNTIME, zoo_model("tiny_cnn"), threads=1,
                      feeds={"input": np.zeros((1, 3, 32, 32), np.float32)})
    with isolated_workers([spec, spec]) as workers:
        assert [len(w.time(1, 3)) for w in workers] == [3, 3]
        assert workers[0].info["provider"] == "CPUExecutionProvider"
        processes = [w.process for w in workers]
    assert [p.exitcode for p in processes] == [0, 0]


def test_against_openvino_times_it_in_float32_and_each_dtype(zoo_model, run_cli, tmp_path):
    pytest.importorskip("openvino", reason="amptool[openvino] is not installed")
    out = tmp_path / "bench.json"
    result = run_cli("bench", zoo_model("tiny_cnn"), "--dtype", "bf16", "--against", "openvino", *FAST,
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    assert [r["variant"] for r in data["results"]] == [ONNXRUNTIME, "openvino-float32", "openvino-bfloat16",
                                                       "amptool-float32", "amptool-bfloat16"]
    assert all(r["median_ms"] > 0 for r in data["results"])
    assert {"amptool-float32/openvino-float32", "amptool-bfloat16/openvino-bfloat16",
            "amptool-bfloat16/openvino-float32"} <= set(data["ratios"])
    assert data["openvino_precision"]["openvino-float32"] == "f32"
    assert data["openvino_precision"]["openvino-bfloat16"] in ("bf16", "f32")  # f32 where the CPU has no bf16
    assert "openvino-bfloat16" in result.output.strip().splitlines()[-1]


def test_against_openvino_refuses_other_targets(zoo_model):
    with pytest.raises(UserError, match="OpenVINO's CPU plugin"):
        BenchConfig(model=zoo_model("tiny_cnn"), target="cuda", against=("openvino",))
    with pytest.raises(UserError, match="not a runtime"):
        BenchConfig(model=zoo_model("tiny_cnn"), against=("tensorrt",))


def test_paired_ratio_is_the_median_of_per_round_ratios():
    """Round by round 2/1, 3/1, 10/5 → median 2.0; the pooled medians would give 3/1 = 3.0."""
    from amptool.app.bench import BenchReport, VariantTiming

    a = VariantTiming("amptool-float32", times_ms=[2, 3, 10], round_ms=[2.0, 3.0, 10.0])
    b = VariantTiming(ONNXRUNTIME, times_ms=[1, 1, 5], round_ms=[1.0, 1.0, 5.0])
    report = BenchReport(model="m", target="llvm", threads=1, tvm_threads=1, inputs=[], results=[b, a], host={},
                         versions={}, date="")
    assert report.ratio("amptool-float32", ONNXRUNTIME) == 3.0
    assert report.paired_ratio("amptool-float32", ONNXRUNTIME) == 2.0
    assert report.ratios(paired=True) == {"amptool-float32/onnxruntime-float32": 2.0}


def test_openvino_refusals_name_what_failed_not_where():
    """OpenVINO's messages open with source locations; the one line amptool shows is the
    conversion summary, or the first line that says something."""
    from amptool.app.bench_worker import openvino_error_summary

    conversion = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:84:\n"
        "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted.\n\n"
        "Summary:\n-- Conversion is failed for: AveragePool-18\n\n")
    assert openvino_error_summary(conversion) == "Conversion is failed for: AveragePool-18"
    other = RuntimeError("Exception from src/inference/src/cpp/core.cpp:84:\nUnsupported input element type u1\n")
    assert openvino_error_summary(other) == "Unsupported input element type u1"
    assert openvino_error_summary(RuntimeError("")) == "RuntimeError"
