"""ai.onnx.ml ``TreeEnsemble`` (opset 5): every tree walked to its full depth with gathers.

Why: TVM has no converter, and sklearn/LightGBM exports end in tree ensembles. Trees are constants,
so the walk is a fixed number of gather + compare steps over flattened node tables — no control flow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amptool import _tvm
from amptool.errors import UserError
from amptool.frontend.small_ops import _array, _node, _static

#: TreeEnsemble ``nodes_modes``: 0 ≤, 1 <, 2 ≥, 3 >, 4 ==, 5 !=, 6 member of a set
_TREE_MEMBER = 6


def convert_tree_ensemble(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """ai.onnx.ml TreeEnsemble (opset 5): every tree walked at once, one gather step per level. No TVM converter.

    Nodes and leaves share one index space (leaf j is node count + j, and a leaf leads to itself),
    so after as many steps as the deepest path each walk sits on its leaf; the leaves' weights are
    then summed, averaged, or min/max'ed per target (0 for a target no leaf gives, as onnxruntime).
    Sets of BRANCH_MEMBER nodes become NaN-padded rows (NaN equals nothing). post_transform NONE,
    SOFTMAX (1) and LOGISTIC (2), numbered as the spec does."""
    from tvm import relax  # noqa: PLC0415

    op, x = relax.op, inputs[0]
    name = _node(attrs, "TreeEnsemble")
    shape, dtype = _static(x, attrs, "TreeEnsemble"), _tvm.tensor_dtype(x) or "float32"
    post, aggregate = int(attrs.get("post_transform", 0)), int(attrs.get("aggregate_function", 1))
    if len(shape) != 2 or post not in (0, 1, 2) or aggregate not in (0, 1, 2, 3):
        raise UserError(f"TreeEnsemble node '{name}': input rank {len(shape)}, post_transform {post}, "
                        f"aggregate_function {aggregate} — amptool supports a [N, F] input, post_transform NONE, "
                        "SOFTMAX or LOGISTIC", "Apply the post transform after the node in the exporter.")
    tree = _TreeArrays(attrs)
    nodes, leaves = len(tree.splits), len(tree.weights)
    ids = np.arange(nodes + leaves, dtype=np.int64)
    walk_true = np.concatenate([np.where(tree.true_leaf, nodes + tree.true_id, tree.true_id), ids[nodes:]])
    walk_false = np.concatenate([np.where(tree.false_leaf, nodes + tree.false_id, tree.false_id), ids[nodes:]])
    roots = np.array([nodes + tree.true_id[r] if tree.true_leaf[r] and tree.false_leaf[r]
                      and tree.true_id[r] == tree.false_id[r] else r for r in tree.roots], dtype=np.int64)
    steps = _tree_depth(walk_true, walk_false, nodes, roots, name)

    def table(values: np.ndarray, fill: float, as_dtype: str) -> Any:  # per node, then a row per leaf
        padding = np.full((leaves, *values.shape[1:]), fill, dtype=values.dtype)
        return _array(np.concatenate([values, padding]), as_dtype)

    feature, split = table(tree.features, 0, "int64"), table(tree.splits, 0.0, dtype)
    mode, missing = table(tree.modes, 0, "int64"), table(tree.missing, 0, "bool")
    sets = table(tree.sets, np.nan, dtype) if tree.sets.shape[1] else None
    go_true, go_false = _array(walk_true), _array(walk_false)
    batch, count = shape[0], len(roots)
    at = bb.emit(op.broadcast_to(_array(roots.reshape(1, count)), [batch, count]))
    for _ in range(steps):
        value = bb.emit(op.gather_elements(x, bb.emit(op.take(feature, at, axis=0)), axis=1))  # [N, trees]
        threshold, how = bb.emit(op.take(split, at, axis=0)), bb.emit(op.take(mode, at, axis=0))
        tests = [op.less_equal(value, threshold), op.less(value, threshold), op.greater_equal(value, threshold),
                 op.greater(value, threshold), op.equal(value, threshold), op.not_equal(value, threshold)]
        result = relax.const(False)
        if sets is not None:
            members = bb.emit(op.take(sets, at, axis=0))  # [N, trees, set size]
            result = op.max(op.astype(op.equal(op.expand_dims(value, 2), members), "uint8"), axis=2)
            result = op.astype(result, "bool")
        for code in range(len(tests) - 1, -1, -1):
            result = op.where(op.equal(how, relax.const(code, "int64")), tests[code], result)
        result = op.logical_or(bb.emit(result), op.logical_and(op.isnan(value), op.take(missing, at, axis=0)))
        at = bb.emit(op.where(result, op.take(go_true, at, axis=0), op.take(go_false, at, axis=0)))
    leaf = bb.emit(op.subtract(at, relax.const(nodes, "int64")))
    weight = bb.emit(op.take(_array(tree.weights, dtype), leaf, axis=0))  # [N, trees]
    target = bb.emit(op.take(_array(tree.targets), leaf, axis=0))
    targets = int(attrs.get("n_targets", int(tree.targets.max(initial=-1)) + 1))
    hit = bb.emit(op.equal(op.expand_dims(target, 2), _array(np.arange(targets, dtype=np.int64))))
    weight = bb.emit(op.expand_dims(weight, 2))  # [N, trees, 1]: hit is [N, trees, targets]
    if aggregate in (0, 1):
        y = bb.emit(op.sum(op.where(hit, weight, relax.const(0.0, dtype)), axis=1))
        if aggregate == 0:
            y = bb.emit(op.divide(y, relax.const(float(count), dtype)))
    else:
        limit = np.finfo(np.dtype(dtype)).max if dtype in ("float32", "float64") else np.finfo(np.float16).max
        init = relax.const(float(limit if aggregate == 2 else -limit), dtype)
        pick = op.min if aggregate == 2 else op.max
        y = bb.emit(pick(op.where(hit, weight, init), axis=1))
        reached = op.astype(op.max(op.astype(hit, "uint8"), axis=1), "bool")  # a target no leaf gives is 0 (as
        y = bb.emit(op.where(reached, y, relax.const(0.0, dtype)))  # onnxruntime; onnx's reference: ∓max)
    if post == 1:
        return op.nn.softmax(y, axis=1)
    return op.sigmoid(y) if post == 2 else y


class _TreeArrays:
    """TreeEnsemble's attributes as numpy arrays, each set of a BRANCH_MEMBER node a NaN-padded row of ``sets``."""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.splits = _attr_array(attrs, "nodes_splits", np.float64)
        count = len(self.splits)
        self.features = _attr_array(attrs, "nodes_featureids", np.int64)
        self.modes = _attr_array(attrs, "nodes_modes", np.int64, np.zeros(count))
        self.true_id, self.false_id = (_attr_array(attrs, f"nodes_{b}nodeids", np.int64) for b in ("true", "false"))
        self.true_leaf, self.false_leaf = (_attr_array(attrs, f"nodes_{b}leafs", np.int64) != 0
                                           for b in ("true", "false"))
        self.missing = _attr_array(attrs, "nodes_missing_value_tracks_true", np.int64, np.zeros(count)) != 0
        self.weights = _attr_array(attrs, "leaf_weights", np.float64)
        self.targets = _attr_array(attrs, "leaf_targetids", np.int64)
        self.roots = _attr_array(attrs, "tree_roots", np.int64)
        flat = _attr_array(attrs, "membership_values", np.float64, np.zeros(0))
        groups: list[list[float]] = []  # one set per NaN-terminated run, in node order
        current: list[float] = []
        for value in flat:
            if np.isnan(value):
                groups.append(current)
                current = []
            else:
                current.append(value)
        width = max((len(g) for g in groups), default=0)
        self.sets = np.full((count, width), np.nan)
        for node, members in zip(np.flatnonzero(self.modes == _TREE_MEMBER), groups, strict=False):
            self.sets[node, :len(members)] = members


def _attr_array(attrs: dict[str, Any], name: str, dtype: Any, default: Any = None) -> np.ndarray:
    """An ints/floats/tensor attribute as a 1-D numpy array."""
    from onnx import TensorProto, numpy_helper  # noqa: PLC0415

    value = attrs.get(name, default)
    if value is None:
        raise UserError(f"TreeEnsemble has no attribute {name}", "Check the exporter's output.")
    if isinstance(value, TensorProto):
        value = numpy_helper.to_array(value)
    return np.asarray(value).reshape(-1).astype(dtype)


def _tree_depth(walk_true: np.ndarray, walk_false: np.ndarray, nodes: int, roots: np.ndarray, name: str) -> int:
    """The most branch steps from a root to a leaf (the walk's step count); refuses a cycle."""
    depth, level = 0, {int(r) for r in roots if r < nodes}
    while level:
        depth += 1
        if depth > nodes:
            raise UserError(f"TreeEnsemble node '{name}': its branches form a cycle", "Check the exporter's output.")
        level = {int(n) for i in level for n in (walk_true[i], walk_false[i]) if n < nodes}
    return depth


TREE_CONVERTERS: dict[str, Any] = {"TreeEnsemble": convert_tree_ensemble}
