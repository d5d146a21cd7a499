"""``amptool diff``: accuracy of the converted model against onnxruntime fp32 (or stored outputs)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from amptool.cli.console import handles_user_errors, stages
from amptool.cli.help import command
from amptool.cli.json_out import emit_json, json_option, json_to_stdout, report_console
from amptool.cli.options import model_options, rpc_options
from amptool.errors import EXIT_ACCURACY_FAILED, EXIT_OK, UserError
from amptool.runtime.inputs import MAX_ITERATIONS

_FILE = click.Path(dir_okay=False)


@command()
@click.argument("model", type=click.Path(dir_okay=False))
@model_options
@click.option("--artifact", type=click.Path(file_okay=False), default=None,
              help="Compare an existing 'amptool convert' output instead of converting.")
@click.option("--inputs", "--load-inputs", "inputs_path", type=click.Path(), default=None, metavar="PATH",
              help="Inputs as .npz (one array per model input; shapes come from the arrays), or a directory "
              "of such files: a dataset, every file a sample.")
@click.option("--sample-axis", type=int, default=None, metavar="AXIS",
              help="The --inputs .npz stacks samples along AXIS (usually 0): a dataset, every slice a sample.")
@click.option("--max-top1-flip", type=float, default=None, metavar="FRACTION",
              help="Fail when more than FRACTION of the class-score rows change their argmax (e.g. 0.01).")
@click.option("--max-top5-flip", type=float, default=None, metavar="FRACTION",
              help="Fail when more than FRACTION of the class-score rows change their top-5 set.")
@click.option("--min-pixel-agreement", type=float, default=None, metavar="FRACTION",
              help="Fail when a segmentation map's per-pixel argmax (or an integer label map) agrees on less "
                   "than FRACTION of pixels; label maps are then judged by it, not by exact equality.")
@click.option("--save-inputs", type=_FILE, default=None, metavar="PATH.npz", help="Write the inputs used to this .npz.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for generated inputs.")
@click.option("--iterations", type=click.IntRange(min=1, max=MAX_ITERATIONS), default=1, show_default=True,
              help="Compare on N generated input sets (seeds SEED…SEED+N-1); report the worst case and the mean.")
@click.option("--val-range", "val_ranges", multiple=True, metavar="[NAME:]LO,HI",
              help="Generated values of input NAME: floats uniform in [LO, HI), integers in [LO, HI); "
              "without NAME, of every float input. Repeatable.")
@click.option("--reference-outputs", "--load-outputs", "reference_outputs", type=_FILE, default=None,
              metavar="PATH.npz",
              help="Compare against stored outputs (.npz, one array per model output) instead of onnxruntime.")
@click.option("--save-outputs", type=_FILE, default=None, metavar="PATH.npz",
              help="Write the reference outputs (as NAME) and the converted ones (as converted/NAME) to this .npz.")
@click.option("--tolerances", "tolerances_path", type=_FILE, default=None, metavar="FILE.yaml",
              help="A tolerance profile (default and per-output atol/rtol/min_cosine/…; see configs/tolerances/); "
              "--atol etc. win over it.")
@click.option("--atol", multiple=True, metavar="[NAME:]VALUE",
              help="Absolute tolerance, for every output or NAME only (repeatable; default per dtype).")
@click.option("--rtol", multiple=True, metavar="[NAME:]VALUE",
              help="Relative tolerance, scaled by max|ref| (or |ref| for elemwise); repeatable.")
@click.option("--min-cosine", multiple=True, metavar="[NAME:]VALUE", help="Minimum cosine similarity; repeatable.")
@click.option("--check-error-stat", multiple=True, metavar="[NAME:]max|elemwise|mean|median|p99",
              help="Statistic of |error| checked against atol + rtol·|ref| (default max); repeatable.")
@click.option("--max-scale-error", multiple=True, metavar="[NAME:]VALUE",
              help="Largest |gain − 1| of the least-squares fit converted ≈ gain·reference (catches a "
              "systematic scale that rounding noise never shows); repeatable.")
@json_option("The full report (every statistic of every output, the tolerance policy)")
@click.option("--junit-xml", "junit_path", type=_FILE, default=None, metavar="PATH.xml",
              help="Write a JUnit XML report: one test case per model output, failing outputs as failures.")
@click.option("--plot", "plot_path", type=_FILE, default=None, metavar="PATH.png",
              help="Draw per output the error histogram and a reference-vs-converted scatter (needs amptool[plot]).")
@click.option("--per-layer", is_flag=True,
              help="Also compare every ONNX node's output with onnxruntime's and name the node where error "
              "first jumps (one more compile; not with --artifact or --reference-outputs).")
@rpc_options
@handles_user_errors
def diff(model: str, dtype: str, build: dict[str, Any],
         artifact: str | None, inputs_path: str | None,
         save_inputs: str | None, seed: int, iterations: int, val_ranges: tuple[str, ...],
         reference_outputs: str | None, save_outputs: str | None, atol: tuple[str, ...], rtol: tuple[str, ...],
         min_cosine: tuple[str, ...], check_error_stat: tuple[str, ...], max_scale_error: tuple[str, ...],
         json_path: str | None,
         plot_path: str | None, per_layer: bool = False, junit_path: str | None = None,
         tolerances_path: str | None = None, sample_axis: int | None = None, max_top1_flip: float | None = None,
         max_top5_flip: float | None = None, min_pixel_agreement: float | None = None, remote: Any = None) -> None:
    """Compare MODEL converted to DTYPE with onnxruntime float32 on the same inputs.

    Exit 0 when every output passes, 1 when one fails, 2 on bad input, 3 when the target cannot run here.
    With GITHUB_ACTIONS=true, each failing output is also printed as an ::error annotation.

    \b
    Examples:
      amptool diff model.onnx --iterations 4                  # float16 vs onnxruntime, 4 input sets
      amptool diff model.onnx --dtype bf16 --atol 1e-2 --load-inputs x.npz
      amptool diff model.onnx --dim batch=2 --dim seq_len=16 --per-layer
      amptool diff model.onnx --inputs val/ --max-top1-flip 0.01   # every .npz in val/ a sample
    """
    from amptool.app.convert import ConvertConfig  # noqa: PLC0415
    from amptool.app.diff import DiffConfig, diff_model  # noqa: PLC0415
    from amptool.cli import ci_report, render  # noqa: PLC0415
    from amptool.compare.tolerance import parse_tolerance_flags  # noqa: PLC0415
    from amptool.runtime.inputs import parse_val_ranges  # noqa: PLC0415

    for flag, path in (("--json", json_path), ("--plot", plot_path), ("--save-inputs", save_inputs),
                       ("--save-outputs", save_outputs), ("--junit-xml", junit_path)):
        if path and not (flag == "--json" and json_to_stdout(path)):
            _check_writable(flag, path)
    if plot_path:
        from amptool.compare.plot import require_matplotlib  # noqa: PLC0415

        require_matplotlib(plot_path)
    policy = parse_tolerance_flags(atol=atol, rtol=rtol, min_cosine=min_cosine, check_stat=check_error_stat,
                                   max_scale_error=max_scale_error)
    if tolerances_path:
        from amptool.compare.tolerance_profile import load_tolerance_profile, merge  # noqa: PLC0415

        policy = merge(load_tolerance_profile(tolerances_path), policy)
    convert = ConvertConfig(model=model, dtype=dtype, **build)
    if convert.target == "llvm" and artifact is None and remote is None:
        from amptool._tvm.common import without_device_backends  # noqa: PLC0415

        without_device_backends()  # this process builds and runs for the CPU only
    config = DiffConfig(
        convert=convert,
        artifact=artifact, inputs_path=inputs_path, save_inputs=save_inputs, seed=seed,
        iterations=iterations, val_ranges=parse_val_ranges(val_ranges),
        reference_outputs=reference_outputs, save_outputs=save_outputs,
        tolerance=policy, per_layer=per_layer, sample_axis=sample_axis, max_top1_flip=max_top1_flip,
        max_top5_flip=max_top5_flip, min_pixel_agreement=min_pixel_agreement, remote=remote,
    )
    start = time.perf_counter()
    with stages() as on_stage:
        report = diff_model(config, on_stage=on_stage)
    seconds = time.perf_counter() - start
    out = report_console(json_path)  # stderr when the JSON owns stdout
    out.print(render.diff_table(report))
    for line in render.failures(report):
        out.print(line, markup=False, soft_wrap=True)
    if report.layers is not None:
        out.print(render.layers_table(report.layers))
        out.print(render.first_jump_line(report.layers), markup=False, soft_wrap=True)
    means = render.iterations_table(report)
    if means is not None:
        out.print(means)
    emit_json(json_path, report.as_json())
    if junit_path:
        ci_report.write_junit(junit_path, report, seconds)
    if ci_report.on_github_actions():
        for line in ci_report.github_annotations(report):
            click.echo(line, err=json_to_stdout(json_path))
    if plot_path:
        from amptool.compare.plot import plot_outputs  # noqa: PLC0415

        title = f"{report.dtype} on {report.target} vs {report.reference_label}: {os.path.basename(model)}"
        plot_outputs(plot_path, report.samples, report.outputs, title)
    out.print(report.verdict, markup=False, soft_wrap=True)  # one line, never wrapped
    sys.exit(EXIT_OK if report.passed else EXIT_ACCURACY_FAILED)


def _check_writable(flag: str, path: str) -> None:
    """Fail before any work when an output file could not be written."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(f"{flag} {path}: cannot write there ({parent} is not a writable directory)",
                        "Choose a path in a writable directory.")
