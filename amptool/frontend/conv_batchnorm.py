"""Fold an inference BatchNormalization into the Conv before it, in float64, written back as float32.

Why amptool does it itself: the fold is what makes a BatchNorm with a running variance of ~1e8 safe
in float16 (the scale lands in the fp32 weights, never in a half-precision tensor), and onnxruntime's
basic-level session, which did it before, costs a ResNet-50 convert ~1 s of wall time and ~2 s of CPU
(opening the session, writing and parsing 100 MB again; measured) on graphs where it folds nothing
else. With BatchNorm folded here, such a graph needs no onnxruntime session at all (``ort_folding``).

The arithmetic is onnxruntime's ConvBNFusion's: ``s = scale / sqrt(var + eps)``, ``W' = W · s`` per
output channel, ``b' = (b − mean) · s + bias``; done in float64, so the result is the exact product
rounded once to float32.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from amptool.frontend.fold import copy_fields
from amptool.frontend.graph import STANDARD_DOMAINS, Names, all_names, iter_nodes
from amptool.frontend.unroll_body import attr_int, constant_value


def fold_conv_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each foldable Conv → BatchNormalization pair of its main graph made one Conv, and
    how many were folded; ``model`` itself (not a copy) when none was. The copy shares nothing with
    ``model``, whose weights it copies only where they are still read (a ResNet-50's folded Conv
    weights are not copied and then dropped: 0.45 → 0.15 s, measured)."""
    graph = model.graph
    constants = _Constants(graph)
    producers = {out: node for node in graph.node for out in node.output}
    uses = Counter(name for node in iter_nodes(graph) for name in node.input)  # subgraphs read too
    uses.update(out.name for out in graph.output)
    pairs = [(producers[bn.input[0]], bn) for bn in graph.node
             if bn.op_type == "BatchNormalization" and bn.input and bn.input[0] in producers
             and _foldable(producers[bn.input[0]], bn, constants, uses)]
    if not pairs:
        return model, 0
    folded = onnx.ModelProto()
    copy_fields(model, folded, skip="graph")
    copy_fields(graph, folded.graph, skip="initializer")
    by_output = {node.output[0]: node for node in folded.graph.node if node.output}
    names = Names(all_names(graph))
    for conv, bn in pairs:
        weight, bias = _folded_parameters(conv, bn, constants)
        weight_name = names.fresh(f"{conv.input[1]}_bn")
        bias_name = names.fresh(f"{conv.name or conv.output[0]}_bn_bias")
        _add_initializer(folded.graph, weight_name, weight)
        _add_initializer(folded.graph, bias_name, bias)
        copied = by_output[conv.output[0]]
        del copied.input[1:]
        copied.input.extend([weight_name, bias_name])
        copied.output[0] = bn.output[0]
    _drop_folded(folded.graph, {bn.output[0] for _, bn in pairs}, graph.initializer)
    return folded, len(pairs)


def _drop_folded(graph: onnx.GraphProto, batchnorms: set[str], initializers: Any) -> None:
    """Remove the folded BatchNorm nodes (by output) from ``graph``, and the Constant nodes nothing reads
    any more; copy into it the ``initializers`` (the original's) that are still read."""
    kept = [node for node in graph.node if not (node.op_type == "BatchNormalization" and node.output[0] in batchnorms)]
    del graph.node[:]
    graph.node.extend(kept)
    read = {name for node in iter_nodes(graph) for name in node.input} | {out.name for out in graph.output}
    for index in reversed(range(len(graph.node))):
        node = graph.node[index]
        if node.op_type == "Constant" and not any(out in read for out in node.output):
            del graph.node[index]
    graph.initializer.extend(init for init in initializers if init.name in read)


def _add_initializer(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    """A float32 initializer written in place (``numpy_helper.from_array`` and ``extend`` copy twice more)."""
    tensor = graph.initializer.add()
    tensor.name = name
    tensor.data_type = onnx.TensorProto.FLOAT
    tensor.dims.extend(value.shape)
    tensor.raw_data = np.ascontiguousarray(value, dtype="<f4").tobytes()


def _folded_parameters(conv: onnx.NodeProto, bn: onnx.NodeProto,
                       constants: _Constants) -> tuple[np.ndarray, np.ndarray]:
    """The Conv's weight and bias with ``bn`` applied: the per-channel factor and the bias in float64,
    the weights' products in float32 (onnxruntime's ConvBNFusion computes all in float32)."""
    weight = constants[conv.input[1]]
    bias = (constants[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2]
            else np.zeros(weight.shape[0]))
    scale, shift, mean, var = (constants[name].astype(np.float64) for name in bn.input[1:5])
    epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    factor = scale / np.sqrt(var + epsilon)
    folded_weight = weight * factor.astype(np.float32).reshape((-1,) + (1,) * (weight.ndim - 1))
    folded_bias = (bias - mean) * factor + shift
    return folded_weight.astype(np.float32, copy=False), folded_bias.astype(np.float32)


def _foldable(conv: onnx.NodeProto, bn: onnx.NodeProto, constants: _Constants, uses: Counter[str]) -> bool:
    """A Conv whose only reader is an inference-mode, per-channel BatchNorm, all parameters float32
    constants of matching sizes."""
    if conv.op_type != "Conv" or conv.domain not in STANDARD_DOMAINS or bn.domain not in STANDARD_DOMAINS:
        return False
    if len(conv.output) != 1 or uses[conv.output[0]] != 1 or len(bn.output) != 1 or len(bn.input) != 5:
        return False
    if attr_int(bn, "training_mode", 0) or not attr_int(bn, "spatial", 1):
        return False
    if len(conv.input) < 2 or not all(name in constants for name in [*conv.input[1:], *bn.input[1:]] if name):
        return False
    weight = constants.shape(conv.input[1])
    if weight is None or len(weight) < 3:
        return False
    vectors = [name for name in [*conv.input[2:], *bn.input[1:]] if name]
    return (all(constants.shape(name) == (weight[0],) for name in vectors)
            and all(constants.is_float32(name) for name in [conv.input[1], *vectors]))


class _Constants:
    """The initializers and Constant outputs of a graph, by name; values converted only when asked."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._tensors = {init.name: init for init in graph.initializer
                         if init.data_location != onnx.TensorProto.EXTERNAL}
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS and len(node.output) == 1:
                value = constant_value(node)
                if value is not None:
                    self._tensors[node.output[0]] = numpy_helper.from_array(value, node.output[0])

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...] | None:
        tensor = self._tensors.get(name)
        return None if tensor is None else tuple(tensor.dims)

    def is_float32(self, name: str) -> bool:
        return self._tensors[name].data_type == onnx.TensorProto.FLOAT

    def __getitem__(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self._tensors[name])
