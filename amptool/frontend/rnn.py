"""ONNX ``LSTM``, ``GRU`` and ``RNN`` → Relax, unrolled over a static sequence length.

Why: TVM 0.27's Relax ONNX frontend has no converter for any of them, yet every speech,
OCR-recogniser and tagging export from PyTorch, Keras and Paddle carries LSTM or GRU, and
older exports of ``nn.RNN`` / ``SimpleRNN`` carry the plain (Elman) ``RNN``.

What: per direction, the input projection ``X·Wᵀ`` (plus every bias the equations allow)
for all timesteps is one matmul — compute-bound, so the mixed-precision pass puts it in the
low dtype with fp32 accumulation. Each timestep is then one ``[batch, hidden]·Rᵀ`` matmul
(two for GRU with ``linear_before_reset=0``) and elementwise gates (for RNN, one activation),
emitted in sequence.
``sequence_lens`` become per-step masks (``t < len``) applied with ``where``: a masked step
keeps the previous state and writes zeros to ``Y``. Walking ``t = seq-1 … 0`` for the reverse
direction then reverses each sequence within its valid length, as ONNX requires.

Follows the ONNX spec for opsets 7–22: forward / reverse / bidirectional, optional ``B``,
``sequence_lens``, ``initial_h``, ``initial_c`` and peepholes ``P``, ``clip``,
``input_forget``, ``linear_before_reset``, ``layout`` 0 and 1. Outputs follow ``X``'s dtype.

When not: a symbolic sequence length (pin shapes first; unrolling needs a number), and
activations outside ``_ACTIVATIONS`` (those taking ``activation_alpha``/``beta`` are
implemented inconsistently across runtimes). Both raise a one-line UserError.
"""

from __future__ import annotations

import functools
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


def _optional(inputs: Sequence[Any], index: int) -> Any:
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


def _parse(op: str, inputs: Sequence[Any], attrs: dict[str, Any], defaults: tuple[str, ...]) -> _Cell:
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


class _Unroller:
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
        """Equal parts along the last axis."""
        if self.value(expr) is not None:
            width = int(expr.ty.shape[-1]) // parts
            return [self.cols(expr, i * width, (i + 1) * width) for i in range(parts)]
        tup = self.emit(self.relax.op.split(expr, parts, axis=-1))
        return [self.emit(self.relax.TupleGetItem(tup, i)) for i in range(parts)]

    def transpose(self, expr: Expr) -> Expr:
        """A 2-D matrix transposed."""
        value = self.value(expr)
        if value is not None:
            return self.relax.const(np.ascontiguousarray(value.T))
        return self.emit(self.relax.op.permute_dims(expr, [1, 0]))

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
        time_axis = self.cell.layout
        if self.cell.seq == 1:
            return [self.emit(op.squeeze(proj, axis=[time_axis]))]
        tup = self.emit(op.split(proj, self.cell.seq, axis=time_axis))
        return [
            self.emit(op.squeeze(self.emit(self.relax.TupleGetItem(tup, t)), axis=[time_axis]))
            for t in range(self.cell.seq)
        ]

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


def _weights(u: _Unroller, inputs: Sequence[Any], d: int, gates: int) -> tuple[Expr, Expr, Expr | None, Expr | None]:
    """Direction ``d``'s W [G·H, I], R [G·H, H], Wb and Rb [G·H] (None without B)."""
    w, r, b = inputs[1], inputs[2], _optional(inputs, 3)
    gh = gates * u.cell.hidden
    if b is None:
        return u.take(w, d), u.take(r, d), None, None
    bias = u.take(b, d)
    return u.take(w, d), u.take(r, d), u.cols(bias, 0, gh), u.cols(bias, gh, 2 * gh)


@dataclass(frozen=True)
class _LstmDirection:
    """One direction's recurrent weights: Rᵀ [H, 4H], peepholes (i, o, f), activations (f, g, h)."""

    r_t: Expr
    peepholes: tuple[Expr, Expr, Expr] | None
    acts: tuple[str, ...]
    input_forget: bool


def _lstm_step(u: _Unroller, w: _LstmDirection, x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    op = u.relax.op
    h, c = state
    f_act, g_act, h_act = w.acts
    i, o, f, c_hat = u.split(u.emit(op.add(x_t, u.emit(op.matmul(h, w.r_t)))), 4)
    if w.peepholes is not None:
        i = u.emit(op.add(i, u.emit(op.multiply(w.peepholes[0], c))))
        f = u.emit(op.add(f, u.emit(op.multiply(w.peepholes[2], c))))
    i = u.act(f_act, i)
    f = u.emit(op.subtract(u.const(1), i)) if w.input_forget else u.act(f_act, f)
    c_new = u.emit(op.add(u.emit(op.multiply(f, c)), u.emit(op.multiply(i, u.act(g_act, c_hat)))))
    if w.peepholes is not None:
        o = u.emit(op.add(o, u.emit(op.multiply(w.peepholes[1], c_new))))
    o = u.act(f_act, o)
    # onnxruntime clips the gates' inputs, never the cell state fed to h.
    h_new = u.emit(op.multiply(o, u.act(h_act, c_new, clip=False)))
    return h_new, c_new


def convert_lstm(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ONNX LSTM (gate order i, o, f, c; peepholes i, o, f) → Relax tuple (Y, Y_h, Y_c)."""
    cell = _parse("LSTM", inputs, attrs, ("sigmoid", "tanh", "tanh"))
    u = _Unroller(bb, cell, _optional(inputs, 4))
    init_h, init_c, peep = _optional(inputs, 5), _optional(inputs, 6), _optional(inputs, 7)
    ys, finals = [], []
    for d, direction in enumerate(cell.directions):
        w, r, wb, rb = _weights(u, inputs, d, 4)
        weights = _LstmDirection(
            r_t=u.transpose(r),
            peepholes=None if peep is None else tuple(u.split(u.take(peep, d), 3)),
            acts=cell.activations[d],
            input_forget=bool(int(attrs.get("input_forget", 0))),
        )
        steps = u.projections(inputs[0], w, None if wb is None else u.add(wb, rb))
        init = (u.state(init_h, d), u.state(init_c, d))
        y, final = u.run(steps, init, functools.partial(_lstm_step, u, weights), direction == "reverse")
        ys.append(y)
        finals.append(final)
    return u.outputs(ys, finals)


@dataclass(frozen=True)
class _GruDirection:
    """One direction's recurrent weights: Rᵀ [H, 3H] (and its zr / h column blocks), Rbh when
    it stays inside the reset."""

    r_t: Expr
    r_zr_t: Expr
    r_h_t: Expr
    rb_h: Expr | None
    acts: tuple[str, ...]
    linear_before_reset: bool


def _gru_step(u: _Unroller, w: _GruDirection, x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    op, hidden = u.relax.op, u.cell.hidden
    (h,) = state
    f_act, g_act = w.acts
    if w.linear_before_reset:
        # h̃ = g(Xt·Whᵀ + r ⊙ (H·Rhᵀ + Rbh) + Wbh): one matmul for all three gates.
        x_z, x_r, x_h = u.split(x_t, 3)
        h_z, h_r, h_h = u.split(u.emit(op.matmul(h, w.r_t)), 3)
        z = u.act(f_act, u.emit(op.add(x_z, h_z)))
        r = u.act(f_act, u.emit(op.add(x_r, h_r)))
        if w.rb_h is not None:
            h_h = u.emit(op.add(h_h, w.rb_h))
        h_hat = u.act(g_act, u.emit(op.add(x_h, u.emit(op.multiply(r, h_h)))))
    else:
        # h̃ = g(Xt·Whᵀ + (r ⊙ H)·Rhᵀ + Rbh + Wbh): the reset gate comes before the h matmul.
        x_zr, x_h = u.cols(x_t, 0, 2 * hidden), u.cols(x_t, 2 * hidden, 3 * hidden)
        z, r = (u.act(f_act, g) for g in u.split(u.emit(op.add(x_zr, u.emit(op.matmul(h, w.r_zr_t)))), 2))
        h_hat = u.act(g_act, u.emit(op.add(x_h, u.emit(op.matmul(u.emit(op.multiply(r, h)), w.r_h_t)))))
    h_new = u.emit(op.add(u.emit(op.multiply(u.emit(op.subtract(u.const(1), z)), h_hat)), u.emit(op.multiply(z, h))))
    return (h_new,)


def convert_gru(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ONNX GRU (gate order z, r, h) → Relax tuple (Y, Y_h)."""
    cell = _parse("GRU", inputs, attrs, ("sigmoid", "tanh"))
    u = _Unroller(bb, cell, _optional(inputs, 4))
    hidden = cell.hidden
    init_h = _optional(inputs, 5)
    linear_before_reset = bool(int(attrs.get("linear_before_reset", 0)))
    ys, finals = [], []
    for d, direction in enumerate(cell.directions):
        w, r, wb, rb = _weights(u, inputs, d, 3)
        bias = rb_h = None
        if wb is not None and linear_before_reset:
            # Rbh sits inside r ⊙ (H·Rhᵀ + Rbh): only Rbz and Rbr fold into the projection.
            bias = u.add(wb, u.concat([u.cols(rb, 0, 2 * hidden), u.const(np.zeros(hidden))]))
            rb_h = u.cols(rb, 2 * hidden, 3 * hidden)
        elif wb is not None:
            bias = u.add(wb, rb)
        r_t = u.transpose(r)
        weights = _GruDirection(
            r_t=r_t,
            r_zr_t=u.cols(r_t, 0, 2 * hidden),
            r_h_t=u.cols(r_t, 2 * hidden, 3 * hidden),
            rb_h=rb_h,
            acts=cell.activations[d],
            linear_before_reset=linear_before_reset,
        )
        steps = u.projections(inputs[0], w, bias)
        y, final = u.run(steps, (u.state(init_h, d),), functools.partial(_gru_step, u, weights), direction == "reverse")
        ys.append(y)
        finals.append(final)
    return u.outputs(ys, finals)


def _rnn_step(u: _Unroller, r_t: Expr, act: str, x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    (h,) = state
    return (u.act(act, u.emit(u.relax.op.add(x_t, u.emit(u.relax.op.matmul(h, r_t))))),)


def convert_rnn(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ONNX RNN, ``Ht = f(Xt·Wᵀ + Ht₋₁·Rᵀ + Wb + Rb)`` → Relax tuple (Y, Y_h)."""
    cell = _parse("RNN", inputs, attrs, ("tanh",))
    u = _Unroller(bb, cell, _optional(inputs, 4))
    init_h = _optional(inputs, 5)
    ys, finals = [], []
    for d, direction in enumerate(cell.directions):
        w, r, wb, rb = _weights(u, inputs, d, 1)
        steps = u.projections(inputs[0], w, None if wb is None else u.add(wb, rb))
        step = functools.partial(_rnn_step, u, u.transpose(r), cell.activations[d][0])
        y, final = u.run(steps, (u.state(init_h, d),), step, direction == "reverse")
        ys.append(y)
        finals.append(final)
    return u.outputs(ys, finals)
