"""Kernels that write their result over an input nothing reads afterwards (``amptool.compiler.in_place``):
which calls qualify, which must not, and onnxruntime's numbers either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from amptool import _tvm
from amptool.app.convert import ConvertConfig, build_model, rewrite_model
from amptool.compiler import cpu
from amptool.compiler.in_place import IN_PLACE_OF, in_place_kernel, write_in_place
from amptool.compiler.targets import host_llvm_spec
from tests.onnx_checks import assert_close_to_onnxruntime

tvm = pytest.importorskip("tvm")
T = pytest.importorskip("tvm.script.tirx")


def _weights(name: str, *shape: int, seed: int) -> str:
    values = np.random.default_rng(seed).normal(0.0, 0.2, size=shape).astype(np.float32)
    dims = ", ".join(str(d) for d in shape)
    return f"float[{dims}] {name} = {{{', '.join(f'{v:.6f}' for v in values.ravel())}}}"


def _save(tmp_path: Path, outputs: str, body: str, inputs: str = "float[1, 16, 8, 8] x") -> str:
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g ({inputs}) => ({outputs})
    <{_weights("w1", 16, 16, 3, 3, seed=1)}, {_weights("w2", 16, 16, 1, 1, seed=2)}>
    {{ {body} }}"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return str(path)


def _in_place_kernels(path: str, dtype: str = "float32", mcpu: str | None = None) -> list[str]:
    """Names of the kernels the CPU pipeline made write in place, for ``path`` in ``dtype`` (lowered
    for ``mcpu``, default this host's CPU)."""
    target = _tvm.make_target({"kind": "llvm", "mcpu": mcpu} if mcpu else host_llvm_spec())
    lowered = cpu.lower(rewrite_model(ConvertConfig(model=path, dtype=dtype)).passes.mod, target)
    return [gv.name_hint for gv, f in lowered.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and IN_PLACE_OF in f.attrs]


def _check_against_onnxruntime(path: str, feeds: dict[str, np.ndarray]) -> None:
    before = {k: v.copy() for k, v in feeds.items()}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    model = build_model(ConvertConfig(model=path, dtype="float32")).compiled()
    for _ in range(2):  # a second run reuses the planned storage
        got = model.run(feeds)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5 * float(np.abs(value).max()))
    for name, value in before.items():
        np.testing.assert_array_equal(feeds[name], value)  # the caller's inputs are never written


_X = {"x": np.random.default_rng(0).normal(size=(1, 16, 8, 8)).astype(np.float32)}


#: ``a`` feeds the second conv and then only the add after the third (a ResNet block's shape).
_RESIDUAL_BLOCK = """
        c = Conv <pads = [1, 1, 1, 1]> (x, w1)
        a = Relu(c)
        d = Conv (a, w2)
        b = Relu(d)
        e = Conv (b, w2)
        s = Add(e, a)
        y = Relu(s)"""


def test_a_residual_block_writes_over_its_dead_residual(tmp_path: Path) -> None:
    """``a`` feeds the second conv and then only the add after the third: the fused conv + add + relu
    kernel writes over it. (Added to the conv's own input it could not: other channels of the pixel
    are read after a channel is written.)"""
    path = _save(tmp_path, "float[1, 16, 8, 8] y", _RESIDUAL_BLOCK)
    assert len([k for k in _in_place_kernels(path) if "conv2d" in k and "add" in k]) == 1
    _check_against_onnxruntime(path, _X)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_low_precision_residual_block_writes_in_place_too(tmp_path: Path, dtype: str) -> None:
    """The residual is a low-precision tensor and the kernel's epilogue casts: the same rule holds.
    (Lowered for a CPU without AMX, whose bfloat16 convs store their epilogues themselves.)"""
    path = _save(tmp_path, "float[1, 16, 8, 8] y", _RESIDUAL_BLOCK)
    assert len([k for k in _in_place_kernels(path, dtype, "znver4") if "conv2d" in k and "add" in k]) == 1
    assert_close_to_onnxruntime(path, _X, dtype)


def test_a_residual_the_kernel_also_convolves_is_not_written_over(tmp_path: Path) -> None:
    """``a`` is both the conv's input and the residual (passed twice): writing a channel of a pixel
    would change the input of the pixel's other channels."""
    path = _save(tmp_path, "float[1, 16, 8, 8] y", """
        c = Conv <pads = [1, 1, 1, 1]> (x, w1)
        a = Relu(c)
        b = Conv (a, w2)
        s = Add(b, a)
        y = Relu(s)""")
    assert not [k for k in _in_place_kernels(path) if "add" in k]
    _check_against_onnxruntime(path, _X)


def test_a_residual_read_later_or_handed_out_keeps_its_value(tmp_path: Path) -> None:
    """``a`` is read again after the add (``z``) and is itself a model output: nothing writes over it."""
    path = _save(tmp_path, "float[1, 16, 8, 8] y, float[1, 16, 8, 8] z, float[1, 16, 8, 8] a", """
        c = Conv <pads = [1, 1, 1, 1]> (x, w1)
        a = Relu(c)
        b = Conv (a, w2)
        s = Add(b, a)
        y = Relu(s)
        z = Conv (a, w2)""")
    assert not [k for k in _in_place_kernels(path) if "add" in k]
    _check_against_onnxruntime(path, _X)


def test_a_model_input_is_never_written_over(tmp_path: Path) -> None:
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 16] x) => (float[4, 16] y) <{_weights("w", 16, 16, seed=3)}> {{
        m = MatMul(x, w)
        y = Add(m, x)
    }}"""
    path = tmp_path / "input.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    assert _in_place_kernels(str(path)) == []
    _check_against_onnxruntime(str(path), {"x": np.random.default_rng(5).normal(size=(4, 16)).astype(np.float32)})


def test_a_reshaped_view_of_a_live_tensor_is_not_written_over(tmp_path: Path) -> None:
    """``v`` is ``h`` reshaped (a view after TVM's reshape rewrite) and ``h`` is read after the add."""
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 16] x) => (float[2, 32] y, float[4, 16] h2)
    <{_weights("w", 16, 16, seed=3)}, {_weights("u", 32, 32, seed=4)}, int64[2] s = {{2, 32}}>
    {{
        m = MatMul(x, w)
        h = Relu(m)
        v = Reshape(h, s)
        p = MatMul(v, u)
        y = Add(p, v)
        h2 = Mul(h, h)
    }}"""
    path = tmp_path / "view.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    _check_against_onnxruntime(str(path), {"x": np.random.default_rng(5).normal(size=(4, 16)).astype(np.float32)})


# The kernel condition, on kernels written by hand.

@T.prim_func(s_tir=True)
def _epilogue(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = T.max(a[vi, vj] + r[vi, vj], T.float32(0))


@T.prim_func(s_tir=True)
def _neighbour(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = a[vi, vj] + r[vi, (vj + 1) % 16]


@T.prim_func(s_tir=True)
def _accumulated(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    for i, j in T.grid(4, 16):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = a[vi, vj]
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = o[vi, vj] + r[vi, vj]


@T.prim_func(s_tir=True)
def _read_before(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    total = T.sblock_alloc_buffer((4,))
    for i, k in T.grid(4, 16):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                total[vi] = T.float32(0)
            total[vi] = total[vi] + r[vi, vk]
    for i, j in T.grid(4, 16):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = a[vi, vj] * total[vi]


@T.prim_func(s_tir=True)
def _read_after(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    late = T.sblock_alloc_buffer((4, 16))
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = a[vi, vj] + T.float32(1)
    for i, j in T.grid(4, 16):
        with T.sblock("late"):
            vi, vj = T.axis.remap("SS", [i, j])
            late[vi, vj] = r[vi, vj]


@T.prim_func(s_tir=True)
def _output_read(a: T.Buffer((4, 16), "float32"), r: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
    late = T.sblock_alloc_buffer((4, 16))
    for i, j in T.grid(4, 16):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = a[vi, vj] + r[vi, vj]
    for i, j in T.grid(4, 16):
        with T.sblock("late"):
            vi, vj = T.axis.remap("SS", [i, j])
            late[vi, vj] = o[vi, vj]


@pytest.mark.parametrize(("kernel", "index", "written"), [
    (_epilogue, 1, True),  # read at the element written
    (_epilogue, 0, True),  # either operand of an elementwise op
    (_neighbour, 1, False),  # reads the next column, which an earlier element overwrote
    (_accumulated, 1, False),  # the output is written twice and read
    (_read_before, 1, True),  # read only by a loop nest that finishes first
    (_read_before, 0, True),
    (_read_after, 1, False),  # read by a loop nest after the output's
    (_output_read, 1, False),  # the output read back: refused, though harmless here (kept simple)
])
def test_the_kernel_condition(kernel, index: int, written: bool) -> None:
    made = in_place_kernel(kernel, index, "k")
    assert (made is not None) == written
    if made is not None:
        assert len(made.params) == len(kernel.params) - 1 and list(made.attrs[IN_PLACE_OF]) == ["k", index]


# The call condition, on Relax functions written by hand (``add`` reads both inputs where it writes).

_KERNELS = """
    @T.prim_func(private=True, s_tir=True)
    def relu(a: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
        for i, j in T.grid(4, 16):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                o[vi, vj] = T.max(a[vi, vj], T.float32(0))

    @T.prim_func(private=True, s_tir=True)
    def flip(a: T.Buffer((4, 16), "float32"), o: T.Buffer((4, 16), "float32")):
        for i, j in T.grid(4, 16):
            with T.sblock("flip"):
                vi, vj = T.axis.remap("SS", [i, j])
                o[vi, vj] = a[vi, 15 - vj]

    @T.prim_func(private=True, s_tir=True)
    def reshape(a: T.Buffer((4, 16), "float32"), o: T.Buffer((8, 8), "float32")):
        for i, j in T.grid(8, 8):
            with T.sblock("reshape"):
                vi, vj = T.axis.remap("SS", [i, j])
                o[vi, vj] = a[(vi * 8 + vj) // 16, (vi * 8 + vj) % 16]

    @T.prim_func(private=True, s_tir=True)
    def add(a: T.Buffer((8, 8), "float32"), b: T.Buffer((8, 8), "float32"), o: T.Buffer((8, 8), "float32")):
        for i, j in T.grid(8, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                o[vi, vj] = a[vi, vj] + b[vi, vj]
"""


def _in_place_calls(body: str, outputs: str) -> dict[str, list[int]]:
    """Binding name → the inputs its call writes over, after ``write_in_place`` of a module whose
    ``main`` (``x``: 4×16) runs ``body`` in one dataflow block, handing out ``outputs``."""
    from tvm.script import from_source

    lines = "\n".join(f"            {line.strip()}" for line in body.strip().splitlines())
    source = f"""
@I.ir_module
class Module:
{_KERNELS}
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), p: R.Tensor((8, 8), "float32")):
        cls = Module
        with R.dataflow():
{lines}
            R.output({outputs})
        return ({outputs},)
"""
    from tvm.script import ir as I
    from tvm.script import relax as R

    mod = write_in_place(from_source(source, extra_vars={"I": I, "R": R, "T": T}))
    calls: dict[str, list[int]] = {}
    for binding in mod["main"].body.blocks[0].bindings:
        if getattr(binding.value, "op", None) is not None and binding.value.op.name == "relax.call_tir_inplace":
            calls[_tvm.var_name(binding.var)] = [int(i) for i in binding.value.attrs.inplace_indices]
    return calls


def _fresh(name: str) -> str:
    """``name`` bound to a fresh 8×8 tensor: relu of x, flipped (not a reshape), reshaped."""
    return f"""
    {name}r = R.call_tir(cls.relu, (x,), R.Tensor((4, 16), "float32"))
    {name}f = R.call_tir(cls.flip, ({name}r,), R.Tensor((4, 16), "float32"))
    {name}v = R.call_tir(cls.reshape, ({name}f,), R.Tensor((8, 8), "float32"))
    {name} = R.call_tir(cls.add, ({name}v, p), R.Tensor((8, 8), "float32"))
    """


@pytest.mark.parametrize(("body", "outputs", "expected"), [
    # a and b fresh, dead after y: y writes over the first.
    (_fresh("a") + _fresh("b") + "y = R.call_tir(cls.add, (a, b), R.Tensor((8, 8), 'float32'))", "y",
     {"y": [0]}),
    # a read after y: y writes over b, and z (a's last reader) over a.
    (_fresh("a") + _fresh("b") + """y = R.call_tir(cls.add, (a, b), R.Tensor((8, 8), 'float32'))
     z = R.call_tir(cls.add, (a, p), R.Tensor((8, 8), 'float32'))""", "y, z", {"y": [1], "z": [0]}),
    # a handed out of the block: y writes over b.
    (_fresh("a") + _fresh("b") + "y = R.call_tir(cls.add, (a, b), R.Tensor((8, 8), 'float32'))", "y, a",
     {"y": [1]}),
    # the parameter p is never written over.
    (_fresh("a") + "y = R.call_tir(cls.add, (p, a), R.Tensor((8, 8), 'float32'))", "y", {"y": [1]}),
    # a passed twice.
    (_fresh("a") + "y = R.call_tir(cls.add, (a, a), R.Tensor((8, 8), 'float32'))", "y", {}),
    # av is a reshape (a view of af once lowered) and af is read after y.
    (_fresh("a") + """y = R.call_tir(cls.add, (av, p), R.Tensor((8, 8), 'float32'))
     z = R.call_tir(cls.reshape, (af,), R.Tensor((8, 8), 'float32'))""", "y, z", {}),
    # a put in a tuple before y (which may alias it).
    (_fresh("a") + """t = (a, p)
     y = R.call_tir(cls.add, (a, p), R.Tensor((8, 8), 'float32'))""", "y, t", {}),
])
def test_which_calls_write_in_place(body: str, outputs: str, expected: dict[str, list[int]]) -> None:
    calls = _in_place_calls(body, outputs)
    # The fresh tensors' own adds write over their dead reshapes: only y and z matter here.
    assert {k: v for k, v in calls.items() if k in ("y", "z")} == expected
