"""Inputs a fuzzing session found to hang, exhaust memory, crash with exit 70, or fail late: each must
now be a one-line user error (exit 2) before any work, or a correct result."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tests.conftest import single_error


def _save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list = (), opset: int = 18) -> str:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.save(model, path)
    return str(path)


def _relu(tmp_path: Path) -> str:
    return _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [1, 4])],
                 [("y", T.FLOAT, [1, 4])])


def _refused(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


@pytest.mark.parametrize(("args", "words"), [
    (("--iterations", "99999999999999999999"), ("--iterations", "10000")),  # built its seed list: OOM
    (("--seed", "-1"), ("--seed",)),  # numpy's ValueError: exit 70
])
def test_diff_flags_out_of_range(run_cli, tmp_path, args, words):
    start = time.monotonic()
    _refused(run_cli("diff", _relu(tmp_path), *args), *words)
    assert time.monotonic() - start < 30


def test_bench_refuses_a_thread_count_no_machine_has(run_cli, tmp_path):
    """--threads 100000 aborted onnxruntime after minutes at a load of ~1,800."""
    result = run_cli("bench", _relu(tmp_path), "--threads", "100000")
    _refused(result, "--threads 100000")
    assert single_error(result.output)


def test_a_loop_known_to_run_past_the_limit_is_refused_before_onnxruntime(run_cli, tmp_path):
    """A constant 10**12-trip Loop: prepare's onnxruntime runs would take as long (convert hung)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info(n, t, s) for n, t, s in
                 (("i", T.INT64, []), ("cond_in", T.BOOL, []), ("v_in", T.FLOAT, [1, 4]))],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in (("cond_out", T.BOOL, []), ("v_out", T.FLOAT, [1, 4]))],
        [numpy_helper.from_array(np.ones([1, 4], np.float32), "one")])
    path = _save(tmp_path / "loop.onnx", [helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body, name="loop")],
                 [("x", T.FLOAT, [1, 4])], [("y", T.FLOAT, [1, 4])],
                 [numpy_helper.from_array(np.array(10**12, np.int64), "M"),
                  numpy_helper.from_array(np.array(True), "cond")])
    start = time.monotonic()
    result = run_cli("convert", path, "-o", str(tmp_path / "out"))
    _refused(result, "Loop 'loop'", "1000000000000 iterations, past amptool's bound of 100000")
    assert time.monotonic() - start < 60 and not (tmp_path / "out").exists()


def test_an_invalid_model_that_crashes_tvm_is_a_user_error(run_cli, tmp_path):
    """Tile with a negative repeat: onnxruntime opens it (so the load let it through), TVM's compile
    failed on it (exit 70); onnx's full check names the problem."""
    path = _save(tmp_path / "tile.onnx", [helper.make_node("Tile", ["x", "r"], ["y"], name="t")],
                 [("x", T.FLOAT, [2, 4])], [("y", T.FLOAT, [4, 4])],
                 [numpy_helper.from_array(np.array([2, -1], np.int64), "r")])
    _refused(run_cli("diff", path), "is not a valid ONNX model", "negative")


def test_files_of_other_flags_inside_the_output_directory_are_refused_up_front(run_cli, tmp_path):
    """--emit-ir OUT/ir.py was written, then OUT refused as foreign after the whole build."""
    model, out = _relu(tmp_path), tmp_path / "out"
    for flag in ("--emit-ir", "--json"):
        result = run_cli("convert", model, "-o", str(out), flag, str(out / "extra"))
        _refused(result, f"{flag} {out / 'extra'} is inside -o")
        assert not out.exists()


def test_output_directory_under_a_file_or_empty_is_refused_before_the_build(run_cli, tmp_path):
    model, blocker = _relu(tmp_path), tmp_path / "afile"
    blocker.write_text("x")
    _refused(run_cli("convert", model, "-o", str(blocker / "sub" / "out")), "is a file, not a directory")
    _refused(run_cli("convert", model, "-o", ""), "-o is empty")


@pytest.mark.parametrize(("starts", "ends", "steps"), [
    ([5], [2], [1]),  # ordinary empty range
    ([1], [np.iinfo(np.int64).min], [2]),  # torch's "to the start" end with a positive step
])
def test_empty_slices_build_and_feed_a_concat(run_cli, tmp_path, starts, ends, steps):
    """A Slice selecting nothing: TVM's strided_slice refused the bounds at compile time (exit 70)."""
    constants = [numpy_helper.from_array(np.array(v, np.int64), n)
                 for n, v in (("s", starts), ("e", ends), ("a", [1]), ("st", steps))]
    path = _save(tmp_path / "slice.onnx",
                 [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["empty"], name="sl"),
                  helper.make_node("Concat", ["x", "empty"], ["y"], name="cat", axis=1),
                  helper.make_node("Identity", ["empty"], ["e_out"], name="id")],
                 [("x", T.FLOAT, [4, 8])], [("y", T.FLOAT, [4, 8]), ("e_out", T.FLOAT, [4, 0])], constants)
    result = run_cli("diff", path, "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED")


@pytest.mark.parametrize(("args", "words"), [
    (("--input-shape", ":1x4"), ("names no input",)),  # was taken silently
    (("--input-shape", "x:1x4", "--input-shape", "x:2x4"), ("'x' twice",)),  # the last one won, silently
    (("--input-shape", "x:0x4"), ("dims must be positive", "hint:")),
])
def test_input_shape_flags_that_say_nothing_or_contradict(run_cli, tmp_path, args, words):
    _refused(run_cli("diff", _relu(tmp_path), *args), *words)


def _passes(result) -> None:
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED"), result.output


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_reciprocal_of_a_product_with_zero_is_infinite_not_a_compile_error(run_cli, tmp_path, dtype):
    """MatMul → Mul(0) → Reciprocal: TVM compiled the 0 in, simplified t·0 to 0 and stopped on 1/0 (exit 70)."""
    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    path = _save(tmp_path / "recip.onnx",
                 [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "zero"], ["u"]),
                  helper.make_node("Reciprocal", ["u"], ["y"])],
                 [("x", T.FLOAT, [1, 16])], [("y", T.FLOAT, [1, 16])],
                 [weights, numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    _passes(run_cli("diff", path, "--dtype", dtype))


@pytest.mark.parametrize(("op", "shape", "out", "attrs"), [
    ("InstanceNormalization", [1, 3, 0, 4], [1, 3, 0, 4], {"epsilon": 1e-5}),  # means of nothing: "Divide by zero"
    ("ReduceMean", [2, 0, 3], [2, 1, 3], {}),  # a non-empty mean of nothing: 0, as onnxruntime's
    ("ReduceMax", [2, 0, 3], [2, 1, 3], {}),
    ("ReduceLogSumExp", [2, 0, 3], [2, 1, 3], {}),
    ("ReduceProd", [2, 0, 3], [2, 1, 3], {}),
])
def test_reductions_over_no_elements_build(run_cli, tmp_path, op, shape, out, attrs):
    """Reductions over a static empty axis: TVM divided by the zero count at compile time (exit 70)."""
    inputs = ["x", "s", "b"] if op == "InstanceNormalization" else ["x", "axes"]
    constants = ([numpy_helper.from_array(np.full(3, v, np.float32), n) for n, v in (("s", 1.0), ("b", 0.0))]
                 if op == "InstanceNormalization" else [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    path = _save(tmp_path / "empty.onnx", [helper.make_node(op, inputs, ["y"], **attrs)],
                 [("x", T.FLOAT, shape)], [("y", T.FLOAT, out)], constants)
    for dtype in ("float32", "bfloat16"):
        _passes(run_cli("diff", path, "--dtype", dtype))


def test_an_opset_newer_than_onnx_is_refused(run_cli, tmp_path):
    """opset_import 99 converted with exit 0, its ops read as some older opset's; onnxruntime refuses it."""
    newest = onnx.defs.onnx_opset_version()
    path = _save(tmp_path / "future.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [1, 4])],
                 [("y", T.FLOAT, [1, 4])], opset=newest + 71)
    _refused(run_cli("convert", path, "-o", str(tmp_path / "out")), f"opset {newest + 71}", f"at most {newest}")
    assert not (tmp_path / "out").exists()


def test_a_constant_larger_than_any_memory_is_an_out_of_memory_refusal(run_cli, tmp_path):
    """ConstantOfShape [10**6, 10**6] (4 TB): TVM's folding died on std::bad_alloc (exit 70)."""
    shape = numpy_helper.from_array(np.array([10**6, 10**6], np.int64), "shp")
    path = _save(tmp_path / "huge.onnx",
                 [helper.make_node("ConstantOfShape", ["shp"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
                 [("x", T.FLOAT, [1, 1])], [("y", T.FLOAT, [10**6, 10**6])], [shape])
    result = run_cli("convert", path, "-o", str(tmp_path / "out"))
    _refused(result, "Out of memory")
    assert single_error(result.output) and not (tmp_path / "out").exists()


_W = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "w")
#: (name, nodes, inputs, outputs, initializers, feeds with indices past the data (and a valid negative one))
_INDEXED = {
    "gather": ([helper.make_node("Gather", ["w", "i"], ["y"], axis=0)], [("i", T.INT64, [3])],
               [("y", T.FLOAT, [3, 4])], [_W], lambda big: {"i": big}),
    "gather_elements": ([helper.make_node("GatherElements", ["w", "i"], ["y"], axis=0)], [("i", T.INT64, [3, 4])],
                        [("y", T.FLOAT, [3, 4])], [_W], lambda big: {"i": np.repeat(big[:, None], 4, 1)}),
    "gather_nd": ([helper.make_node("GatherND", ["w", "i"], ["y"])], [("i", T.INT64, [3, 1])],
                  [("y", T.FLOAT, [3, 4])], [_W], lambda big: {"i": big[:, None]}),
    "scatter_elements": ([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
                         [("x", T.FLOAT, [10, 4]), ("i", T.INT64, [3, 4]), ("u", T.FLOAT, [3, 4])],
                         [("y", T.FLOAT, [10, 4])], [],
                         lambda big: {"x": np.zeros((10, 4), np.float32), "i": np.repeat(big[:, None], 4, 1),
                                      "u": np.ones((3, 4), np.float32)}),
    "scatter_nd": ([helper.make_node("ScatterND", ["x", "i", "u"], ["y"])],
                   [("x", T.FLOAT, [10, 4]), ("i", T.INT64, [3, 1]), ("u", T.FLOAT, [3, 4])], [("y", T.FLOAT, [10, 4])],
                   [], lambda big: {"x": np.zeros((10, 4), np.float32), "i": big[:, None],
                                    "u": np.ones((3, 4), np.float32)}),
    "roi_align": ([helper.make_node("RoiAlign", ["x", "rois", "i"], ["y"], output_height=2, output_width=2)],
                  [("x", T.FLOAT, [2, 3, 8, 8]), ("rois", T.FLOAT, [3, 4]), ("i", T.INT64, [3])],
                  [("y", T.FLOAT, [3, 3, 2, 2])], [],
                  lambda index: {"x": np.arange(384, dtype=np.float32).reshape(2, 3, 8, 8),
                                 "rois": np.tile(np.float32([1.0, 1.5, 6.0, 5.0]), (3, 1)), "i": index}),
    # TVM's MaxUnpool scatters inside a reshape: the guard reaches calls nested in a converter's result
    "max_unpool": ([helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                   [("x", T.FLOAT, [1, 1, 2, 2]), ("i", T.INT64, [1, 1, 2, 2])], [("y", T.FLOAT, [1, 1, 4, 4])], [],
                   lambda index: {"x": np.float32([[[[1, 2], [3, 4]]]]),
                                  "i": np.append(index, 5).reshape(1, 1, 2, 2).astype(np.int64)}),
}
#: The cases whose indices are a graph input read against a constant table: refused before the run.
_REFUSED_UP_FRONT = frozenset({"gather", "gather_elements"})
#: Valid indices: negative ones count from the end, except a box's batch index and an unpooled position.
_VALID = {name: np.array([1, -1, 3], np.int64) for name in _INDEXED} | {
    "roi_align": np.array([1, 0, 1], np.int64), "max_unpool": np.array([0, 10, 15], np.int64)}


@pytest.mark.parametrize("name", list(_INDEXED))
def test_indices_past_the_data_do_not_crash_the_run(tmp_path, name):
    """Gather/GatherElements/GatherND/ScatterElements/ScatterND/RoiAlign/MaxUnpool read and wrote at any
    index they were fed: indices of ±10^9 segfaulted ``amptool run`` (onnxruntime refuses the run). Clamped now, the
    run finishes (in a subprocess, so a regression fails the test rather than the suite); valid indices,
    negative ones among them, still give onnxruntime's results."""
    import subprocess
    import sys

    import onnxruntime as ort

    import amptool

    nodes, inputs, outputs, inits, feeds = _INDEXED[name]
    path = _save(tmp_path / f"{name}.onnx", nodes, inputs, outputs, inits, opset=16)
    artifact = tmp_path / "art"
    amptool.convert(path, dtype="float32", output=artifact)
    np.savez(tmp_path / "bad.npz", **feeds(np.array([1, 10**9, -7 * 10**8], np.int64)))
    run = subprocess.run([sys.executable, "-m", "amptool", "run", str(artifact), "--inputs", str(tmp_path / "bad.npz"),
                          "-o", str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300, check=False)
    if name in _REFUSED_UP_FRONT:  # a graph input indexing a constant table: refused by value (index_ranges)
        assert run.returncode == 2 and "it indexes a table of 10 rows" in run.stderr, run.stdout + run.stderr
        unchecked = amptool.load(artifact)
        unchecked.model.index_limits = {}  # what the kernels do with such a value: clamp it (in-process: safe)
        assert np.isfinite(unchecked.run(feeds(np.array([1, 10**9, -7 * 10**8], np.int64)))["y"]).all()
    else:
        assert run.returncode == 0, run.stdout + run.stderr
    valid = feeds(_VALID[name])
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, valid)[0]
    np.testing.assert_allclose(amptool.load(artifact).run(valid)["y"], want, rtol=1e-6, atol=1e-6)


def test_a_run_time_size_past_memory_is_an_out_of_memory_refusal(run_cli, tmp_path):
    """A Range whose limit is an input's value (10^12 elements): TVM's allocation failed with
    ``std::bad_alloc``, which ``amptool run`` reported as an internal error (exit 70)."""
    path = _save(tmp_path / "range.onnx", [helper.make_node("Range", ["a", "b", "c"], ["y"])],
                 [("a", T.FLOAT, []), ("b", T.FLOAT, []), ("c", T.FLOAT, [])], [("y", T.FLOAT, ["n"])], opset=17)
    artifact = tmp_path / "art"
    assert run_cli("convert", path, "--dtype", "float32", "-o", str(artifact)).exit_code == 0
    np.savez(tmp_path / "big.npz", a=np.float32(0), b=np.float32(1e12), c=np.float32(1))
    result = run_cli("run", str(artifact), "--inputs", str(tmp_path / "big.npz"), "-o", str(tmp_path / "y.npz"))
    _refused(result, "Out of memory while running")
    np.savez(tmp_path / "small.npz", a=np.float32(0), b=np.float32(5), c=np.float32(1))
    assert run_cli("run", str(artifact), "--inputs", str(tmp_path / "small.npz"), "-o",
                   str(tmp_path / "y.npz")).exit_code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["y"], np.arange(5, dtype=np.float32))


_INT_TYPES = {"int64": T.INT64, "int32": T.INT32, "int8": T.INT8, "uint8": T.UINT8}


@pytest.mark.parametrize("dtype", list(_INT_TYPES))
@pytest.mark.parametrize(("op", "attrs"), [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
def test_integer_division_by_zero_or_minus_one_does_not_trap(tmp_path, dtype, op, attrs):
    """The CPU's integer division traps on a zero divisor and on MIN / -1: ``amptool run`` died of SIGFPE
    (onnxruntime refuses the run). Now x / 0 and x % 0 are 0 (numpy's answers), MIN / -1 wraps; any other
    divisor, negative ones among them, gives onnxruntime's quotient and remainder."""
    import subprocess
    import sys

    import onnxruntime as ort

    import amptool

    elem, kind = _INT_TYPES[dtype], np.dtype(dtype)
    path = _save(tmp_path / "m.onnx", [helper.make_node(op, ["a", "b"], ["y"], **attrs)],
                 [("a", elem, [64]), ("b", elem, [64])], [("y", elem, [64])], opset=17)
    artifact = tmp_path / "art"
    amptool.convert(path, dtype="float32", output=artifact)
    rng = np.random.default_rng(0)
    info = np.iinfo(kind)
    a = rng.integers(info.min, info.max, 64, endpoint=True).astype(kind)
    b = rng.integers(max(info.min, -9), 10, 64).astype(kind)
    b[b == 0] = 3
    if kind.kind == "i":
        b[:4], a[4] = -1, info.min  # (MIN / -1 is left out of the comparison: onnxruntime's is undefined)
    valid = {"a": np.where((a == info.min) & (b == -1), 0, a).astype(kind), "b": b}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, valid)[0]
    np.testing.assert_array_equal(amptool.load(artifact).run(valid)["y"], want)
    divisors = np.array([0, 1, 2, -1 if kind.kind == "i" else 0], kind)
    hostile = {"a": np.full(64, info.min, kind), "b": np.tile(divisors, 16)}
    np.savez(tmp_path / "bad.npz", **hostile)
    run = subprocess.run([sys.executable, "-m", "amptool", "run", str(artifact), "--inputs", str(tmp_path / "bad.npz"),
                          "-o", str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not np.load(tmp_path / "out.npz")["y"][hostile["b"] == 0].any()


def test_a_token_id_past_the_vocabulary_is_refused_by_name(run_cli, tmp_path):
    """An input that indexes a constant table (input_ids → Gather over the embeddings, through a Cast)
    is checked against its rows before the run: one line naming the input, the value, where it sits and
    the table's size, exit 2 — as onnxruntime refuses it. The manifest lists the limit."""
    table = numpy_helper.from_array(np.arange(24, dtype=np.float32).reshape(6, 4), "embeddings")
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=T.INT64),
             helper.make_node("Gather", ["embeddings", "ids64"], ["y"], axis=0)]
    path = _save(tmp_path / "embed.onnx", nodes, [("ids", T.INT32, [1, 3])], [("y", T.FLOAT, [1, 3, 4])], [table])
    artifact = tmp_path / "art"
    assert run_cli("convert", path, "--dtype", "float32", "-o", str(artifact)).exit_code == 0
    from tests.conftest import read_json

    assert read_json(artifact / "manifest.json")["index_inputs"] == {"ids": 6}
    np.savez(tmp_path / "bad.npz", ids=np.array([[1, 6, 2]], np.int32))
    result = run_cli("run", str(artifact), "--inputs", str(tmp_path / "bad.npz"), "-o", str(tmp_path / "y.npz"))
    _refused(result, "Input 'ids' holds 6 at [0, 1]", "table of 6 rows", "valid: -6 to 5")
    np.savez(tmp_path / "ok.npz", ids=np.array([[1, -1, 2]], np.int32))
    ok = run_cli("run", str(artifact), "--inputs", str(tmp_path / "ok.npz"), "-o", str(tmp_path / "y.npz"))
    assert ok.exit_code == 0, ok.output
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["y"][0, 1], [20, 21, 22, 23])
