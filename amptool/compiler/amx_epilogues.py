"""AMX kernels with their epilogues: ``conv2d/matmul → add bias → add residual → relu/clip →
astype(bfloat16)`` becomes one call of the AMX kernel that applies them while storing.

What: in each dataflow block, a conv2d or matmul that ``amx_plan.plan`` gives an AMX kernel, and
the chain of single-use float32 ops after it — in this order: ``add`` of a constant per output
channel (the bias), ``add`` of a tensor of the output's shape (a shortcut, read in bfloat16 when
it is a bfloat16 value cast up), up to two of ``relu``/``maximum``/``minimum`` with a scalar
constant (ReLU, ReLU6, a clip), ``astype`` to bfloat16 — is replaced by one ``call_tir`` of the AMX
kernel with that :class:`~amptool.compiler.cpu_amx.Epilogue`, bound to the chain's last variable.
The chain stops at the first op that does not fit; what follows stays as it was.

Why: the AMX kernels are hand-written (``cpu_amx``), so FuseOps cannot put an epilogue into
them: each conv stored float32 sums and a kernel of its own read them back for the bias, ReLU
and cast — on ResNet-50 bf16 1.2 ms of 7.9 in such kernels, and twice the output's memory
traffic. Here the epilogue runs on the 32 × 32 tile still in cache and stores bfloat16.

When: only for targets with AMX-BF16 (``amx_plan.plan`` checks); ``widen_epilogues`` has already made
the chains float32, so this runs after it. Preserves: the same float32 operations in the same
order, rounded once to bfloat16 at the end — the values of the unfused chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from amptool import _tvm


class _Chain(NamedTuple):
    """A fused kernel to be: its plan, epilogue, residual argument, and the chain's bindings."""

    plan: Any
    epilogue: Any
    residual: Any
    drop: frozenset[int]  # variable handles whose bindings go
    last: int  # handle of the variable the fused call is bound to


def fuse_amx_epilogues(mod: Any) -> Any:
    """``mod`` with each AMX conv/matmul's epilogue chain in its kernel (module docstring)."""
    from tvm import relax  # noqa: PLC0415

    chains: list[_Chain] = []
    for _, func in _tvm.relax_functions(mod):
        if isinstance(func.body, relax.SeqExpr):
            chains += _chains(func)
    if not chains:
        return mod
    return _tvm.rewrite_functions(mod, _rewriter_class()(mod, chains))


def _chains(func: Any) -> list[_Chain]:
    from tvm import relax  # noqa: PLC0415

    from amptool.compiler import amx_plan  # noqa: PLC0415

    uses = _tvm.var_uses(func)
    found = []
    # Bindings a chain took: a shortcut add is in two chains' reach (ResNet's downsample and main
    # branch), the first conv in binding order takes it and the other stops before it.
    claimed: set[int] = set()
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        bindings = list(block.bindings)
        users: dict[int, Any] = {}  # variable handle → the one binding reading it (when read once)
        values: dict[int, Any] = {}
        for binding in bindings:
            values[binding.var.__chandle__()] = binding.value
            if isinstance(binding.value, relax.Call):
                for arg in _tvm.array_items(binding.value.args):
                    if isinstance(arg, relax.Var) and uses[arg.__chandle__()] == 1:
                        users[arg.__chandle__()] = binding
        for binding in bindings:
            if not isinstance(binding.value, relax.Call) or _tvm.op_name(binding.value) not in (
                    "relax.matmul", "relax.nn.conv2d"):
                continue
            plan = amx_plan.plan(binding.value)
            if plan is not None:
                chain = _follow(binding, plan, users, values, uses, claimed)
                if chain is not None:
                    found.append(chain)
                    claimed |= chain.drop | {chain.last}
    return found


def _follow(start: Any, plan: Any, users: dict[int, Any], values: dict[int, Any], uses: Any,
            claimed: set[int]) -> _Chain | None:
    """The longest epilogue chain after ``start`` through bindings no other chain took (None when
    it has no step)."""
    from tvm import relax  # noqa: PLC0415

    from amptool.compiler.cpu_amx import Epilogue  # noqa: PLC0415

    var = start.var
    shape = _tvm.static_shape(var)
    fields: dict[str, Any] = {}
    residual = None
    drop = {var.__chandle__()}
    last = None
    stage = 0  # steps must come in Epilogue's order: bias 1, residual 2, clamps 3 (two at most), cast 5
    clamps: list[tuple[str, float]] = []
    while isinstance(var, relax.DataflowVar) and var.__chandle__() in users:
        binding = users[var.__chandle__()]
        if binding.var.__chandle__() in claimed:
            break
        call = binding.value
        name = _tvm.op_name(call)
        args = _tvm.array_items(call.args)
        others = [a for a in args if not a.same_as(var)]
        step = None
        if name == "relax.add" and len(others) == 1 and _tvm.tensor_dtype(call) == "float32":
            bias = _bias(others[0], shape)
            if bias is not None and stage < 1:
                step, fields["bias"] = 1, tuple(float(v) for v in bias)
            elif bias is None and stage < 2 and _tvm.static_shape(others[0]) == shape:
                step, residual = 2, others[0]
                source = values.get(residual.__chandle__()) if isinstance(residual, relax.DataflowVar) else None
                if (source is not None and _tvm.op_name(source) == "relax.astype"
                        and _tvm.tensor_dtype(source.args[0]) == "bfloat16" and uses[residual.__chandle__()] == 1
                        and residual.__chandle__() not in claimed):
                    drop.add(residual.__chandle__())  # read the bfloat16 value; its cast goes
                    residual = source.args[0]
                fields["residual"] = _tvm.tensor_dtype(residual)
        elif name == "relax.nn.relu" and stage <= 3 and len(clamps) < 2:
            step = 3
            clamps.append(("max", 0.0))
        elif name in ("relax.maximum", "relax.minimum") and len(others) == 1 and stage <= 3 and len(clamps) < 2:
            scalar = _scalar(others[0])
            if scalar is not None:
                step = 3
                clamps.append(("max" if name == "relax.maximum" else "min", scalar))
        elif name == "relax.astype" and _tvm.tensor_dtype(call) == "bfloat16" and stage < 5:
            step, fields["dtype"] = 5, "bfloat16"
        if step is None:
            break
        stage = step
        if last is not None:
            drop.add(last)
        var = binding.var
        last = var.__chandle__()
        if step == 5:
            break
    if last is None:
        return None
    return _Chain(plan, Epilogue(**fields, clamps=tuple(clamps)), residual, frozenset(drop), last)


def _bias(expr: Any, shape: list[int] | None) -> np.ndarray | None:
    """A float32 constant that varies only along the output's last axis, as a vector, or None."""
    if shape is None or not _tvm.is_constant(expr) or _tvm.tensor_dtype(expr) != "float32":
        return None
    value = _tvm.constant_view(expr)
    if value.ndim > len(shape) or (value.ndim and value.shape[-1] not in (1, shape[-1])):
        return None
    if any(d != 1 for d in value.shape[:-1]):
        return None
    return np.broadcast_to(value.reshape(-1), (shape[-1],)).astype(np.float32)


def _scalar(expr: Any) -> float | None:
    if not _tvm.is_constant(expr) or _tvm.tensor_dtype(expr) != "float32":
        return None
    value = _tvm.constant_view(expr)
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _rewriter_class() -> Any:
    from tvm.relax.expr_functor import mutator  # noqa: PLC0415

    @mutator
    class _Rewriter(_tvm.dataflow_scoped_mutator()):  # type: ignore[misc]
        def __init__(self, mod: Any, chains: list[_Chain]) -> None:
            super().__init__(mod)
            self.drop = frozenset().union(*(chain.drop for chain in chains))
            self.ends = {chain.last: chain for chain in chains}

        def visit_var_binding_(self, binding: Any) -> None:
            handle = binding.var.__chandle__()
            if handle in self.drop:
                return
            chain = self.ends.get(handle)
            if chain is None:
                super().visit_var_binding_(binding)
                return
            plan = dataclasses.replace(chain.plan, data=self.visit_expr(chain.plan.data))
            residual = None if chain.residual is None else self.visit_expr(chain.residual)
            call = self.builder_.normalize(plan.emit(self.builder_, chain.epilogue, residual))
            self.builder_.emit_normalized(_tvm.var_binding(binding.var, call))

    return _Rewriter
