"""``convert --lower-only``: lower and schedule for a target, without its code generator.

Why: a target's codegen may be missing here (the PyPI TVM has no Vulkan codegen), yet
lowering and scheduling need none. Running them shows whether the converted model gets
through to codegen for that target — every op legalized, every kernel scheduled — before
the toolchain is installed. OUTDIR gets ``lowered.py`` (the scheduled module as TVMScript)
and ``manifest.json`` with ``lower_only: true`` and ``library: null``; there is nothing to run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from amptool import _tvm, compiler
from amptool.app.artifact import write_artifact, write_manifest
from amptool.app.convert import BuildResult, ConvertConfig, Rewritten, _io_specs, count_loops, resolve, rewrite_model
from amptool.frontend.signature import graph_outputs
from amptool.runtime.inputs import TABLE_INDEXING, index_ranges

LOWERED_NAME = "lowered.py"


def lower_model(config: ConvertConfig, output_dir: str,
                on_stage: Callable[[str], None] | None = None) -> tuple[Rewritten, dict[str, Any]]:
    """Rewrite, lower and schedule for ``config.target``; write OUTDIR atomically."""
    target = resolve(config, lower_only=True)  # bad flags fail before any work; missing codegen does not
    notify = on_stage or (lambda _name: None)
    rewritten = rewrite_model(config, on_stage=on_stage)
    notify("lower")
    start = time.perf_counter()
    try:
        lowered = compiler.lower_module(rewritten.passes.mod, target.spec)
    except Exception as err:
        raise RuntimeError(f"TVM failed to lower the converted module for {config.target}: {err}") from err
    rewritten.timings_s["lower"] = time.perf_counter() - start
    build = BuildResult(
        config=config, loaded=rewritten.loaded, inputs=rewritten.inputs,
        outputs=_io_specs(graph_outputs(rewritten.loaded.model), config), policy=rewritten.policy,
        passes=rewritten.passes, target_spec=target.spec, device=target.device, executable=None,
        fixed_inputs=rewritten.fixed_inputs, prepare_steps=rewritten.prepare_steps,
        prepare_notes=rewritten.prepare_notes, calibration=rewritten.calibration, timings_s=rewritten.timings_s,
        prepared=rewritten.prepared, arch=target.arch, unmatched_node_rules=rewritten.unmatched_node_rules,
        run_time_loops=count_loops(rewritten.passes.mod),
        index_inputs=index_ranges(rewritten.prepared, TABLE_INDEXING) if rewritten.prepared is not None else {},
    )
    notify("export")
    script = _tvm.module_script(lowered)
    manifest: dict[str, Any] = {}

    def write(tmp: str) -> None:
        with open(os.path.join(tmp, LOWERED_NAME), "w", encoding="utf-8") as handle:
            handle.write(script)
        manifest.update(build.manifest())
        manifest.update(library=None, lower_only=True, lowered=LOWERED_NAME,
                        kernels=_tvm.count_prim_funcs(lowered),
                        codegen_missing=_codegen_missing(config.target))
        write_manifest(tmp, manifest)

    write_artifact(output_dir, write)
    return rewritten, manifest


def _codegen_missing(name: str) -> str | None:
    from amptool.compiler.targets import known_target  # noqa: PLC0415

    return known_target(name).missing()
