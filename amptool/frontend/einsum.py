"""Two-operand Einsum as a (batched) matmul between transposes and reshapes.

What: ``bhqd,bhkd->bhqk`` and every other two-operand contraction without repeated letters in an
operand: letters in both operands and the output are batch axes, in both operands only are summed
(the matmul's K), in one operand and the output are its rows/columns (M or N), in one operand
only are summed out first. Each operand is transposed to ``[batch, M, K]`` / ``[batch, K, N]``,
flattened to 3-D (2-D when there is no batch axis, so a constant right operand gets the packed
matmul kernel), multiplied, and the product reshaped and transposed into the output's order.

Why: TVM legalizes ``einsum`` into one generic reduction per output element, which the CPU
schedules treat as a row of dot products: an attention score einsum (8 heads, 256×256, d 64) took
3× onnxruntime's time. As a matmul it takes the tiled matmul schedules (and bf16's dot product).

When not (TVM's converter): one or three+ operands, ellipsis, a letter repeated in an operand
(diagonals), dims that differ between the operands (broadcast), dynamic shapes, integer dtypes.

Preserves: values up to float rounding (the same products, summed in the matmul's order).
"""

from __future__ import annotations

import math
from typing import Any

from amptool.frontend.small_ops import _shape


def convert_einsum(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """The matmul form of a two-operand Einsum (see the module docstring), or None for TVM's converter."""
    from tvm import relax  # noqa: PLC0415

    raw = attrs.get("equation", "")
    equation = (raw.decode() if isinstance(raw, bytes) else str(raw)).replace(" ", "")
    plan = _plan(equation, inputs)
    if plan is None:
        return None
    op = relax.op
    a, b = inputs
    letters_a, letters_b, out, sizes = plan
    a, letters_a = _sum_out(bb, a, letters_a, keep=set(letters_b) | set(out))
    b, letters_b = _sum_out(bb, b, letters_b, keep=set(letters_a) | set(out))
    batch = [c for c in out if c in letters_a and c in letters_b]
    rows = [c for c in out if c in letters_a and c not in letters_b]
    cols = [c for c in out if c in letters_b and c not in letters_a]
    contract = [c for c in letters_a if c in letters_b and c not in out]

    def flat(letters: list[str]) -> int:
        return math.prod(sizes[c] for c in letters)

    lead = [flat(batch)] if batch else []
    left = _arrange(bb, a, letters_a, [*batch, *rows, *contract], [*lead, flat(rows), flat(contract)])
    right = _arrange(bb, b, letters_b, [*batch, *contract, *cols], [*lead, flat(contract), flat(cols)])
    product = bb.emit(op.matmul(left, right))
    produced = [*batch, *rows, *cols]
    product = bb.emit(op.reshape(product, [sizes[c] for c in produced])) if produced else product
    order = [produced.index(c) for c in out]
    if not out:
        return op.reshape(product, [])
    return product if order == list(range(len(order))) else op.permute_dims(product, order)


def _plan(equation: str, inputs: list[Any]) -> tuple[list[str], list[str], list[str], dict[str, int]] | None:
    """(letters of A, of B, of the output, size per letter), or None where this conversion declines."""
    if len(inputs) != 2 or "." in equation or equation.count(",") != 1:
        return None
    lhs, arrow, rhs = equation.partition("->")
    spec_a, spec_b = lhs.split(",")
    if not arrow:  # implicit output: the letters that appear once, in alphabetical order
        rhs = "".join(sorted(c for c in set(spec_a + spec_b) if (spec_a + spec_b).count(c) == 1))
    specs = [list(spec_a), list(spec_b), list(rhs)]
    if not all(s.isalpha() for s in (spec_a, spec_b)) or (rhs and not rhs.isalpha()):
        return None
    if any(len(set(s)) != len(s) for s in specs) or not set(rhs) <= set(spec_a) | set(spec_b):
        return None
    shapes = [_shape(x) for x in inputs]
    if any(s is None for s in shapes) or any(str(x.ty.dtype) not in ("float16", "bfloat16", "float32", "float64")
                                               for x in inputs):
        return None
    sizes: dict[str, int] = {}
    for letters, shape in zip(specs[:2], shapes, strict=True):
        assert shape is not None
        if len(letters) != len(shape):
            return None
        for c, n in zip(letters, shape, strict=True):
            if sizes.setdefault(c, n) != n:
                return None  # a broadcast (a dim of 1 against n): TVM's einsum
    return specs[0], specs[1], specs[2], sizes


def _sum_out(bb: Any, x: Any, letters: list[str], keep: set[str]) -> tuple[Any, list[str]]:
    """``x`` summed over its letters that appear nowhere else (and those letters dropped)."""
    from tvm import relax  # noqa: PLC0415

    axes = [i for i, c in enumerate(letters) if c not in keep]
    if not axes:
        return x, letters
    return bb.emit(relax.op.sum(x, axis=axes)), [c for c in letters if c in keep]


def _arrange(bb: Any, x: Any, letters: list[str], order: list[str], shape: list[int]) -> Any:
    """``x`` transposed to ``order`` and reshaped to ``shape`` (each step only when it changes something)."""
    from tvm import relax  # noqa: PLC0415

    perm = [letters.index(c) for c in order]
    if perm != list(range(len(perm))):
        x = bb.emit(relax.op.permute_dims(x, perm))
    current = _shape(x)
    return x if current == shape else bb.emit(relax.op.reshape(x, shape))
