"""CPU speed of amptool builds against onnxruntime: ``amptool bench`` over a fixed model set.

    .venv/bin/python benchmarks/cpu_speed.py                 # all models, 2 and 1 threads → README.md
    .venv/bin/python benchmarks/cpu_speed.py --models resnet50,bert --threads 1 --no-write
    .venv/bin/python benchmarks/cpu_speed.py --against openvino   # OpenVINO fp32 and bf16 beside (amptool[openvino])

Models (built in code or shipped by the onnx wheel; nothing is downloaded):
  resnet50      torchvision-shaped ResNet-50, seeded weights          (benchmarks/models.py)
  inception_v1  GoogLeNet from the onnx wheel's backend test data    (light_inception_v1.onnx)
  squeezenet    SqueezeNet 1.0 from the onnx wheel                    (light_squeezenet.onnx)
  mobilenet_v2  MobileNetV2 1.0, depthwise convolutions, ReLU6        (benchmarks/models.py)
  bert          BERT-base encoder (12 layers, d 768, seq 128)         (benchmarks/models.py)

The onnx wheel's light_* models have constant placeholder weights whose activations overflow
float16; their outputs are meaningless but their kernels are the real ones, which is all timing
needs. Each variant runs in a worker process of its own, one at a time, in rotating rounds (see
amptool.app.bench). Other load slows onnxruntime's pool more than TVM's, so the ratios are fair
only on an idle machine; the table records the load averages before and after.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from amptool.app.bench import (  # noqa: E402
    ONNXRUNTIME,
    BenchConfig,
    BenchReport,
    amptool_variant,
    bench_model,
    openvino_variant,
)
from benchmarks import models  # noqa: E402

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LOW = ("float16", "bfloat16")
MARKER = "<!-- cpu_speed results -->"
END_MARKER = "<!-- /cpu_speed results -->"


def _light(name: str) -> Callable[[], onnx.ModelProto]:
    return lambda: onnx.load(str(LIGHT / f"light_{name}.onnx"))


MODELS: dict[str, tuple[str, Callable[[], onnx.ModelProto]]] = {
    "resnet50": ("ResNet-50, 1×3×224×224", models.resnet50),
    "inception_v1": ("Inception v1 (GoogLeNet), 1×3×224×224", _light("inception_v1")),
    "squeezenet": ("SqueezeNet 1.0, 1×3×224×224", _light("squeezenet")),
    "mobilenet_v2": ("MobileNetV2, 1×3×224×224", models.mobilenet_v2),
    "bert": ("BERT-base encoder, 12 layers, seq 128", models.bert_base),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--threads", default="2,1", help="comma-separated thread counts, one table each")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--readme", default=str(HERE / "README.md"), help="file whose results section is replaced")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--against", default="", help="'openvino': also time OpenVINO fp32 and bf16 (each isolated)")
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")

    # TVM sizes its thread pool once per process thread and can only shrink it: largest first.
    counts = sorted({int(t) for t in args.threads.split(",")}, reverse=True)
    tables: list[str] = []
    with tempfile.TemporaryDirectory(prefix="amptool-cpu-speed-") as tmp:
        paths = {}
        for name in names:
            paths[name] = os.path.join(tmp, f"{name}.onnx")
            onnx.save(MODELS[name][1](), paths[name])
        for threads in counts:
            load_before = os.getloadavg()[0]
            reports: list[tuple[str, BenchReport]] = []
            for name in names:
                print(f"== {name}, {threads} thread(s)", file=sys.stderr, flush=True)
                config = BenchConfig(model=paths[name], dtypes=LOW, threads=threads, rounds=args.rounds,
                                     runs=args.runs, against=tuple(a for a in args.against.split(",") if a))
                report = bench_model(config, on_stage=lambda stage: print(f"   {stage}", file=sys.stderr, flush=True))
                reports.append((MODELS[name][0], report))
                print(_row(MODELS[name][0], report), flush=True)
            tables.append(_table(reports, threads, args, load_before, os.getloadavg()[0]))
    section = _section(tables, reports[0][1])
    print(section)
    if not args.no_write:
        _write(Path(args.readme), section)


def _ms(report: BenchReport, variant: str, digits: int = 1) -> str:
    timing = report.timing(variant)
    return "—" if timing is None else f"{timing.median_ms:.{digits}f}"


def _ratio(report: BenchReport, variant: str, baseline: str) -> str:
    """The ratio of pooled medians, then the per-round paired one in parentheses (``paired_ratio``)."""
    value, paired = report.ratio(variant, baseline), report.paired_ratio(variant, baseline)
    if value is None:
        return "—"
    return f"{value:.2f}×" + ("" if paired is None else f" ({paired:.2f}×)")


def _row(title: str, report: BenchReport) -> str:
    fp32 = amptool_variant("float32")
    compile_s = report.timing(fp32).compile_s if report.timing(fp32) else None
    cells = [
        title,
        _ms(report, ONNXRUNTIME), _ms(report, fp32), *(_ms(report, amptool_variant(d)) for d in LOW),
        _ratio(report, fp32, ONNXRUNTIME), *(_ratio(report, amptool_variant(d), fp32) for d in LOW),
        "—" if compile_s is None else f"{compile_s:.1f}",
    ]
    if _has_openvino(report):
        cells += [_ms(report, openvino_variant("float32")), _ms(report, openvino_variant("bfloat16")),
                  _ratio(report, fp32, openvino_variant("float32")),
                  _ratio(report, amptool_variant("bfloat16"), openvino_variant("bfloat16"))]
    return "| " + " | ".join(cells) + " |"


def _has_openvino(report: BenchReport) -> bool:
    return report.timing(openvino_variant("float32")) is not None


def _table(reports: list[tuple[str, BenchReport]], threads: int, args: argparse.Namespace, load_before: float,
           load_after: float) -> str:
    openvino = any(_has_openvino(report) for _, report in reports)
    lines = [
        f"**{threads} thread(s)** for TVM and onnxruntime, batch 1, {args.rounds} rounds × {args.runs} runs per "
        f"variant, medians. Load average {load_before:.1f} before, {load_after:.1f} after. Ratios: of the "
        "pooled medians, and in parentheses the median over rounds of each round's ratio (steadier on a "
        "shared machine: both sides of a pair ran minutes apart at most).",
        "",
        "| model | onnxruntime fp32 ms | amptool fp32 ms | amptool fp16 ms | amptool bf16 ms "
        "| fp32 vs onnxruntime | fp16 vs fp32 | bf16 vs fp32 | fp32 compile s |"
        + (" OpenVINO fp32 ms | OpenVINO bf16 ms | fp32 vs OpenVINO fp32 | bf16 vs OpenVINO bf16 |"
           if openvino else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 4 if openvino else ""),
        *(_row(title, report) for title, report in reports),
    ]
    return "\n".join(lines)


def _section(tables: list[str], report: BenchReport) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        MARKER,
        f"Measured {date} on {report.host['cpu']} (LLVM `{report.host['llvm_cpu']}`{_mattr(report.host)}, "
        f"{report.host['cpus']} CPUs "
        f"visible to the process). Versions: {versions}. Each runtime timed in its own worker process, one at "
        "a time (amptool bench); a load average above ~2.2 means other work shared the 2 cores and the "
        "ratios favour amptool.",
        "",
        *("\n\n".join(tables).splitlines()),
        "",
        "Reproduce: `.venv/bin/python benchmarks/cpu_speed.py`.",
    ]
    return "\n".join(lines) + "\n"


def _write(readme: Path, section: str) -> None:
    """Replace the text between the results markers (or append a section); atomically. What other
    scripts wrote around it is kept."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    if MARKER in text:
        head, _, rest = text.partition(MARKER)
        tail = rest.partition(END_MARKER)[2] if END_MARKER in rest else ""
    else:
        head, tail = (text.rstrip() + "\n\n" if text else ""), ""
    tmp = readme.with_suffix(".md.tmp")
    tmp.write_text(head + section + END_MARKER + tail, encoding="utf-8")
    os.replace(tmp, readme)


def _mattr(host: dict[str, str]) -> str:
    """`` with -mattr=…`` where the host's features differ from its LLVM CPU name's, else empty."""
    return f" with `-mattr={host['llvm_mattr']}`" if host.get("llvm_mattr") else ""


if __name__ == "__main__":
    main()
