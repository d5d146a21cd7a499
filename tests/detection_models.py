"""torchvision detectors exported to ONNX for tests/test_detection.py (needs torch + torchvision).

Random weights from a fixed seed (``weights=None, weights_backbone=None``: nothing downloaded),
the TorchScript exporter, one 3×H×W image in, ``boxes``, ``scores`` and ``labels`` out — the
graph torchvision exports for deployment: score thresholds, TopK with a run-time K, NMS and
Gathers on what it keeps. Run as a script to export one to a path:
``python tests/detection_models.py ssdlite out.onnx``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

SIZE = 320  # both detectors resize to 320×320; an image of that size leaves the resize a no-op


def _ssdlite() -> Any:
    import torch
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    # Untrained, every class scores about 1/91: the 300 detections kept by default differ in score by
    # a few ulp, and their order flips when the image moves by one ulp (onnxruntime against itself).
    # Sharper class logits and 20 detections from 100 candidates per class keep them apart.
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, detections_per_img=20,
                                          topk_candidates=100)
    with torch.no_grad():
        for head in model.head.classification_head.module_list:
            head[-1].weight.mul_(20.0)
            head[-1].bias.mul_(20.0)
    return model


def _faster_rcnn() -> Any:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    # Untrained, no class reaches the default score threshold (0.05) and every detection is dropped.
    return fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, box_score_thresh=0.01)


#: name → (builder, output names in the order torchvision's result dict has them)
MODELS: dict[str, tuple[Callable[[], Any], list[str]]] = {
    "ssdlite": (_ssdlite, ["boxes", "scores", "labels"]),
    "faster_rcnn": (_faster_rcnn, ["boxes", "labels", "scores"]),
}


def image(seed: int = 0) -> np.ndarray:
    """A seeded 3×SIZE×SIZE image in [0, 1]: smooth blobs, so detectors see some structure."""
    rng = np.random.default_rng(seed)
    low = rng.random((3, SIZE // 32, SIZE // 32)).astype(np.float32)
    return np.kron(low, np.ones((32, 32), np.float32)).astype(np.float32)


def _calibrate(model: Any, seed: int) -> None:
    """Batch-norm statistics from a few seeded images, so activations keep their scale.

    Freshly initialised, the backbone's statistics (mean 0, variance 1) shrink activations about
    a thousandfold per stage: every score comes out 1/91 and every box an anchor, a graph whose
    NMS sees only ties. Fitted statistics give varied scores and boxes, as trained weights do.
    """
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # a plain average over the batches seen
    model.backbone.train()
    with torch.no_grad():
        images, _ = model.transform([torch.from_numpy(image(seed + 100 + i)) for i in range(4)])
        model.backbone(images.tensors)
    model.eval()


def export(name: str, path: str, seed: int = 0) -> None:
    """Export detector ``name`` (a key of MODELS) with weights drawn from ``seed`` to ``path``."""
    import torch

    torch.manual_seed(seed)
    build, outputs = MODELS[name]
    model = build().eval()
    _calibrate(model, seed)
    sample = [torch.from_numpy(image(seed))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on torchvision's Python-side shape logic
        torch.onnx.export(model, (sample,), path, opset_version=17, dynamo=False, input_names=["image"],
                          output_names=outputs)


if __name__ == "__main__":
    export(sys.argv[1], sys.argv[2])
