"""Rich renderings of convert summaries and diff reports (presentation only)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from amptool.app.diff import DiffReport
from amptool.app.diff import fmt_number as _fmt


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def convert_summary(manifest: dict[str, Any]) -> list[Table]:
    ops = Table(title=f"ops by compute dtype ({manifest['dtype']})", title_justify="left")
    ops.add_column("op")
    dtypes = sorted({d for counts in manifest["ops_by_dtype"].values() for d in counts})
    for dtype in dtypes:
        ops.add_column(dtype, justify="right")
    for op, counts in manifest["ops_by_dtype"].items():
        ops.add_row(op.removeprefix("relax."), *[str(counts.get(d, "")) for d in dtypes])

    facts = Table(title="summary", title_justify="left", show_header=False)
    facts.add_column("what")
    facts.add_column("value", justify="right")
    wb = manifest["weight_bytes"]
    ratio = wb["after"] / wb["before"] if wb["before"] else 1.0
    facts.add_row("casts inserted", str(manifest["casts_inserted"]))
    facts.add_row("weights before → after", f"{_mb(wb['before'])} → {_mb(wb['after'])} ({ratio:.2f}×)")
    facts.add_row("ops kept fp32 by range guards", str(len(manifest["guarded"])))
    facts.add_row("unknown ops (kept fp32)", str(sum(manifest["unknown_ops"].values())))
    facts.add_row("prepare", ", ".join(manifest["prepare"]) or "—")
    facts.add_row("like-ops concretized", concretize_summary(manifest.get("concretize_like")))

    times = Table(title="time per stage", title_justify="left")
    times.add_column("stage")
    times.add_column("seconds", justify="right")
    for stage, seconds in manifest["timings_s"].items():
        times.add_row(stage, f"{seconds:.3f}")
    return [ops, facts, times]


def concretize_summary(section: dict[str, Any] | None) -> str:
    """``3 (eye_like ×1, zeros_like ×2); 1 left alone`` — or ``off`` under --no-concretize."""
    if section is None:
        return "off (--no-concretize)"
    done = section["concretized"]
    text = str(sum(done.values()))
    if done:
        text += " (" + ", ".join(f"{op} ×{n}" for op, n in done.items()) + ")"
    left = sum(s["count"] for s in section["skipped"])
    return text + (f"; {left} left alone" if left else "")


def concretize_table(section: dict[str, Any] | None) -> Table | None:
    """Like-ops ConcretizeLike left alone, with why; None when there are none."""
    if not section or not section["skipped"]:
        return None
    table = Table(title="like-ops not concretized", title_justify="left")
    for column in ("op", "why", "count"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for s in section["skipped"]:
        table.add_row(escape(s["op"]), escape(s["reason"]), str(s["count"]))
    return table


def diff_table(report: DiffReport) -> Table:
    """One row per output: the worst case over iterations, when there are several."""
    tol = report.tolerance
    count = report.iterations.get("count", 1)
    over = f", worst of {count} input sets" if count > 1 else ""
    table = Table(
        title=f"{report.dtype} on {report.target} vs {report.reference_label}{over} "
        f"(atol {tol.atol:g}, rtol {tol.rtol:g}, min cosine {tol.min_cosine:g}, "
        f"max scale error {tol.max_scale_error:g}, stat {tol.check_stat})",
        title_justify="left",
    )
    # max_rel is in the JSON, not here: against near-zero references it is huge and says little,
    # and 120 columns hold only the statistics the verdict reads plus a few for context.
    columns = ("output", "shape", "max_abs", "mean_abs", "cosine", "scale_err", "snr_db", "top1",
               "nan/inf", "of tol", "verdict")
    for column in columns:
        table.add_column(column, justify="left" if column in ("output", "verdict") else "right")
    for o in report.outputs:
        verdict = "[green]pass[/]" if o["passed"] else f"[red]FAIL[/] {o['failed_check']}"
        topk = o.get("topk_agree")
        unchecked = o.get("unchecked") or ()
        table.add_row(
            escape(o["name"]), "x".join(str(d) for d in o["shape"]) or "scalar",
            _fmt(o["max_abs"]), _fmt(o["mean_abs"]),
            _unjudged(_fmt(o["cosine"], 7), "cosine" in unchecked),
            _unjudged(_fmt(o.get("scale_error"), 2), "scale_error" in unchecked),
            _fmt(o["snr_db"], 4), _fmt(topk["top1"] if topk else None, 3),
            _nonfinite(o),
            _fmt(o.get("tolerance_ratio"), 2), verdict,
        )
    if any(o.get("unchecked") for o in report.outputs):
        table.caption = ("(…) not judged: the reference or every error is within atol, where direction is noise, "
                         "or the output is one value")
        table.caption_justify = "left"
    return table


def _unjudged(text: str, skipped: bool) -> str:
    return f"[dim]({text})[/]" if skipped else text


def failures(report: DiffReport) -> list[str]:
    """One line per failing output: why it failed (the table has room only for which check); a note
    per passing output whose reference lies within atol of zero, where any result would pass."""
    lines = [f"FAIL {o['name']}: {o['failure']}" for o in report.outputs if not o["passed"]]
    for o in report.outputs:
        if o["passed"] and o.get("reference_below_atol"):
            atol = o["tolerance"]["atol"] if o.get("tolerance") else report.tolerance.atol
            peak = float(o["reference_max_abs"])
            lines.append(f"note: {o['name']}: every reference value is within atol {atol:g} of zero (max |ref| "
                         f"{peak:.3g}), so zeros would pass too; judge it on real inputs or with an atol below its "
                         f"scale, e.g. --atol {o['name']}:{peak * 1e-3:.1g}")
    return lines


def iterations_table(report: DiffReport) -> Table | None:
    """Mean statistics over the input sets, when there were several."""
    section = report.iterations
    if section.get("count", 1) <= 1:
        return None
    seeds = [s for s in section["seeds"] if s is not None]
    which = f"input sets (seeds {seeds[0]}…{seeds[-1]})" if seeds else "samples"
    table = Table(title=f"mean over {section['count']} {which}", title_justify="left")
    for column in ("output", "max_abs", "mean_abs", "cosine", "snr_db", "top1", "failed"):
        table.add_column(column, justify="left" if column == "output" else "right")
    for m in section["mean"]:
        table.add_row(escape(m["name"]), _fmt(m["max_abs"]), _fmt(m["mean_abs"]), _fmt(m["cosine"], 7),
                      _fmt(m["snr_db"], 4), _fmt(m["top1_agree"], 3), f"{m['failed_iterations']}/{section['count']}")
    return table


def _nonfinite(o: dict[str, Any]) -> str:
    """NaN/Inf counts of the converted output, and the reference's when it has any."""
    text = f"{o['nan']}/{o['inf']}"
    if o["nan_reference"] or o["inf_reference"]:
        return f"{text} (ref {o['nan_reference']}/{o['inf_reference']})"
    return text


def layers_table(layers: Any, limit: int = 40) -> Table:
    """Per-layer errors (an ``amptool.app.per_layer.LayerReport``) in graph order, the first jump
    highlighted. Beyond ``limit`` rows: the first and last nodes, every jump with the nodes just
    before it, then the largest errors; gaps are marked. JSON has every node."""
    rows = layers.layers
    first = next((i for i, layer in enumerate(rows) if layer["jump"]), None)
    shown = set(range(len(rows)))
    if len(rows) > limit:
        jumps = [i for i, layer in enumerate(rows) if layer["jump"]]
        wanted = [k for i in jumps for k in (i, i - 1, i - 2)] + [0, len(rows) - 1]
        wanted += sorted(range(len(rows)), key=lambda i: -(rows[i]["rel_err"] or 0.0))
        shown = set()
        for i in wanted:
            if len(shown) < limit and 0 <= i < len(rows):
                shown.add(i)
    table = Table(title=f"per-layer error, {layers.dtype} ({len(rows)} node outputs compared)", title_justify="left")
    for column in ("#", "node", "op", "dtype", "shape", "max_abs", "rel_err", "growth", "cosine", "nan/inf", "jump"):
        table.add_column(column, justify="left" if column in ("node", "op", "dtype", "jump") else "right",
                         overflow="fold" if column in ("node", "op") else "ellipsis")
    previous = -1
    for i in sorted(shown):
        if i > previous + 1:
            table.add_row("", f"[dim]… {i - previous - 1} more[/]", *[""] * 9)
        layer = rows[i]
        style = "bold red" if i == first else ("red" if layer["jump"] else None)
        table.add_row(
            str(i), escape(layer["node"]), layer["op_type"], layer["dtype"].replace("float", "f"),
            "x".join(str(d) for d in layer["shape"]) or "scalar", _fmt(layer["max_abs"]), _fmt(layer["rel_err"], 3),
            _fmt(layer["growth"], 3), _fmt(layer["cosine"], 7), f"{layer['nan']}/{layer['inf']}",
            ("FIRST " if i == first else "") + (layer["jump_reason"] or ""), style=style,
        )
        previous = i
    if previous < len(rows) - 1:
        table.add_row("", f"[dim]… {len(rows) - previous - 1} more[/]", *[""] * 9)
    skipped = ", ".join(f"{n} {why}" for why, n in layers.skipped.items())
    table.caption = (f"rel_err = max_abs / (max|ref| + {layers.floor:g}); growth = rel_err over its inputs'; "
                     f"jump: new NaN/Inf, cosine < {layers.tolerance.min_cosine:g}, or growth and its RMS "
                     f"counterpart > {layers.growth_limit:g}" + (f"; not compared: {skipped}" if skipped else ""))
    table.caption_justify = "left"
    return table


def first_jump_line(layers: Any) -> str:
    """One line naming the node where error first jumped, or saying there was none."""
    layer = next((layer for layer in layers.layers if layer["jump"]), None)
    if layer is None:
        worst = max(layers.layers, key=lambda x: x["rel_err"] or 0.0, default=None)
        where = f"; largest rel_err {_fmt(worst['rel_err'], 3)} at '{worst['node']}'" if worst else ""
        return f"per-layer: no jump in {len(layers.layers)} nodes compared{where}"
    why = {"nonfinite": f"{layer['new_nonfinite']} NaN/Inf where the reference is finite",
           "cosine": f"cosine {_fmt(layer['cosine'], 7)}",
           "growth": f"rel_err {_fmt(layer['rel_err'], 3)}, {_fmt(layer['growth'], 3)}× its inputs' "
                     f"(RMS {_fmt(layer['rms_growth'], 3)}×)"}
    return f"per-layer: error first jumps at '{layer['node']}' ({layer['op_type']}): {why[layer['jump_reason']]}"


def fallback_table(section: dict[str, Any]) -> Table:
    """The auto-fallback search, one row per build it measured."""
    table = Table(title=f"auto-fallback search ({section['compiles']} compiles, the final build included)",
                  title_justify="left")
    for column in ("build", "kept fp32", "worst output", "of tol", "first jump", "verdict"):
        table.add_column(column, justify="right" if column in ("build", "kept fp32", "of tol") else "left")
    for i, attempt in enumerate(section["attempts"], 1):
        verdict = "[green]pass[/]" if attempt["passed"] else f"[red]FAIL[/] {escape(attempt['failure'] or '')}"
        table.add_row(str(i), str(attempt["kept"]), escape(attempt["worst_output"]),
                      _fmt(attempt["tolerance_ratio"], 3), escape(attempt["first_jump"] or "—"), verdict)
    return table


def pareto_table(report: dict[str, Any]) -> Table:
    """One row per fallback step: what it keeps, what it costs, what it buys (``--pareto``)."""
    table = Table(title=f"speed/accuracy per step (held-out {report['held_out']}; {report['timing']})",
                  title_justify="left")
    for column in ("step", "kept fp32", "low-precision compute", "of tol", "held-out", "ms", "× float32", ""):
        table.add_column(column, justify="left" if column in ("step", "held-out", "") else "right")
    frontier = set(report["frontier"])
    for step in report["steps"]:
        marks = (("chosen", step["chosen"]), ("frontier", step["step"] in frontier))
        table.add_row(escape(step["step"]), "all" if step["all_float32"] else str(step["nodes_kept_fp32"]),
                      f"{step['fraction_low_precision']:.1%}", _fmt(step["tolerance_ratio"], 3),
                      "[green]pass[/]" if step["held_out_passed"] else "[red]FAIL[/]", _fmt(step["latency_ms"], 4),
                      _fmt(step["latency_vs_float32"], 3),
                      " ".join(mark for mark, on in marks if on))
    return table


def fallback_line(section: dict[str, Any], dtype: str) -> str:
    """``PASSED | …`` / ``FAILED | …``: compiles, nodes kept, compute left in the low dtype, and the
    worst output on the search's input sets and on the held-out ones. A held-out failure after a
    passing search leads the line: colours that did not generalise are the news."""
    kept = section["nodes_kept_fp32"]
    names = ", ".join(kept[:5]) + (f", … ({len(kept)} in all)" if len(kept) > 5 else "")
    final = section["final"] or {}
    search, held = section["search"], section["held_out"]
    verdict = "PASSED" if section["passed"] else "FAILED"
    reason = ""
    if search["passed"] and not held["passed"]:
        reason = (f" | held-out check failed: output '{held['worst_output']}' {held['failure']} on "
                  f"{held['worst_set']} (search passed on {search['source']})")
    if final.get("passed"):
        on_search = f"{_fmt(final.get('tolerance_ratio'), 3)}× tolerance"
    else:
        on_search = f"{final.get('failure')} on {search['worst_set']}"
    if held["passed"]:
        other = f"'{held['worst_output']}' " if held["worst_output"] != final.get("name") else ""
        on_held = f"{other}{_fmt(held['tolerance_ratio'], 3)}× tolerance"
    else:
        on_held = "failed" if reason else f"failed ({held['worst_output']} on {held['worst_set']})"
    return (f"{verdict} | auto-fallback{reason} | {section['compiles']} compiles | {len(kept)} node(s) kept float32"
            + (f" ({names})" if kept else "")
            + f" | {section['fraction_low_precision']:.1%} of compute in {dtype} "
            f"(was {section['fraction_low_precision_before']:.1%}) | worst output '{final.get('name')}' on search "
            f"{search['source']}: {on_search} | held-out {held['source']}: {on_held}")
