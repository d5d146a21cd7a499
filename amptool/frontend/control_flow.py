"""``If`` nodes whose condition is only known at run time, one branch of which does not type.

TVM's ONNX frontend imports both branches of an ``If`` (their nodes are computed eagerly, the
``relax.If`` only selects), so a branch that is ill-typed at the pinned input shapes — a
voice-activity detector's ``If(sr == 16000)`` whose 8 kHz branch reshapes 256 samples when 512
are pinned — fails the whole import. onnxruntime imports it and fails only if that branch is
taken. amptool does the same: the branch that types is imported; the other becomes a branch that
raises at run time (``assert_op``, its message marked with ``errors.BRANCH_RAISE_MARKER`` so the runtime can
tell it from a crash), with the sibling's value as its nominal result so the two branches' types
agree by construction — through mixed precision too. A warning names the ``If`` and the graph
inputs its condition depends on. When both branches fail, the import fails as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from amptool.errors import BRANCH_RAISE_MARKER, UserError, error_summary

log = logging.getLogger(__name__)



@dataclass
class _IfNode:
    name: str
    condition: str
    branches: dict[str, onnx.GraphProto]  # "then_branch"/"else_branch" → body
    deciding_inputs: list[str]


@dataclass
class BranchImporter:
    """Wraps the frontend's branch conversion: a branch that fails becomes one that raises."""

    model: onnx.ModelProto
    warnings: list[str] = field(default_factory=list)
    _ifs: list[_IfNode] = field(default_factory=list)
    _done: dict[tuple[str, str], Any] = field(default_factory=dict)
    _trial: bool = False  # inside a trial import (scope): warnings are neither logged nor kept

    def __post_init__(self) -> None:
        self._ifs = list(_if_nodes(self.model))

    def convert(self, graph: onnx.GraphProto, convert: Callable[[onnx.GraphProto], Any]) -> Any:
        """``convert(graph)``, or — when it fails and ``graph`` is one branch of an ``If`` whose
        other branch converts — a raising branch typed like the other."""
        owner = self._owner(graph)
        if owner is not None and owner[1] in self._done_for(owner[0]):
            return self._done_for(owner[0])[owner[1]]  # converted already, as a failing sibling's partner
        try:
            result = convert(graph)
        except Exception as err:
            if owner is None:
                raise
            node, branch = owner
            other = "else_branch" if branch == "then_branch" else "then_branch"
            sibling = self._done_for(node).get(other)
            if sibling is None:
                try:
                    sibling = convert(node.branches[other])
                except Exception:  # noqa: BLE001 - both branches fail: the first failure is the one to report
                    if not node.deciding_inputs:
                        raise err from None
                    raise UserError(f"If '{node.name}': neither branch types at these input shapes; "
                                    f"{branch.split('_')[0]} branch: {_reason(err)}",
                                    _pin_hint(node.deciding_inputs)) from None
                self._done[(node.name, other)] = sibling
            reason = _reason(err)
            warning = (
                f"If '{node.name}': its {branch.split('_')[0]} branch does not type at these input shapes "
                f"({reason}); it raises at run time if taken. The branch taken is decided by "
                f"{_names(node.deciding_inputs)}."
            )
            self.warnings.append(warning)
            if not self._trial:
                log.warning("%s", warning)
            result = raising_branch(sibling, f"{BRANCH_RAISE_MARKER}: If '{node.name}' {branch.split('_')[0]} branch "
                                             f"({reason[:200]})")
        if owner is not None:
            self._done[(owner[0].name, owner[1])] = result
        return result

    @contextlib.contextmanager
    def scope(self, keep_warnings: bool = True) -> Iterator[None]:
        """Branches converted inside are reused only inside: a Loop body is imported once per
        function it goes into (loop_function.py), each with its own variables. ``keep_warnings``
        False: the warnings of a trial import are dropped with it."""
        done, warned, trial = self._done, len(self.warnings), self._trial
        self._done, self._trial = {}, trial or not keep_warnings
        try:
            yield
        finally:
            self._done, self._trial = done, trial
            if not keep_warnings:
                del self.warnings[warned:]

    def _done_for(self, node: _IfNode) -> dict[str, Any]:
        return {branch: value for (name, branch), value in self._done.items() if name == node.name}

    def _owner(self, graph: onnx.GraphProto) -> tuple[_IfNode, str] | None:
        for node in self._ifs:
            for branch, body in node.branches.items():
                if body is graph or (body.name == graph.name and body == graph):
                    return node, branch
        return None


def raising_branch(nominal: Any, message: str) -> Any:
    """A branch body that fails with ``message`` when run; typed as ``nominal`` (a value of the
    outer scope, never returned because the assertion fires first)."""
    from tvm import relax  # noqa: PLC0415

    check = relax.Var("branch_check", relax.TupleType([]))
    never = relax.op.assert_op(relax.const(False, "bool"), format=message)
    return relax.SeqExpr([relax.BindingBlock([relax.VarBinding(check, never)])], nominal)


def _if_nodes(model: onnx.ModelProto) -> list[_IfNode]:
    producers = _producers(model.graph)
    graph_inputs = {value.name for value in model.graph.input}
    found: list[_IfNode] = []

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            bodies = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
            if node.op_type == "If" and node.input:
                found.append(_IfNode(node.name or node.output[0], node.input[0], bodies,
                                     _inputs_behind(node.input[0], producers, graph_inputs)))
            for body in bodies.values():
                walk(body)

    walk(model.graph)
    return found


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output if out}


def _inputs_behind(tensor: str, producers: dict[str, onnx.NodeProto], graph_inputs: set[str]) -> list[str]:
    """The graph inputs ``tensor`` is computed from (top-level graph; names in first-seen order)."""
    found: list[str] = []
    frontier, seen = [tensor], {tensor}
    while frontier:
        name = frontier.pop()
        if name in graph_inputs and name not in found:
            found.append(name)
        node = producers.get(name)
        for source in node.input if node is not None else ():
            if source and source not in seen:
                seen.add(source)
                frontier.append(source)
    return found


def _names(inputs: list[str]) -> str:
    if not inputs:
        return "values computed inside the model"
    return "input " + ", ".join(repr(n) for n in inputs)


def _pin_hint(inputs: list[str]) -> str:
    flags = " ".join(f"--fixed-input {name}=VALUE" for name in inputs)
    return f"{_names(inputs).capitalize()} decides which branch runs: pin it with {flags}, and the If folds away."


def _reason(err: Exception) -> str:
    return err.message if isinstance(err, UserError) else error_summary(err, last=True)
