"""Probe builds: the converted module with the bindings named after ONNX nodes exposed.

``plan_probes`` finds, for each main-graph node output, the Relax var that carries it: the
importer binds each node's result to a var named ``identifier(node)`` (``_<i>`` per output of
a multi-output node; ``_2``, ``_3`` on a name clash), and provenance records its node; a
converter that returned one tuple value (Split) is probed through the items taken from it. A
float32 conv/matmul that accumulated for the low dtype is probed through its cast down, the
value its consumers read. Outputs with no such binding at the top level of ``main`` (folded
to constants, returned their input, inside an ``If``, not floating point) are counted by reason.

``expose_bindings`` is a small pass (IRModule → IRModule): a function that returns ``main``'s
result followed by each probed var cast to float32 — ``main`` itself, or a copy beside it —
so one compile yields every intermediate. Preserves ``main`` (when beside), well-formedness.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from amptool import _tvm, compiler
from amptool.errors import error_summary
from amptool.frontend.graph import identifier
from amptool.frontend.importer import NodeOrigin
from amptool.frontend.signature import TensorSpec
from amptool.passes.mixed_precision import Decision
from amptool.runtime.tvm_runner import CompiledModel


@dataclass(frozen=True)
class Probe:
    """One ONNX node output and the Relax var that carries it in the converted module."""

    node: str
    op_type: str
    tensor: str  # ONNX tensor name
    var: str  # Relax var exposed
    dtype: str  # dtype of that var in the converted module


# --------------------------------------------------------------------------- mapping


def plan_probes(
    model: onnx.ModelProto,
    mod: Any,
    provenance: Mapping[str, NodeOrigin],
    decisions: Sequence[Decision],
    dtype: str,
) -> tuple[list[Probe], collections.Counter[str]]:
    """The Relax var carrying each main-graph node output, in graph order; skip reasons counted."""
    top = _top_level_bindings(mod)
    accumulated = {d.var for d in decisions if d.dtype == dtype and d.dtype != "float32"}
    cast_down = _casts_down(top, dtype)
    items = _tuple_items(top)
    probes: list[Probe] = []
    skipped: collections.Counter[str] = collections.Counter()
    for node in model.graph.node:
        outputs = list(node.output)
        for index, tensor in enumerate(outputs):
            if not tensor:
                continue
            var = _bound_var(node.name, index, len(outputs), top, provenance)
            if var is not None and _tvm.is_tuple_type(getattr(top[var].var, "ty", None)):
                var = items.get((var, index))  # a node whose converter returned one tuple value
            if var is None:
                skipped["no binding"] += 1
                continue
            var_dtype = _tvm.tensor_dtype(top[var].var)
            if var_dtype not in _tvm.FLOAT_DTYPES:
                skipped["not a float tensor"] += 1
                continue
            if var_dtype == "float32" and var in accumulated and var in cast_down:
                var, var_dtype = cast_down[var], dtype
            probes.append(Probe(node.name, node.op_type, tensor, var, str(var_dtype)))
    return probes, skipped


def _bound_var(node: str, index: int, count: int, top: Mapping[str, Any],
               provenance: Mapping[str, NodeOrigin]) -> str | None:
    """The var the importer named after output ``index`` of ``node``: ``identifier(node)`` for
    one output, ``_<index>`` suffixed for several, ``_2``… on a clash; or, for a converter that
    returned one tuple value, the tuple var itself."""
    base = identifier(node)
    stems = [(base, False), (f"{base}_0", False)] if count == 1 else [(f"{base}_{index}", False), (base, True)]
    for stem, tuple_only in stems:
        for name in [stem, *(f"{stem}_{k}" for k in range(2, 10))]:
            origin = provenance.get(name)
            if name not in top or origin is None or origin.node != node:
                continue
            if tuple_only and not _tvm.is_tuple_type(getattr(top[name].var, "ty", None)):
                continue
            return name
    return None


def _top_level_bindings(mod: Any) -> dict[str, Any]:
    """Var name → binding, for the bindings at the top level of ``main`` (outside any ``If``)."""
    main = mod["main"]
    return {_tvm.var_name(b.var): b for block in main.body.blocks for b in block.bindings}


def _tuple_items(top: Mapping[str, Any]) -> dict[tuple[str, int], str]:
    """(tuple var name, index) → name of the top-level binding that takes that item."""
    from tvm import relax  # noqa: PLC0415

    found: dict[tuple[str, int], str] = {}
    for name, binding in top.items():
        value = getattr(binding, "value", None)
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            found.setdefault((_tvm.var_name(value.tuple_value), int(value.index)), name)
    return found


def _casts_down(top: Mapping[str, Any], dtype: str) -> dict[str, str]:
    """float32 var name → name of a top-level binding that casts it to ``dtype``."""
    from tvm import relax  # noqa: PLC0415

    found: dict[str, str] = {}
    for name, binding in top.items():
        value = getattr(binding, "value", None)
        if (isinstance(value, relax.Call) and _tvm.op_name(value) == "relax.astype"
                and _tvm.tensor_dtype(binding.var) == dtype and isinstance(value.args[0], relax.Var)):
            found.setdefault(_tvm.var_name(value.args[0]), name)
    return found


# --------------------------------------------------------------------------- the probe module


def expose_bindings(mod: Any, names: Sequence[str], entry: str = "main") -> Any:
    """``mod`` with a function ``entry`` that returns ``(main's result, *[float32(var) for var
    in names])``: ``main`` itself by default, or a copy beside it.

    Each probed var gets a float32 copy bound right after it (an output var of its dataflow
    block, so it escapes the block and fusion keeps it); only top-level bindings of ``main``
    can be exposed. Every name must be bound there.
    """
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    wanted = set(names)

    @mutator
    class _Expose(PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.depth = 0
            self.exposed: dict[str, Any] = {}

        def visit_seq_expr_(self, seq: Any) -> Any:
            self.depth += 1
            try:
                new = super().visit_seq_expr_(seq)
            finally:
                self.depth -= 1
            if self.depth > 0:
                return new
            missing = [n for n in names if n not in self.exposed]
            if missing:
                raise ValueError(f"cannot expose {missing[:3]}: not bound at the top level of main")
            body = relax.Tuple([new.body, *(self.exposed[n] for n in names)])
            return relax.SeqExpr(new.blocks, body)

        def visit_var_binding_(self, binding: Any) -> None:
            super().visit_var_binding_(binding)
            name = _tvm.var_name(binding.var)
            if self.depth != 1 or name not in wanted or name in self.exposed:
                return
            value = self.visit_expr(binding.var)  # the var as remapped by this mutator
            if _tvm.tensor_dtype(value) != "float32":
                value = relax.op.astype(value, "float32")
            emit = self.builder_.emit_output if self.builder_.current_block_is_dataflow() else self.builder_.emit
            self.exposed[name] = emit(value, name_hint=f"{name}_probe")

    main = mod["main"]
    body = _Expose(mod).visit_expr(main.body)
    probed = relax.Function(list(main.params), body, None, main.is_pure, main.attrs)
    out = _copy_module(mod)
    if entry == "main":
        out[mod.get_global_var("main")] = probed
    else:  # the copy needs its own parameter vars and symbol
        probed = relax.utils.copy_with_new_vars(probed)
        if probed.attrs is not None and "global_symbol" in probed.attrs:
            probed = probed.with_attr("global_symbol", entry)
        out[relax.GlobalVar(entry)] = probed
    _tvm.assert_well_formed(out, "expose_bindings")
    return out


def _copy_module(mod: Any) -> Any:
    import tvm  # noqa: PLC0415

    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)


@dataclass
class ProbedModel:
    """A compiled probe module: ``run`` returns the model outputs and the probed tensors.

    With ``plain`` (``compile_probed(beside=True)``) the outputs come from the unprobed
    ``main`` of the same executable: exactly what a normal build computes. The probed function
    is fused differently (every probe is a fusion boundary), and LLVM may then contract a
    float32 multiply-add differently; after float16 rounding such differences reach the same
    order as the conversion error itself (measured: 0.0027 on PP-OCRv4 rec's output, whose
    error is 0.01), so a pass/fail decision must be taken on the real kernels.
    """

    compiled: CompiledModel
    output_names: list[str]
    probes: list[Probe]
    skipped: collections.Counter[str]
    plain: CompiledModel | None = None

    def run(self, feeds: Mapping[str, np.ndarray], *,
            with_outputs: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(model outputs, probed tensors); ``with_outputs=False`` skips the run of ``plain`` and
        returns no outputs (a caller that has them from ``plain`` already)."""
        values = self.compiled.run(feeds)
        outputs: dict[str, np.ndarray] = {}
        if with_outputs:
            outputs = self.outputs(self.plain.run(feeds) if self.plain is not None else values)
        probed = {p.tensor: values[f"probe:{p.tensor}"] for p in self.probes}
        return outputs, probed

    def outputs(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model outputs among a run's ``values``, as float32."""
        return {name: _as_float32(values[name]) for name in self.output_names}


def compile_probed(
    mod: Any,
    decisions: Sequence[Decision],
    prepared: onnx.ModelProto,
    provenance: Mapping[str, NodeOrigin],
    inputs: Sequence[TensorSpec],
    output_names: Sequence[str],
    dtype: str,
    target_spec: dict[str, Any],
    device: str = "cpu",
    *,
    beside: bool = False,
    kernels: Any = None,
) -> ProbedModel:
    """Plan probes on the rewritten ``mod``, expose them and compile the probe module; with
    ``beside``, the probed function is compiled next to the untouched ``main`` (one compile,
    both sets of kernels) and outputs come from ``main``. ``kernels``: a KernelCache shared with
    the other probe builds of a search (``compiler.kernel_cache``)."""
    probes, skipped = plan_probes(prepared, mod, provenance, decisions, dtype)
    names = list(dict.fromkeys(p.var for p in probes))
    entry = _PROBE_ENTRY if beside else "main"
    try:
        # Beside main, the probed copy's own kernels only rank nodes: compiled for less (split_codegen.codegen).
        executable = compiler.compile_module(expose_bindings(mod, names, entry), target_spec, kernels=kernels,
                                             secondary=entry if beside else None)
    except Exception as err:
        raise RuntimeError(f"TVM failed to compile the probe module: {error_summary(err, last=True)}") from err
    by_var = {p.var: p for p in probes}
    # Each var is exposed once (mapping gives one var per node output; this only guards it).
    probes = [by_var[name] for name in names]
    vm = _tvm.vm_from_executable(executable, device)
    input_names, input_dtypes = [s.name for s in inputs], [s.dtype for s in inputs]
    compiled = CompiledModel(
        vm=_Entry(vm, entry) if beside else vm,
        input_names=input_names,
        output_names=[*output_names, *(f"probe:{p.tensor}" for p in probes)],
        device=device,
        input_dtypes=input_dtypes,
    )
    plain = CompiledModel(vm, input_names, list(output_names), device, input_dtypes) if beside else None
    return ProbedModel(compiled, list(output_names), probes, skipped, plain)


_PROBE_ENTRY = "main_probe"


class _Entry:
    """A VM whose ``main`` is another function of the executable (the runner calls ``main``)."""

    def __init__(self, vm: Any, name: str) -> None:
        self._vm, self._name = vm, name

    def __getitem__(self, key: str) -> Any:
        return self._vm[self._name if key == "main" else key]


def _as_float32(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind == "V" or str(array.dtype) in ("bfloat16", "float16"):
        return array.astype(np.float32)
    return array
