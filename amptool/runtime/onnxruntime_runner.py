"""The fp32 reference: onnxruntime on CPU, on the model as the user gave it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from amptool.errors import UserError


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name → array. Raises UserError when onnxruntime cannot run the model."""
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures are raised and reported once, by us
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        names = [o.name for o in session.get_outputs()]
        outputs = session.run(names, dict(feeds))
    except Exception as err:
        text = str(err).strip().splitlines()
        raise UserError(
            f"onnxruntime cannot run the reference model: {text[0][:300] if text else err!r}",
            "Pass --reference-outputs with stored outputs, or fix the model for onnxruntime.",
        ) from err
    return {n: np.asarray(o) for n, o in zip(names, outputs)}
