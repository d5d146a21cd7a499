"""The ONNX backend node cases, regenerated from the installed onnx (the wheel no longer ships them).

``collect_testcases()`` builds each case's model and data in memory (no download); each is written
once to ``DIR/NAME/`` as ``model.onnx`` + ``data.pkl`` (pickle: inputs may be sequences or None),
so every worker process reads only the case it runs.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import onnx


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # the op type the case tests (its file in onnx/backend/test/case/node)
    path: str  # directory with model.onnx and data.pkl
    float_io: bool  # every input/output a tensor, at least one float32: worth a float16 run


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _op_of(name: str, model: onnx.ModelProto, schemas: list[str]) -> str:
    """The op a case tests: the longest op type its name starts with (expanded cases have many nodes)."""
    stem = _squash(name.removeprefix("test_"))
    best = max((s for s in schemas if stem.startswith(_squash(s))), key=len, default="")
    if best:
        return best
    return model.graph.node[0].op_type if model.graph.node else "?"


def _float_io(model: onnx.ModelProto) -> bool:
    kinds = [v.type for v in (*model.graph.input, *model.graph.output)]
    if not all(t.HasField("tensor_type") for t in kinds):
        return False
    return any(t.tensor_type.elem_type == onnx.TensorProto.FLOAT for t in kinds)


def generate(directory: str) -> list[Case]:
    """Write every node case under ``directory`` (reused when its index is already there)."""
    directory = os.path.abspath(directory)
    index = os.path.join(directory, "index.json")
    version = onnx.__version__
    if os.path.exists(index):
        with open(index) as f:
            saved = json.load(f)
        if saved.get("onnx") == version:  # paths are stored relative to the index: the directory may move
            return [Case(**{**c, "path": os.path.join(directory, c["path"])}) for c in saved["cases"]]
    from onnx.backend.test.case.node import collect_testcases  # noqa: PLC0415 - slow: only when generating

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        collected = collect_testcases()
    schemas = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")})
    cases = []
    for tc in collected:
        if tc.model is None or not tc.data_sets:
            continue
        path = os.path.join(directory, tc.name)
        os.makedirs(path, exist_ok=True)
        onnx.save(tc.model, os.path.join(path, "model.onnx"))
        inputs, outputs = tc.data_sets[0]
        with open(os.path.join(path, "data.pkl"), "wb") as f:
            pickle.dump({"inputs": list(inputs), "outputs": list(outputs)}, f)
        cases.append(Case(tc.name, _op_of(tc.name, tc.model, schemas), path, _float_io(tc.model)))
    tmp = index + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"onnx": version, "cases": [{**asdict(c), "path": c.name} for c in cases]}, f)
    os.replace(tmp, index)
    return cases
