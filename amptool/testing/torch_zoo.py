"""Real PyTorch exports for amptool's regression suite: architectures people actually ship.

Each entry builds a PyTorch module with seeded random weights (no hub download: transformers
models come from a config) and example inputs; :func:`export` writes it to ONNX with the
TorchScript exporter (``dynamo=False``) or the dynamo exporter (``dynamo=True``). These are
the exports whose shape chains, masks and control flow trip TVM's frontend, so
``make zoo`` runs convert + diff over every (model, exporter) pair.

Needs the optional ``zoo`` extra (torch 2.13 CPU, transformers, onnxscript).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXPORTERS = ("torchscript", "dynamo")
OPSET = 18  # the dynamo exporter's lowest; asking it for less yields invalid models


@dataclass(frozen=True)
class TorchCase:
    """A module, example inputs and their ONNX names."""

    module: Any
    inputs: tuple[Any, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def _torch() -> Any:
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    return torch


def resnet18_like() -> TorchCase:
    """A ResNet-18-shaped CNN (BatchNorm, residual adds, global pool, Linear)."""
    torch = _torch()
    nn: Any = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            widths = [32, 64, 128, 256]
            layers, cin = [], 32
            for i, w in enumerate(widths):
                layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
                cin = w
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(256, 1000)

        def forward(self, x: Any) -> Any:
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    net = trained_like(Net())
    return TorchCase(net, (torch.randn(1, 3, 112, 112),), ("pixels",), ("logits",))


def mobilenet_v2_like() -> TorchCase:
    """Inverted residuals with depthwise convs and ReLU6 (Clip), Hardswish head."""
    torch = _torch()
    nn: Any = torch.nn

    def inverted(cin: int, cout: int, stride: int, expand: int = 4) -> Any:
        mid = cin * expand
        return nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
            self.b1 = inverted(16, 24, 2)
            self.b2 = inverted(24, 24, 1)
            self.b3 = inverted(24, 48, 2)
            self.head = nn.Sequential(nn.Conv2d(48, 128, 1), nn.Hardswish())
            self.fc = nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            x = self.b1(self.stem(x))
            x = x + self.b2(x)
            x = self.head(self.b3(x))
            return torch.softmax(self.fc(x.mean(dim=(2, 3))), dim=-1)

    net = trained_like(Net())
    return TorchCase(net, (torch.randn(2, 3, 64, 64),), ("image",), ("probs",))


def trained_like(net: Any) -> Any:
    """Give BatchNorm layers trained-looking running statistics, then switch to eval."""
    torch = _torch()
    gen = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)
    return net.eval()


def _hf(config_cls: str, model_cls: str, **config: Any) -> Any:
    _torch()
    import transformers  # noqa: PLC0415

    cfg = getattr(transformers, config_cls)(**config)
    with contextlib.redirect_stderr(io.StringIO()):
        model = getattr(transformers, model_cls)(cfg)
    return model.eval()


class _Unwrap:
    """Return plain tensors from a transformers model (exporters dislike ModelOutput)."""

    @staticmethod
    def wrap(model: Any, keys: tuple[str, ...], arg_names: tuple[str, ...]) -> Any:
        torch = _torch()

        base: Any = torch.nn.Module

        class Wrapped(base):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                out = self.model(**dict(zip(arg_names, args, strict=True)))
                return tuple(out[k] for k in keys)

        return Wrapped().eval()


def bert_encoder() -> TorchCase:
    """A BERT-style encoder: int64 ids, attention mask, token types; GELU, LayerNorm."""
    torch = _torch()
    model = _hf("BertConfig", "BertModel", vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    types = torch.zeros(2, 16, dtype=torch.int64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    wrapped = _Unwrap.wrap(model, ("last_hidden_state", "pooler_output"), names)
    return TorchCase(wrapped, (ids, mask, types), names, ("last_hidden_state", "pooler_output"))


def gpt2_decoder() -> TorchCase:
    """A GPT-2-style causal decoder, left-padded batch: causal + padding mask with finfo.min, tied LM head."""
    torch = _torch()
    model = _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                n_positions=64, use_cache=False)
    ids = torch.randint(0, 1000, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.int64)
    mask[0, :5] = 0  # left padding, as batched generation does
    names = ("input_ids", "attention_mask")
    return TorchCase(_Unwrap.wrap(model, ("logits",), names), (ids, mask), names, ("logits",))


def vit_encoder() -> TorchCase:
    """A ViT: patch-embedding conv, class token, position embeddings, attention."""
    torch = _torch()
    model = _hf("ViTConfig", "ViTModel", image_size=32, patch_size=8, hidden_size=96, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=192, add_pooling_layer=True)
    return TorchCase(_Unwrap.wrap(model, ("last_hidden_state", "pooler_output"), ("pixel_values",)),
                     (torch.randn(1, 3, 32, 32),),
                     ("pixel_values",), ("last_hidden_state", "pooler_output"))


def lstm_tagger() -> TorchCase:
    """Embedding + 2-layer bidirectional LSTM + Linear: an RNN sequence tagger."""
    torch = _torch()
    nn: Any = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(500, 32)
            self.rnn = nn.LSTM(32, 48, num_layers=2, bidirectional=True, batch_first=True)
            self.out = nn.Linear(96, 9)

        def forward(self, ids: Any) -> Any:
            y, _ = self.rnn(self.emb(ids))
            return self.out(y)

    return TorchCase(Net().eval(), (torch.randint(0, 500, (2, 12)),), ("tokens",), ("tags",))


def crnn_ocr() -> TorchCase:
    """CRNN-style OCR: conv feature extractor over a text line, bidirectional GRU, log-softmax."""
    torch = _torch()
    nn: Any = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cnn = nn.Sequential(
                nn.Conv2d(1, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d((2, 1)),
                nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((8, 1)),
            )
            self.rnn = nn.GRU(64, 48, bidirectional=True)
            self.head = nn.Linear(96, 37)

        def forward(self, x: Any) -> Any:
            f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [W, N, C]
            y, _ = self.rnn(f)
            return torch.log_softmax(self.head(y), dim=-1)

    return TorchCase(trained_like(Net()), (torch.randn(1, 1, 32, 64),), ("line_image",), ("char_logprobs",))


ALL_CASES: dict[str, Callable[[], TorchCase]] = {
    "resnet18_like": resnet18_like,
    "mobilenet_v2_like": mobilenet_v2_like,
    "bert_encoder": bert_encoder,
    "gpt2_decoder": gpt2_decoder,
    "vit_encoder": vit_encoder,
    "lstm_tagger": lstm_tagger,
    "crnn_ocr": crnn_ocr,
}


def hf_case(config_cls: str, model_cls: str, inputs: dict[str, Any], outputs: tuple[str, ...],
            part: str | None = None, **config: Any) -> TorchCase:
    """A transformers model built from ``config_cls(**config)`` with seeded random weights — or
    the module its method ``part`` returns ('get_encoder') — called with ``inputs`` (ONNX input
    name → tensor, passed by keyword) and returning ``outputs``."""
    names = tuple(inputs)
    model = _hf(config_cls, model_cls, **config)
    if part is not None:
        model = getattr(model, part)()
    return TorchCase(_Unwrap.wrap(model, outputs, names), tuple(inputs.values()), names, outputs)


def export(name: str, exporter: str, path: str) -> None:
    """Export case ``name`` to ``path`` with the TorchScript or dynamo exporter."""
    export_case(ALL_CASES[name](), exporter, path)


def export_case(case: TorchCase, exporter: str, path: str) -> None:
    """Export ``case`` to ``path`` with the TorchScript or dynamo exporter."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; choose one of {EXPORTERS}")
    torch = _torch()
    import logging  # noqa: PLC0415

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            case.module, case.inputs, path,
            input_names=list(case.input_names), output_names=list(case.output_names),
            opset_version=OPSET, dynamo=(exporter == "dynamo"),
            **({"external_data": False} if exporter == "dynamo" else {}),
        )
    if not os.path.exists(path):
        raise RuntimeError(f"torch.onnx.export wrote nothing to {path}")


def example_inputs(name: str) -> dict[str, Any]:
    """The case's example inputs as numpy arrays keyed by ONNX input name."""
    case = ALL_CASES[name]()
    return {n: t.numpy() for n, t in zip(case.input_names, case.inputs, strict=True)}
