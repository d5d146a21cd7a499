"""Helpers shared by the one-node converter tests: a typed value info, and outputs compared by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from onnx import TensorProto, helper


def info(name: str, dims, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def assert_outputs_match(actual: Mapping[str, np.ndarray], names: Sequence[str], expected: Sequence[np.ndarray],
                         *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Every named output has the expected shape and values (a reference's outputs, in ``names`` order)."""
    for name, want in zip(names, expected, strict=True):
        assert actual[name].shape == want.shape, name
        np.testing.assert_allclose(actual[name], want, rtol=rtol, atol=atol, err_msg=name)
