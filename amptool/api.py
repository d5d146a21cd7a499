"""amptool's public Python API: what the CLI does, with the same names and typed options.

Each function turns keyword arguments into the application layer's frozen config and calls it;
the CLI does the same after parsing text (``amptool/cli``). A problem with the caller's input
raises :class:`amptool.errors.UserError` (``exit_code`` 2, or 3 for an unavailable target);
anything else is a bug. Nothing here prints; pass ``on_stage=`` to follow progress.
See docs/python-api.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amptool.app.artifact import load_artifact
from amptool.app.bench import BenchConfig, BenchReport, bench_model
from amptool.app.convert import BuildResult, ConvertConfig, build_model, export_build, write_ir
from amptool.app.diff import DiffConfig, DiffReport, diff_model
from amptool.app.inspect import InspectReport, inspect_model
from amptool.app.outdir import check_output_dir
from amptool.compare.tolerance import TolerancePolicy
from amptool.compare.tolerance_profile import tolerance_override
from amptool.errors import UserError
from amptool.runtime.remote import RemoteSpec
from amptool.runtime.tvm_runner import CompiledModel

PathLike = str | os.PathLike[str]
StageCallback = Callable[[str], None]
Feeds = Mapping[str, np.ndarray]


@dataclass
class ConvertResult:
    """A conversion: its manifest, where it was written (None when kept in memory), and the build."""

    manifest: dict[str, Any]
    output: str | None
    build: BuildResult | None = field(default=None, repr=False)
    _model: CompiledModel | None = field(default=None, repr=False)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run the converted model on named arrays; returns named arrays."""
        if self._model is None:
            if self.build is None or self.build.executable is None:
                raise UserError("this conversion has no library to run (lower_only=True)")
            self._model = self.build.compiled()
        return self._model.run(feeds)


@dataclass
class Artifact:
    """An artifact directory loaded with the TVM runtime alone (works without TVM's compiler)."""

    path: str
    manifest: dict[str, Any]
    model: CompiledModel = field(repr=False)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return list(self.manifest["inputs"])

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return list(self.manifest["outputs"])

    @property
    def device(self) -> str:
        return self.model.device

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Named arrays in, named arrays out (the manifest's input names, dtypes and shapes)."""
        missing = [i["name"] for i in self.inputs if i["name"] not in feeds]
        if missing:
            raise UserError(f"run: no array for input(s) {', '.join(repr(n) for n in missing)}",
                            f"Inputs: {', '.join(i['name'] for i in self.inputs)}.")
        return self.model.run(feeds)


def _config(model: PathLike, dtype: str, build: Mapping[str, Any]) -> ConvertConfig:
    """Build options as ConvertConfig fields; an unknown one is the caller's error, not a TypeError."""
    known = set(ConvertConfig.__dataclass_fields__) - {"model", "dtype"}
    unknown = sorted(set(build) - known)
    if unknown:
        raise UserError(f"unknown option(s) {', '.join(unknown)}", f"Build options: {', '.join(sorted(known))}.")
    return ConvertConfig(model=os.fspath(model), dtype=dtype, **build)


def convert(model: PathLike, *, dtype: str = "float16", output: PathLike | None = None, lower_only: bool = False,
            emit_ir: PathLike | None = None, on_stage: StageCallback | None = None, **build: Any) -> ConvertResult:
    """Convert ``model`` to ``dtype``; with ``output``, write the artifact directory (atomically).

    ``build`` takes ConvertConfig's fields: colors, target, cuda_arch, target_options,
    input_shapes ({name: dims}), fixed_inputs ({name: value}), calibration, low_precision_io,
    range_guards, cancellation_guard, prepare, concretize, max_input_bytes, dims ({symbolic dim: value}),
    exclude_ops and exclude_nodes (op types / node-name patterns kept float32)."""
    config = _config(model, dtype, build)
    out = os.fspath(output) if output is not None else None
    if out is not None:
        check_output_dir(out, "output")
    if lower_only:
        if out is None:
            raise UserError("lower_only=True writes lowered.py into an output directory: give output=")
        from amptool.app.lower import lower_model  # noqa: PLC0415 - lowering imports every backend's intrinsics

        rewritten, manifest = lower_model(config, out, on_stage=on_stage)
        if emit_ir is not None:
            write_ir(rewritten.passes.mod, os.fspath(emit_ir))
        return ConvertResult(manifest=manifest, output=out)
    result = build_model(config, on_stage=on_stage, emit_ir=os.fspath(emit_ir) if emit_ir is not None else None)
    manifest = export_build(result, out, on_stage) if out is not None else result.manifest()
    return ConvertResult(manifest=manifest, output=out, build=result)


def load(outdir: PathLike, *, device: str | None = None) -> Artifact:
    """Load an artifact directory written by ``convert``; ``device`` like ``cpu`` or ``cuda:0``."""
    path = os.fspath(outdir)
    manifest, model = load_artifact(path, device=device)
    return Artifact(path=path, manifest=manifest, model=model)


def tolerance_policy(per_output: Mapping[str, Mapping[str, Any]] | None = None, **defaults: Any) -> TolerancePolicy:
    """A TolerancePolicy from numbers: ``atol=…`` etc. for every output, ``per_output`` for single ones."""
    named = tuple((name, tolerance_override(values, f"per_output[{name!r}]"))
                  for name, values in (per_output or {}).items())
    return TolerancePolicy(default=tolerance_override(defaults, "diff"), per_output=named)


def diff(model: PathLike, *, dtype: str = "float16", artifact: PathLike | None = None,
         inputs: PathLike | Feeds | None = None, seed: int = 0, iterations: int = 1,
         val_ranges: Mapping[str, tuple[float, float]] | None = None, reference_outputs: PathLike | None = None,
         save_inputs: PathLike | None = None, save_outputs: PathLike | None = None,
         atol: float | None = None, rtol: float | None = None, min_cosine: float | None = None,
         max_scale_error: float | None = None, check_error_stat: str | None = None,
         per_output: Mapping[str, Mapping[str, Any]] | None = None, per_layer: bool = False,
         sample_axis: int | None = None, max_top1_flip: float | None = None, max_top5_flip: float | None = None,
         min_pixel_agreement: float | None = None, remote: RemoteSpec | None = None,
         on_stage: StageCallback | None = None, **build: Any) -> DiffReport:
    """Compare ``model`` converted to ``dtype`` with onnxruntime float32 on the same inputs.

    ``inputs`` is an ``.npz`` path, a directory of them (a dataset, each file a sample; so is one
    ``.npz`` with ``sample_axis``) or a dict of arrays; without it, ``iterations`` seeded sets
    from ``seed``. The report's ``passed`` is the verdict, ``verdict`` the line diff prints,
    ``dataset`` the statistics over all sets (flip rates, worst sample). ``remote``: run the converted
    model on a device behind TVM's RPC (``RemoteSpec(host, port, key=…)``; docs/remote.md)."""
    policy = tolerance_policy(per_output, atol=atol, rtol=rtol, min_cosine=min_cosine,
                              max_scale_error=max_scale_error, check_error_stat=check_error_stat)
    arrays = dict(inputs) if isinstance(inputs, Mapping) else None
    config = DiffConfig(
        convert=_config(model, dtype, build),
        artifact=_path(artifact), inputs_path=None if arrays is not None else _path(inputs),
        input_arrays=arrays, save_inputs=_path(save_inputs), seed=seed, iterations=iterations,
        val_ranges=dict(val_ranges or {}), reference_outputs=_path(reference_outputs),
        save_outputs=_path(save_outputs), tolerance=policy, per_layer=per_layer, sample_axis=sample_axis,
        max_top1_flip=max_top1_flip, max_top5_flip=max_top5_flip, min_pixel_agreement=min_pixel_agreement,
        remote=remote,
    )
    return diff_model(config, on_stage=on_stage)


def inspect(model: PathLike, *, dtype: str = "float16", on_stage: StageCallback | None = None,
            headroom_margin: float | None = None, **build: Any) -> InspectReport:
    """What converting ``model`` to ``dtype`` would do, per node: colour, compute dtype, guard. No compile.
    ``headroom_margin`` (inspect --headroom --margin): also each node's margin to the dtype's limits,
    in ``report.headroom``; ``amptool.app.inspect.write_headroom_colors`` writes its block list."""
    return inspect_model(_config(model, dtype, build), on_stage=on_stage, headroom_margin=headroom_margin)


def bench(model: PathLike, *, dtypes: Sequence[str] = ("float16",), target: str = "llvm",
          cuda_arch: str | None = None, threads: int | None = None, batch: int | None = None,
          rounds: int = 5, runs: int = 3, warmup: int = 2, seed: int = 0, fresh_workers: bool = True,
          against: Sequence[str] = (), remote: RemoteSpec | None = None,
          on_stage: StageCallback | None = None, **build: Any) -> BenchReport:
    """Time amptool float32 and each of ``dtypes`` next to onnxruntime float32, each runtime in a
    worker process of its own; ``model`` is an ONNX file or an artifact directory. ``remote``: time
    amptool's builds on that device instead (onnxruntime stays here; docs/remote.md)."""
    build = dict(build)
    config = BenchConfig(model=os.fspath(model), dtypes=tuple(dtypes), target=target, cuda_arch=cuda_arch,
                         batch=batch, threads=threads, input_shapes=build.pop("input_shapes", {}),
                         colors=build.pop("colors", None), build=build, rounds=rounds, runs=runs,
                         warmup=warmup, seed=seed, fresh_workers=fresh_workers, against=tuple(against))
    _config(model, "float32", build)  # unknown build options are refused here, before any work
    if remote is not None:
        from amptool.app.remote_bench import bench_remote  # noqa: PLC0415

        return bench_remote(config, remote, on_stage=on_stage)
    return bench_model(config, on_stage=on_stage)


def _path(value: PathLike | Feeds | None) -> str | None:
    return None if value is None or isinstance(value, Mapping) else os.fspath(value)
