"""The fp32 reference: onnxruntime on CPU, on the model as the user gave it.

onnxruntime's Python API takes and gives numpy arrays only of numpy's own types. bfloat16 and
float8 inputs (ml_dtypes arrays) are passed as ``OrtValue``s built from their bits. Outputs of
those types, and int4/uint4, cannot come back ("No corresponding Numpy type for Tensor Type"),
so each is read through a Cast to float32 (int8/uint8 for int4/uint4) appended to the graph —
exact, every such value is representable — and returned as the ml_dtypes array of its type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from amptool.dtypes import is_ml_dtype
from amptool.errors import UserError

_HINT = "Pass --reference-outputs with stored outputs, or fix the model for onnxruntime."

_T = onnx.TensorProto
#: Output types onnxruntime cannot return to numpy → the type they are read through.
_READ_AS = {
    _T.BFLOAT16: _T.FLOAT,
    _T.FLOAT8E4M3FN: _T.FLOAT,
    _T.FLOAT8E4M3FNUZ: _T.FLOAT,
    _T.FLOAT8E5M2: _T.FLOAT,
    _T.FLOAT8E5M2FNUZ: _T.FLOAT,
    _T.INT4: _T.INT8,
    _T.UINT4: _T.UINT8,
}
_SUFFIX = "__amptool_read"


class OnnxruntimeRunner:
    """One onnxruntime CPU session, reused for every input set (``diff --iterations``)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import onnxruntime as ort  # noqa: PLC0415

        model, self._read = _readable_outputs(model)
        options = ort.SessionOptions()
        options.log_severity_level = 4  # failures are raised and reported once, by us
        try:
            self._session: Any = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:
            raise _user_error(err) from err
        copies = {copy for copy, _ in self._read.values()}
        self.output_names = [o.name for o in self._session.get_outputs() if o.name not in copies]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Output name → array. Raises UserError when onnxruntime cannot run the model."""
        fetch = [self._read[n][0] if n in self._read else n for n in self.output_names]
        try:
            outputs = self._session.run(fetch, {name: _feed(array) for name, array in feeds.items()})
        except Exception as err:
            raise _user_error(err) from err
        result = {}
        for name, value in zip(self.output_names, outputs):
            array = np.asarray(value)
            result[name] = array.astype(self._read[name][1]) if name in self._read else array
        return result


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name → array, from a fresh session. Raises UserError when onnxruntime cannot run the model."""
    return OnnxruntimeRunner(model).run(feeds)


def _feed(array: np.ndarray) -> Any:
    """``array``, or an OrtValue of its bits for ml_dtypes' bfloat16/float8."""
    array = np.asarray(array)
    if not is_ml_dtype(array.dtype) or array.dtype.itemsize not in (1, 2):
        return array
    import onnxruntime as ort  # noqa: PLC0415

    elem_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    bits = np.ascontiguousarray(array).view(np.uint8 if array.dtype.itemsize == 1 else np.uint16)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, elem_type)


def _readable_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, tuple[str, np.dtype]]]:
    """``model`` with a readable copy of every output numpy cannot take, and output name →
    (copy's name, the dtype to give the values back in)."""
    unreadable = [o for o in model.graph.output if o.type.tensor_type.elem_type in _READ_AS]
    if not unreadable:
        return model, {}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    read: dict[str, tuple[str, np.dtype]] = {}
    for output in unreadable:
        elem_type = output.type.tensor_type.elem_type
        name = f"{output.name}{_SUFFIX}"
        copy.graph.node.append(onnx.helper.make_node("Cast", [output.name], [name], name=name, to=_READ_AS[elem_type]))
        copy.graph.output.append(onnx.helper.make_tensor_value_info(name, _READ_AS[elem_type], None))
        read[output.name] = (name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    return copy, read


def _user_error(err: Exception) -> UserError:
    text = str(err).strip().splitlines()
    return UserError(f"onnxruntime cannot run the reference model: {text[0][:300] if text else err!r}", _HINT)
