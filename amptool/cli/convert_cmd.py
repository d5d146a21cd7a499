"""``amptool convert``: build the artifact and print a summary."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from amptool.cli.console import handles_user_errors, is_quiet, out, stages
from amptool.cli.help import command
from amptool.cli.json_out import emit_json, json_option, json_to_stdout
from amptool.cli.options import model_options, validation_option
from amptool.errors import EXIT_ACCURACY_FAILED, UserError
from amptool.fileio import check_writable_file

if TYPE_CHECKING:
    from amptool.app.convert import ConvertConfig
    from amptool.app.fallback import FallbackResult


@command()
@click.argument("model", type=click.Path(dir_okay=False))
@model_options
@click.option("-o", "--output", "output_dir", required=True, type=click.Path(file_okay=False),
              help="Artifact directory (library + manifest.json): new, empty or an earlier artifact, which is replaced "
              "atomically; any other directory is refused untouched.")
@json_option("The manifest")
@click.option("--lower-only", is_flag=True,
              help="Lower and schedule for --target without code generation (works where its codegen is "
              "missing); OUTDIR gets lowered.py and manifest.json, no library.")
@click.option("--emit-ir", "emit_ir", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Also write the final Relax module (after every pass, before compiling) as TVMScript.")
@click.option("--auto-fallback", is_flag=True,
              help="Find ONNX nodes to keep float32 until diff's tolerance holds on several input sets, then check "
              "them on held-out ones; writes OUTDIR/fallback.yaml (pass it back with --colors).")
@click.option("--atol", multiple=True, metavar="[NAME:]VALUE", help="With --auto-fallback: as diff's --atol.")
@click.option("--rtol", multiple=True, metavar="[NAME:]VALUE", help="With --auto-fallback: as diff's --rtol.")
@click.option("--min-cosine", multiple=True, metavar="[NAME:]VALUE",
              help="With --auto-fallback: as diff's --min-cosine.")
@click.option("--iterations", type=int, default=None, metavar="N",
              help="With --auto-fallback: search on N seeded input sets (seeds 0…N-1, as diff's; default 4, "
              "or the --calibration inputs when given).")
@validation_option
@click.option("--max-compiles", type=int, default=None, metavar="N",
              help="With --auto-fallback: most compiles the search may use, the final build included (default 10).")
@click.option("--target-margin", type=float, default=None, metavar="FRACTION",
              help="With --auto-fallback: keep falling back until every output's error is at most FRACTION of "
              "its tolerance (e.g. 0.5), not just within it.")
@click.option("--pareto", "pareto_path", type=click.Path(dir_okay=False), default=None, metavar="FILE.json",
              help="With --auto-fallback: per search step, nodes kept float32, share of compute in the low dtype, "
              "held-out accuracy and latency (each step built normally and timed in its own process).")
@click.option("--pareto-plot", "pareto_plot", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="With --pareto: latency against held-out error per step (needs amptool[plot]).")
@handles_user_errors
def convert(model: str, dtype: str, build: dict[str, Any],
            output_dir: str, json_path: str | None, auto_fallback: bool = False, atol: tuple[str, ...] = (),
            rtol: tuple[str, ...] = (), min_cosine: tuple[str, ...] = (), iterations: int | None = None,
            max_compiles: int | None = None, validation: str | None = None, emit_ir: str | None = None,
            lower_only: bool = False, target_margin: float | None = None, pareto_path: str | None = None,
            pareto_plot: str | None = None) -> None:
    """Convert MODEL.onnx to DTYPE and compile it into OUTPUT.

    \b
    Examples:
      amptool convert model.onnx -o out/                      # float16 for this CPU
      amptool convert model.onnx --dtype bf16 --exclude-op Softmax -o out/
      amptool convert model.onnx --dim batch=8 --target cuda -o out/ -q
    """
    from amptool.app.convert import ConvertConfig, check_ir_path, convert_model, write_ir  # noqa: PLC0415
    from amptool.app.outdir import check_output_dir, check_outside  # noqa: PLC0415
    from amptool.cli import render  # noqa: PLC0415

    config = ConvertConfig(model=model, dtype=dtype, **build)
    if config.target == "llvm":
        from amptool._tvm.common import without_device_backends  # noqa: PLC0415

        without_device_backends()  # this process builds and runs for the CPU only
    given = (("--atol", atol), ("--rtol", rtol), ("--min-cosine", min_cosine), ("--iterations", iterations),
             ("--max-compiles", max_compiles), ("--validation", validation), ("--target-margin", target_margin),
             ("--pareto", pareto_path))
    search_flags = [flag for flag, value in given if value not in (None, ())]
    if search_flags and not auto_fallback:
        raise UserError(f"{', '.join(search_flags)}: only used by --auto-fallback",
                        "Add --auto-fallback, or check a build's accuracy with 'amptool diff'.")
    if pareto_plot and not pareto_path:
        raise UserError("--pareto-plot draws the --pareto steps, but there is no --pareto FILE.json",
                        "Add --pareto FILE.json.")
    for flag, path in (("--pareto", pareto_path), ("--pareto-plot", pareto_plot)):
        if path:
            check_writable_file(path, flag, "Name a file in a writable directory.")
    if pareto_plot:
        from amptool.compare.plot import require_matplotlib  # noqa: PLC0415

        require_matplotlib(pareto_plot)
    check_output_dir(output_dir)  # before anything is built: a foreign directory is refused untouched
    check_outside(output_dir, emit_ir, "--emit-ir")
    check_outside(output_dir, json_path, "--json")
    if emit_ir:
        check_ir_path(emit_ir)
    if lower_only:
        if auto_fallback:
            raise UserError("--lower-only and --auto-fallback: the search runs each build; a lowered module "
                            "cannot run", "Drop one of them.")
        _lower_only(config, output_dir, json_path, emit_ir)
        return
    fallback = None
    with stages() as on_stage:
        if auto_fallback:
            fallback, manifest = _auto_fallback(config, output_dir, on_stage, atol, rtol, min_cosine, iterations,
                                                max_compiles, validation, target_margin, pareto_path is not None)
            if emit_ir:
                write_ir(fallback.build.passes.mod, emit_ir)
        else:
            _result, manifest = convert_model(config, output_dir, on_stage=on_stage, emit_ir=emit_ir)
    # exit 1 like diff when the search or the held-out check fails; the artifact is still written
    failed = fallback is not None and not fallback.passed
    if fallback is not None and fallback.pareto is not None and pareto_path:
        _write_pareto(fallback.pareto, pareto_path, pareto_plot)
    emit_json(json_path, manifest)
    if json_to_stdout(json_path):  # the JSON is the whole of stdout
        sys.exit(EXIT_ACCURACY_FAILED if failed else 0)
    for table in render.convert_summary(manifest):
        out.print(table)
    if manifest["unknown_ops"] and not is_quiet():
        names = ", ".join(f"{k} ×{v}" for k, v in manifest["unknown_ops"].items())
        out.print(f"[yellow]warning:[/] ops not in any colour list were kept float32: {names}")
    if manifest["ops_converted"] == 0 and dtype != "float32" and not is_quiet():
        out.print(f"[yellow]warning:[/] no op was converted to {dtype}")
    if emit_ir:
        out.print(f"wrote {emit_ir} (final Relax module)")
    if fallback is None:
        out.print(f"wrote {output_dir}/ (model.so, manifest.json)")
        return
    out.print(render.fallback_table(manifest["auto_fallback"]))
    if fallback.pareto is not None:
        out.print(render.pareto_table(fallback.pareto))
        out.print(f"wrote {pareto_path}" + (f" and {pareto_plot}" if pareto_plot else ""))
    out.print(f"wrote {output_dir}/ (model.so, manifest.json, fallback.yaml)")
    out.print(render.fallback_line(manifest["auto_fallback"], dtype), markup=False, soft_wrap=True)
    if failed:
        sys.exit(EXIT_ACCURACY_FAILED)


def _lower_only(config: ConvertConfig, output_dir: str, json_path: str | None, emit_ir: str | None) -> None:
    from amptool.app.convert import write_ir  # noqa: PLC0415
    from amptool.app.lower import LOWERED_NAME, lower_model  # noqa: PLC0415
    from amptool.cli import render  # noqa: PLC0415

    with stages() as on_stage:
        rewritten, manifest = lower_model(config, output_dir, on_stage=on_stage)
    if emit_ir:
        write_ir(rewritten.passes.mod, emit_ir)
    emit_json(json_path, manifest)
    if json_to_stdout(json_path):  # the JSON is the whole of stdout
        return
    for table in render.convert_summary(manifest):
        out.print(table)
    missing = manifest["codegen_missing"]
    out.print(f"wrote {output_dir}/ ({LOWERED_NAME}, manifest.json): {manifest['kernels']} kernels lowered and "
              f"scheduled for {config.target}, no library (--lower-only)", markup=False, soft_wrap=True)
    if missing:
        out.print(f"note: building for {config.target} here needs: {missing}", markup=False, soft_wrap=True)


def _auto_fallback(config: ConvertConfig, output_dir: str, on_stage: Callable[[str], None],
                   atol: tuple[str, ...], rtol: tuple[str, ...], min_cosine: tuple[str, ...],
                   iterations: int | None, max_compiles: int | None, validation: str | None,
                   target_margin: float | None, pareto: bool) -> tuple[FallbackResult, dict[str, Any]]:
    from amptool.app.convert import export_build  # noqa: PLC0415
    from amptool.app.fallback import DEFAULT_MAX_COMPILES, FALLBACK_FILE, FallbackConfig, auto_fallback  # noqa: PLC0415
    from amptool.compare.tolerance import parse_tolerance_flags  # noqa: PLC0415

    policy = parse_tolerance_flags(atol=atol, rtol=rtol, min_cosine=min_cosine)
    search = FallbackConfig(convert=config, tolerance=policy, iterations=iterations, validation=validation,
                            max_compiles=DEFAULT_MAX_COMPILES if max_compiles is None else max_compiles,
                            target_margin=target_margin, pareto=pareto)
    result = auto_fallback(search, on_stage=on_stage)
    manifest = export_build(result.build, output_dir, on_stage,
                            extra_manifest={"auto_fallback": result.manifest_section()},
                            extra_files={FALLBACK_FILE: result.yaml_text})
    return result, manifest


def _write_pareto(report: dict[str, Any], path: str, plot: str | None) -> None:
    from amptool.app.pareto import write_pareto  # noqa: PLC0415

    write_pareto(path, report)
    if plot:
        from amptool.compare.plot import plot_pareto  # noqa: PLC0415

        name = os.path.basename(report["model"])
        plot_pareto(plot, report["steps"], f"{report['dtype']} auto-fallback steps: {name}")
