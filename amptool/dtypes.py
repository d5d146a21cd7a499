"""Dtype names (TVM's and ONNX's: 'float16', 'bfloat16', …) as numpy dtypes, in one place.

numpy has no bfloat16; ml_dtypes supplies it (imported only when asked for).
"""

from __future__ import annotations

import numpy as np


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for ``name``; bfloat16 through ml_dtypes."""
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def as_float_dtype(array: np.ndarray, name: str | None) -> np.ndarray:
    """Float ``array`` as ``name`` (fp32 feeds to a module built with --low-precision-io);
    integer/bool arrays, and ``name=None``, leave it as it is."""
    array = np.asarray(array)
    if name is None or array.dtype.kind != "f" or str(array.dtype) == name:
        return array
    return array.astype(numpy_dtype(name))
