"""Spatial ops: Resize, pooling with indices, ConvTranspose output_shape, Col2Im, CenterCropPad, AffineGrid, …

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS.
"""

from __future__ import annotations

from typing import Any

LAYOUT_CONVERTERS: dict[str, Any] = {}
