"""CPU speed across architectures people ship, at realistic sizes: ``amptool bench`` per model.

cpu_speed.py times three models well; this sweep times twenty-one once, to find the architecture whose
shapes a schedule misses (ViT's 197 tokens had a one-row matmul tile and a scalar attention
product: 2.28× onnxruntime before the fix). PyTorch modules with seeded random weights (transformers
configs; a detector, a U-Net and an optical-flow net from ``vision_archs.py``; nothing downloaded),
exported with the TorchScript exporter at opset 18; each then runs
``amptool bench`` (every runtime in its own worker process, rounds alternated).

    .venv/bin/python benchmarks/arch_sweep.py                          # every model, float32, 2 threads
    .venv/bin/python benchmarks/arch_sweep.py --models vit,regnet --dtype bfloat16 --rounds 5

Needs the zoo extra (``make zoo`` installs it: torch 2.13 CPU, transformers). The table prints the
pooled-median ratio amptool/onnxruntime and, in parentheses, the median of per-round ratios; on
this 2-core VM single ratios move ±10% between runs — read it for outliers, not for 5%.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from amptool.app.bench import ONNXRUNTIME, BenchConfig, BenchReport, amptool_variant, bench_model  # noqa: E402
from amptool.testing.torch_zoo import TorchCase, crnn_ocr, export_case, hf_case  # noqa: E402
from benchmarks.vision_archs import raft_flow, unet, yolo_detector  # noqa: E402


def _torch() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _text(config_cls: str, model_cls: str, tokens: int, mask: bool = True, **config: Any) -> TorchCase:
    """Token ids (and an all-ones attention mask, with ``mask``) into a text model."""
    torch = _torch()
    inputs = {"input_ids": torch.randint(0, 1000, (1, tokens))}
    if mask:
        inputs["attention_mask"] = torch.ones(1, tokens, dtype=torch.int64)
    return hf_case(config_cls, model_cls, inputs, ("last_hidden_state",), vocab_size=1000, **config)


def _image(config_cls: str, model_cls: str, output: str = "pooler_output", size: int = 224, **config: Any) -> TorchCase:
    pixels = _torch().randn(1, 3, size, size)
    return hf_case(config_cls, model_cls, {"pixel_values": pixels}, (output,), **config)


def _recurrent(kind: str, features: int, hidden: int, steps: int, classes: int) -> TorchCase:
    torch = _torch()

    class Tagger(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(features, hidden, num_layers=2, bidirectional=True, batch_first=True)
            self.out = torch.nn.Linear(2 * hidden, classes)

        def forward(self, x: Any) -> Any:
            return self.out(self.rnn(x)[0])

    return TorchCase(Tagger().eval(), (torch.randn(1, steps, features),), ("features",), ("logits",))


#: name → (what it is, builder)
MODELS: dict[str, tuple[str, Callable[[], TorchCase]]] = {
    "llama": ("Llama block ×2, d 1024, GQA 16/4 heads, 128 tokens",
              lambda: _text("LlamaConfig", "LlamaModel", 128, hidden_size=1024, intermediate_size=2816,
                            num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
                            max_position_embeddings=512)),
    "gpt2": ("GPT-2 block ×2, d 768, 128 tokens",
             lambda: _text("GPT2Config", "GPT2Model", 128, n_embd=768, n_layer=2, n_head=12, n_positions=512)),
    "bert384": ("BERT-base layer ×2, 384 tokens",
                lambda: _text("BertConfig", "BertModel", 384, hidden_size=768, num_hidden_layers=2,
                              num_attention_heads=12, intermediate_size=3072)),
    "distilbert": ("DistilBERT ×2 layers, 128 tokens",
                   lambda: _text("DistilBertConfig", "DistilBertModel", 128, n_layers=2)),
    "t5": ("T5 encoder ×2, d 512, relative position bias, 128 tokens",
           lambda: _text("T5Config", "T5EncoderModel", 128, num_layers=2, d_model=512, d_ff=2048, num_heads=8,
                         mask=False)),
    "clip_text": ("CLIP text encoder ×2 layers, 77 tokens",
                  lambda: _text("CLIPTextConfig", "CLIPTextModel", 77, num_hidden_layers=2, mask=False)),
    "vit": ("ViT-B/16 ×2 layers, 224² (197 tokens)",
            lambda: _image("ViTConfig", "ViTModel", "last_hidden_state", hidden_size=768, num_hidden_layers=2,
                           num_attention_heads=12, intermediate_size=3072, add_pooling_layer=False)),
    "yolos": ("YOLOS ×2 layers, d 384, 224² (197 tokens + 100 detection tokens)",
              lambda: _image("YolosConfig", "YolosModel", "last_hidden_state", image_size=[224, 224],
                             num_hidden_layers=2, hidden_size=384, num_attention_heads=6, intermediate_size=1536)),
    "swin": ("Swin-T depths 2-2-2-2, 224²", lambda: _image("SwinConfig", "SwinModel", depths=[2, 2, 2, 2])),
    "convnext": ("ConvNeXt-T depths 2-2-2-2, 224²",
                 lambda: _image("ConvNextConfig", "ConvNextModel", depths=[2, 2, 2, 2])),
    "regnet": ("RegNet (transformers' default: 64-channel groups), 224²",
               lambda: _image("RegNetConfig", "RegNetModel")),
    "efficientnet": ("EfficientNet-B0, 224²",
                     lambda: _image("EfficientNetConfig", "EfficientNetModel", width_coefficient=1.0,
                                    depth_coefficient=1.0, hidden_dim=1280)),
    "segformer": ("SegFormer-B0 encoder, 256²",
                  lambda: _image("SegformerConfig", "SegformerModel", "last_hidden_state", size=256)),
    "wav2vec2": ("wav2vec2-base extractor + 2 layers, 1 s of 16 kHz",
                 lambda: hf_case("Wav2Vec2Config", "Wav2Vec2Model", {"input_values": _torch().randn(1, 16000)},
                                 ("last_hidden_state",), num_hidden_layers=2)),
    "whisper": ("Whisper encoder, d 384, 2 layers, 30 s of mel frames (1500 tokens)",
                lambda: hf_case("WhisperConfig", "WhisperModel", {"input_features": _torch().randn(1, 80, 3000)},
                                ("last_hidden_state",), part="get_encoder", d_model=384, encoder_layers=2,
                                decoder_layers=1, encoder_attention_heads=6, decoder_attention_heads=6,
                                encoder_ffn_dim=1536, decoder_ffn_dim=1536)),
    "lstm": ("2-layer bidirectional LSTM 80 → 512, 100 steps", lambda: _recurrent("LSTM", 80, 512, 100, 29)),
    "gru": ("2-layer bidirectional GRU 256 → 256, 80 steps", lambda: _recurrent("GRU", 256, 256, 80, 97)),
    "yolo": ("YOLOv8n-style detector with its box decode, 320²", yolo_detector),
    "unet": ("U-Net 32-256 channels, 2×2 transposed convs, 256²", unet),
    "raft": ("RAFT-style flow, 256×320, all-pairs correlation, 4 GRU iterations", raft_flow),
    "crnn": ("CRNN OCR: convs over a 32×128 text line, bidirectional GRU, log-softmax", crnn_ocr),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--dtype", action="append", default=[], choices=("float16", "bfloat16"),
                        help="also time amptool in this dtype (repeatable); float32 always")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="amptool-arch-sweep-") as tmp:
        for name in names:
            path = os.path.join(tmp, f"{name}.onnx")
            print(f"== {name}: export", file=sys.stderr, flush=True)
            export_case(MODELS[name][1](), "torchscript", path)
            config = BenchConfig(model=path, dtypes=tuple(args.dtype), threads=args.threads, rounds=args.rounds,
                                 runs=args.runs)
            report = bench_model(config, on_stage=lambda stage: print(f"   {stage}", file=sys.stderr, flush=True))
            rows.append(_row(name, report, args.dtype))
            print(rows[-1], flush=True)
    print(_table(rows, args))


def _ratio(report: BenchReport, variant: str) -> str:
    value, paired = report.ratio(variant, ONNXRUNTIME), report.paired_ratio(variant, ONNXRUNTIME)
    if value is None:
        return "—"
    return f"{value:.2f}×" + ("" if paired is None else f" ({paired:.2f}×)")


def _ms(report: BenchReport, variant: str) -> str:
    timing = report.timing(variant)
    return "—" if timing is None else f"{timing.median_ms:.1f}"


def _row(name: str, report: BenchReport, dtypes: list[str]) -> str:
    variants = [amptool_variant("float32"), *(amptool_variant(d) for d in dtypes)]
    cells = [MODELS[name][0], _ms(report, ONNXRUNTIME), *(_ms(report, v) for v in variants),
             *(_ratio(report, v) for v in variants)]
    return "| " + " | ".join(cells) + " |"


def _table(rows: list[str], args: argparse.Namespace) -> str:
    names = ["fp32", *(d.replace("float", "fp").replace("bfp", "bf") for d in args.dtype)]
    head = ["model", "onnxruntime fp32 ms", *(f"amptool {n} ms" for n in names), *(f"{n} / onnxruntime" for n in names)]
    return "\n".join([
        f"{args.threads} thread(s), batch 1, {args.rounds} rounds × {args.runs} runs per variant, medians; "
        f"load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
        *rows,
    ])


if __name__ == "__main__":
    main()
