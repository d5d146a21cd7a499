"""``amptool convert``: build the artifact and print a summary."""

from __future__ import annotations

import click

from amptool.cli.console import handles_user_errors, out, stages
from amptool.cli.options import calibration_option, fixed_input_option, low_precision_io_option, model_options


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@model_options
@fixed_input_option
@calibration_option
@low_precision_io_option
@click.option("-o", "--output", "output_dir", required=True, type=click.Path(file_okay=False),
              help="Artifact directory (library + manifest.json); replaced atomically.")
@click.option("--json", "json_summary", is_flag=True, help="Print the manifest as JSON instead of tables.")
@handles_user_errors
def convert(model: str, dtype: str, colors: str | None, target: str, input_shapes: tuple[str, ...],
            no_range_guards: bool, no_prepare: bool, fixed_inputs: tuple[str, ...], calibration: str | None,
            low_precision_io: bool,
            output_dir: str, json_summary: bool) -> None:
    """Convert MODEL.onnx to DTYPE and compile it into OUTPUT."""
    import json  # noqa: PLC0415

    from amptool.cli import render  # noqa: PLC0415
    from amptool.convert import ConvertConfig, convert_model  # noqa: PLC0415

    config = ConvertConfig(model=model, dtype=dtype, colors=colors, target=target,
                           input_shapes=input_shapes, range_guards=not no_range_guards,
                           prepare=not no_prepare, fixed_inputs=fixed_inputs,
                           calibration=calibration, low_precision_io=low_precision_io)
    with stages() as on_stage:
        _result, manifest = convert_model(config, output_dir, on_stage=on_stage)
    if json_summary:
        click.echo(json.dumps(manifest, indent=2))
        return
    for table in render.convert_summary(manifest):
        out.print(table)
    if manifest["unknown_ops"]:
        names = ", ".join(f"{k} ×{v}" for k, v in manifest["unknown_ops"].items())
        out.print(f"[yellow]warning:[/] ops not in any colour list were kept float32: {names}")
    if manifest["ops_converted"] == 0 and dtype != "float32":
        out.print(f"[yellow]warning:[/] no op was converted to {dtype}")
    out.print(f"wrote {output_dir}/ (model.so, manifest.json)")
