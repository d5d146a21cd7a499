"""Whether onnxruntime's basic-level folding session could still change a graph in a way that matters.

prepare opens that session (graph optimisation "basic", the optimised model written and parsed again)
for what it folds: constant and shape chains the TVM importer cannot take, function ops expanded,
BatchNorm and constant scales merged into the Conv before them in float32. On a ResNet-50 it costs ~1 s
of wall time and ~2 s of CPU (with the check-numerics session it brings). Once amptool's own folder has
run (constants, Shapes, decided Ifs) and folded each Conv → BatchNorm pair (``conv_batchnorm``), a graph
of plain ops left nothing the session would change but fusions that are only about onnxruntime's own
speed (Pad into Conv, Relu into Clip, Identity removed): ``folding_needed`` says when that is so.

It is a list of ops, not a model of onnxruntime's optimiser: an op not listed, a domain other than
ONNX's, a local function or anything still foldable sends the model through the session as before.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import numpy_helper

from amptool.frontend.graph import STANDARD_DOMAINS, iter_nodes
from amptool.frontend.unroll_body import constant_value

#: Standard ops that onnxruntime runs with a kernel of its own (never expanded as a function) and that
#: its basic level rewrites only for its own speed. Control flow, shape ops (Shape, Size,
#: ConstantOfShape, Range, Expand) and the quantized ops are left out on purpose.
PLAIN_OPS = frozenset({
    "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant", "Conv",
    "ConvTranspose", "DepthToSpace", "Div", "Dropout", "Elu", "Erf", "Exp", "Flatten", "Gather", "Gemm",
    "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "LRN", "MatMul", "Max", "MaxPool", "Mean", "Min",
    "Mul", "Neg", "Pad", "Pow", "PRelu", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum",
    "Relu", "Reshape", "Resize", "Selu", "Sigmoid", "Slice", "Softmax", "Softplus", "Softsign",
    "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Transpose", "Unsqueeze", "Upsample",
    # Comparisons, selections and gathers (a transformer export's masks and embeddings: BERT's Where,
    # IsNaN, Expand and GatherElements sent a 440 MB model through the session, ~9 s of a 22 s convert),
    # and ops onnxruntime runs with a kernel and its basic level leaves alone.
    "And", "ArgMax", "ArgMin", "Ceil", "Cos", "CumSum", "Einsum", "Equal", "Expand", "Floor", "GatherElements",
    "GatherND", "Greater", "GreaterOrEqual", "GRU", "IsInf", "IsNaN", "Less", "LessOrEqual", "LSTM", "Mod", "Not",
    "OneHot", "Or", "ReduceL2", "ReduceProd", "ReduceSumSquare", "RNN", "Round", "ScatterElements", "ScatterND",
    "GridSample", "Sign", "Sin", "Tile", "TopK", "Trilu", "Where", "Xor",
})

#: onnxruntime's basic level merges a constant scale or shift into the weights of the op before it
#: (ConvMulFusion, ConvAddFusion, ConvBNFusion, MatmulBNFusion): in float32, which matters once the
#: graph runs in float16, so such a pair keeps the session. (Its MatMul + Add → Gemm computes the same.)
_MERGED_INTO = {
    "Conv": frozenset({"Add", "Sub", "Mul", "Div", "BatchNormalization"}),
    "ConvTranspose": frozenset({"Add", "Sub", "Mul", "Div", "BatchNormalization"}),
    "Gemm": frozenset({"BatchNormalization"}),
    "MatMul": frozenset({"BatchNormalization"}),
}


def folding_needed(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime's folding session may still change ``model`` (its first node that says so), or
    None when it could not change what the importer or the float16 rewrite sees."""
    if model.functions:
        return f"local function {model.functions[0].name}"
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    constants.update(node.output[0] for node in graph.node if node.op_type == "Constant" and node.output)
    producers = {out: node for node in graph.node for out in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    readers.update(out.name for out in graph.output)
    for node in graph.node:
        label = f"{node.op_type} node {node.name or (node.output[0] if node.output else '')}".rstrip()
        if node.domain not in STANDARD_DOMAINS or node.op_type not in PLAIN_OPS:
            return label
        if node.op_type == "Constant" and constant_value(node) is None:
            return f"{label} (a sparse or string value)"
        if node.op_type != "Constant" and node.input and all(name in constants for name in node.input if name):
            return f"{label} (constant inputs left unfolded)"
        if _scales_weights(node, producers, readers, constants):
            return f"{label} (a constant scale onnxruntime merges into the weights before it)"
    return None


def _scales_weights(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], readers: Counter[str],
                    constants: set[str]) -> bool:
    """``node`` reads the only output of an op it would be merged into (``_MERGED_INTO``) and, besides
    it, only constants."""
    for position, name in enumerate(node.input):
        source = producers.get(name)
        if source is None or node.op_type not in _MERGED_INTO.get(source.op_type, ()) or readers[name] != 1:
            continue
        others = [other for i, other in enumerate(node.input) if i != position and other]
        if all(other in constants for other in others):
            return True
    return False


def constants_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Constant node of its main graph an initializer, as onnxruntime's saved model
    has them (TVM's importer takes a Constant's ``value`` only: ``value_ints``, ``value_float`` … are
    refused); ``model`` itself when it has none, else a copy. Call after ``folding_needed`` said None
    (every Constant's value is then readable)."""
    if not any(node.op_type == "Constant" for node in model.graph.node):
        return model
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    graph = converted.graph
    read = {name for node in iter_nodes(graph) for name in node.input} | {out.name for out in graph.output}
    kept = []
    for node in graph.node:
        value = constant_value(node) if node.op_type == "Constant" else None
        if value is None:
            kept.append(node)
        elif node.output[0] in read:  # a Constant nothing reads (left by folding) goes
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    return converted
