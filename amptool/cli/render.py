"""Rich renderings of convert summaries and diff reports (presentation only)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from amptool.diff import DiffReport


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


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

    times = Table(title="time per stage", title_justify="left")
    times.add_column("stage")
    times.add_column("seconds", justify="right")
    for stage, seconds in manifest["timings_s"].items():
        times.add_row(stage, f"{seconds:.3f}")
    return [ops, facts, times]


def diff_table(report: DiffReport) -> Table:
    tol = report.tolerance
    table = Table(
        title=f"{report.dtype} on {report.target} vs onnxruntime float32 "
        f"(atol {tol.atol:g}, rtol {tol.rtol:g}, min cosine {tol.min_cosine:g}, stat {tol.check_stat})",
        title_justify="left",
    )
    for column in ("output", "shape", "max_abs", "mean_abs", "max_rel", "cosine", "snr_db", "nan", "inf", "verdict"):
        table.add_column(column, justify="left" if column in ("output", "verdict") else "right")
    for o in report.outputs:
        verdict = "[green]pass[/]" if o["passed"] else f"[red]FAIL[/] {o['failure']}"
        cosine = o["cosine"]
        table.add_row(
            o["name"], "x".join(str(d) for d in o["shape"]) or "scalar",
            _fmt(o["max_abs"]), _fmt(o["mean_abs"]), _fmt(o["max_rel"]),
            _fmt(cosine, 7), _fmt(o["snr_db"], 4), str(o["nan"]), str(o["inf"]), verdict,
        )
    return table


def verdict_line(report: DiffReport) -> str:
    """The grep-friendly last line: ``PASSED | …`` or ``FAILED | …``."""
    worst = report.worst
    count = f"{len(report.outputs)} output{'s' if len(report.outputs) != 1 else ''}"
    if report.passed:
        detail = f"worst cosine {worst['cosine']:.7f} ({worst['name']})" if worst else "no outputs"
        return f"PASSED | {report.dtype} on {report.target} | {count} | {detail}"
    assert worst is not None
    failed = sum(1 for o in report.outputs if not o["passed"])
    return (
        f"FAILED | {report.dtype} on {report.target} | {failed}/{len(report.outputs)} outputs failed | "
        f"output '{worst['name']}': {worst['failure']}"
    )
