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
@click.option("--headroom", is_flag=True,
              help="Per node: calibrated max |x|, the margin to the dtype's max, and the share of "
                   "non-zero outputs that are subnormal or flush to zero.")
@click.option("--margin", type=click.FloatRange(min=1.0), default=None, metavar="FACTOR",
              help="With --headroom/--write-colors: a node whose max |x| is above dtype max / FACTOR "
                   "(or most of whose non-zero outputs flush to zero) is under the margin  [default: 16].")
@click.option("--write-colors", "write_colors", type=click.Path(dir_okay=False), default=None, metavar="FILE.yaml",
              help="Write a colour list keeping the nodes under the margin float32 (implies --headroom); "
                   "pass it back with --colors.")
@handles_user_errors
def inspect(model: str, dtype: str, build: dict[str, Any], json_path: str | None, show_nodes: bool,
            headroom: bool, margin: float | None, write_colors: str | None) -> None:
    """Show what converting MODEL to DTYPE would do: colour and dtype per op, casts, guards.

    \b
    Examples:
      amptool inspect model.onnx --nodes                      # one row per ONNX node
      amptool inspect model.onnx --exclude-op Conv --json report.json
      amptool inspect model.onnx --exclude-node '/encoder/*' --dtype bf16
      amptool inspect model.onnx --headroom --margin 64 --write-colors keep.yaml --calibration data.npz
    """
    from amptool.app.convert import ConvertConfig  # noqa: PLC0415
    from amptool.app.headroom import DEFAULT_MARGIN, check_headroom_request  # noqa: PLC0415
    from amptool.app.inspect import inspect_model, write_headroom_colors  # noqa: PLC0415
    from amptool.fileio import check_writable_file  # noqa: PLC0415

    config = ConvertConfig(model=model, dtype=dtype, **build)
    wants_headroom = headroom or margin is not None or write_colors is not None
    headroom_margin = (DEFAULT_MARGIN if margin is None else margin) if wants_headroom else None
    if headroom_margin is not None:
        check_headroom_request(dtype, headroom_margin)  # before the pipeline: seconds to minutes
    if write_colors is not None:
        check_writable_file(write_colors, "--write-colors", "Name a file in a writable directory, e.g. keep.yaml.")
    with stages() as on_stage:
        report = inspect_model(config, on_stage=on_stage, headroom_margin=headroom_margin)
    data = report.as_json()
    out = report_console(json_path)  # stderr when the JSON owns stdout
    for table in _tables(data, show_nodes):
        out.print(table)
    if data["headroom"] is not None:
        out.print(_headroom_table(data["headroom"]))
    if write_colors is not None:
        kept = write_headroom_colors(report, write_colors)
        if not is_quiet():
            out.print(f"wrote {escape(write_colors)}: {len(kept)} node(s) under the {data['headroom']['margin']:g}x "
                      f"margin kept float32 (use --colors {escape(write_colors)})", soft_wrap=True)
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
    facts.add_row("ops guarded by cancellation", str(len(data["guarded_cancellations"])))
    unknown = ", ".join(f"{k} ×{v}" for k, v in data["unknown_ops"].items()) or "none"
    facts.add_row("unknown ops (kept fp32)", escape(unknown))
    facts.add_row("like-ops concretized", escape(render.concretize_summary(data["concretize_like"])))
    tables.append(facts)
    left_alone = render.concretize_table(data["concretize_like"])
    if left_alone is not None:
        tables.append(left_alone)

    guarded = data["guarded_constants"] + data["guarded_activations"] + data["guarded_cancellations"]
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


def _headroom_table(headroom: dict[str, Any], rows: int = 20) -> Table:
    """The nodes under the margin (all of them) and the tightest of the rest, up to ``rows``."""
    title = (f"headroom in {headroom['dtype']} (max {headroom['dtype_max']:.6g}; under the margin: "
             f"{len(headroom['under_margin'])} node(s) below {headroom['margin']:g}x or mostly flushing to zero)")
    table = Table(title=title, title_justify="left")
    for column in ("node", "op type", "max |x|", "margin", "subnormal", "flushed", "under"):
        table.add_column(column, justify="left" if column in ("node", "op type") else "right")
    if headroom["skipped"]:
        table.add_row("—", "", "", "", "", "", escape(f"calibration skipped: {headroom['skipped']}"))
        return table
    nodes = headroom["nodes"]
    shown = nodes[:max(rows, len(headroom["under_margin"]))]
    for n in shown:
        margin = "inf" if n["overflow_margin"] == float("inf") else f"{n['overflow_margin']:.3g}x"
        table.add_row(escape(n["name"]), escape(n["op_type"]), f"{n['max_abs']:.3g}", margin,
                      f"{n['subnormal_fraction']:.1%}", f"{n['flushed_fraction']:.1%}",
                      "yes" if n["under_margin"] else "")
    if len(nodes) > len(shown):
        table.add_row("…", "", "", "", "", "", f"{len(nodes) - len(shown)} more (see --json)")
    return table
