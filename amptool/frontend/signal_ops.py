"""Signal processing and text ops: DFT, STFT, window functions, MelWeightMatrix, TfIdfVectorizer, …

Converters in the shape of amptool.frontend.converters (``fn(bb, inputs, attrs) -> relax.Expr``);
the table at the bottom is merged into CONVERTERS.
"""

from __future__ import annotations

from typing import Any

SIGNAL_CONVERTERS: dict[str, Any] = {}
