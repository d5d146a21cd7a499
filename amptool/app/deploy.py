"""Run an artifact on stored inputs (``amptool run``): .npz in, .npz out.

This is the deployment path, so it loads nothing that needs TVM's compiler: the library
goes through ``tvm.runtime.load_module`` and the runtime's VirtualMachine, never
``tvm.relax``. A host with a runtime-only TVM (no ``lib/libtvm_compiler.so``, or
``TVM_USE_RUNTIME_LIB=1``) runs what a build host converted.

Inputs are checked against the manifest before the library is loaded: exactly one array per
input, the dtype and shape it was built for. ``.npz`` cannot hold bfloat16, so a bfloat16
input (``--low-precision-io``) is given as float32 and rounded on the way in, and a bfloat16
output is written as float32 (exact).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.app.artifact import check_runnable, load_artifact, read_manifest
from amptool.errors import UserError
from amptool.frontend.shape_inputs import value_preview
from amptool.frontend.signature import TensorSpec
from amptool.runtime.inputs import check_input_arrays, check_input_shapes, read_npz, save_arrays
from amptool.runtime.remote import RemoteSpec


@dataclass(frozen=True)
class RunConfig:
    artifact: str  # an 'amptool convert' output directory
    inputs: str  # .npz, one array per model input
    output: str  # .npz to write, one array per model output
    device: str | None = None  # None: the device the library was built for
    remote: RemoteSpec | None = None  # run on a device behind TVM's RPC instead of here (docs/remote.md)


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    device: str
    manifest: dict[str, Any]
    load_s: float
    run_s: float
    runtime_only: bool  # whether TVM ran without its compiler library
    artifact: str = ""  # the OUTDIR that was run
    output: str = ""  # the .npz written
    remote: dict[str, Any] | None = None  # where it ran, with --rpc/--rpc-server

    def as_json(self) -> dict[str, Any]:
        """What ``amptool run --json`` writes: the outputs' names, dtypes and shapes, not their values."""
        return {
            "artifact": self.artifact,
            "output": self.output,
            "dtype": self.manifest.get("dtype"),
            "target": self.manifest.get("target"),
            "device": self.device,
            "runtime_only": self.runtime_only,
            "outputs": [{"name": name, "dtype": np.asarray(value).dtype.name, "shape": list(np.shape(value))}
                        for name, value in self.outputs.items()],
            "load_ms": round(self.load_s * 1e3, 3),
            "run_ms": round(self.run_s * 1e3, 3),
            "remote": self.remote,
        }


def run_artifact(config: RunConfig) -> RunResult:
    """Check the inputs, load the library, run it once and write the outputs atomically."""
    _check_output_path(config.output)
    manifest = read_manifest(config.artifact)
    check_runnable(config.artifact, manifest)
    specs = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in manifest["inputs"]]
    arrays = _without_fixed(read_npz(config.inputs, "--inputs"), manifest.get("fixed_inputs", {}), config.inputs)
    feeds = check_input_arrays(arrays, [_npz_spec(s) for s in specs], "--inputs", config.inputs)
    check_input_shapes(feeds, specs, f"--inputs {config.inputs}")
    start = time.perf_counter()
    with contextlib.ExitStack() as session:
        if config.remote is None:
            manifest, compiled = load_artifact(config.artifact, device=config.device)
        else:
            from amptool.app.remote import remote_artifact  # noqa: PLC0415

            manifest, compiled = session.enter_context(remote_artifact(config.remote, config.artifact, config.device))
        loaded = time.perf_counter()
        outputs = compiled.run(feeds)
        ran = time.perf_counter()
    remote = None
    if config.remote is not None:
        from amptool.app.remote import remote_json  # noqa: PLC0415

        remote = remote_json(compiled)  # type: ignore[arg-type]  # a RemoteModel with --rpc
    save_arrays(config.output, {name: _npz_array(value) for name, value in outputs.items()}, "-o")
    return RunResult(outputs=outputs, device=compiled.device, manifest=manifest, load_s=loaded - start,
                     run_s=ran - loaded, runtime_only=_tvm.runtime_only(), artifact=config.artifact,
                     output=config.output, remote=remote)


def _without_fixed(arrays: dict[str, np.ndarray], fixed: dict[str, Any], path: str) -> dict[str, np.ndarray]:
    """The arrays less those of inputs the artifact fixed (a constant of the build): each must hold
    the fixed value — another value would need a different build, not a different feed."""
    for name, value in fixed.items():
        if name not in arrays:
            continue
        given, pinned = np.asarray(arrays.pop(name)), np.asarray(value)
        if given.shape != pinned.shape or not np.array_equal(given, pinned.astype(given.dtype)):
            raise UserError(
                f"--inputs {path}: input '{name}' is fixed to {value_preview(pinned)} in this artifact, "
                f"the file gives {value_preview(given)}",
                f"Convert again with --fixed-input {name}=VALUE for that value, or drop '{name}' from the file.",
            )
    return arrays


def _npz_spec(spec: TensorSpec) -> TensorSpec:
    """The dtype the .npz holds for ``spec``: float32 for bfloat16."""
    return TensorSpec(spec.name, "float32", spec.shape) if spec.dtype == "bfloat16" else spec


def _npz_array(value: np.ndarray) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _check_output_path(path: str) -> None:
    """Refuse an output that cannot be written before anything runs."""
    if os.path.isdir(path):
        raise UserError(f"-o {path}: is a directory", "Name a file, e.g. -o outputs.npz.")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(f"-o {path}: directory {parent} does not exist or is not writable")
