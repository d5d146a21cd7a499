"""``dynamic_shares``: a CPU kernel's parallel loop with enough work is claimed segment by segment
from atomic counters — every iteration runs exactly once, whatever the extent — and small loops
keep TVM's static split."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from amptool import _tvm
from amptool.compiler import dynamic_shares, stack_tiles


def _add_one(extent: int, inner: int, first: int = 0):
    """Rows ``first`` … ``first + extent - 1`` of a ``(first + extent, inner)`` buffer each add one."""

    @T.prim_func
    def add_one(a: T.Buffer((first + extent, inner), "float32")):
        T.func_attr({"global_symbol": "add_one", "tirx.noalias": True})
        for i in T.parallel(first, first + extent):
            for j in range(inner):
                a[i, j] = a[i, j] + T.float32(1)

    return add_one


def _parallel_loops(func) -> list:
    loops: list = []

    def keep(loop):
        if loop.kind == tirx.ForKind.PARALLEL:
            loops.append(loop)
        return loop

    tvm_ffi.structural_map(func.body, (tirx.For, keep))
    return loops


@pytest.mark.parametrize(("extent", "inner", "first"), [(1000, 100, 0), (37, 5000, 0), (17, 8000, 3), (3, 40000, 0),
                                                         (2, 70000, 1), (224, 512, 0)])
def test_every_iteration_runs_once_per_call(extent, inner, first):
    """Uneven segments, a last piece shorter than the others, a loop not starting at zero, at two threads."""
    assert extent * inner >= dynamic_shares.MIN_WORK
    target = _tvm.make_target({"kind": "llvm"})
    lib = tvm.compile(tvm.IRModule({"add_one": _add_one(extent, inner, first)}), target=target,
                      tir_pipeline=stack_tiles.CPU_TIR_PIPELINE)
    assert "lock" in lib.mod.inspect_source("asm")  # the claims are atomic read-modify-writes
    data = tvm.runtime.tensor(np.zeros((first + extent, inner), np.float32))
    _tvm.set_num_threads(2)
    for _ in range(20):
        lib["add_one"](data)
    expected = np.zeros((first + extent, inner), np.float32)
    expected[first:] = 20
    np.testing.assert_array_equal(data.numpy(), expected)


def test_a_loop_with_work_becomes_segments_of_claimed_pieces():
    mod = dynamic_shares.DynamicShares(tvm.IRModule({"add_one": _add_one(224, 512)}))
    func = mod["add_one"]
    (loop,) = _parallel_loops(func)
    assert loop.extent.value == min(224, dynamic_shares.SEGMENTS)
    assert func.script().count("amptool_claim") == 2  # the first claim of a segment, and the next one after a piece


def test_a_small_loop_keeps_the_static_split():
    original = _add_one(64, 16)
    assert dynamic_shares.MIN_WORK > 64 * 16
    mod = dynamic_shares.DynamicShares(tvm.IRModule({"add_one": original}))
    assert "amptool_claim" not in mod["add_one"].script()
    assert _parallel_loops(mod["add_one"])[0].extent.value == 64


def test_work_multiplies_loop_extents():
    body = _add_one(10, 7).body
    assert dynamic_shares.work(body) == 70
