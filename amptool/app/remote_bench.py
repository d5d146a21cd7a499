"""``bench --rpc``: amptool's builds timed on a remote device, next to onnxruntime timed here.

The builds and the inputs are bench's (``amptool.app.bench``): float32 and every low dtype,
exported to a private temporary directory, the same seeded inputs. Then:

  onnxruntime  here, in its own worker process per round, exactly as a local bench times it;
  amptool      uploaded to the device (one session per variant, the library removed after) and
               timed there by TVM's time evaluator: per round ``runs`` single calls after one
               discarded call, clocked on the device (a GPU is synchronised before the clock stops),
               so neither the network nor this machine's load is in the numbers.

The ratios then compare the device with this machine: what moving the model there buys. Each
round is its own RPC call, bounded by ``--rpc-timeout``, so a slow device never looks like a
dead one and a dead one stops the bench with exit 3.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any

import numpy as np

from amptool import __version__, _tvm
from amptool.app.artifact import LIBRARY_NAME, check_runnable, read_manifest
from amptool.app.bench import (
    ONNXRUNTIME,
    BenchConfig,
    BenchReport,
    ProgressCallback,
    StageCallback,
    VariantTiming,
    _from_onnx,
    _onnxruntime_provider,
    amptool_variant,
    artifact_baseline,
    default_threads,
    host_info,
    time_rounds,
)
from amptool.app.bench_worker import ONNXRUNTIME_RUNTIME, WorkerSpec
from amptool.app.versions import engine_versions
from amptool.errors import UserError
from amptool.frontend.prepare import pin_shapes, reference_model
from amptool.frontend.signature import TensorSpec
from amptool.runtime.inputs import generate_inputs
from amptool.runtime.remote import RemoteSpec, open_remote

CLOCK = "amptool: TVM time evaluator on the remote device, per call; onnxruntime: wall clock per call here"
ISOLATION = "amptool on the remote device; onnxruntime in a process per round here"


def bench_remote(config: BenchConfig, remote: RemoteSpec, on_stage: StageCallback | None = None,
                 on_progress: ProgressCallback | None = None) -> BenchReport:
    """Build every variant here, time it on ``remote``; time onnxruntime here (see the module docstring)."""
    notify = on_stage or (lambda _name: None)
    if getattr(config, "against", ()):
        raise UserError(f"--against {', '.join(config.against)} times other runtimes here; with --rpc only amptool "
                        "runs on the device", "Drop --against, or bench here without --rpc/--rpc-server.")
    threads = config.threads or default_threads()
    _tvm.set_num_threads(threads)  # the builds' pool here
    with tempfile.TemporaryDirectory(prefix="amptool-bench-rpc-") as scratch:
        if os.path.isdir(config.model):
            paths, specs, model, fixed = _artifact_variant(config)
            built: dict[str, tuple[float | None, float | None]] = {}
        else:
            variants, specs, model, fixed = _from_onnx(config, notify, scratch)
            paths = {name: v.path for name, v in variants.items()}
            built = {name: (v.build_s, v.compile_s) for name, v in variants.items()}
        feeds = {**generate_inputs(specs, model, seed=config.seed), **fixed}
        ort_model = pin_shapes(reference_model(model), specs) if (config.batch or config.input_shapes) else model
        ort_path = os.path.join(scratch, "onnxruntime.onnx")
        with open(ort_path, "wb") as handle:
            handle.write(ort_model.SerializeToString())
        provider = _onnxruntime_provider("llvm")  # onnxruntime runs here, on this machine's CPU
        timings = [VariantTiming(ONNXRUNTIME)]
        notify("onnxruntime: timing here")
        infos = time_rounds([WorkerSpec(ONNXRUNTIME, ONNXRUNTIME_RUNTIME, ort_path, threads, feeds,
                                         provider=provider)], timings, config, notify, None)
        remote_info: dict[str, Any] = {}
        total = len(paths) * config.rounds
        for index, (name, path) in enumerate(paths.items()):
            notify(f"{name}: upload to {remote.label}")
            build_s, compile_s = built.get(name, (None, None))
            timing = VariantTiming(name, build_s=build_s, compile_s=compile_s)
            timing.times_ms.extend(_time_on_device(remote, path, feeds, config, remote_info, on_progress,
                                                   index * config.rounds, total))
            timings.append(timing)
    return BenchReport(
        model=config.model,
        target=config.target,
        threads=threads,
        tvm_threads=threads,
        inputs=specs,
        results=timings,
        host={**host_info(), "remote": remote.label, "remote_server": str(remote_info.get("server", "")),
              "remote_device": str(remote_info.get("device", ""))},
        versions={"amptool": __version__, **_tvm.versions(), **engine_versions()},
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        onnxruntime_provider=str(infos[0].get("provider", provider)),
        clock=CLOCK,
        isolation=ISOLATION,
    )


def _time_on_device(remote: RemoteSpec, directory: str, feeds: dict[str, np.ndarray], config: BenchConfig,
                    info: dict[str, Any], on_progress: ProgressCallback | None, done: int, total: int) -> list[float]:
    """Per round, ``runs`` single calls timed on the device; one RPC call (bounded by the timeout) per round."""
    manifest = read_manifest(directory)
    library = os.path.join(directory, str(manifest.get("library") or LIBRARY_NAME))
    times: list[float] = []
    with open_remote(remote, library, str(manifest.get("device", "cpu")), [i["name"] for i in manifest["inputs"]],
                     [o["name"] for o in manifest["outputs"]], [i["dtype"] for i in manifest["inputs"]]) as model:
        info.update(model.info)
        for round_index in range(config.rounds):
            times.extend(model.time(feeds, number=1, repeat=config.runs))
            if on_progress:
                on_progress(done + round_index + 1, total)
    return times


def _artifact_variant(config: BenchConfig) -> tuple[dict[str, str], list[TensorSpec], Any, dict[str, np.ndarray]]:
    """An artifact as the one amptool variant (it may be built for the device only, so nothing loads
    here), at its input shapes; onnxruntime runs its original model."""
    manifest = read_manifest(config.model)
    check_runnable(config.model, manifest)
    _path, model, specs, fixed = artifact_baseline(config.model, manifest, "the onnxruntime baseline")
    return {amptool_variant(str(manifest.get("dtype"))): config.model}, specs, model, fixed
