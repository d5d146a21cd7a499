"""``amptool run``: run an artifact on an .npz of inputs and write its outputs."""

from __future__ import annotations

from typing import Any

import click

from amptool.cli.console import handles_user_errors, verbosity_options
from amptool.cli.help import command
from amptool.cli.json_out import emit_json, json_option, report_console
from amptool.cli.options import rpc_options


@command()
@click.argument("artifact", metavar="OUTDIR", type=click.Path(file_okay=False))
@click.option("--inputs", "inputs_path", required=True, metavar="X.npz", type=click.Path(dir_okay=False),
              help="One array per model input, with the dtype and shape the manifest lists.")
@click.option("-o", "--output", "output_path", required=True, metavar="Y.npz", type=click.Path(dir_okay=False),
              help="Where to write the outputs (one array per model output); written atomically.")
@click.option("--device", default=None, metavar="cpu|cuda[:N]|vulkan[:N]",
              help="Device to run on  [default: the one the artifact was built for].")
@rpc_options
@json_option("The outputs' names, dtypes and shapes, the device, load and run ms, the artifact")
@verbosity_options
@handles_user_errors
def run(artifact: str, inputs_path: str, output_path: str, device: str | None, remote: Any = None,
        json_path: str | None = None) -> None:
    """Run the library in OUTDIR (from 'amptool convert') on X.npz and write Y.npz.

    \b
    Needs only the TVM runtime: works with a TVM installed without its compiler library.
    With --rpc/--rpc-server the library runs on a remote device (uploaded, removed afterwards).
    Exit 2 for a bad OUTDIR or inputs, 3 when the device (or the remote) is not there.

    \b
    Examples:
      amptool run out/ --inputs x.npz -o y.npz
      amptool run out/ --inputs x.npz -o y.npz --device cuda:1 -v
      amptool run out/ --inputs x.npz -o y.npz --rpc 10.0.0.2:9190 --rpc-key rasp4
    """
    from amptool.app.deploy import RunConfig, run_artifact  # noqa: PLC0415

    result = run_artifact(RunConfig(artifact=artifact, inputs=inputs_path, output=output_path, device=device,
                                    remote=remote))
    shapes = ", ".join(f"{name} {value.dtype.name}{list(value.shape)}" for name, value in result.outputs.items())
    runtime = "TVM runtime only" if result.runtime_only else "TVM with compiler"
    out = report_console(json_path)  # stderr when the JSON owns stdout
    where = result.device if result.remote is None else f"{result.device} of {remote.label}"
    out.print(f"wrote {output_path}: {shapes} | {result.manifest.get('dtype')} on {where} | "
              f"load {result.load_s * 1e3:.0f} ms, run {result.run_s * 1e3:.1f} ms | {runtime}",
              markup=False, soft_wrap=True)
    emit_json(json_path, result.as_json())
