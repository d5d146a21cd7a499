"""The fp32 reference: onnxruntime on CPU, on the model as the user gave it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from amptool.errors import UserError

_HINT = "Pass --reference-outputs with stored outputs, or fix the model for onnxruntime."


class OnnxruntimeRunner:
    """One onnxruntime CPU session, reused for every input set (``diff --iterations``)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import onnxruntime as ort  # noqa: PLC0415

        options = ort.SessionOptions()
        options.log_severity_level = 4  # failures are raised and reported once, by us
        try:
            self._session: Any = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:
            raise _user_error(err) from err
        self.output_names = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Output name → array. Raises UserError when onnxruntime cannot run the model."""
        try:
            outputs = self._session.run(self.output_names, dict(feeds))
        except Exception as err:
            raise _user_error(err) from err
        return {n: np.asarray(o) for n, o in zip(self.output_names, outputs)}


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name → array, from a fresh session. Raises UserError when onnxruntime cannot run the model."""
    return OnnxruntimeRunner(model).run(feeds)


def _user_error(err: Exception) -> UserError:
    text = str(err).strip().splitlines()
    return UserError(f"onnxruntime cannot run the reference model: {text[0][:300] if text else err!r}", _HINT)
