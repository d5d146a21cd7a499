"""Import an ONNX graph into a Relax IRModule, each binding named after its ONNX node.

TVM's ONNX frontend names every binding ``lv…``, so nothing downstream can say which ONNX
node a value came from — yet per-node colour overrides and layer-wise error reports need
exactly that. The one isolated place that fixes it is ``_ProvenanceImporter``: it wraps
the frontend's converter dispatch, binds each node's result to a variable named after the
node (sanitised to an identifier), and records ``var name → (ONNX node, op type)``.
Helper bindings a converter emits on the way (Gemm's transpose, a bias reshape) belong to
the node whose result follows them; ``attribute_bindings`` derives that after import.

Unsupported ops are found up front — all of them, with counts and node names — rather than
one at a time deep inside the frontend. Any converter failure is re-raised as a user
error naming the node.
"""

from __future__ import annotations

import collections
import contextlib
import io
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from amptool import _tvm
from amptool.dtypes import SMALL_INT_CONTAINERS
from amptool.errors import UserError, error_summary
from amptool.frontend.control_flow import BranchImporter
from amptool.frontend.converters import CONVERTERS
from amptool.frontend.detection import name_unknown_dims, shape_value_producers
from amptool.frontend.gradient import check_gradients, is_gradient
from amptool.frontend.gradient_lower import lower_gradient
from amptool.frontend.graph import STANDARD_DOMAINS, Names, default_opset, identifier, iter_nodes
from amptool.frontend.index_bounds import guard_run_time_values
from amptool.frontend.loop_function import LoopFunctions, convert_loop
from amptool.frontend.narrow_casts import check_narrow_types, small_int_rewrites
from amptool.frontend.shape_inputs import SHAPE_OPERANDS, fixed_input_hint, inputs_deciding_node
from amptool.frontend.signature import TensorSpec

#: Node types the frontend handles outside its converter map (Loop: loop_function.py, by the importer).
_DIRECT_OPS = frozenset({"If", "Constant", "Loop"})


@dataclass(frozen=True)
class NodeOrigin:
    """Where a Relax binding came from."""

    node: str
    op_type: str


@dataclass
class ImportedModel:
    mod: Any  # tvm.IRModule
    provenance: dict[str, NodeOrigin]  # binding var name → ONNX node
    tensors: dict[str, Any] = field(default_factory=dict)  # ONNX tensor → its Relax value


def supported_op_types() -> frozenset[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # noqa: PLC0415

    return frozenset(_get_convert_map()) | _DIRECT_OPS | frozenset(CONVERTERS)


def check_supported(model: onnx.ModelProto) -> None:
    """Raise one UserError listing every op without a converter, with counts and nodes."""
    supported = supported_op_types()
    missing: dict[str, list[str]] = collections.defaultdict(list)
    for node in iter_nodes(model.graph):
        if node.op_type not in supported and not is_gradient(node):  # Gradient: lowered by gradient.py
            label = node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"
            missing[label].append(node.name)
    if missing:
        parts = []
        for op, nodes in sorted(missing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = ", ".join(f"'{n}'" for n in nodes[:3]) + (", …" if len(nodes) > 3 else "")
            parts.append(f"{op} ×{len(nodes)} ({shown})")
        raise UserError(
            f"No converter for {len(missing)} op type(s): " + "; ".join(parts) + _loop_reasons(model, missing),
            "These ops cannot be imported into TVM Relax yet; replace them in the exporter "
            "or export with a different opset."
            + (" Scan converts once prepare can unroll it (sequence length known before run time)."
               if "Scan" in missing else ""),
        )


def _loop_reasons(model: onnx.ModelProto, missing: dict[str, list[str]]) -> str:
    """Why prepare left a Scan in place (it unrolls those with a known length; a Loop it leaves
    becomes a recursive function instead)."""
    if "Scan" not in missing:
        return ""
    from amptool.frontend.unroll import refusals  # noqa: PLC0415

    reasons = refusals(model)
    named = [n for n in missing["Scan"] if n in reasons]
    return "".join(f". Scan '{n}' is not unrolled: {reasons[n]}" for n in named[:3])


def import_model(model: onnx.ModelProto, inputs: Sequence[TensorSpec]) -> ImportedModel:
    """ONNX → Relax with static input shapes and named bindings."""
    check_supported(model)
    check_narrow_types(model)
    model = small_int_rewrites(model)
    importer = _make_importer(
        shape_dict={s.name: [int(d) for d in (s.shape or ())] for s in inputs},
        dtype_dict={s.name: SMALL_INT_CONTAINERS.get(s.dtype, s.dtype) for s in inputs},  # int4 arrives as int8
        model=model,
    )
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            mod = importer.from_onnx(model.graph, default_opset(model))
        except UserError:
            _close_blocks(importer.bb)
            raise
        except Exception as err:
            _close_blocks(importer.bb)
            raise UserError(
                f"Import into TVM Relax failed: {error_summary(err, last=True)}",
                "Pin input shapes with --input-shape; if it persists, the model uses a "
                "pattern the ONNX frontend does not handle.",
            ) from err
    mod = guard_run_time_values(importer._loops.add_to(mod))
    if importer._branches.warnings:  # a raising branch's assert_op is the only impure call
        mod["main"] = mod["main"].with_attr("relax.force_pure", True)
    provenance = attribute_bindings(mod, importer.named)
    return ImportedModel(mod=mod, provenance=provenance, tensors=dict(importer._nodes))


def _close_blocks(bb: Any) -> None:
    """End the blocks an aborted import left open, so TVM does not print "BlockBuilder
    destroyed with remaining blocks!" under the user's one-line error."""
    for _ in range(64):
        try:
            bb._end_block()
        except Exception:  # noqa: BLE001 - closing blocks until TVM says none is open: any error ends it
            return


def _make_importer(shape_dict: dict[str, list[int]], dtype_dict: dict[str, str], model: onnx.ModelProto) -> Any:
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter  # noqa: PLC0415

    class _ProvenanceImporter(ONNXGraphImporter):
        def __init__(self) -> None:
            super().__init__(shape_dict, dtype_dict, keep_params_in_input=False, sanitize=True)
            self.named: dict[str, NodeOrigin] = {}
            self._names = Names(set())
            self._gradients = check_gradients(model)  # Gradient node name → what it differentiates
            self._branches = BranchImporter(model)  # If branches that do not type raise at run time
            self._shape_tensors = shape_value_producers(model)  # shape values read by ops that need tensors
            self._loops = LoopFunctions()  # Loops left to run time: recursive functions

        def _check_for_unsupported_ops(self, graph: Any) -> None:
            """Done already, and better, by ``check_supported`` — which also knows amptool's
            own converters (the frontend's check would reject LSTM/GRU)."""

        def _convert_operator(self, op_name: str, inputs: Any, attrs: dict, opset: int) -> Any:
            node_name = str(attrs.get("tvm_custom", {}).get("name", "") or op_name)
            inputs = _empty_as_constants(inputs, SHAPE_OPERANDS.get(op_name, {}))
            inputs = name_unknown_dims(self.bb, inputs, self._nodes)  # an If's result of data-dependent length
            try:
                if op_name == "Gradient" and node_name in self._gradients:
                    return self._gradient(node_name, list(inputs))
                if op_name == "Loop":
                    return convert_loop(self, node_name, list(inputs), attrs, self._loops)
                attrs.setdefault("tvm_custom", {})["opset"] = opset  # defaults that moved between opsets (DFT axis)
                result = CONVERTERS[op_name](self.bb, list(inputs), attrs) if op_name in CONVERTERS else None
                if result is None:  # not ours, or ours declined this instance
                    result = super()._convert_operator(op_name, inputs, attrs, opset)
                else:
                    result = self.bb.normalize(result)
            except UserError as err:
                deciding = inputs_deciding_node(model, node_name)
                if not deciding:
                    raise
                raise UserError(err.message, fixed_input_hint(deciding)) from err
            except Exception as err:
                deciding = inputs_deciding_node(model, node_name)
                if deciding:
                    hint = fixed_input_hint(deciding)
                elif _static_shapes(inputs):
                    hint = (f"Its inputs' shapes are all known and disagree with what {op_name} requires: check the "
                            "model with onnx.checker.check_model(model, full_check=True); if onnxruntime runs it, "
                            "please report it.")
                else:
                    hint = "Pin input shapes with --input-shape; dynamic shape chains are the usual cause."
                raise UserError(
                    f"Cannot import node '{node_name}' (op {op_name}): {error_summary(err, last=True)}", hint,
                ) from err
            return self._bind(result, node_name, op_name)

        def _convert_subgraph(self, bb: Any, graph: Any) -> Any:
            """An If branch; one that does not type at these shapes raises at run time (control_flow.py)."""
            parent = super()._convert_subgraph
            return self._branches.convert(graph, lambda body: parent(bb, body))

        def _gradient(self, node_name: str, inputs: list[Any]) -> Any:
            """A Gradient node needs its forward graph, not only its inputs: gradient.py lowers it."""
            spec = self._gradients[node_name]
            lowered = lower_gradient(self.bb, model, spec, inputs, self._names.fresh, import_model, self._nodes)
            self.named.update({var: NodeOrigin(*origin) for var, origin in lowered.named.items()})
            return lowered.outputs[0] if len(lowered.outputs) == 1 else relax.Tuple(lowered.outputs)

        def _bind(self, result: Any, node_name: str, op_type: str) -> Any:
            origin = NodeOrigin(node_name, op_type)
            if isinstance(result, relax.ShapeExpr) and node_name in self._shape_tensors:
                result = relax.op.shape_to_tensor(result)
            if isinstance(result, relax.Call):
                var = self.bb.emit(result, name_hint=self._names.fresh(identifier(node_name)))
                self.named[str(var.name)] = origin
                return var
            if isinstance(result, relax.Tuple):
                fields = []
                for i, item in enumerate(result.fields):
                    if isinstance(item, relax.Call):
                        item = self.bb.emit(item, name_hint=self._names.fresh(f"{identifier(node_name)}_{i}"))
                        self.named[str(item.name)] = origin
                    fields.append(item)
                return relax.Tuple(fields)
            if isinstance(result, relax.Var) and str(result.name) not in self.named:
                # The converter emitted its result itself: claim it if it is still anonymous.
                self.named.setdefault(str(result.name), origin)
            return result

    return _ProvenanceImporter()


def _static_shapes(inputs: Any) -> bool:
    """Every given input a tensor whose dims are all numbers (a failed conversion then cannot be a
    symbolic dim's doing)."""
    given = [value for value in inputs if value is not None]
    return bool(given) and all(_tvm.static_shape(value) is not None for value in given)


def _empty_as_constants(inputs: Any, positions: Any) -> Any:
    """Shape-deciding operands (``positions``) with a static zero-size shape as constants: an
    empty tensor has one possible value.

    Why: converters that need a value at import time (Reduce* axes, Split sizes) refuse a graph
    input, yet an input of shape [0] — "reduce over the default axes" — can only ever be empty.
    Only those operands: an empty *data* constant would reach the library, and TVM 0.27 writes an
    empty tensor into its constant pool that it cannot read back ("Invalid DLTensor file format")."""
    import numpy as np  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    items = list(inputs)
    changed = False
    for i, value in enumerate(items):
        if i not in positions or not isinstance(value, relax.Var):
            continue
        if not isinstance(getattr(value, "ty", None), relax.TensorType):
            continue
        dims = _tvm.static_shape(value)
        if dims is not None and 0 in dims:
            items[i] = relax.const(np.zeros(dims, dtype=str(value.ty.dtype)), str(value.ty.dtype))
            changed = True
    if not changed:
        return inputs
    return type(inputs)(items)  # the frontend's onnx_input: None past the end


def attribute_bindings(mod: Any, named: dict[str, NodeOrigin]) -> dict[str, NodeOrigin]:
    """Give every anonymous binding the origin of the next named binding in its block."""
    from tvm import relax  # noqa: PLC0415

    provenance = dict(named)
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in _blocks(func.body):
            pending: list[str] = []
            for binding in block.bindings:
                name = str(binding.var.name)
                if name in provenance:
                    for anon in pending:
                        provenance[anon] = provenance[name]
                    pending = []
                else:
                    pending.append(name)
    return provenance


def _blocks(expr: Any) -> Iterable[Any]:
    from tvm import relax  # noqa: PLC0415

    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            yield block
            for binding in block.bindings:
                if isinstance(binding.value, relax.If):
                    yield from _blocks(binding.value.true_branch)
                    yield from _blocks(binding.value.false_branch)

