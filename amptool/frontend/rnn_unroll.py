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


#: Gate blocks in W, R and B per op.
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _check_shapes(op: str, label: str, inputs: Sequence[Any], layout: int, dims: tuple[int, int, int, int]) -> None:
    """Every input's shape as ONNX defines it from R's and X's (the unroller slices by them: a
    malformed node would otherwise fail deep inside the import with TVM's words)."""
    num_dir, batch, hidden, features = dims
    gh = _GATES[op] * hidden
    state = [batch, num_dir, hidden] if layout else [num_dir, batch, hidden]
    expected = {1: ("W", [num_dir, gh, features]), 2: ("R", [num_dir, gh, hidden]), 3: ("B", [num_dir, 2 * gh]),
                4: ("sequence_lens", [batch]), 5: ("initial_h", state)}
    if op == "LSTM":
        expected.update({6: ("initial_c", state), 7: ("P", [num_dir, 3 * hidden])})
    for index, (name, want) in expected.items():
        given = optional_input(inputs, index)
        if given is not None and (got := _shape(given, f"input {name}", label)) != want:
            raise UserError(f"{label} input {name} has shape {got}; X and R make it {want}.", _HINT_SPEC)


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
    r_shape = _shape(r, "recurrence weight R", label)
    if len(r_shape) != 3:
        raise UserError(f"{label} input R must be 3-D [directions, gates·hidden, hidden], got shape {r_shape}.",
                        _HINT_SPEC)
    num_dir, _, hidden = r_shape
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
    _check_shapes(op, label, inputs, layout, (num_dir, batch, hidden, x_shape[2]))
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

    def __init__(self, bb: Any, cell: _Cell, x: Expr, seq_lens: Expr | None) -> None:
        self.bb, self.cell, self.x = bb, cell, x
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

    def recurrent(self, rs: Sequence[Expr]) -> Expr:
        """Rᵀ of each direction: ``[H, G·H]`` for one (the packed matmul, bfloat16 dot products
        included), ``[directions, H, G·H]`` for two (a batched matmul, one weight per direction)."""
        transposed = [self.transpose(r) for r in rs]
        return transposed[0] if len(transposed) == 1 else self.stack(transposed)

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

    def stack(self, parts: Sequence[Expr]) -> Expr:
        """``parts`` stacked along a new first axis (one per direction)."""
        values = [v for v in (self.value(p) for p in parts) if v is not None]
        if len(values) == len(parts):
            return self.relax.const(np.ascontiguousarray(np.stack(values)))
        return self.emit(self.relax.op.stack(list(parts), axis=0))

    def reshape(self, expr: Expr, shape: Sequence[int]) -> Expr:
        value = self.value(expr)
        if value is not None:
            return self.relax.const(np.ascontiguousarray(value.reshape(shape)))
        return self.emit(self.relax.op.reshape(expr, list(shape)))

    def per_direction(self, parts: Sequence[Expr]) -> Expr:
        """One vector per direction → ``[directions, 1, n]``: broadcasts against the state."""
        return self.reshape(self.stack(parts), [len(parts), 1, -1])

    def act(self, names: Sequence[str], x: Expr, clip: bool = True) -> Expr:
        """Each direction's activation over its slice of ``x`` (``[directions, …]``); one op when
        they agree, as they do unless the node lists them per direction."""
        if clip and self.cell.clip is not None:
            x = self.emit(self.relax.op.clip(x, -self.cell.clip, self.cell.clip))
        table = _activation_table()
        if len(set(names)) == 1:
            return self.emit(table[names[0]](x))
        op = self.relax.op
        pieces = [self.emit(table[name](self.emit(op.strided_slice(x, axes=[0], begin=[d], end=[d + 1]))))
                  for d, name in enumerate(names)]
        return self.emit(op.concat(pieces, axis=0))

    def times(self, step: int) -> list[int]:
        """The timestep each direction reads at ``step``: forward walks 0 … seq-1, reverse seq-1 … 0."""
        last = self.cell.seq - 1
        return [last - step if d == "reverse" else step for d in self.cell.directions]

    def seq_first(self, x: Expr) -> Expr:
        """``X`` as ``[seq, batch, input]`` whatever the node's layout."""
        return x if self.cell.layout == 0 else self.emit(self.relax.op.permute_dims(x, [1, 0, 2]))

    def projections(self, weights: Sequence[Expr], biases: Sequence[Expr | None]) -> list[Expr]:
        """``X·Wᵀ + bias`` of every direction for every timestep, one matmul per direction, then per
        step one ``[directions, batch, gates]``: each direction's row for the timestep it is at.

        Why both directions in one step: the steps are tiny (a CRNN's GRU: 48 hidden units), so
        their kernel calls, not their arithmetic, cost the time; a bidirectional layer now makes
        half as many, each a batched matmul (one weight per direction) and one gate kernel."""
        op = self.relax.op
        x = self.seq_first(self.x)
        projected = []
        for w, bias in zip(weights, biases, strict=True):
            proj = self.emit(op.matmul(x, self.transpose(w)))
            projected.append(proj if bias is None else self.emit(op.add(proj, bias)))
        rows = projected[0] if len(projected) == 1 else self.emit(op.concat(projected, axis=0))  # [dirs·seq, B, G]
        # Each step takes its rows by an index tensor, fused into the step's gate kernel, which all
        # steps then share (the index is the kernel's argument, not a constant compiled into it, as
        # a slice's begin would be: 1,200 distinct kernels for 300 steps × 4). A ``split`` into
        # every timestep was a kernel of its own with ``seq`` outputs, a copy at run time, and
        # scheduling it took minutes at a few hundred steps (each inlining attempt re-analysed its
        # hundreds of blocks).
        seq = self.cell.seq
        return [self.emit(op.take(rows, self._index([d * seq + t for d, t in enumerate(self.times(s))]), axis=0))
                for s in range(seq)]

    def _index(self, rows: list[int]) -> Expr:
        return self.relax.const(np.array(rows, "int64"))

    def initial(self, init: Expr | None) -> Expr:
        """The initial state ``[directions, batch, hidden]`` (zeros when omitted)."""
        if init is None:
            return self.const(np.zeros((len(self.cell.directions), self.cell.batch, self.cell.hidden)))
        return self.seq_first(init)  # layout 1 gives [batch, directions, hidden]

    def _masks(self, seq_lens: Expr | None) -> list[Expr] | None:
        """Per step, a ``[directions, batch, 1]`` bool: is the timestep each direction is at inside
        each sequence? The last entry: is any of it inside (a zero-length sequence ends in a zero
        state). None when all sequences are full."""
        if seq_lens is None:
            return None
        op = self.relax.op
        steps = np.arange(self.cell.seq)
        zeros = [0] * len(self.cell.directions)
        every = [self.times(s) for s in range(self.cell.seq)] + [zeros]
        lens_value = self.value(seq_lens)
        if lens_value is not None:
            if bool(np.all(lens_value >= self.cell.seq)):
                return None
            inside = steps[:, None, None] < lens_value.reshape(1, self.cell.batch, 1)
            return [self.relax.const(np.ascontiguousarray(inside[times])) for times in every]
        lens_dtype = str(seq_lens.ty.dtype)
        lens = self.emit(op.reshape(seq_lens, [1, self.cell.batch, 1]))
        inside = self.emit(op.less(self.relax.const(steps.reshape(-1, 1, 1).astype(lens_dtype)), lens))
        return [self.emit(op.take(inside, self._index(times), axis=0)) for times in every]

    def run(self, steps: list[Expr], init: tuple[Expr, ...], step: Step) -> Expr:
        """Unroll ``step`` over time; returns (Y, *final states) in the node's layout, as one tuple."""
        op = self.relax.op
        if not steps:
            return self._empty(self.x, len(init))
        state = init
        ys: list[Expr] = []
        zero = self.const(0)
        for s, x_s in enumerate(steps):
            new = step(x_s, state)
            if self.masks is None:
                state = new
                ys.append(new[0])
                continue
            mask = self.masks[s]
            ys.append(self.emit(op.where(mask, new[0], zero)))
            state = tuple(self.emit(op.where(mask, n, old)) for n, old in zip(new, state, strict=True))
        if self.masks is not None:
            state = tuple(self.emit(op.where(self.masks[-1], final, zero)) for final in state)
        return self._outputs(self.emit(op.stack(ys, axis=0)), state)

    def _empty(self, x: Expr, states: int) -> Expr:
        """A zero-length sequence: Y empty, every final state zeros (onnxruntime's LSTM; its GRU and
        RNN abort the process). Y is X reshaped, both empty: TVM cannot read an empty constant back."""
        dirs, batch, hidden = len(self.cell.directions), self.cell.batch, self.cell.hidden
        y_shape = [batch, 0, dirs, hidden] if self.cell.layout else [0, dirs, batch, hidden]
        y = self.emit(self.relax.op.reshape(x, y_shape))
        state = self.const(np.zeros((batch, dirs, hidden) if self.cell.layout else (dirs, batch, hidden)))
        return self.emit(self.relax.Tuple([y, *[state] * states]))

    def _outputs(self, by_step: Expr, finals: tuple[Expr, ...]) -> Expr:
        """``relax.Tuple(Y, Y_h[, Y_c])`` in the node's layout, emitted as one value. ``by_step`` is
        ``[seq, directions, batch, H]`` in step order: a reverse direction's steps run backwards in time."""
        op = self.relax.op
        pieces = []
        for d, direction in enumerate(self.cell.directions):
            piece = by_step if len(self.cell.directions) == 1 else self.emit(
                op.strided_slice(by_step, axes=[1], begin=[d], end=[d + 1]))
            pieces.append(self.emit(op.flip(piece, axis=0)) if direction == "reverse" else piece)
        y = pieces[0] if len(pieces) == 1 else self.emit(op.concat(pieces, axis=1))  # [seq, dirs, batch, H]
        if self.cell.layout == 1:
            y = self.emit(op.permute_dims(y, [2, 0, 1, 3]))  # [batch, seq, dirs, H]
            finals = tuple(self.emit(op.permute_dims(f, [1, 0, 2])) for f in finals)  # [batch, dirs, H]
        # One tuple value: the importer names it after the ONNX node, and every binding above
        # it (the whole unrolled recurrence) is attributed to that node.
        return self.emit(self.relax.Tuple([y, *finals]))


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
