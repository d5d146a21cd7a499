"""Small ops TVM's ONNX frontend lacks or gets wrong (elementwise, reductions, linear algebra, ai.onnx.ml).

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS.
"""

from __future__ import annotations

from typing import Any

SMALL_OP_CONVERTERS: dict[str, Any] = {}
