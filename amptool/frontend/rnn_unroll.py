"""What ``LSTM``, ``GRU`` and ``RNN`` share: attribute parsing and checks (``_Cell``), and the
unroller that emits per-direction weight slices, input projections, sequence masks and the
stacked outputs. The cell equations live in :mod:`amptool.frontend.rnn`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError

Expr = Any  # relax.Expr; TVM is imported lazily
Step = Callable[[Expr, tuple[Expr, ...]], tuple[Expr, ...]]

_DIRECTIONS = {"forward": ("forward",), "reverse": ("reverse",), "bidirectional": ("forward", "reverse")}


def _relax() -> Any:
    from tvm import relax  # noqa: PLC0415

    return relax


def _softsign(x: Expr) -> Expr:
    relax = _relax()
    dtype = str(x.ty.dtype)
    return relax.op.divide(x, relax.op.add(relax.const(1, dtype), relax.op.abs(x)))


def _activation_table() -> dict[str, Callable[[Expr], Expr]]:
    relax = _relax()
    return {
        "sigmoid": relax.op.sigmoid,
        "tanh": relax.op.tanh,
        "relu": relax.op.nn.relu,
        "softsign": _softsign,
        "softplus": relax.op.nn.softplus,
    }


_HINT_SPEC = "The node does not follow the ONNX spec; check it with onnx.checker and re-export."

#: Activation names accepted in ``activations`` (case-insensitive).
_ACTIVATIONS = ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus")


@dataclass(frozen=True)
class _Cell:
    """What one node asks for, parsed and checked once."""

    directions: tuple[str, ...]
    activations: tuple[tuple[str, ...], ...]  # per direction, lower-case names
    clip: float | None
    layout: int
    seq: int
    batch: int
    hidden: int
    dtype: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def optional_input(inputs: Sequence[Any], index: int) -> Any:
    """An optional input, or None when omitted (empty name) or trailing."""
    return inputs[index] if index < len(inputs) else None


def _shape(expr: Expr, role: str, label: str) -> list[int]:
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    try:
        if shape is None:
            raise TypeError
        return [int(d) for d in shape]
    except TypeError as err:
        dims = "?" if shape is None else "x".join(str(d) for d in shape)
        raise UserError(
            f"{label} needs a static {role} shape to unroll over time, got [{dims}].",
            "Pin the input shapes with --input-shape (e.g. --input-shape x:32x1x40).",
        ) from err


def parse_cell(op: str, inputs: Sequence[Any], attrs: dict[str, Any], defaults: tuple[str, ...]) -> _Cell:
    x, r = inputs[0], inputs[2]
    node = str(attrs.get("tvm_custom", {}).get("name", "") or "")
    label = f"{op} node '{node}'" if node else op  # every message names the node
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise UserError(f"{label} layout={layout} is not defined by ONNX.", "Use layout 0 or 1.")
    x_shape = _shape(x, "input X", label)
    if len(x_shape) != 3:
        raise UserError(f"{label} input X must be 3-D, got shape {x_shape}.", _HINT_SPEC)
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    num_dir, _, hidden = _shape(r, "recurrence weight R", label)
    if "hidden_size" in attrs and int(attrs["hidden_size"]) != hidden:
        raise UserError(
            f"{label} hidden_size={attrs['hidden_size']} disagrees with R's last dimension {hidden}.", _HINT_SPEC
        )

    direction = _text(attrs.get("direction", "forward"))
    if direction not in _DIRECTIONS:
        raise UserError(
            f"{label}: unknown direction '{direction}'. Choose one of: {', '.join(_DIRECTIONS)}.", _HINT_SPEC
        )
    directions = _DIRECTIONS[direction]
    if num_dir != len(directions):
        raise UserError(
            f"{label} direction '{direction}' needs {len(directions)} weight set(s), W/R have {num_dir}.", _HINT_SPEC
        )

    given = tuple(_text(a) for a in attrs.get("activations", ()))
    per_dir = len(defaults)
    if given and len(given) != per_dir * len(directions):
        raise UserError(
            f"{label} with direction '{direction}' needs {per_dir * len(directions)} activations, got {len(given)}.",
            _HINT_SPEC,
        )
    allowed = {a.lower() for a in _ACTIVATIONS}
    for name in given:
        if name.lower() not in allowed:
            raise UserError(
                f"{label}: activation '{name}' is not supported. Supported: {', '.join(_ACTIVATIONS)}.",
                "Re-export with the default activations, or add it to amptool/frontend/rnn.py.",
            )
    names = tuple(a.lower() for a in given) or defaults * len(directions)
    clip = attrs.get("clip")
    return _Cell(
        directions=directions,
        activations=tuple(names[i * per_dir : (i + 1) * per_dir] for i in range(len(directions))),
        clip=None if clip is None else float(clip),
        layout=layout,
        seq=seq,
        batch=batch,
        hidden=hidden,
        dtype=str(x.ty.dtype),
    )


class Unroller:
    """Emits the shared parts of an unrolled recurrence for one node.

    Weight plumbing (per-direction slices, transposes, bias sums) is done in numpy when the
    weights are constants, as they are in every real export: FoldConstant would otherwise
    JIT-compile one kernel per slice, seconds per node. Non-constant weights get Relax ops.
    """

    def __init__(self, bb: Any, cell: _Cell, seq_lens: Expr | None) -> None:
        self.bb, self.cell = bb, cell
        self.relax = _relax()
        self.masks = self._masks(seq_lens)

    def emit(self, expr: Expr) -> Expr:
        return self.bb.emit(expr)

    def const(self, value: Any) -> Expr:
        return self.relax.const(np.asarray(value, dtype=self.cell.dtype))

    @staticmethod
    def value(expr: Expr) -> np.ndarray | None:
        """A constant's value, or None for anything computed at run time."""
        return _tvm.constant_numpy(expr) if _tvm.is_constant(expr) else None

    def take(self, expr: Expr, index: int, axis: int = 0) -> Expr:
        """``expr[index]`` along ``axis``, that axis dropped."""
        value = self.value(expr)
        if value is not None:
            return self.relax.const(np.ascontiguousarray(np.take(value, index, axis=axis)))
        op = self.relax.op
        piece = op.strided_slice(expr, axes=[axis], begin=[index], end=[index + 1])
        return self.emit(op.squeeze(self.emit(piece), axis=[axis]))

    def cols(self, expr: Expr, start: int, stop: int) -> Expr:
        """Columns ``start:stop`` of the last axis."""
        value = self.value(expr)
        if value is not None:
            return self.relax.const(np.ascontiguousarray(value[..., start:stop]))
        axis = len(expr.ty.shape) - 1
        return self.emit(self.relax.op.strided_slice(expr, axes=[axis], begin=[start], end=[stop]))

    def split(self, expr: Expr, parts: int) -> list[Expr]:
        """Equal parts along the last axis, each a slice of its own: a slice fuses into the kernel
        that reads it, where a ``split``'s tuple stayed a kernel of its own every timestep (GRU 5 → 4
        kernels a step, LSTM 4 → 3; 50 steps of hidden 256: GRU 0.52 → 0.49 ms, LSTM 0.66 → 0.58 ms,
        alternated in one process)."""
        width = int(expr.ty.shape[-1]) // parts
        return [self.cols(expr, i * width, (i + 1) * width) for i in range(parts)]

    def transpose(self, expr: Expr) -> Expr:
        """A 2-D matrix transposed."""
        value = self.value(expr)
        if value is not None:
            return self.relax.const(np.ascontiguousarray(value.T))
        return self.emit(self.relax.op.permute_dims(expr, [1, 0]))

    def matmul(self, a: Expr, b: Expr) -> Expr:
        """``a·b``; in numpy when both are constants (a step from a constant initial state: left to
        FoldConstant, that one matmul made it legalize every call of the unrolled sequence)."""
        va, vb = self.value(a), self.value(b)
        if va is not None and vb is not None:
            return self.const(np.matmul(va.astype(np.float64), vb.astype(np.float64)))
        return self.emit(self.relax.op.matmul(a, b))

    def add(self, a: Expr, b: Expr) -> Expr:
        va, vb = self.value(a), self.value(b)
        if va is not None and vb is not None:
            return self.relax.const(va + vb)
        return self.emit(self.relax.op.add(a, b))

    def concat(self, parts: list[Expr]) -> Expr:
        """1-D vectors end to end."""
        values = [v for v in (self.value(p) for p in parts) if v is not None]
        if len(values) == len(parts):
            return self.relax.const(np.concatenate(values))
        return self.emit(self.relax.op.concat(parts, axis=0))

    def act(self, name: str, x: Expr, clip: bool = True) -> Expr:
        if clip and self.cell.clip is not None:
            x = self.emit(self.relax.op.clip(x, -self.cell.clip, self.cell.clip))
        return self.emit(_activation_table()[name](x))

    def projections(self, x: Expr, w: Expr, bias: Expr | None) -> list[Expr]:
        """``X·Wᵀ + bias`` for every timestep in one matmul, then one [batch, gates] per step."""
        op = self.relax.op
        proj = self.emit(op.matmul(x, self.transpose(w)))
        if bias is not None:
            proj = self.emit(op.add(proj, bias))
        # Each step takes its row by an index tensor, fused into the step's first kernel, which all
        # steps then share (the index is the kernel's argument, not a constant compiled into it, as
        # a slice's begin would be: 1,200 distinct kernels for 300 steps × 4). A ``split`` into
        # every timestep was a kernel of its own with ``seq`` outputs, a copy at run time, and
        # scheduling it took minutes at a few hundred steps (each inlining attempt re-analysed its
        # hundreds of blocks).
        op, axis = self.relax.op, self.cell.layout
        return [self.emit(op.squeeze(self.emit(op.take(proj, self.relax.const(np.array([t], "int64")), axis=axis)),
                                     axis=[axis]))
                for t in range(self.cell.seq)]

    def state(self, init: Expr | None, d: int) -> Expr:
        """Direction ``d``'s initial state [batch, hidden] (zeros when omitted)."""
        if init is None:
            return self.const(np.zeros((self.cell.batch, self.cell.hidden)))
        return self.take(init, d, axis=self.cell.layout)

    def _masks(self, seq_lens: Expr | None) -> list[Expr] | None:
        """Per step, a [batch, 1] bool: is ``t`` inside each sequence? None when all are full."""
        if seq_lens is None:
            return None
        op = self.relax.op
        steps = np.arange(self.cell.seq)
        lens_value = self.value(seq_lens)
        if lens_value is not None:
            if bool(np.all(lens_value >= self.cell.seq)):
                return None
            inside = steps[:, None, None] < lens_value.reshape(1, self.cell.batch, 1)
            return [self.relax.const(inside[t]) for t in steps]
        lens_dtype = str(seq_lens.ty.dtype)
        lens = self.emit(op.reshape(seq_lens, [self.cell.batch, 1]))
        return [self.emit(op.less(self.relax.const(int(t), lens_dtype), lens)) for t in steps]

    def run(self, steps: list[Expr], init: tuple[Expr, ...], step: Step, reverse: bool) -> tuple[Expr, Expr]:
        """Unroll ``step`` over time: returns (Y for this direction, final state tuple)."""
        op = self.relax.op
        state = init
        ys: list[Expr] = [None] * self.cell.seq
        zero = self.const(0)
        for t in reversed(range(self.cell.seq)) if reverse else range(self.cell.seq):
            new = step(steps[t], state)
            if self.masks is None:
                state, ys[t] = new, new[0]
                continue
            mask = self.masks[t]
            ys[t] = self.emit(op.where(mask, new[0], zero))
            state = tuple(self.emit(op.where(mask, n, s)) for n, s in zip(new, state))
        if self.masks is not None:
            # A zero-length sequence ends in a zero state, not the initial one (onnxruntime).
            state = tuple(self.emit(op.where(self.masks[0], s, zero)) for s in state)
        y = self.emit(op.stack(ys, axis=self.cell.layout))  # [seq, batch, H] or [batch, seq, H]
        return y, state

    def outputs(self, ys: list[Expr], finals: list[tuple[Expr, ...]]) -> Expr:
        """``relax.Tuple(Y, Y_h[, Y_c])`` in the node's layout, emitted as one value."""
        op = self.relax.op
        # layout 0: Y [seq, dirs, batch, H], states [dirs, batch, H]; layout 1: [batch, seq, dirs, H], [batch, dirs, H]
        y = op.stack(ys, axis=1 if self.cell.layout == 0 else 2)
        states = [op.stack([f[k] for f in finals], axis=self.cell.layout) for k in range(len(finals[0]))]
        fields = [self.emit(e) for e in [y, *states]]
        # One tuple value: the importer names it after the ONNX node, and every binding above
        # it (the whole unrolled recurrence) is attributed to that node.
        return self.emit(self.relax.Tuple(fields))


def direction_weights(
    u: Unroller, inputs: Sequence[Any], d: int, gates: int
) -> tuple[Expr, Expr, Expr | None, Expr | None]:
    """Direction ``d``'s W [G·H, I], R [G·H, H], Wb and Rb [G·H] (None without B)."""
    w, r, b = inputs[1], inputs[2], optional_input(inputs, 3)
    gh = gates * u.cell.hidden
    if b is None:
        return u.take(w, d), u.take(r, d), None, None
    bias = u.take(b, d)
    return u.take(w, d), u.take(r, d), u.cols(bias, 0, gh), u.cols(bias, gh, 2 * gh)
