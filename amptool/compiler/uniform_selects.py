"""Selects that every lane of a vector decides alike, written so that TVM's vectorizer sees it.

What: in a block under a vectorized loop of ``n`` lanes, a comparison of a block variable with a
multiple of ``n`` (``64 <= v``, ``v < 64``) becomes the same comparison of ``v // n`` (``2 <= v //
32``) — where ``v`` is bound to the lane plus a multiple of ``n``, so ``v // n`` is one value for
the whole vector. Runs after the schedule rules (``cpu.stage_passes``), on scheduled functions.

Why: TVM's ``VectorizeLoop`` runs any ``if_then_else`` whose condition is a vector as a loop of
scalars, and a concat along channels is such a select (``c < 64 ? a[c] : b[c - 64]``). Once the
block's binding is substituted, TVM's simplifier turns ``(f % 4 * 32 + lane) // 32`` into ``f % 4``
— the condition is a scalar and the vector stays — but it leaves ``64 <= f % 4 * 32 + lane`` as
it is. SqueezeNet's concats (two 64- or 128-channel halves) ran 32 scalar copies per vector
(``cpu_schedules._selected_runs`` already keeps each vector inside one input).
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym.analyzer import Analyzer

#: (comparison, whether the constant is its left side): the forms that hold unchanged over ``// n``
#: when ``n`` divides the constant (``K <= v``, ``v < K``, ``v >= K``, ``K > v``).
_EXACT = ((tirx.LE, True), (tirx.LT, False), (tirx.GE, False), (tirx.GT, True))


def _uses(expr: Any, var: Any) -> bool:
    found = [False]

    def seen(node: Any) -> None:
        if node.same_as(var):
            found[0] = True

    tvm_ffi.structural_walk(expr, (tirx.Var, seen))
    return found[0]


def _lane_uniform(realize: Any, lane: Any, lanes: int) -> list[Any]:
    """Block variables whose binding moves with ``lane`` yet has one ``// lanes`` per vector."""
    analyzer = Analyzer()
    analyzer.bind(lane, tvm.ir.Range(0, lanes))
    return [iter_var.var for iter_var, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
            if _uses(value, lane) and not _uses(analyzer.simplify(tirx.floordiv(value, lanes)), lane)]


def _rewrite_block(realize: Any, lane: Any, lanes: int) -> Any:
    uniform = _lane_uniform(realize, lane, lanes)
    if not uniform:
        return realize

    def compare(node: Any) -> Any:
        for kind, constant_first in _EXACT:
            if not isinstance(node, kind):
                continue
            constant, var = (node.a, node.b) if constant_first else (node.b, node.a)
            if (isinstance(constant, tirx.IntImm) and int(constant) % lanes == 0
                    and isinstance(var, tirx.Var) and any(var.same_as(u) for u in uniform)):
                whole = tirx.IntImm(constant.ty, int(constant) // lanes)
                per_vector = tirx.floordiv(var, tirx.IntImm(var.ty, lanes))
                return kind(whole, per_vector) if constant_first else kind(per_vector, whole)
        return node

    block = realize.block
    body = tvm_ffi.structural_map(block.body, ((tirx.LE, tirx.LT, tirx.GE, tirx.GT), compare))
    if body.same_as(block.body):
        return realize
    rewritten = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                             block.alloc_buffers, block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(realize.iter_values, realize.predicate, rewritten)


def _vector_loop(loop: Any) -> Any:
    if loop.kind != tirx.ForKind.VECTORIZED or not isinstance(loop.extent, tirx.IntImm):
        return loop
    lanes = int(loop.extent)
    body = tvm_ffi.structural_map(loop.body, (s_tir.SBlockRealize,
                                              lambda realize: _rewrite_block(realize, loop.loop_var, lanes)))
    if body.same_as(loop.body):
        return loop
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations,
                    loop.step)


def _uniform_selects(func: Any, _mod: Any, _ctx: Any) -> Any:
    return tvm_ffi.structural_map(func, (tirx.For, _vector_loop))


UniformSelects = tirx.transform.prim_func_pass(_uniform_selects, opt_level=0, name="amptool.UniformSelects")
