"""ONNX ``LSTM``, ``GRU`` and ``RNN`` → Relax, unrolled over a static sequence length.

Why: TVM 0.27's Relax ONNX frontend has no converter for any of them, yet every speech,
OCR-recogniser and tagging export from PyTorch, Keras and Paddle carries LSTM or GRU, and
older exports of ``nn.RNN`` / ``SimpleRNN`` carry the plain (Elman) ``RNN``.

What: per direction, the input projection ``X·Wᵀ`` (plus every bias the equations allow)
for all timesteps is one matmul — compute-bound, so the mixed-precision pass puts it in the
low dtype with fp32 accumulation. Each step is then one ``[directions, batch, hidden]·Rᵀ``
matmul (two for GRU with ``linear_before_reset=0``) and elementwise gates (for RNN, one
activation), emitted in sequence: a bidirectional layer's step advances the forward direction
at ``t`` and the reverse one at ``seq-1-t`` together (``rnn_unroll.Unroller``).
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
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool.frontend.rnn_directions import apart
from amptool.frontend.rnn_unroll import (
    Expr,
    Unroller,
    direction_weights,
    optional_input,
    parse_cell,
)


def _roles(cell_activations: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """Per-direction activation lists (f, g, h per direction) → per role, one name per direction."""
    return tuple(zip(*cell_activations, strict=True))


@dataclass(frozen=True)
class _LstmWeights:
    """Rᵀ (``Unroller.recurrent``), peepholes (i, o, f) as ``[directions, 1, H]``, activations per
    role (f, g, h), each one name per direction."""

    r_t: Expr
    peepholes: tuple[Expr, Expr, Expr] | None
    acts: tuple[tuple[str, ...], ...]
    input_forget: bool


def _lstm_step(u: Unroller, w: _LstmWeights, x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    op = u.relax.op
    h, c = state
    f_act, g_act, h_act = w.acts
    i, o, f, c_hat = u.split(u.emit(op.add(x_t, u.matmul(h, w.r_t))), 4)
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
    cell = parse_cell("LSTM", inputs, attrs, ("sigmoid", "tanh", "tanh"))
    by_direction = apart(convert_lstm, bb, inputs, attrs, cell, outputs=3)
    if by_direction is not None:
        return by_direction
    u = Unroller(bb, cell, inputs[0], optional_input(inputs, 4))
    init_h, init_c, peep = optional_input(inputs, 5), optional_input(inputs, 6), optional_input(inputs, 7)
    per_dir = [direction_weights(u, inputs, d, 4) for d in range(len(cell.directions))]
    peepholes = None
    if peep is not None:
        split = [u.split(u.take(peep, d), 3) for d in range(len(cell.directions))]
        peepholes = tuple(u.per_direction([parts[k] for parts in split]) for k in range(3))
    weights = _LstmWeights(
        r_t=u.recurrent([r for _, r, _, _ in per_dir]),
        peepholes=peepholes,
        acts=_roles(cell.activations),
        input_forget=bool(int(attrs.get("input_forget", 0))),
    )
    steps = u.projections([w for w, _, _, _ in per_dir],
                          [None if wb is None else u.add(wb, rb) for _, _, wb, rb in per_dir])
    init = (u.initial(init_h), u.initial(init_c))
    return u.run(steps, init, functools.partial(_lstm_step, u, weights))


@dataclass(frozen=True)
class _GruWeights:
    """Rᵀ (``Unroller.recurrent``) and its zr / h column blocks, Rbh as ``[directions, 1, H]`` when
    it stays inside the reset, activations per role (f, g)."""

    r_t: Expr
    r_zr_t: Expr
    r_h_t: Expr
    rb_h: Expr | None
    acts: tuple[tuple[str, ...], ...]
    linear_before_reset: bool


def _gru_step(u: Unroller, w: _GruWeights, x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    op, hidden = u.relax.op, u.cell.hidden
    (h,) = state
    f_act, g_act = w.acts
    if w.linear_before_reset:
        # h̃ = g(Xt·Whᵀ + r ⊙ (H·Rhᵀ + Rbh) + Wbh): one matmul for all three gates.
        x_z, x_r, x_h = u.split(x_t, 3)
        h_z, h_r, h_h = u.split(u.matmul(h, w.r_t), 3)
        z = u.act(f_act, u.emit(op.add(x_z, h_z)))
        r = u.act(f_act, u.emit(op.add(x_r, h_r)))
        if w.rb_h is not None:
            h_h = u.emit(op.add(h_h, w.rb_h))
        h_hat = u.act(g_act, u.emit(op.add(x_h, u.emit(op.multiply(r, h_h)))))
    else:
        # h̃ = g(Xt·Whᵀ + (r ⊙ H)·Rhᵀ + Rbh + Wbh): the reset gate comes before the h matmul.
        x_zr, x_h = u.cols(x_t, 0, 2 * hidden), u.cols(x_t, 2 * hidden, 3 * hidden)
        z, r = (u.act(f_act, g) for g in u.split(u.emit(op.add(x_zr, u.matmul(h, w.r_zr_t))), 2))
        h_hat = u.act(g_act, u.emit(op.add(x_h, u.matmul(u.emit(op.multiply(r, h)), w.r_h_t))))
    h_new = u.emit(op.add(u.emit(op.multiply(u.emit(op.subtract(u.const(1), z)), h_hat)), u.emit(op.multiply(z, h))))
    return (h_new,)


def convert_gru(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ONNX GRU (gate order z, r, h) → Relax tuple (Y, Y_h)."""
    cell = parse_cell("GRU", inputs, attrs, ("sigmoid", "tanh"))
    by_direction = apart(convert_gru, bb, inputs, attrs, cell, outputs=2)
    if by_direction is not None:
        return by_direction
    u = Unroller(bb, cell, inputs[0], optional_input(inputs, 4))
    hidden = cell.hidden
    linear_before_reset = bool(int(attrs.get("linear_before_reset", 0)))
    ws, rs, biases, rb_hs = [], [], [], []
    for d in range(len(cell.directions)):
        w, r, wb, rb = direction_weights(u, inputs, d, 3)
        bias = rb_h = None
        if wb is not None and linear_before_reset:
            # Rbh sits inside r ⊙ (H·Rhᵀ + Rbh): only Rbz and Rbr fold into the projection.
            bias = u.add(wb, u.concat([u.cols(rb, 0, 2 * hidden), u.const(np.zeros(hidden))]))
            rb_h = u.cols(rb, 2 * hidden, 3 * hidden)
        elif wb is not None:
            bias = u.add(wb, rb)
        ws.append(w)
        rs.append(r)
        biases.append(bias)
        rb_hs.append(rb_h)
    r_t = u.recurrent(rs)
    weights = _GruWeights(
        r_t=r_t,
        r_zr_t=u.cols(r_t, 0, 2 * hidden),
        r_h_t=u.cols(r_t, 2 * hidden, 3 * hidden),
        rb_h=None if rb_hs[0] is None else u.per_direction(rb_hs),
        acts=_roles(cell.activations),
        linear_before_reset=linear_before_reset,
    )
    steps = u.projections(ws, biases)
    return u.run(steps, (u.initial(optional_input(inputs, 5)),), functools.partial(_gru_step, u, weights))


def _rnn_step(u: Unroller, r_t: Expr, acts: tuple[str, ...], x_t: Expr, state: tuple[Expr, ...]) -> tuple[Expr, ...]:
    (h,) = state
    return (u.act(acts, u.emit(u.relax.op.add(x_t, u.matmul(h, r_t)))),)


def convert_rnn(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ONNX RNN, ``Ht = f(Xt·Wᵀ + Ht₋₁·Rᵀ + Wb + Rb)`` → Relax tuple (Y, Y_h)."""
    cell = parse_cell("RNN", inputs, attrs, ("tanh",))
    by_direction = apart(convert_rnn, bb, inputs, attrs, cell, outputs=2)
    if by_direction is not None:
        return by_direction
    u = Unroller(bb, cell, inputs[0], optional_input(inputs, 4))
    per_dir = [direction_weights(u, inputs, d, 1) for d in range(len(cell.directions))]
    steps = u.projections([w for w, _, _, _ in per_dir],
                          [None if wb is None else u.add(wb, rb) for _, _, wb, rb in per_dir])
    (acts,) = _roles(cell.activations)
    step = functools.partial(_rnn_step, u, u.recurrent([r for _, r, _, _ in per_dir]), acts)
    return u.run(steps, (u.initial(optional_input(inputs, 5)),), step)
