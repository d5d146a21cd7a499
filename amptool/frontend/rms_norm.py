"""RMSNormalization over every axis of its input (``axis`` 0, or ``-rank``).

Why: TVM's converter lowers to topi's ``rms_norm``, whose kernel reads its reduced sum with one
index per *kept* axis — none when every axis is reduced, so FoldConstant (or the build) fails with
"Tensor dimension mismatch in read ndim = 1, indices.size=0". Here the input gets a leading unit
axis, kept out of the reduction, and loses it again: the same arithmetic with one kept axis.
Every other ``axis`` declines to TVM's converter.
"""

from __future__ import annotations

from typing import Any

from amptool import _tvm


def convert_rms_normalization(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """RMSNormalization reducing every axis; other instances decline (None)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x, scale = inputs[0], inputs[1]
    try:
        rank = len(x.ty.shape)
    except (AttributeError, TypeError):
        return None  # unknown rank: TVM's converter names the problem
    if rank == 0 or int(attrs.get("axis", -1)) % rank != 0:
        return None
    dtype = _tvm.tensor_dtype(x) or "float32"
    stash = int(attrs.get("stash_type", 1)) == 1 and dtype != "float32"  # compute in float32
    if stash:
        x, scale = bb.emit(op.astype(x, "float32")), bb.emit(op.astype(scale, "float32"))
    wide = bb.emit(op.expand_dims(x, 0))
    y = bb.emit(op.nn.rms_norm(wide, scale, list(range(1, rank + 1)), float(attrs.get("epsilon", 1e-5))))
    y = bb.emit(op.squeeze(y, [0]))
    return op.astype(y, dtype) if stash else y


RMS_NORM_CONVERTERS: dict[str, Any] = {"RMSNormalization": convert_rms_normalization}
