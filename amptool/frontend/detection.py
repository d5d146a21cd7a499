"""Detection ops with data-dependent results: NonMaxSuppression and what feeds on it.

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS.
"""

from __future__ import annotations

from typing import Any

DETECTION_CONVERTERS: dict[str, Any] = {}
