"""legalize_ops: TVM's LegalizeOps with each distinct call legalized once — the same module,
built from fewer legalizations, and never one call's kernel for a call that differs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from amptool import _tvm
from amptool.compiler import cpu, legalize_once
from amptool.compiler.cpu_kernels import legalize_map
from amptool.compiler.targets import host_llvm_spec


def _module():
    """Repeats (two ``add(x, y)``, two ``relu``, two slices of one range), and calls alike but for
    what must tell them apart: ``add(x, x)`` against ``add(x, y)``, clip bounds, reshape targets,
    slice ranges, a constant operand."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    y = relax.Var("y", relax.TensorType([4, 8], "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            doubled = bb.emit(relax.op.add(x, x))
            summed = bb.emit(relax.op.add(x, y))
            again = bb.emit(relax.op.add(doubled, summed))
            shifted = bb.emit(relax.op.add(again, relax.const(np.full((4, 8), 0.5, "float32"))))
            # scalar constants, which TVM compiles into the kernel: each its own
            shifted = bb.emit(relax.op.multiply(relax.op.add(shifted, relax.const(1.0, "float32")),
                                                relax.const(2.0, "float32")))
            shifted = bb.emit(relax.op.multiply(relax.op.add(shifted, relax.const(-3.0, "float32")),
                                                relax.const(0.5, "float32")))
            low = bb.emit(relax.op.clip(shifted, relax.prim_value(0.0), relax.prim_value(6.0)))
            high = bb.emit(relax.op.clip(summed, relax.prim_value(-1.0), relax.prim_value(1.0)))
            wide = bb.emit(relax.op.reshape(relax.op.nn.relu(low), (2, 16)))
            tall = bb.emit(relax.op.reshape(relax.op.nn.relu(high), (16, 2)))
            left = bb.emit(relax.op.strided_slice(summed, axes=[1], begin=[0], end=[4]))
            also_left = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[0], end=[4]))
            right = bb.emit(relax.op.strided_slice(summed, axes=[1], begin=[4], end=[8]))
            halves = bb.emit(relax.op.add(bb.emit(relax.op.add(left, also_left)), right))
            out = bb.emit_output(relax.Tuple([wide, tall, halves]))
        bb.emit_func_output(out)
    return bb.get()


def _expected(x, y):
    summed = x + y
    low = np.clip((((2 * x + summed + 0.5) + 1) * 2 - 3) * 0.5, 0, 6)
    halves = summed[:, :4] + x[:, :4] + summed[:, 4:]
    return np.maximum(low, 0).reshape(2, 16), np.maximum(np.clip(summed, -1, 1), 0).reshape(16, 2), halves


def test_same_module_as_legalize_ops_from_fewer_legalizations(monkeypatch):
    mod = _module()
    runs = []
    real = legalize_once._legalization

    def counted(name, custom):
        legalization = real(name, custom)
        return lambda bb, call: runs.append(name) or legalization(bb, call)

    monkeypatch.setattr(legalize_once, "_legalization", counted)
    legalized = legalize_once.legalize_ops(legalize_map())(mod)
    tvm.ir.assert_structural_equal(legalized, relax.transform.LegalizeOps(legalize_map())(mod))
    # add(x, x), add(x, y), add(·, constant) and two adds of scalars are legalized, add(doubled, summed)
    # repeats add(x, y); the second relu repeats the first; the multiplies hold different scalars, the
    # clips and reshapes differ in their bounds and targets; the slice of x repeats the first slice of
    # summed (a tuple of begins is a value like any other), the second range is its own; of the two
    # adds of halves, the second repeats the first.
    want = (["relax.add"] * 6 + ["relax.multiply"] * 2 + ["relax.nn.relu"] + ["relax.clip", "relax.reshape"] * 2
            + ["relax.strided_slice"] * 2)
    assert sorted(runs) == sorted(want)


def test_built_module_computes_what_each_call_says():
    target = _tvm.make_target({"kind": "llvm"})
    executable = cpu.build(_module(), target)[0]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 8)).astype("float32"), rng.standard_normal((4, 8)).astype("float32")
    got = _tvm.run_vm(_tvm.vm_from_executable(executable, "cpu"), [x, y], "cpu")
    for value, want in zip(got, _expected(x, y), strict=True):
        np.testing.assert_allclose(np.asarray(value), want, rtol=1e-6)


@pytest.mark.parametrize("shape", [[4, 8], ["n", 8]])
def test_symbolic_shapes_are_legalized_every_time(shape):
    n = tvm.tirx.Var("n", "int64")
    dims = [n if d == "n" else d for d in shape]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(dims, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.nn.relu(x), relax.op.nn.relu(x)))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(legalize_once.legalize_ops()(mod), relax.transform.LegalizeOps()(mod))


def test_a_repeated_multi_output_call_reuses_its_kernel():
    """split returns a tuple: its kernel's result is a list of tensors, taken over as such."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    y = relax.Var("y", relax.TensorType([4, 8], "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            left = bb.emit(relax.op.split(x, 2, axis=1))
            right = bb.emit(relax.op.split(y, 2, axis=1))
            out = bb.emit_output(relax.op.add(relax.TupleGetItem(left, 1), relax.TupleGetItem(right, 0)))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(legalize_once.legalize_ops()(mod), relax.transform.LegalizeOps()(mod))
    executable = cpu.build(mod, _tvm.make_target({"kind": "llvm"}))[0]
    a, b = np.arange(32, dtype="float32").reshape(4, 8), -np.arange(32, dtype="float32").reshape(4, 8)
    got = _tvm.run_vm(_tvm.vm_from_executable(executable, "cpu"), [a, b], "cpu")[0]
    np.testing.assert_array_equal(np.asarray(got), a[:, 4:] + b[:, :4])


def _convs():
    """Three NHWC convs on one input: two alike but for their weights, one with other geometry."""
    rng = np.random.default_rng(3)
    weights = [rng.standard_normal((16, 8, 3, 3)).astype("float32") for _ in range(3)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 10, 10, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            convs = [bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=padding, data_layout="NHWC",
                                                kernel_layout="OIHW", out_layout="NHWC"))
                     for w, padding in zip(weights, ([1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]), strict=True)]
            out = bb.emit_output(relax.Tuple(convs))
        bb.emit_func_output(out)
    return bb.get(), weights


def test_convs_alike_but_for_their_weights_share_one_kernel(monkeypatch):
    """A conv packs its weights before its kernel is built, so legalize_ops runs each conv's
    legalization; ``call_te`` builds the kernel once for the two alike and hands each its own
    weights: the module TVM's LegalizeOps makes (its add_func finds the same kernel again), from
    two builds instead of three, computing each conv with its weights."""
    mod, weights = _convs()
    target = _tvm.make_target(host_llvm_spec())  # it runs here: no foreign ISA
    builds = []
    real = relax.BlockBuilder.call_te
    monkeypatch.setattr(relax.BlockBuilder, "call_te", lambda bb, *a, **k: builds.append(a[0]) or real(bb, *a, **k))
    with target:
        legalized = legalize_once.legalize_ops(legalize_map())(mod)
        assert len(builds) == 2
        tvm.ir.assert_structural_equal(legalized, relax.transform.LegalizeOps(legalize_map())(mod))
    assert sum(isinstance(f, tvm.tirx.PrimFunc) for _gv, f in legalized.functions_items()) == 2

    x = np.random.default_rng(4).standard_normal((1, 10, 10, 8)).astype("float32")
    got = _tvm.run_vm(_tvm.vm_from_executable(cpu.build(mod, target)[0], "cpu"), [x], "cpu")
    for value, w, pad in zip(got, weights, (1, 1, 0), strict=True):
        padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # n, h, w, c, kh, kw
        np.testing.assert_allclose(np.asarray(value), np.einsum("nhwcij,ocij->nhwo", windows, w), rtol=1e-4,
                                   atol=1e-4)


def test_calls_on_the_same_constant_share_its_packed_legalization(monkeypatch):
    """Matmuls by the very same constant weight (an unrolled recurrence's steps) are legalized
    once and share the packed weight, where each had packed its own copy (600 copies of a 1 MB
    matrix for a 300-frame bidirectional LSTM); a weight with the same values in another constant
    is packed for itself. Each product is still its own input's."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 32)).astype("float32")
    shared, twin = relax.const(w), relax.const(w.copy())
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType([2, 64], "float32")) for i in range(3)]
    with bb.function("main", xs):
        with bb.dataflow():
            weights = (shared, shared, twin)
            products = [bb.emit(relax.op.matmul(x, weight)) for x, weight in zip(xs, weights, strict=True)]
            out = bb.emit_output(relax.Tuple(products))
        bb.emit_func_output(out)
    mod = bb.get()
    target = _tvm.make_target(host_llvm_spec())
    runs = []
    real = legalize_once._legalization
    monkeypatch.setattr(legalize_once, "_legalization",
                        lambda name, custom: (lambda bb, call: runs.append(name) or real(name, custom)(bb, call)))
    with target:
        legalized = legalize_once.legalize_ops(legalize_map())(mod)
    assert runs == ["relax.matmul", "relax.matmul"]
    calls = list(_tvm.bound_calls(legalized["main"]))
    packed = [call.args[1].fields[1] for call in calls]
    assert packed[0].same_as(packed[1]) and not packed[0].same_as(packed[2])

    inputs = [rng.standard_normal((2, 64)).astype("float32") for _ in xs]
    got = _tvm.run_vm(_tvm.vm_from_executable(cpu.build(mod, target)[0], "cpu"), inputs, "cpu")
    for value, x in zip(got, inputs, strict=True):
        np.testing.assert_allclose(np.asarray(value), x @ w, rtol=1e-5, atol=1e-5)
