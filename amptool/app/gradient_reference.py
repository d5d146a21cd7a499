"""The reference for models with ONNX ``Gradient`` nodes: central finite differences in float64.

onnxruntime's default build cannot run the training domain, so ``diff`` cannot ask it for
gradients. Finite differences need nothing but the forward graph: for every element ``i`` of
every ``x`` in ``xs``, ``(f(x + h·e_i) − f(x − h·e_i)) / 2h`` with ``f = sum(y)`` (see
``frontend.gradient`` for why the sum) evaluated by onnx's reference evaluator on a float64
copy of the forward graph. With ``h = ε^(1/3)·max(1, |x_i|)`` the truncation (O(h²)) and
rounding (O(ε/h)) errors are both ~1e-11 relative — far below fp32 rounding, so the
reference is exact for comparing a float32 or float16 build.

The other outputs come from onnxruntime float32 on the forward graph, as for any model.
Outputs computed *from* a gradient (an optimizer step) have no reference here: that is a
user error naming the output, with --reference-outputs as the way out.

Cost: two forward evaluations per element of ``xs``, capped at ``MAX_ELEMENTS``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amptool.errors import UserError
from amptool.frontend.gradient import GradientSpec, check_gradients, forward_model, forward_only

#: Elements of xs (summed over a node's xs) the finite differences may perturb.
MAX_ELEMENTS = 20_000
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
_HINT = "Compare against stored gradients with --reference-outputs."


class GradientReference:
    """Same interface as ``OnnxruntimeRunner``: ``run(feeds) → {output: array}``."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from amptool.frontend.prepare import reference_model  # noqa: PLC0415
        from amptool.runtime.onnxruntime_runner import OnnxruntimeRunner  # noqa: PLC0415

        self.model = model
        self.specs = list(check_gradients(model).values())
        forward = forward_only(model)
        kept = {o.name for o in forward.graph.output}
        grads = {o for s in self.specs for o in s.outputs if o}
        for output in model.graph.output:
            if output.name not in kept and output.name not in grads:
                raise UserError(f"Output '{output.name}' is computed from a Gradient output; the "
                                "finite-difference reference covers gradients themselves only", _HINT)
        known = {v.name for v in forward.graph.input} | {t.name for t in forward.graph.initializer}
        known |= {o for n in forward.graph.node for o in n.output}
        for spec in self.specs:
            late = [name for name in spec.inputs if name not in known]
            if late:
                raise UserError(f"Gradient '{spec.node}' is evaluated at '{late[0]}', which is computed from a "
                                "Gradient output; the finite-difference reference cannot follow it", _HINT)
        self.output_names = [o.name for o in model.graph.output]
        self._ort = OnnxruntimeRunner(reference_model(forward)) if kept else None
        self._forward64 = as_float64(forward)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs: dict[str, np.ndarray] = self._ort.run(feeds) if self._ort is not None else {}
        needed = sorted({name for s in self.specs for name in s.inputs})
        values = _values64(self._forward64, feeds, needed)
        for spec in self.specs:
            at = {name: values[value] for name, value in zip((*spec.xs, *spec.zs), spec.inputs, strict=True)}
            grads = finite_difference_gradients(self.model, spec, at)
            outputs.update({name: g for name, g in zip(spec.outputs, grads) if name})
        return outputs


def finite_difference_gradients(model: onnx.ModelProto, spec: GradientSpec,
                                values: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """d sum(y) / d x for each x in ``spec.xs`` at ``values`` (xs and zs), in float64."""
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    args = {name: np.asarray(values[name]) for name in (*spec.xs, *spec.zs)}
    total = sum(args[x].size for x in spec.xs)
    if total > MAX_ELEMENTS:
        raise UserError(f"Gradient '{spec.node}': xs hold {total} elements; the finite-difference "
                        f"reference evaluates the forward graph twice per element (limit {MAX_ELEMENTS})", _HINT)
    types = [(helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for a in args.values()]
    evaluator = ReferenceEvaluator(as_float64(forward_model(model, spec, types)), new_ops=_float64_ops())

    def f(current: dict[str, np.ndarray]) -> float:
        outputs: Any = evaluator.run(None, current)
        return float(np.asarray(outputs[0], dtype=np.float64).sum())

    grads = []
    for x in spec.xs:
        base = args[x]
        grad = np.zeros(base.shape, dtype=np.float64)
        flat, out = base.reshape(-1), grad.reshape(-1)
        for i in range(flat.size):
            h = np.cbrt(np.finfo(np.float64).eps) * max(1.0, abs(float(flat[i])))
            plus, minus = flat.copy(), flat.copy()
            plus[i] += h
            minus[i] -= h
            up = f({**args, x: plus.reshape(base.shape)})
            down = f({**args, x: minus.reshape(base.shape)})
            out[i] = (up - down) / (2 * h)
        grads.append(grad)
    return grads


def _values64(forward: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """``names`` (graph inputs, initializers or intermediate tensors) in float64."""
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    feeds64 = {k: _up(np.asarray(v)) for k, v in feeds.items()}
    weights = {t.name: numpy_helper.to_array(t) for t in forward.graph.initializer}
    values = {n: feeds64[n] if n in feeds64 else weights[n] for n in names if n in feeds64 or n in weights}
    rest = [n for n in names if n not in values]
    if rest:
        inputs = {v.name for v in forward.graph.input}
        evaluator = ReferenceEvaluator(forward, new_ops=_float64_ops())
        found = evaluator.run(rest, {k: v for k, v in feeds64.items() if k in inputs})
        values.update(zip(rest, (np.asarray(v) for v in found), strict=True))
    return values


def _float64_ops() -> list[Any]:
    """Reference-evaluator ops that otherwise round to float32 inside (onnx 1.x's Erf computes
    ``math.erf`` into float32): at ε^(1/3) steps that rounding is a 1e-2 error in the derivative."""
    from onnx.reference.ops._op import OpRunUnaryNum  # noqa: PLC0415

    erf = np.vectorize(math.erf, otypes=[np.float64])

    class Erf(OpRunUnaryNum):
        def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
            return (erf(x).astype(x.dtype),)

    return [Erf]


def _up(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "f" or array.dtype.kind == "V" else array


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy computing in float64: float tensors, constants and Cast targets become double."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _graph64(out.graph)
    return out


def _graph64(graph: onnx.GraphProto) -> None:
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type in _FLOATS:
            value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type in _FLOATS:
            graph.initializer[i].CopyFrom(_tensor64(tensor))
    for node in graph.node:
        for attr in node.attribute:
            _attribute64(node, attr)


def _attribute64(node: onnx.NodeProto, attr: onnx.AttributeProto) -> None:
    if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _FLOATS:
        attr.t.CopyFrom(_tensor64(attr.t))
    elif attr.type == onnx.AttributeProto.GRAPH:
        _graph64(attr.g)
    elif attr.type == onnx.AttributeProto.GRAPHS:
        for sub in attr.graphs:
            _graph64(sub)
    elif node.op_type == "Cast" and attr.name == "to" and attr.i in _FLOATS:
        attr.i = onnx.TensorProto.DOUBLE
    elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
        values: Any = attr.f if attr.name == "value_float" else list(attr.floats)
        attr.CopyFrom(helper.make_attribute("value", numpy_helper.from_array(np.asarray(values, dtype=np.float64))))


def _tensor64(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
