"""``amptool diff``: accuracy of the converted model against onnxruntime fp32."""

from __future__ import annotations

import sys

import click

from amptool.cli.console import handles_user_errors, out, stages
from amptool.cli.options import model_options
from amptool.compare.stats import CHECK_STATS
from amptool.errors import EXIT_ACCURACY_FAILED, EXIT_OK
from amptool.fileio import write_json


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@model_options
@click.option("--artifact", type=click.Path(file_okay=False), default=None,
              help="Compare an existing 'amptool convert' output instead of converting.")
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False), default=None,
              help="Inputs as .npz (one array per model input); shapes come from the arrays.")
@click.option("--save-inputs", type=click.Path(dir_okay=False), default=None,
              help="Write the inputs used to this .npz.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default per dtype).")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default per dtype).")
@click.option("--min-cosine", type=float, default=None, help="Minimum cosine similarity per output.")
@click.option("--check-error-stat", type=click.Choice(CHECK_STATS), default="max", show_default=True,
              help="Statistic checked against atol + rtol·|ref|.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the full report as JSON.")
@handles_user_errors
def diff(model: str, dtype: str, colors: str | None, target: str, input_shapes: tuple[str, ...],
         no_range_guards: bool, no_prepare: bool, artifact: str | None, inputs_path: str | None,
         save_inputs: str | None, seed: int, atol: float | None, rtol: float | None,
         min_cosine: float | None, check_error_stat: str, json_path: str | None) -> None:
    """Compare MODEL converted to DTYPE with onnxruntime float32 on the same inputs.

    Exit 0 when every output passes, 1 when one fails, 2 on bad input.
    """
    from amptool.cli import render  # noqa: PLC0415
    from amptool.convert import ConvertConfig  # noqa: PLC0415
    from amptool.diff import DiffConfig, diff_model  # noqa: PLC0415

    config = DiffConfig(
        convert=ConvertConfig(model=model, dtype=dtype, colors=colors, target=target,
                              input_shapes=input_shapes, range_guards=not no_range_guards,
                              prepare=not no_prepare),
        artifact=artifact, inputs_path=inputs_path, save_inputs=save_inputs, seed=seed,
        atol=atol, rtol=rtol, min_cosine=min_cosine, check_stat=check_error_stat,
    )
    with stages() as on_stage:
        report = diff_model(config, on_stage=on_stage)
    out.print(render.diff_table(report))
    if json_path:
        write_json(json_path, report.as_json())
    out.print(render.verdict_line(report), markup=False)
    sys.exit(EXIT_OK if report.passed else EXIT_ACCURACY_FAILED)

