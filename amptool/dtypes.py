"""Dtype names (TVM's and ONNX's: 'float16', 'bfloat16', 'float8_e4m3fn', …) as numpy dtypes, in one place.

numpy has no bfloat16, float8 or int4; ml_dtypes supplies them (imported only when asked for).
Their numpy ``kind`` is 'V' (void) — except float8_e5m2's, which is 'f' — so code that asks
``dtype.kind`` misses or misreads them: :func:`is_ml_dtype` and :func:`numeric_kind` say what
they are.
"""

from __future__ import annotations

import numpy as np

#: The dtypes a model is converted to (float32: the unconverted baseline).
DTYPES = ("float16", "bfloat16", "float32")
#: Largest finite value of each low dtype: casting anything larger gives inf.
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
#: Smallest positive (subnormal) value of each low dtype: anything below half of it becomes 0.
DTYPE_TINY = {"float16": 5.960464477539063e-08, "bfloat16": 9.183549615799121e-41}
#: Smallest positive normal value of each low dtype: below it, values are subnormal and lose significand bits.
DTYPE_NORMAL = {"float16": 6.103515625e-05, "bfloat16": 1.1754943508222875e-38}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for ``name``; bfloat16, float8, int4, … through ml_dtypes."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: PLC0415

        if not hasattr(ml_dtypes, name):
            raise
        return np.dtype(getattr(ml_dtypes, name))


def is_ml_dtype(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is one of ml_dtypes' types (registered with numpy as user-defined)."""
    return np.dtype(dtype).num >= 256  # NPY_USERDEF: numpy's own types are numbered below it


def numeric_kind(dtype: np.dtype) -> str:
    """numpy's kind letter ('f', 'i', 'u', 'b', …); for an ml_dtypes type (kind 'V'), 'f' for its
    floats (bfloat16, float8, float4) and 'i'/'u' for its integers (int4, uint4, int2, uint2)."""
    dtype = np.dtype(dtype)
    if not is_ml_dtype(dtype):
        return dtype.kind
    import ml_dtypes  # noqa: PLC0415

    try:
        ml_dtypes.finfo(dtype)
        return "f"
    except ValueError:
        pass
    try:
        return "i" if int(ml_dtypes.iinfo(dtype).min) < 0 else "u"
    except ValueError:
        return "V"


def as_float_dtype(array: np.ndarray, name: str | None) -> np.ndarray:
    """Float ``array`` as ``name`` (fp32 feeds to a module built with --low-precision-io);
    integer/bool arrays, and ``name=None``, leave it as it is."""
    array = np.asarray(array)
    if name is None or array.dtype.kind != "f" or str(array.dtype) == name:
        return array
    return array.astype(numpy_dtype(name))


#: Integers narrower than a byte → the 8-bit type that carries their values: TVM cannot hold
#: sub-byte tensors, and onnxruntime packs them two (or four) a byte where numpy keeps one.
SMALL_INT_CONTAINERS = {"int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8"}


def as_container(array: np.ndarray) -> np.ndarray:
    """An ml_dtypes int4/uint4/int2/uint2 array as the int8/uint8 that carries its values in a
    compiled module; any other array as it is."""
    array = np.asarray(array)
    container = SMALL_INT_CONTAINERS.get(str(array.dtype))
    return array if container is None else array.astype(container)
