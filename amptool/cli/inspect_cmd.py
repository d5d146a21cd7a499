"""``amptool inspect``: the colour decision per node, without compiling."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from amptool.cli.console import handles_user_errors, is_quiet, stages
from amptool.cli.help import command
from amptool.cli.json_out import emit_json, json_option, report_console
from amptool.cli.options import model_options


@command()
@click.argument("model", type=click.Path(dir_okay=False))
@model_options
@json_option("Nodes, unknown_ops, guarded_constants, casts_inserted, concretize_like, timings_s …")
@click.option("--nodes", "show_nodes", is_flag=True, help="Also print one row per ONNX node.")
@handles_user_errors
def inspect(model: str, dtype: str, build: dict[str, Any], json_path: str | None, show_nodes: bool) -> None:
    """Show what converting MODEL to DTYPE would do: colour and dtype per op, casts, guards.

    \b
    Examples:
      amptool inspect model.onnx --nodes                      # one row per ONNX node
      amptool inspect model.onnx --exclude-op Conv --json report.json
      amptool inspect model.onnx --exclude-node '/encoder/*' --dtype bf16
    """
    from amptool.app.convert import ConvertConfig  # noqa: PLC0415
    from amptool.app.inspect import inspect_model  # noqa: PLC0415

    config = ConvertConfig(model=model, dtype=dtype, **build)
    with stages() as on_stage:
        report = inspect_model(config, on_stage=on_stage)
    data = report.as_json()
    out = report_console(json_path)  # stderr when the JSON owns stdout
    for table in _tables(data, show_nodes):
        out.print(table)
    emit_json(json_path, data)
    if data["ops_converted"] == 0 and dtype != "float32" and not is_quiet():
        out.print(f"[yellow]warning:[/] no op would be converted to {dtype}")


def _tables(data: dict[str, Any], show_nodes: bool) -> list[Table]:
    from amptool.cli import render  # noqa: PLC0415

    low = data["dtype"]
    by_type = Table(title=f"ONNX op type → colour → compute dtype ({low})", title_justify="left")
    for column in ("op type", "colour", "dtype", "nodes"):
        by_type.add_column(column, justify="right" if column == "nodes" else "left")
    for row in data["by_op_type"]:
        by_type.add_row(escape(row["op_type"]), row["color"], row["dtype"], str(row["count"]))
    tables = [by_type]

    facts = Table(title="summary", title_justify="left", show_header=False)
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row(f"ops computing in {low}", f"{data['ops_converted']} of {data['ops_considered']}")
    facts.add_row("casts inserted", str(data["casts_inserted"]))
    facts.add_row("constants guarded (kept fp32)", str(len(data["guarded_constants"])))
    facts.add_row("ops guarded by activation range", str(len(data["guarded_activations"])))
    unknown = ", ".join(f"{k} ×{v}" for k, v in data["unknown_ops"].items()) or "none"
    facts.add_row("unknown ops (kept fp32)", escape(unknown))
    facts.add_row("like-ops concretized", escape(render.concretize_summary(data["concretize_like"])))
    tables.append(facts)
    left_alone = render.concretize_table(data["concretize_like"])
    if left_alone is not None:
        tables.append(left_alone)

    guarded = data["guarded_constants"] + data["guarded_activations"]
    if guarded:
        guards = Table(title="kept float32 by range guards", title_justify="left")
        for column in ("node", "op", "why"):
            guards.add_column(column)
        for g in guarded[:20]:
            guards.add_row(escape(g["node"]), g["op"].removeprefix("relax."), escape(g["reason"]))
        if len(guarded) > 20:
            guards.add_row("…", "", f"{len(guarded) - 20} more (see --json)")
        tables.append(guards)

    if show_nodes:
        nodes = Table(title="per node", title_justify="left")
        for column in ("node", "op type", "colour", "dtype"):
            nodes.add_column(column)
        for n in data["nodes"]:
            nodes.add_row(escape(n["name"]), escape(n["op_type"]), n["color"], n["dtype"])
        tables.append(nodes)
    return tables
