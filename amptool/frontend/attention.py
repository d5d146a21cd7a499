"""ONNX ``Attention`` (opset 23/24) and ``RotaryEmbedding`` (opset 23) as plain Relax ops.

Why: TVM 0.27's frontend has no converter for the standard-domain ``Attention`` (only the
com.microsoft one under another name) nor for ``RotaryEmbedding``, so every opset-23 attention
export was refused. Attention here is matmul → softcap → additive bias → softmax → matmul, so
the mixed-precision pass colours the matmuls like any other. Follows the spec: 3-D inputs split
into heads, ``scale`` (default 1/√head_size) applied as √scale to Q and K, past key/value
concatenated (the presents are outputs 1–2), grouped-query heads repeated, a boolean or additive
``attn_mask`` shorter than the key length padded as masked, ``is_causal`` aligned to the end of
the past cache, ``nonpad_kv_seqlen`` (opset 24) masking the keys past each batch's length, and
``qk_matmul_output_mode`` 0–3 for output 3. A query row whose every key is masked gives 0 (a
plain softmax of an all −inf row is NaN). Needs static shapes (amptool pins them).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amptool.errors import UserError

#: "masked" as a bias: finite, because TVM's LLVM code is built with fast-math, under which a
#: comparison with -inf is folded away (a fully masked row then came back NaN, not 0). Any sum
#: of a few of these stays finite and exp() of it is 0.
_MASKED = -1e30


def _shape(x: Any, what: str) -> list[int]:
    try:
        return [int(d) for d in x.ty.shape]
    except TypeError as err:
        raise UserError(f"{what} needs static input shapes", "Pin the input shapes with --input-shape.") from err


def _heads(bb: Any, x: Any, heads: int) -> Any:
    """[B, S, H·D] → [B, H, S, D]."""
    from tvm import relax  # noqa: PLC0415

    b, s, hidden = _shape(x, "Attention")
    return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, [b, s, heads, hidden // heads])), [0, 2, 1, 3]))


def _mask_bias(bb: Any, mask: Any, kv_len: int, dtype: str) -> Any:
    """attn_mask as an additive bias (bool: True attends), padded as masked up to ``kv_len`` keys."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    shape = _shape(mask, "Attention")
    if str(mask.ty.dtype) == "bool":
        mask = bb.emit(op.where(mask, relax.const(0.0, dtype), relax.const(_MASKED, dtype)))
    elif str(mask.ty.dtype) != dtype:
        mask = bb.emit(op.astype(mask, dtype))
    if shape[-1] < kv_len:
        pad = [0] * (2 * len(shape))
        pad[-1] = kv_len - shape[-1]
        mask = bb.emit(op.nn.pad(mask, pad, pad_value=_MASKED))
    return mask


def convert_attention(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """The standard-domain Attention; declines com.microsoft's (``num_heads``, packed weights) to TVM."""
    from tvm import relax  # noqa: PLC0415

    if "num_heads" in attrs:
        return None

    op = relax.op
    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = inputs[:7]
    io_dtype = str(q.ty.dtype)
    if io_dtype in ("float16", "bfloat16"):  # accumulate and softmax in float32, as onnxruntime does
        q, k, v, past_k, past_v = (None if t is None else bb.emit(op.astype(t, "float32"))
                                   for t in (q, k, v, past_k, past_v))
        if mask is not None and str(mask.ty.dtype) != "bool":
            mask = bb.emit(op.astype(mask, "float32"))
    dtype = str(q.ty.dtype)
    rank = len(_shape(q, "Attention"))
    if rank == 3:
        q = _heads(bb, q, int(attrs["q_num_heads"]))
        k = _heads(bb, k, int(attrs["kv_num_heads"]))
        v = _heads(bb, v, int(attrs["kv_num_heads"]))
    batch, q_heads, q_len, head = _shape(q, "Attention")
    past_len = _shape(past_k, "Attention")[2] if past_k is not None else 0
    if past_k is not None:
        k = bb.emit(op.concat([past_k, k], axis=2))
        v = bb.emit(op.concat([past_v, v], axis=2))
    present_k, present_v = k, v
    kv_heads, kv_len = _shape(k, "Attention")[1], _shape(k, "Attention")[2]
    if kv_heads != q_heads:
        k = bb.emit(op.repeat(k, q_heads // kv_heads, axis=1))
        v = bb.emit(op.repeat(v, q_heads // kv_heads, axis=1))
    scale = attrs.get("scale")
    root = relax.const(math.sqrt(float(scale) if scale is not None else 1.0 / math.sqrt(head)), dtype)
    scores = bb.emit(op.matmul(op.multiply(q, root), op.permute_dims(op.multiply(k, root), [0, 1, 3, 2])))
    softcap = float(attrs.get("softcap", 0.0) or 0.0)
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        scores = bb.emit(op.multiply(op.tanh(op.divide(scores, cap)), cap))
    capped = scores

    bias = _mask_bias(bb, mask, kv_len, dtype) if mask is not None else None
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    if int(attrs.get("is_causal", 0)):
        if nonpad is not None and past_k is None:  # external cache: the frontier per batch
            offset = bb.emit(op.subtract(op.reshape(op.astype(nonpad, "int64"), [batch, 1, 1, 1]),
                                         relax.const(q_len, "int64")))
            allowed = op.less_equal(relax.const(j.reshape(1, 1, 1, kv_len), "int64"),
                                    op.add(relax.const(i.reshape(1, 1, q_len, 1), "int64"), offset))
            causal = bb.emit(op.where(allowed, relax.const(0.0, dtype), relax.const(_MASKED, dtype)))
        else:
            causal = relax.const(np.where(j <= i + past_len, 0.0, _MASKED).astype(dtype))
        bias = causal if bias is None else bb.emit(op.add(bias, causal))
    if nonpad is not None:
        keep = op.less(relax.const(np.arange(kv_len).reshape(1, 1, 1, kv_len), "int64"),
                       op.reshape(op.astype(nonpad, "int64"), [batch, 1, 1, 1]))
        padding = bb.emit(op.where(keep, relax.const(0.0, dtype), relax.const(_MASKED, dtype)))
        bias = padding if bias is None else bb.emit(op.add(bias, padding))
    if bias is not None and mask is not None and str(mask.ty.dtype) != "bool":  # a float mask may hold -inf
        bias = bb.emit(op.maximum(bias, relax.const(_MASKED, dtype)))
    biased = bb.emit(op.add(scores, bias)) if bias is not None else scores

    precision = attrs.get("softmax_precision")
    soft_dtype = dtype
    if precision:
        from onnx import helper  # noqa: PLC0415

        soft_dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(precision))))
    logits = bb.emit(op.astype(biased, soft_dtype)) if soft_dtype != dtype else biased
    probs = bb.emit(op.nn.softmax(logits, axis=-1))
    if bias is not None:  # fully masked rows: 0, not NaN (decided on the bias, as the spec does)
        dead = op.equal(op.max(bias, axis=[-1], keepdims=True), relax.const(_MASKED, dtype))
        probs = bb.emit(op.where(dead, relax.const(0.0, soft_dtype), probs))
    if soft_dtype != dtype:
        probs = bb.emit(op.astype(probs, dtype))
    out = bb.emit(op.matmul(probs, v))
    if rank == 3:
        out = bb.emit(op.reshape(bb.emit(op.permute_dims(out, [0, 2, 1, 3])), [batch, q_len, -1]))
    mode = int(attrs.get("qk_matmul_output_mode", 0) or 0)
    qk_out = {0: capped, 1: capped, 2: biased, 3: probs}.get(mode, capped)
    if bias is not None and mode == 2:
        qk_out = bb.emit(op.add(capped, op.broadcast_to(bias, _shape(capped, "Attention"))))
    count = int(attrs.get("tvm_custom", {}).get("num_outputs", 1))
    results = [out, present_k, present_v, qk_out][:max(count, 1)]
    if io_dtype != dtype:
        results = [bb.emit(op.astype(r, io_dtype)) for r in results]
    return results[0] if count == 1 else relax.Tuple(results)


def convert_rotary_embedding(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """RotaryEmbedding (opset 23): rotate the first ``rotary_embedding_dim`` features of each head.

    ``cos_cache``/``sin_cache`` are [max_pos, rot/2] gathered by ``position_ids`` ([B, S]), or
    [B, S, rot/2] already gathered; ``interleaved`` pairs (x0, x1), (x2, x3)… instead of halves.
    Input [B, H, S, D] or [B, S, H·D] (``num_heads`` then says H)."""
    from tvm import relax  # noqa: PLC0415

    op = relax.op
    x, cos, sin = inputs[0], inputs[1], inputs[2]
    positions = inputs[3] if len(inputs) > 3 else None
    shape = _shape(x, "RotaryEmbedding")
    if len(shape) == 3:
        heads = int(attrs.get("num_heads", 0))
        if not heads:
            raise UserError("RotaryEmbedding with a 3-D input needs the num_heads attribute")
        x4 = bb.emit(op.permute_dims(bb.emit(op.reshape(x, [shape[0], shape[1], heads, shape[2] // heads])),
                                     [0, 2, 1, 3]))
    else:
        x4 = x
    b, h, s, d = _shape(x4, "RotaryEmbedding")
    rot = int(attrs.get("rotary_embedding_dim", 0)) or d
    if positions is not None:
        cos = bb.emit(op.take(cos, op.astype(positions, "int64"), axis=0))
        sin = bb.emit(op.take(sin, op.astype(positions, "int64"), axis=0))
    half = rot // 2
    cache_batch = _shape(cos, "RotaryEmbedding")[0]
    cos = bb.emit(op.reshape(cos, [cache_batch, 1, s, half]))
    sin = bb.emit(op.reshape(sin, [cache_batch, 1, s, half]))
    part = bb.emit(op.strided_slice(x4, [3], [0], [rot]))
    if int(attrs.get("interleaved", 0)):
        pairs = bb.emit(op.reshape(part, [b, h, s, half, 2]))
        x1 = op.squeeze(op.strided_slice(pairs, [4], [0], [1]), [4])
        x2 = op.squeeze(op.strided_slice(pairs, [4], [1], [2]), [4])
    else:
        x1 = op.strided_slice(part, [3], [0], [half])
        x2 = op.strided_slice(part, [3], [half], [rot])
    x1, x2 = bb.emit(x1), bb.emit(x2)
    real = bb.emit(op.subtract(op.multiply(x1, cos), op.multiply(x2, sin)))
    imag = bb.emit(op.add(op.multiply(x2, cos), op.multiply(x1, sin)))
    if int(attrs.get("interleaved", 0)):
        rotated = bb.emit(op.reshape(op.stack([real, imag], axis=4), [b, h, s, rot]))
    else:
        rotated = bb.emit(op.concat([real, imag], axis=3))
    if rot < d:
        rotated = bb.emit(op.concat([rotated, op.strided_slice(x4, [3], [rot], [d])], axis=3))
    if len(shape) == 3:
        return op.reshape(bb.emit(op.permute_dims(rotated, [0, 2, 1, 3])), shape)
    return rotated
