"""``amptool bench``: time onnxruntime and amptool builds, each in its own process; print ratios."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import click

from amptool.cli.console import err, handles_user_errors, stages
from amptool.cli.help import command
from amptool.cli.json_out import emit_json, json_option, json_to_stdout, report_console
from amptool.cli.options import DtypeChoice, build_options, rpc_options


@command()
@click.argument("model", type=click.Path(exists=True))
@click.option("--dtype", "dtypes", type=DtypeChoice(), multiple=True, default=("float16",),
              show_default=True, help="Low-precision dtype to time next to float32 (repeatable).")
@build_options
@click.option("--batch", type=int, default=None, help="Batch size: the first dim of every input.")
@click.option("--threads", type=int, default=None,
              help="Threads for TVM and onnxruntime alike  [default: every CPU available].")
@click.option("--rounds", type=int, default=5, show_default=True, help="Rounds over all variants.")
@click.option("--runs", type=int, default=3, show_default=True, help="Timed runs per variant per round.")
@click.option("--against", multiple=True, type=click.Choice(["openvino"]),
              help="Also time this runtime (repeatable): openvino adds OpenVINO's CPU plugin in float32 and in each "
              "DTYPE, each in its own process (needs amptool[openvino]). onnxruntime is always timed.")
@click.option("--fresh-workers/--same-workers", default=True, show_default=True,
              help="New worker processes every round (samples each process's luck: core placement, memory "
                   "layout), or one per variant for the whole bench (faster to load).")
@rpc_options
@json_option("The timings, ratios, host and versions")
@handles_user_errors
def bench(model: str, dtypes: tuple[str, ...], build: dict[str, Any], batch: int | None, threads: int | None,
          rounds: int, runs: int, fresh_workers: bool, json_path: str | None, remote: Any = None,
          against: tuple[str, ...] = ()) -> None:
    """Time MODEL (.onnx, or an 'amptool convert' output directory) under onnxruntime float32,
    amptool float32 and amptool in each DTYPE; print time ratios.

    \b
    Each variant runs in a process of its own, one at a time, so one runtime's thread pool
    never slows another. Ratios are what to read: variants take turns in the same rounds, so
    load from other processes slows them alike. On a GPU every timed call ends with a device
    synchronize.

    \b
    Examples:
      amptool bench model.onnx                                # float16 and float32 vs onnxruntime
      amptool bench model.onnx --dtype fp16 --dtype bf16 --threads 4
      amptool bench out/ --rounds 10                          # an artifact from 'amptool convert'
      amptool bench model.onnx --dtype bf16 --against openvino  # OpenVINO fp32 and bf16 beside
      amptool bench model.onnx --rpc 10.0.0.2:9190 --rpc-key rasp4 --target-options '-mtriple=aarch64-linux-gnu'
    """
    from amptool.app.bench import BenchConfig, bench_model  # noqa: PLC0415

    build = dict(build)
    config = BenchConfig(model=model, dtypes=dtypes, target=build.pop("target"), cuda_arch=build.pop("cuda_arch"),
                         input_shapes=build.pop("input_shapes"), colors=build.pop("colors"), build=build,
                         batch=batch, threads=threads, rounds=rounds, runs=runs,
                         fresh_workers=fresh_workers, against=tuple(dict.fromkeys(against)))
    with _progress() as (on_stage, on_progress):
        if remote is None:
            report = bench_model(config, on_stage=on_stage, on_progress=on_progress)
        else:  # amptool timed on the remote device, onnxruntime here
            from amptool.app.remote_bench import bench_remote  # noqa: PLC0415

            report = bench_remote(config, remote, on_stage=on_stage, on_progress=on_progress)
    report_console(json_path).print(_table(report))  # stderr when the JSON owns stdout
    click.echo(_summary(report), err=json_to_stdout(json_path))
    emit_json(json_path, report.as_json())


@contextlib.contextmanager
def _progress() -> Iterator[tuple[Callable[[str], None], Callable[[int, int], None]]]:
    """A build line (current stage) and a timing bar, on stderr; outside a terminal, convert's
    stage lines with elapsed seconds plus one line per quarter of the timing (-q: none)."""
    if not err.is_terminal:
        with stages() as on_stage:
            def on_progress(done: int, total: int) -> None:
                if done == total or done % max(1, total // 4) == 0:
                    on_stage(f"timing {done}/{total}")

            yield on_stage, on_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        build = progress.add_task("building", total=None)
        timing: list[Any] = []

        def on_stage(name: str) -> None:
            progress.update(build, description=f"[bold]{name}[/]")

        def on_progress(done: int, total: int) -> None:
            if not timing:
                progress.update(build, visible=False)
                timing.append(progress.add_task("timing", total=total))
            progress.update(timing[0], completed=done)

        yield on_stage, on_progress


def _fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _table(report: Any) -> Any:
    from rich.table import Table  # noqa: PLC0415

    from amptool.app.bench import ONNXRUNTIME, amptool_variant  # noqa: PLC0415

    where = (f"amptool on {report.host['remote_device']} at {report.host['remote_server']} (TVM time evaluator), "
             f"onnxruntime here on {report.threads} thread(s), {report.host['cpu']}" if report.host.get("remote")
             else f"{report.host['gpu']} (compute {report.host['gpu_compute']}), onnxruntime on "
             f"{report.onnxruntime_provider.removesuffix('ExecutionProvider')}" if "gpu" in report.host
             else f"{report.threads} thread(s), {report.host['cpu']} ({report.host['llvm_cpu']})")
    table = Table(title=f"{report.model} on {report.target}, {where}", title_justify="left")
    openvino = any(r.variant.startswith("openvino-") for r in report.results)
    columns = ["variant", "median ms", "p90 ms", "× onnxruntime fp32", "× amptool fp32",
               *(["× openvino same dtype"] if openvino else []), "build s"]
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    fp32 = amptool_variant("float32")
    for r in report.results:
        amptool = r.variant.startswith("amptool-")
        same = f"openvino-{r.variant.removeprefix('amptool-')}"
        table.add_row(
            r.variant, f"{r.median_ms:.2f}", f"{r.p90_ms:.2f}",
            _fmt_ratio(report.ratio(r.variant, ONNXRUNTIME)),
            _fmt_ratio(report.ratio(r.variant, fp32)) if amptool else "—",
            *([_fmt_ratio(report.ratio(r.variant, same)) if amptool else "—"] if openvino else []),
            "—" if r.build_s is None else f"{r.build_s:.1f}",
        )
    return table


def _summary(report: Any) -> str:
    """One grep-friendly line: each amptool variant's ratios, then the thread count."""
    parts = []
    for r in report.results:
        if not r.variant.startswith("amptool-"):
            continue
        ratios = [f"{value:.2f}x {key.split('/')[1]}" for key, value in report.ratios().items()
                  if key.split("/")[0] == r.variant]
        parts.append(f"{r.variant} {', '.join(ratios)}")
    return "BENCH | " + " | ".join([*parts, f"threads {report.threads}"])
