"""Run a compiled amptool module (in memory or from an artifact directory)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.dtypes import as_container, as_float_dtype
from amptool.errors import UserError, model_raised


@dataclass
class CompiledModel:
    """A loaded VM plus the input/output names it was built for."""

    vm: Any
    input_names: Sequence[str]
    output_names: Sequence[str]
    device: str = "cpu"
    input_dtypes: Sequence[str] | None = None  # what the module takes (low under --low-precision-io)
    deep_stack: bool = False  # holds run-time loops: one VM frame per iteration (_tvm.on_deep_stack)
    index_limits: Mapping[str, int] = field(default_factory=dict)  # input → rows it indexes (inputs.index_ranges)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_index_inputs(feeds, self.index_limits)
        arrays = [as_container(feeds[n]) for n in self.input_names]
        if self.input_dtypes is not None:
            arrays = [as_float_dtype(a, d) for a, d in zip(arrays, self.input_dtypes)]
        try:
            outputs = _tvm.run_vm(self.vm, arrays, self.device, deep_stack=self.deep_stack)
        except Exception as err:
            refusal = model_raised(err)
            if refusal is not None:
                raise refusal from err
            if "std::bad_alloc" in str(err):  # a size read from an input's value (Range's limit, Tile's repeats)
                raise UserError("Out of memory while running: the model asked for more than this machine has",
                                "Check the input values that decide sizes (a Range's limit, Tile's repeats, a "
                                "ConstantOfShape's shape); onnxruntime would fail on them too.") from err
            raise
        if len(outputs) != len(self.output_names):
            raise RuntimeError(
                f"compiled module returned {len(outputs)} outputs, expected {len(self.output_names)}"
            )
        return dict(zip(self.output_names, outputs))


def check_index_inputs(feeds: Mapping[str, Any], limits: Mapping[str, int]) -> None:
    """Raise a one-line UserError when a feed in ``limits`` (input → rows of the table it indexes:
    ``inputs.index_ranges``) holds a value outside ``[-rows, rows)``. The kernels would clamp it
    (no crash) and answer wrongly; onnxruntime refuses it."""
    for name, rows in limits.items():
        value = feeds.get(name)
        if value is None:
            continue
        array = np.asarray(value)
        if array.size == 0 or array.dtype.kind not in "iu":
            continue
        outside = (array < -rows) | (array >= rows)
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            raise UserError(
                f"Input '{name}' holds {array[where]} at {list(where)}: it indexes a table of {rows} rows "
                f"(valid: {-rows} to {rows - 1})",
                "Feed indices inside the table (a token id past the vocabulary?); onnxruntime refuses them too.")
