"""Hand-written PyTorch models for ``arch_sweep.py``: vision architectures transformers has no config for.

Each is the shape of a model people ship, written from its paper's block diagram with seeded random
weights (nothing downloaded): a YOLOv8n-style detector with its box decode, a U-Net with transposed
convs and skip concats, and a RAFT-style optical-flow net (all-pairs correlation, grid-sample
lookups, a convolutional GRU unrolled over iterations). Sizes are realistic but small enough for a
2-core sweep.
"""

from __future__ import annotations

from typing import Any

from amptool.testing.torch_zoo import TorchCase, trained_like


def _torch() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _conv_bn_act(torch: Any, cin: int, cout: int, k: int = 3, s: int = 1, act: Any = None) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout),
                         act if act is not None else nn.SiLU())


def yolo_detector(size: int = 320) -> TorchCase:
    """YOLOv8n-style: Conv-BN-SiLU, C2f blocks (split, bottlenecks, concat), SPPF (three 5×5 max
    pools), an FPN/PAN neck (nearest upsampling, concats), decoupled heads and the exported decode
    (distribution-focal boxes: softmax over 16 bins, sigmoid scores)."""
    torch = _torch()
    nn = torch.nn

    class C2f(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
            super().__init__()
            self.hidden = cout // 2
            self.cv1 = _conv_bn_act(torch, cin, 2 * self.hidden, 1)
            self.cv2 = _conv_bn_act(torch, (2 + n) * self.hidden, cout, 1)
            self.blocks = nn.ModuleList(nn.Sequential(_conv_bn_act(torch, self.hidden, self.hidden),
                                                      _conv_bn_act(torch, self.hidden, self.hidden)) for _ in range(n))
            self.shortcut = shortcut

        def forward(self, x: Any) -> Any:
            parts = list(self.cv1(x).split(self.hidden, 1))
            for block in self.blocks:
                y = block(parts[-1])
                parts.append(parts[-1] + y if self.shortcut else y)
            return self.cv2(torch.cat(parts, 1))

    class SPPF(nn.Module):  # type: ignore[misc]
        def __init__(self, c: int) -> None:
            super().__init__()
            self.cv1 = _conv_bn_act(torch, c, c // 2, 1)
            self.cv2 = _conv_bn_act(torch, c * 2, c, 1)
            self.pool = nn.MaxPool2d(5, 1, 2)

        def forward(self, x: Any) -> Any:
            x = self.cv1(x)
            y1 = self.pool(x)
            y2 = self.pool(y1)
            return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))

    class Detector(nn.Module):  # type: ignore[misc]
        def __init__(self, classes: int = 80, bins: int = 16) -> None:
            super().__init__()
            self.bins = bins
            self.stem = nn.Sequential(_conv_bn_act(torch, 3, 16, 3, 2), _conv_bn_act(torch, 16, 32, 3, 2),
                                      C2f(32, 32, 1), _conv_bn_act(torch, 32, 64, 3, 2), C2f(64, 64, 2))
            self.p4 = nn.Sequential(_conv_bn_act(torch, 64, 128, 3, 2), C2f(128, 128, 2))
            self.p5 = nn.Sequential(_conv_bn_act(torch, 128, 256, 3, 2), C2f(256, 256, 1), SPPF(256))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.top4, self.top3 = C2f(384, 128, 1, False), C2f(192, 64, 1, False)
            self.down3, self.out4 = _conv_bn_act(torch, 64, 64, 3, 2), C2f(192, 128, 1, False)
            self.down4, self.out5 = _conv_bn_act(torch, 128, 128, 3, 2), C2f(384, 256, 1, False)
            self.box = nn.ModuleList(nn.Sequential(_conv_bn_act(torch, c, 64), _conv_bn_act(torch, 64, 64),
                                                   nn.Conv2d(64, 4 * bins, 1)) for c in (64, 128, 256))
            self.cls = nn.ModuleList(nn.Sequential(_conv_bn_act(torch, c, 80), _conv_bn_act(torch, 80, 80),
                                                   nn.Conv2d(80, classes, 1)) for c in (64, 128, 256))
            self.register_buffer("bin_values", torch.arange(bins, dtype=torch.float32).view(1, bins, 1, 1))

        def forward(self, x: Any) -> Any:
            p3 = self.stem(x)
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            t4 = self.top4(torch.cat([self.up(p5), p4], 1))
            n3 = self.top3(torch.cat([self.up(t4), p3], 1))
            n4 = self.out4(torch.cat([self.down3(n3), t4], 1))
            n5 = self.out5(torch.cat([self.down4(n4), p5], 1))
            boxes, scores = [], []
            for level, feature in enumerate((n3, n4, n5)):
                boxes.append(self.box[level](feature).flatten(2))
                scores.append(self.cls[level](feature).flatten(2))
            box = torch.cat(boxes, 2)  # [1, 4·bins, anchors]
            anchors = box.shape[2]
            bins = box.view(1, 4, self.bins, anchors).transpose(1, 2).softmax(1)  # [1, bins, 4, anchors]
            distances = (bins * self.bin_values).sum(1)  # [1, 4, anchors]
            return torch.cat([distances, torch.cat(scores, 2).sigmoid()], 1)

    return TorchCase(trained_like(Detector()), (torch.randn(1, 3, size, size),), ("images",), ("detections",))


def unet(size: int = 256) -> TorchCase:
    """U-Net: double 3×3 convs at four depths with 2×2 max pools, 2×2 stride-2 transposed convs up,
    skip concats, a 1×1 conv to the classes."""
    torch = _torch()
    nn = torch.nn
    widths = (32, 64, 128, 256)

    def double(cin: int, cout: int) -> Any:
        return nn.Sequential(_conv_bn_act(torch, cin, cout, act=nn.ReLU()),
                             _conv_bn_act(torch, cout, cout, act=nn.ReLU()))

    class UNet(nn.Module):  # type: ignore[misc]
        def __init__(self, classes: int = 3) -> None:
            super().__init__()
            self.down = nn.ModuleList(double(cin, cout) for cin, cout in zip((3, *widths[:-1]), widths, strict=True))
            self.bottom = double(widths[-1], 2 * widths[-1])
            self.ups = nn.ModuleList(nn.ConvTranspose2d(2 * w, w, 2, 2) for w in reversed(widths))
            self.up_convs = nn.ModuleList(double(2 * w, w) for w in reversed(widths))
            self.head = nn.Conv2d(widths[0], classes, 1)

        def forward(self, x: Any) -> Any:
            skips = []
            for block in self.down:
                x = block(x)
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
            x = self.bottom(x)
            for up, conv, skip in zip(self.ups, self.up_convs, reversed(skips), strict=True):
                x = conv(torch.cat([up(x), skip], 1))
            return self.head(x)

    return TorchCase(trained_like(UNet()), (torch.randn(1, 3, size, size),), ("image",), ("mask",))


def raft_flow(height: int = 256, width: int = 320, iterations: int = 4) -> TorchCase:
    """RAFT-style optical flow at 1/8 resolution: a conv feature encoder per frame, all-pairs
    correlation (one matmul) pooled into a 2-level pyramid, per iteration a 9×9 lookup around the
    current flow by grid sampling, a motion encoder and a separable convolutional GRU, then the
    flow upsampled ×8 (bilinear)."""
    torch = _torch()
    nn = torch.nn
    functional = nn.functional
    h, w = height // 8, width // 8
    radius, levels = 4, 2

    def encoder(cout: int) -> Any:
        return nn.Sequential(_conv_bn_act(torch, 3, 32, 7, 2, nn.ReLU()), _conv_bn_act(torch, 32, 64, 3, 2, nn.ReLU()),
                             _conv_bn_act(torch, 64, 96, 3, 2, nn.ReLU()), nn.Conv2d(96, cout, 1))

    class Flow(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.features, self.context = encoder(128), encoder(96 + 64)  # GRU state, its inputs
            taps = levels * (2 * radius + 1) ** 2
            self.motion = nn.Sequential(nn.Conv2d(taps + 2, 96, 3, padding=1), nn.ReLU(),
                                        nn.Conv2d(96, 64, 3, padding=1), nn.ReLU())
            hidden, inputs = 96, 64 + 64 + 2
            self.gru_h = nn.ModuleList(nn.Conv2d(hidden + inputs, 3 * hidden, k, padding=p)
                                       for k, p in (((1, 5), (0, 2)), ((5, 1), (2, 0))))
            self.flow_head = nn.Sequential(nn.Conv2d(hidden, 128, 3, padding=1), nn.ReLU(),
                                           nn.Conv2d(128, 2, 3, padding=1))
            ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                    indexing="ij")
            self.register_buffer("coords", torch.stack([xs, ys]).unsqueeze(0))  # [1, 2, h, w]
            d = torch.arange(-radius, radius + 1, dtype=torch.float32)
            dy, dx = torch.meshgrid(d, d, indexing="ij")
            self.register_buffer("delta", torch.stack([dx, dy], -1).view(1, 2 * radius + 1, 2 * radius + 1, 2))

        def _gru(self, state: Any, x: Any) -> Any:
            for conv in self.gru_h:
                z, r, q = conv(torch.cat([state, x], 1)).chunk(3, 1)
                z, r = torch.sigmoid(z), torch.sigmoid(r)
                q = torch.tanh(q * r + q)
                state = (1 - z) * state + z * q
            return state

        def forward(self, image1: Any, image2: Any) -> Any:
            f1, f2 = self.features(image1), self.features(image2)
            corr = torch.matmul(f1.flatten(2).transpose(1, 2), f2.flatten(2)) / 128 ** 0.5  # [1, hw, hw]
            pyramid = [corr.view(h * w, 1, h, w)]
            pyramid.append(functional.avg_pool2d(pyramid[-1], 2, 2))
            context = self.context(image1)
            state, features = torch.tanh(context[:, :96]), torch.relu(context[:, 96:])
            flow = torch.zeros(1, 2, h, w)
            for _ in range(iterations):
                centre = (self.coords + flow).permute(0, 2, 3, 1).reshape(h * w, 1, 1, 2)
                looked = []
                for level, volume in enumerate(pyramid):
                    size = torch.tensor([volume.shape[3] - 1, volume.shape[2] - 1], dtype=torch.float32)
                    grid = (centre / 2 ** level + self.delta) / size * 2 - 1
                    looked.append(functional.grid_sample(volume, grid, align_corners=True).view(h, w, -1))
                lookup = torch.cat(looked, -1).permute(2, 0, 1).unsqueeze(0)  # [1, taps, h, w]
                motion = self.motion(torch.cat([lookup, flow], 1))
                state = self._gru(state, torch.cat([features, motion, flow], 1))
                flow = flow + self.flow_head(state)
            return functional.interpolate(flow * 8, scale_factor=8, mode="bilinear", align_corners=False)

    frames = (torch.randn(1, 3, height, width), torch.randn(1, 3, height, width))
    return TorchCase(trained_like(Flow()), frames, ("image1", "image2"), ("flow",))
