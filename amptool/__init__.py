"""amptool: ONNX → mixed-precision (float16 / bfloat16) TVM Relax models, proven against onnxruntime.

    import amptool
    result = amptool.convert("model.onnx", dtype="float16", output="out/")
    outputs = amptool.load("out/").run({"x": x})
    assert amptool.diff("model.onnx", dtype="float16").passed

The functions live in :mod:`amptool.api` and are imported on first use, so ``import amptool`` (and
``amptool --help``) stays instant: TVM and onnxruntime load only when a model is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from amptool import _without_torch

__version__ = "0.1.0"

_without_torch.install()

#: Public name → the module that defines it.
_PUBLIC = {
    "convert": "amptool.api", "diff": "amptool.api", "inspect": "amptool.api", "bench": "amptool.api",
    "load": "amptool.api", "tolerance_policy": "amptool.api", "ConvertResult": "amptool.api",
    "Artifact": "amptool.api", "DiffReport": "amptool.app.diff", "InspectReport": "amptool.app.inspect",
    "BenchReport": "amptool.app.bench", "UserError": "amptool.errors", "TargetUnavailableError": "amptool.errors",
}
__all__ = [
    "Artifact", "BenchReport", "ConvertResult", "DiffReport", "InspectReport", "TargetUnavailableError", "UserError",
    "__version__", "bench", "convert", "diff", "inspect", "load", "tolerance_policy",
]

if TYPE_CHECKING:
    from amptool.api import Artifact, ConvertResult, bench, convert, diff, inspect, load, tolerance_policy
    from amptool.app.bench import BenchReport
    from amptool.app.diff import DiffReport
    from amptool.app.inspect import InspectReport
    from amptool.errors import TargetUnavailableError, UserError


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'amptool' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
