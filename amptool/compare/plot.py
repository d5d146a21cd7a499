"""``diff --plot``: per output, the error histogram and reference-vs-converted scatter.

matplotlib is an optional extra (``pip install 'amptool[plot]'``). It is drawn with the
object API (``matplotlib.figure.Figure`` + Agg), never ``pyplot``: no global state, no display.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from amptool.errors import UserError
from amptool.fileio import atomic_write

FORMATS = ("png", "svg", "pdf")
MAX_POINTS = 20_000  # scatter points per output; more is slow and looks the same


def require_matplotlib(path: str) -> None:
    """Fail before any work if the plot cannot be drawn or written."""
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise UserError(f"--plot {path}: unknown image type '.{fmt}'",
                        f"Name the file with one of: {', '.join('.' + f for f in FORMATS)}.")
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as err:
        raise UserError("--plot needs matplotlib, which is not installed",
                        "pip install 'amptool[plot]' (or pip install matplotlib).") from err


def plot_outputs(
    path: str,
    samples: Mapping[str, tuple[np.ndarray, np.ndarray]],
    results: Sequence[dict[str, Any]],
    title: str,
) -> None:
    """One row per numeric output: signed-error histogram (log counts) and a scatter against y = x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    rows = [r for r in results if r["name"] in samples and _numeric(*samples[r["name"]])]
    fig = Figure(figsize=(11, 3.2 * max(len(rows), 1)), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    if not rows:
        fig.text(0.5, 0.5, "no numeric output with matching shapes to plot", ha="center")
    axes = fig.subplots(max(len(rows), 1), 2, squeeze=False)
    rng = np.random.default_rng(0)
    for row, result in zip(axes, rows):
        ref, out = (np.asarray(a, dtype=np.float64).ravel() for a in samples[result["name"]])
        finite = np.isfinite(ref) & np.isfinite(out)
        ref, out = ref[finite], out[finite]
        verdict = "pass" if result["passed"] else f"FAIL ({result['failed_check']})"
        hist, scatter = row
        hist.hist(out - ref, bins=100, log=True, color="tab:blue")
        hist.set_title(f"{result['name']}: error (converted − reference), {verdict}", fontsize=9)
        hist.set_xlabel(f"max_abs {_fmt(result['max_abs'])}  mean_abs {_fmt(result['mean_abs'])}")
        hist.set_ylabel("count")
        if ref.size > MAX_POINTS:
            keep = rng.choice(ref.size, MAX_POINTS, replace=False)
            ref, out = ref[keep], out[keep]
        scatter.scatter(ref, out, s=12 if ref.size < 1000 else 2, alpha=0.6, color="tab:orange", rasterized=True)
        if ref.size:
            lo, hi = float(min(ref.min(), out.min())), float(max(ref.max(), out.max()))
            scatter.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        scatter.set_title(f"{result['name']}: converted vs reference (cosine {_fmt(result['cosine'], 7)})", fontsize=9)
        scatter.set_xlabel("reference")
        scatter.set_ylabel("converted")
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    with atomic_write(path, "wb", "--plot") as handle:
        fig.savefig(handle, format=fmt, dpi=110)


def plot_pareto(path: str, steps: Sequence[dict[str, Any]], title: str) -> None:
    """Latency against held-out error (× tolerance), one labelled point per fallback step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots()
    for step in steps:
        ratio = step.get("tolerance_ratio")
        if ratio is None or step.get("latency_ms") is None:
            continue
        colour = "tab:green" if step["held_out_passed"] else "tab:red"
        axes.scatter([step["latency_ms"]], [ratio], s=80 if step["chosen"] else 30, color=colour,
                     edgecolors="black" if step["chosen"] else "none")
        label = step["step"] if step["held_out_passed"] else f"{step['step']} (FAIL)"
        axes.annotate(label, (step["latency_ms"], ratio), textcoords="offset points", xytext=(5, 4),
                      fontsize=8)
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_yscale("symlog", linthresh=0.1)
    axes.set_xlabel("median latency (ms)")
    axes.set_ylabel("held-out error / tolerance (≤ 1 passes)")
    axes.set_title(title, fontsize=10)
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    with atomic_write(path, "wb", "--pareto-plot") as handle:
        fig.savefig(handle, format=fmt, dpi=110)


def _numeric(ref: np.ndarray, out: np.ndarray) -> bool:
    return ref.shape == out.shape and ref.dtype.kind in "fiub" and out.dtype.kind in "fiub" and ref.size > 0


def _fmt(value: Any, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}g}"
