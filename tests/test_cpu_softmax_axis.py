"""Softmax over a middle axis moved last (``amptool.compiler.cpu_softmax_axis``): onnxruntime's
values for Softmax/LogSoftmax over every axis, and the permuted form only where elements follow
the axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from tests.conftest import staged_module
from tests.onnx_checks import assert_close_to_onnxruntime, save_node_model

SHAPE = [1, 16, 4, 35]  # a YOLOv8 box decode's [1, bins, 4, anchors], fewer anchors


def _model(tmp_path: Path, op: str, axis: int, shape: list[int] = SHAPE) -> tuple[str, dict[str, np.ndarray]]:
    x = (np.random.default_rng(7).standard_normal(shape) * 4).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    return save_node_model(tmp_path / "model.onnx", node, {"x": x}, {}), {"x": x}


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_matches_onnxruntime_on_every_axis(tmp_path: Path, op: str, axis: int) -> None:
    path, feeds = _model(tmp_path, op, axis)
    assert_close_to_onnxruntime(path, feeds)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision(tmp_path: Path, dtype: str) -> None:
    path, feeds = _model(tmp_path, "Softmax", 1)
    assert_close_to_onnxruntime(path, feeds, dtype)


@pytest.mark.parametrize(("axis", "shape", "moved"), [
    (1, SHAPE, True),  # 140 elements after the bins: rows made contiguous
    (-1, SHAPE, False),  # the last axis already
    (1, [1, 10, 1, 1], False),  # nothing after the axis: its rows are contiguous as they are
])
def test_only_strided_rows_are_moved_last(tmp_path: Path, axis: int, shape: list[int], moved: bool) -> None:
    path, _ = _model(tmp_path, "Softmax", axis, shape)
    script = staged_module(path, "float32", "layout")["main"].script()
    assert ("R.nn.softmax(lv, axis=-1)" in script) == moved, script
    assert script.count("R.permute_dims") == (2 if moved else 0), script
