"""GPU verification (issue 7, item 4); run through ``benchmarks/gpu_check.sh``, which checks for
a GPU first.

For each case — ResNet-50 at batch 1 and 32, a BERT-base encoder at batch 8 × 128 tokens — the
network is built in PyTorch (seeded weights, trained-looking BatchNorm statistics; nothing is
downloaded) and exported to ONNX at that batch, then:

  1. ``amptool convert --target cuda`` to float32 and float16 (artifacts in OUT/CASE-DTYPE);
  2. ``amptool diff --artifact`` of each against onnxruntime float32 on the CPU: every float16
     output must reach cosine >= 0.999 (--min-cosine), float32 is reported as a sanity check;
  3. ``amptool bench --target cuda``: amptool float32/float16 and onnxruntime, the device
     synchronised after every call;
  4. PyTorch eager float32 and float16 (``torch.autocast``) on the same GPU, timed the same way
     (``torch.cuda.synchronize`` after every call), same rounds and runs.

It prints a markdown table and writes OUT/report.json and OUT/report.md. Exit 0 when every
float16 output meets the cosine bound, 1 when one does not, 3 when a tool reports the target
unavailable. ``--target llvm`` runs the same flow on the CPU (PyTorch on the CPU, autocast to
bfloat16 there) — to check this script on a machine without a GPU, not to measure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amptool.testing.torch_zoo import trained_like

HERE = Path(__file__).resolve().parent
MIN_COSINE = 0.999


def resnet50(torch: Any) -> Any:
    """torchvision's ResNet-50 v1.5 layout (stride on the 3×3 conv), 1000 classes."""
    nn = torch.nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> Any:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)

    class Bottleneck(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                      conv_bn(width, width * 4, 1, relu=False))
            self.short = conv_bn(cin, width * 4, 1, stride, relu=False) if stride != 1 or cin != width * 4 else None

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))

    blocks: list[Any] = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(count):
            blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    blocks += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return trained_like(nn.Sequential(*blocks))


def bert_encoder(torch: Any, layers: int = 12) -> Any:
    """BERT-base shape: token + position embeddings, LayerNorm, 12 post-norm layers (d 768,
    12 heads, GELU MLP 3072); returns the last hidden state."""
    nn = torch.nn

    class Encoder(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(30522, 768), nn.Embedding(512, 768)
            self.norm = nn.LayerNorm(768)
            layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
            self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, ids: Any) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return self.layers(self.norm(self.tokens(ids) + self.positions(positions)))

    return Encoder().eval()


#: case → (title, builder(torch, args) → (module, example input), input name, output name)
Case = tuple[str, Callable[[Any, argparse.Namespace], tuple[Any, Any]], str, str]
CASES: dict[str, Case] = {
    "resnet50-b1": ("ResNet-50, 1×3×224×224", lambda t, a: (resnet50(t), t.randn(1, 3, 224, 224)), "image", "logits"),
    "resnet50-b32": ("ResNet-50, 32×3×224×224", lambda t, a: (resnet50(t), t.randn(32, 3, 224, 224)), "image",
                     "logits"),
    "bert-b8": ("BERT-base encoder, 8×128 tokens",
                lambda t, a: (bert_encoder(t, a.bert_layers), t.randint(0, 30522, (8, 128))), "input_ids", "hidden"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--out", default="out/gpu_check", help="artifacts and report")
    parser.add_argument("--target", default="cuda", choices=("cuda", "llvm"),
                        help="llvm: the same flow on the CPU, to check the script without a GPU")
    parser.add_argument("--cuda-arch", default=None, help="passed to amptool (default: the local GPU's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--bert-layers", type=int, default=12, help="fewer for a quick check")
    args = parser.parse_args()
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    import torch

    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        try:
            results.append(check_case(torch, name, args, out))
        except ToolFailed as failed:
            print(f"gpu_check: {name}: {failed}", file=sys.stderr)
            return failed.code
    report = render(results, args)
    print(report)
    (out / "report.md").write_text(report + "\n", encoding="utf-8")
    (out / "report.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    failed = [r["case"] for r in results if not r["float16_ok"]]
    print(f"GPU_CHECK | {'FAILED ' + ', '.join(failed) if failed else 'PASSED'} | {len(results)} case(s) | "
          f"float16 cosine >= {MIN_COSINE} vs onnxruntime float32")
    return 1 if failed else 0


class ToolFailed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def amptool(*args: str) -> None:
    command = [sys.executable, "-m", "amptool", *args]
    print("$ amptool " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: accuracy failed, judged from the JSON below
        raise ToolFailed(f"amptool {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}",
                         3 if done.returncode == 3 else 2)


def check_case(torch: Any, name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    title, build, input_name, output_name = CASES[name]
    module, example = build(torch, args)
    model = out / f"{name}.onnx"
    # Not under no_grad: there nn.TransformerEncoderLayer takes its fused fast path, which has no ONNX export.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(model), input_names=[input_name], output_names=[output_name],
                          opset_version=17, dynamo=False)
    target = ["--target", args.target, *(["--cuda-arch", args.cuda_arch] if args.cuda_arch else [])]
    result: dict[str, Any] = {"case": name, "title": title}
    for dtype in ("float32", "float16"):
        artifact = out / f"{name}-{dtype}"
        amptool("convert", str(model), "--dtype", dtype, *target, "-o", str(artifact), "--json")
        report = out / f"{name}-{dtype}-diff.json"
        amptool("diff", str(model), "--dtype", dtype, "--artifact", str(artifact), "--min-cosine",
                str(MIN_COSINE), "--json", str(report))
        diff = json.loads(report.read_text(encoding="utf-8"))
        result[f"{dtype}_cosine"] = min(_finite(o["cosine"]) for o in diff["outputs"])
        result[f"{dtype}_diff_passed"] = diff["passed"]
    result["float16_ok"] = result["float16_cosine"] >= MIN_COSINE
    bench_json = out / f"{name}-bench.json"
    amptool("bench", str(model), "--dtype", "float16", *target, "--rounds", str(args.rounds), "--runs",
            str(args.runs), "--json", str(bench_json))
    bench = json.loads(bench_json.read_text(encoding="utf-8"))
    result["ms"] = {r["variant"]: r["median_ms"] for r in bench["results"]}
    result["onnxruntime_provider"] = bench.get("onnxruntime_provider")
    result["gpu"] = bench["host"].get("gpu", bench["host"]["cpu"])
    result["ms"].update(torch_times(torch, module, example, args))
    return result


def _finite(value: float | None) -> float:
    return -math.inf if value is None else float(value)


def torch_times(torch: Any, module: Any, example: Any, args: argparse.Namespace) -> dict[str, float]:
    """PyTorch eager medians: float32 and autocast (float16 on CUDA, bfloat16 on the CPU)."""
    device = "cuda" if args.target == "cuda" else "cpu"
    low = torch.float16 if device == "cuda" else torch.bfloat16
    module, example = module.to(device), example.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"torch-float32": [], f"torch-autocast-{str(low).split('.')[-1]}": []}

    def call(autocast: bool) -> None:
        with torch.inference_mode(), torch.autocast(device, dtype=low, enabled=autocast):
            module(example)
        sync()

    for _ in range(3):
        call(False)
        call(True)
    for round_index in range(args.rounds):
        order = list(times) if round_index % 2 == 0 else list(reversed(times))
        for key in order:
            call(key != "torch-float32")  # untimed: settles the other variant's state
            for _ in range(args.runs):
                start = time.perf_counter()
                call(key != "torch-float32")
                times[key].append((time.perf_counter() - start) * 1e3)
    module.to("cpu")
    return {key: round(statistics.median(values), 4) for key, values in times.items()}


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    variants = list(dict.fromkeys(k for r in results for k in r["ms"]))
    head = ["case", "device", "fp16 cosine", "fp32 cosine", *(f"{v} ms" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["title"], r["gpu"], f"{r['float16_cosine']:.7f}" + ("" if r["float16_ok"] else " FAIL"),
                 f"{r['float32_cosine']:.7f}", *(f"{r['ms'][v]:.2f}" if v in r["ms"] else "—" for v in variants)]
        lines.append("| " + " | ".join(cells) + " |")
    provider = results[0]["onnxruntime_provider"] if results else "—"
    lines.append("")
    synced = ", device synchronised after every call" if args.target == "cuda" else ""
    lines.append(f"Target {args.target}; medians of {args.rounds} rounds × {args.runs} runs{synced}; onnxruntime on "
                 f"{provider}; cosine: worst output against onnxruntime float32 (CPU).")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
