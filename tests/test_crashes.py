"""Models that used to end in a Python traceback (issue 13, the crash list): each must now give
a correct result (exit 0, PASSED) or a one-line user error (exit 2, ``error: …``).

Each case runs the CLI in-process with ``catch_exceptions=True``, so an escaping exception is
recorded in ``result.exception`` instead of aborting the test, and the checks below can fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from onnx import TensorProto, helper, numpy_helper

from amptool.compare.stats import compare_output, default_tolerance

T = TensorProto


def _model(nodes: list[onnx.NodeProto], inputs: Sequence[tuple[str, int, list[int]]],
           outputs: Sequence[tuple[str, int, list[int]]], opset: int = 21,
           initializers: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _save(model: onnx.ModelProto, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _inputs(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return str(path)


def _cli(*args: str) -> Result:
    from amptool.cli.main import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=True)


def _no_traceback(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output


def _passes(result: Result) -> None:
    _no_traceback(result)
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("PASSED |"), result.output


def _refuses(result: Result, *words: str) -> None:
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]


# --------------------------------------------------------------------------- unary math ops

#: cosh/sinh overflow at |x| ≈ 89.4 in float32 (not at 88.7, where exp does); sinh of tiny x
#: must not cancel to 0; NaN/±inf/-0 pass through as onnxruntime gives them.
EDGES = np.array([[0.0, -0.0, 1e-30, -1e-6, 1e-3, 0.5, -0.999, 1.0, 2.5, -7.0, 20.0, 50.0],
                  [88.0, 88.8, 89.0, -89.4, 89.42, 90.0, 1e5, np.inf, -np.inf, np.nan, 3.0, -0.25]], np.float32)


@pytest.mark.parametrize("op", ["Cosh", "Sinh"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cosh_sinh_match_onnxruntime(op: str, dtype: str, tmp_path: Path) -> None:
    model = _model([helper.make_node(op, ["x"], ["y"], name=op.lower())], [("x", T.FLOAT, [2, 12])],
                   [("y", T.FLOAT, [2, 12])], opset=18)
    _passes(_cli("diff", _save(model, tmp_path, op), "--dtype", dtype, "--inputs", _inputs(tmp_path, x=EDGES)))


def test_cosh_sinh_in_a_float16_model(tmp_path: Path) -> None:
    """A float16 model computes cosh/sinh on float16 tensors: legalized through float32."""
    nodes = [helper.make_node("Cosh", ["x"], ["c"], name="cosh"), helper.make_node("Sinh", ["x"], ["s"], name="sinh")]
    model = _model(nodes, [("x", T.FLOAT16, [2, 8])], [("c", T.FLOAT16, [2, 8]), ("s", T.FLOAT16, [2, 8])], opset=18)
    _passes(_cli("diff", _save(model, tmp_path, "hyperbolic16"), "--dtype", "float32"))


UNARY = ["Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cos", "Cosh", "Erf", "Exp", "Log", "Reciprocal",
         "Round", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_unary_math_ops_compile_and_match(dtype: str, tmp_path: Path) -> None:
    """One model, every unary math op on the same input (out-of-domain values give NaN on
    both sides: acosh below 1, atanh at ±1)."""
    nodes = [helper.make_node(op, ["x"], [op.lower()], name=op.lower()) for op in UNARY]
    model = _model(nodes, [("x", T.FLOAT, [2, 8])], [(op.lower(), T.FLOAT, [2, 8]) for op in UNARY], opset=18)
    x = np.linspace(-0.95, 3.0, 16, dtype=np.float32).reshape(2, 8)
    _passes(_cli("diff", _save(model, tmp_path, "unary"), "--dtype", dtype, "--inputs", _inputs(tmp_path, x=x)))


# --------------------------------------------------------------------------- narrow casts


def _dense_values() -> np.ndarray:
    """Every finite float8 value of the four formats, the midpoints between neighbours (ties)
    and one float32 step either side, specials, and random values over many decades."""
    parts = [np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 490, 496, 500, 240, 248,
                       57344, 61439, 61440, 65536, 1e30, 2.5, -2.5, 7.5, 8.5, -8.5, 2**26 + 8], np.float32)]
    for fmt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz):
        grid = np.unique(np.arange(256, dtype=np.uint8).view(fmt).astype(np.float32))
        grid = grid[np.isfinite(grid)]
        middle = (grid[1:] + grid[:-1]) / 2
        parts += [grid, middle, np.nextafter(middle, np.float32(np.inf)), np.nextafter(middle, np.float32(-np.inf))]
    rng = np.random.default_rng(0)
    parts += [(rng.standard_normal(200) * scale).astype(np.float32) for scale in (1e-4, 1e-2, 1.0, 1e2, 1e4)]
    return np.concatenate(parts).astype(np.float32)


NARROW = [("FLOAT8E4M3FN", 1), ("FLOAT8E4M3FN", 0), ("FLOAT8E4M3FNUZ", 1), ("FLOAT8E4M3FNUZ", 0),
          ("FLOAT8E5M2", 1), ("FLOAT8E5M2", 0), ("FLOAT8E5M2FNUZ", 1), ("FLOAT8E5M2FNUZ", 0),
          ("INT4", None), ("UINT4", None), ("BFLOAT16", None)]


@pytest.mark.parametrize(("to", "saturate"), NARROW)
def test_cast_roundtrip_reproduces_onnxruntime_exactly(to: str, saturate: int | None, tmp_path: Path) -> None:
    """Cast to the narrow type and back: onnxruntime's rounding, saturation, NaN/inf, bit for bit
    (``--atol 0 --rtol 0``). TVM alone dropped the float8/bfloat16 pair and truncated int4."""
    x = _dense_values()
    extra = {} if saturate is None else {"saturate": saturate}
    nodes = [helper.make_node("Cast", ["x"], ["q"], name="to_narrow", to=getattr(T, to), **extra),
             helper.make_node("Cast", ["q"], ["y"], name="back", to=T.FLOAT)]
    model = _model(nodes, [("x", T.FLOAT, [x.size])], [("y", T.FLOAT, [x.size])])
    result = _cli("diff", _save(model, tmp_path, "roundtrip"), "--dtype", "float32", "--atol", "0", "--rtol", "0",
                  "--inputs", _inputs(tmp_path, x=x))
    _passes(result)


@pytest.mark.parametrize("to", ["FLOAT8E4M3FN", "FLOAT8E5M2FNUZ", "BFLOAT16", "INT4", "UINT4"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_narrow_graph_output(to: str, dtype: str, tmp_path: Path) -> None:
    """A float8/bfloat16/int4 graph output: onnxruntime's reference comes back as an ml_dtypes
    array and is compared in float64 (was: onnxruntime refused, then a TypeError in the stats)."""
    nodes = [helper.make_node("Mul", ["x", "scale"], ["s"], name="scale"),
             helper.make_node("Cast", ["s"], ["y"], name="to_narrow", to=getattr(T, to))]
    model = _model(nodes, [("x", T.FLOAT, [4, 8])], [("y", getattr(T, to), [4, 8])],
                   initializers=[numpy_helper.from_array(np.array(9.0, np.float32), "scale")])
    _passes(_cli("diff", _save(model, tmp_path, "narrow_out"), "--dtype", dtype, "--atol", "0", "--rtol", "0"))


def test_float8_weights_through_data_movement(tmp_path: Path) -> None:
    """Weight-only float8 (an initializer cast up), and a float8 activation moved by
    Reshape/Transpose before it is cast back: the decode of float8 is amptool's, not TVM's."""
    w = (np.random.default_rng(1).standard_normal((8, 4)) * 3).astype(ml_dtypes.float8_e4m3fn)
    nodes = [helper.make_node("Cast", ["w"], ["wf"], name="dequant_w", to=T.FLOAT),
             helper.make_node("MatMul", ["x", "wf"], ["m"], name="matmul"),
             helper.make_node("Cast", ["m"], ["q"], name="quant", to=T.FLOAT8E5M2),
             helper.make_node("Transpose", ["q"], ["qt"], name="transpose", perm=[1, 0]),
             helper.make_node("Cast", ["qt"], ["y"], name="dequant", to=T.FLOAT)]
    model = _model(nodes, [("x", T.FLOAT, [4, 8])], [("y", T.FLOAT, [4, 4])],
                   initializers=[numpy_helper.from_array(w, "w")])
    path = _save(model, tmp_path, "f8_weights")
    for extra in ((), ("--no-prepare",)):
        _passes(_cli("diff", path, "--dtype", "float32", *extra))


def test_casts_between_narrow_types(tmp_path: Path) -> None:
    """float8 → another float8, → int4, and bfloat16 → int32 (TVM's own cast of bfloat16 to an
    integer fails to compile): each exact."""
    x = _dense_values()
    nodes = [helper.make_node("Cast", ["x"], ["a"], name="to_e4m3", to=T.FLOAT8E4M3FN),
             helper.make_node("Cast", ["a"], ["b"], name="to_e5m2fnuz", to=T.FLOAT8E5M2FNUZ),
             helper.make_node("Cast", ["b"], ["y1"], name="f8_out", to=T.FLOAT),
             helper.make_node("Cast", ["a"], ["c"], name="to_int4", to=T.INT4),
             helper.make_node("Cast", ["c"], ["y2"], name="int4_out", to=T.FLOAT),
             helper.make_node("Cast", ["x"], ["d"], name="to_bf16", to=T.BFLOAT16),
             helper.make_node("Cast", ["d"], ["y3"], name="bf16_to_int", to=T.INT32)]
    outputs = [("y1", T.FLOAT, [x.size]), ("y2", T.FLOAT, [x.size]), ("y3", T.INT32, [x.size])]
    model = _model(nodes, [("x", T.FLOAT, [x.size])], outputs)
    x = np.clip(np.nan_to_num(x), -2e9, 2e9).astype(np.float32)  # bfloat16 → int32 of NaN/inf/huge: undefined
    _passes(_cli("diff", _save(model, tmp_path, "chains"), "--dtype", "float32", "--atol", "0", "--rtol", "0",
                 "--inputs", _inputs(tmp_path, x=x)))


@pytest.mark.parametrize("source", ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "BFLOAT16"])
def test_narrow_graph_input_decodes_every_code(source: str, tmp_path: Path) -> None:
    """Library level (the CLI cannot generate float8 inputs): every float8 code, and every
    bfloat16 one, cast to float32, as onnxruntime decodes them (given to it as OrtValues)."""
    from amptool.app.convert import ConvertConfig, build_model
    from amptool.runtime.onnxruntime_runner import OnnxruntimeRunner

    dtype = onnx.helper.tensor_dtype_to_np_dtype(getattr(T, source))
    x = np.arange(256 if dtype.itemsize == 1 else 65536, dtype=np.uint8 if dtype.itemsize == 1 else np.uint16)
    x = x.view(dtype)
    model = _model([helper.make_node("Cast", ["x"], ["y"], name="decode", to=T.FLOAT)], [("x", getattr(T, source),
                   [x.size])], [("y", T.FLOAT, [x.size])])
    reference = OnnxruntimeRunner(model).run({"x": x})["y"]
    converted = build_model(ConvertConfig(model=_save(model, tmp_path, "decode"), dtype="float32")).compiled().run(
        {"x": x})["y"]
    np.testing.assert_array_equal(np.asarray(converted), reference)


@pytest.mark.parametrize(("to", "signed"), [("INT2", True), ("UINT2", False)])
def test_cast_to_two_bit_integers_wraps_like_int4(to: str, signed: bool, tmp_path: Path) -> None:
    """Cast to int2/uint2 (opset 25; onnxruntime has no kernel for it): carried in int8/uint8 and,
    like int4, rounded half away from zero then wrapped modulo 4 — on whole numbers exactly the onnx
    reference's values (ml_dtypes), which truncates halves. Was refused."""
    from amptool.app.convert import ConvertConfig, build_model

    x = np.array([-9, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 1e9, np.nan, 0.5, 1.5, -1.5, 2.49], np.float32)
    model = _model([helper.make_node("Cast", ["x"], ["y"], name="to_small", to=getattr(T, to))],
                   [("x", T.FLOAT, [x.size])], [("y", getattr(T, to), [x.size])], opset=25)
    model.ir_version = 11
    y = build_model(ConvertConfig(model=_save(model, tmp_path, "small"), dtype="float32")).compiled().run({"x": x})["y"]
    assert np.asarray(y).dtype == (np.int8 if signed else np.uint8)
    whole = np.asarray(x[:13]).astype(getattr(ml_dtypes, to.lower())).astype(np.int64)
    np.testing.assert_array_equal(np.asarray(y[:13]).astype(np.int64), whole)
    halves = [0, 0, 1, -2, -2, -2] if signed else [0, 0, 1, 2, 2, 2]  # 1e9, NaN → 0; halves away from zero, wrapped
    np.testing.assert_array_equal(np.asarray(y[13:]).astype(np.int64), halves)


@pytest.mark.parametrize(("to", "opset", "name"), [("FLOAT4E2M1", 23, "float4_e2m1fn"),
                                                   ("FLOAT8E8M0", 24, "float8_e8m0fnu")])
@pytest.mark.parametrize("command", ["diff", "convert"])
def test_cast_to_unsupported_narrow_type_is_refused(to: str, opset: int, name: str, command: str,
                                                    tmp_path: Path) -> None:
    nodes = [helper.make_node("Cast", ["x"], ["q"], name="to_narrow", to=getattr(T, to)),
             helper.make_node("Cast", ["q"], ["y"], name="back", to=T.FLOAT)]
    model = _model(nodes, [("x", T.FLOAT, [2, 8])], [("y", T.FLOAT, [2, 8])], opset=opset)
    model.ir_version = 11
    args = ["-o", str(tmp_path / "out")] if command == "convert" else []
    _refuses(_cli(command, _save(model, tmp_path, "unsupported"), *args), "'to_narrow'", name)


# --------------------------------------------------------------------------- comparison of ml_dtypes arrays


def test_stats_cast_ml_dtypes_up_to_float64() -> None:
    """bfloat16/float8 references count as floats (numpy calls them kind 'V'), int4 as integers."""
    ref = np.linspace(-2, 2, 16).astype(ml_dtypes.bfloat16)
    off = (np.linspace(-2, 2, 16) + 0.25).astype(ml_dtypes.bfloat16)
    tol = default_tolerance("bfloat16")
    same = compare_output("y", ref, ref.astype(np.float32), tol)
    assert same["passed"] and same["max_abs"] == 0.0 and same["cosine"] == pytest.approx(1.0)
    shifted = compare_output("y", ref, off, tol)
    assert not shifted["passed"] and shifted["max_abs"] == pytest.approx(0.25, abs=0.02)
    f8 = compare_output("y", ref.astype(ml_dtypes.float8_e4m3fn), ref.astype(ml_dtypes.float8_e4m3fn), tol)
    assert f8["passed"] and f8["max_abs"] == 0.0
    int4 = np.array([-8, -1, 0, 7], np.int8)
    assert compare_output("y", int4.astype(ml_dtypes.int4), int4, tol)["passed"]
    wrong = compare_output("y", int4.astype(ml_dtypes.int4), int4 + 1, tol)
    assert not wrong["passed"] and wrong["failed_check"] == "exact"
    raw = compare_output("y", np.zeros(4, np.float32).view("V4"), np.zeros(4, np.float32), tol)
    assert not raw["passed"] and raw["failed_check"] == "values"  # bytes from an .npz: a verdict, not a TypeError


# --------------------------------------------------------------------------- tensor types


def _identity(elem_type: int, *, output_type: int | None = None) -> onnx.ModelProto:
    out = elem_type if output_type is None else output_type
    return _model([helper.make_node("Identity", ["x"], ["y"], name="id")], [("x", elem_type, [2, 4])],
                  [("y", out, [2, 4])], opset=18)


@pytest.mark.parametrize(("elem_type", "words"), [
    (99, ("'x'", "99")),
    (T.COMPLEX64, ("'x'", "complex64")),
    (T.COMPLEX128, ("'x'", "complex128")),
    (T.UNDEFINED, ("'x'",)),
    (T.FLOAT8E8M0, ("'x'", "float8_e8m0fnu")),
    (T.FLOAT4E2M1, ("'x'", "float4_e2m1fn")),
])
@pytest.mark.parametrize("command", ["inspect", "diff"])
def test_input_of_unknown_or_unsupported_type_is_refused(elem_type: int, words: tuple[str, ...], command: str,
                                                         tmp_path: Path) -> None:
    _refuses(_cli(command, _save(_identity(elem_type), tmp_path, "typed")), *words)


def test_output_of_unknown_type_is_refused(tmp_path: Path) -> None:
    model = _identity(T.FLOAT, output_type=99)
    _refuses(_cli("diff", _save(model, tmp_path, "out99")), "'y'", "99")


def test_unusual_integer_inputs_and_bool_output(tmp_path: Path) -> None:
    """uint16/uint32/uint64/int8 inputs, a bool and a uint64 output."""
    inputs = [("a", T.UINT16, [2, 4]), ("b", T.UINT32, [2, 4]), ("c", T.UINT64, [2, 4]), ("d", T.INT8, [2, 4])]
    nodes = [helper.make_node("Cast", [n], [f"{n}f"], name=f"cast_{n}", to=T.FLOAT) for n, _, _ in inputs]
    nodes += [helper.make_node("Sum", [f"{n}f" for n, _, _ in inputs], ["total"], name="sum"),
              helper.make_node("Greater", ["af", "df"], ["greater"], name="greater"),
              helper.make_node("Identity", ["c"], ["c_out"], name="c_out")]
    outputs = [("total", T.FLOAT, [2, 4]), ("greater", T.BOOL, [2, 4]), ("c_out", T.UINT64, [2, 4])]
    path = _save(_model(nodes, inputs, outputs, opset=18), tmp_path, "integers")
    for dtype in ("float32", "float16"):
        _passes(_cli("diff", path, "--dtype", dtype))


def test_a_bfloat16_model_builds_its_finiteness_and_sorting_ops(tmp_path: Path) -> None:
    """A model that is bfloat16 itself (not converted to it): IsNaN/IsInf, TopK and ArgMax on its own
    bfloat16 tensors. TVM has no bfloat16 kernel for the first (the build failed, exit 70) and reads
    bfloat16 wrongly in the others: they compute on float32 copies, their values come back bfloat16."""
    from amptool.app.convert import ConvertConfig, build_model

    x = np.array([[3.5, np.nan, -1.25, np.inf, 0.5, -np.inf, 7.0, 2.0]], np.float32).astype(ml_dtypes.bfloat16)
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    nodes = [helper.make_node("IsNaN", ["x"], ["nan"], name="nan"),
             helper.make_node("IsInf", ["x"], ["inf"], name="inf"),
             helper.make_node("Where", ["nan", "zero", "x"], ["clean"], name="clean"),
             helper.make_node("TopK", ["clean", "k"], ["top", "where"], name="top", axis=1),
             helper.make_node("ArgMax", ["clean"], ["best"], name="best", axis=1)]
    model = _model(nodes, [("x", T.BFLOAT16, [1, 8])],
                   [("nan", T.BOOL, [1, 8]), ("inf", T.BOOL, [1, 8]), ("top", T.BFLOAT16, [1, 3]),
                    ("where", T.INT64, [1, 3]), ("best", T.INT64, [1, 1])],
                   initializers=[k, numpy_helper.from_array(np.array(0, np.float32).astype(ml_dtypes.bfloat16),
                                                            "zero")])
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "bf16_native"), dtype="float32")).compiled().run(
        {"x": x})
    wide = x.astype(np.float32)
    np.testing.assert_array_equal(got["nan"], np.isnan(wide))
    np.testing.assert_array_equal(got["inf"], np.isinf(wide))
    assert str(np.asarray(got["top"]).dtype) == "bfloat16"
    np.testing.assert_array_equal(np.asarray(got["top"]).astype(np.float32), [[np.inf, 7.0, 3.5]])
    np.testing.assert_array_equal(got["where"], [[3, 6, 0]])
    np.testing.assert_array_equal(got["best"], [[3]])


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("elem", ["INT16", "UINT16", "UINT32", "UINT64"])
def test_topk_of_integers_tvm_cannot_sort(elem: str, largest: int, tmp_path: Path) -> None:
    """TopK over int16/uint16/uint32/uint64 (token ids, class ids, hashes): TVM has no sort for them
    ("Unsupported input dtype", exit 70); they sort as int64 (uint64 by its bits, top one flipped,
    values above 2**63 included) and the values come back in their own dtype."""
    from amptool.app.convert import ConvertConfig, build_model

    dtype = onnx.helper.tensor_dtype_to_np_dtype(getattr(T, elem))
    x = np.array([[5, 1, 300, 3, 9, 7], [0, 65535 if elem != "INT16" else -7, 2, 128, 4, 1]]).astype(dtype)
    if elem == "UINT64":
        x[0, 0], x[1, 2] = np.uint64(2**63 + 5), np.uint64(2**64 - 1)
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top", axis=1, largest=largest)],
                   [("x", getattr(T, elem), [2, 6])], [("v", getattr(T, elem), [2, 3]), ("i", T.INT64, [2, 3])],
                   initializers=[numpy_helper.from_array(np.array([3], np.int64), "k")])
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "topk_int"), dtype="float32")).compiled().run({"x": x})
    order = np.argsort(x, axis=1, kind="stable")
    order = (np.flip(order, axis=1) if largest else order)[:, :3]  # distinct values: no ties to break
    assert np.asarray(got["v"]).dtype == dtype
    np.testing.assert_array_equal(got["i"], order)
    np.testing.assert_array_equal(got["v"], np.take_along_axis(x, order, axis=1))


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x < 0, 0.5 * (np.exp(x) - 1), x)


def _selu(x: np.ndarray) -> np.ndarray:
    alpha, gamma = 1.67326319217681884765625, 1.05070102214813232421875
    return gamma * np.where(x <= 0, alpha * np.exp(x) - alpha, x)


@pytest.mark.parametrize(("op", "attrs", "formula"), [
    ("Elu", {"alpha": 0.5}, _elu), ("Selu", {}, _selu),
    ("ThresholdedRelu", {"alpha": 0.25}, lambda x: np.where(x > 0.25, x, 0.0)),
])
@pytest.mark.parametrize("elem", ["FLOAT16", "BFLOAT16", "DOUBLE"])
def test_activations_of_a_model_that_is_not_float32(op: str, attrs: dict, formula: Any, elem: str,
                                                    tmp_path: Path) -> None:
    """Elu/Selu/ThresholdedRelu in a float16, bfloat16 or float64 model: TVM's converters build them
    with float32 constants and the import failed ("Binary operators must have the same datatype")."""
    from amptool.app.convert import ConvertConfig, build_model

    dtype = ml_dtypes.bfloat16 if elem == "BFLOAT16" else onnx.helper.tensor_dtype_to_np_dtype(getattr(T, elem))
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(2, 6).astype(dtype)
    model = _model([helper.make_node(op, ["x"], ["y"], name="act", **attrs)],
                   [("x", getattr(T, elem), [2, 6])], [("y", getattr(T, elem), [2, 6])])
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "act"), dtype="float32")).compiled().run({"x": x})["y"]
    assert np.asarray(got).dtype == np.dtype(dtype)
    want = formula(x.astype(np.float64))
    tolerance = {"FLOAT16": 2e-3, "BFLOAT16": 2e-2, "DOUBLE": 1e-12}[elem]
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=tolerance, atol=tolerance)


def test_constant_given_as_value_float_without_onnxruntime_folding(tmp_path: Path) -> None:
    """Constant nodes written with value_float / value_ints (function bodies, hand-built graphs) and
    --no-prepare: TVM's converter reads `value` only and the import failed ("no value in Constant")."""
    nodes = [helper.make_node("Constant", [], ["scale"], name="scale", value_float=2.5),
             helper.make_node("Constant", [], ["shape"], name="shape", value_ints=[4, 2]),
             helper.make_node("Mul", ["x", "scale"], ["m"], name="mul"),
             helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape")]
    model = _model(nodes, [("x", T.FLOAT, [2, 4])], [("y", T.FLOAT, [4, 2])])
    _passes(_cli("diff", _save(model, tmp_path, "consts"), "--dtype", "float32", "--no-prepare"))


def test_bitcast_of_bool(tmp_path: Path) -> None:
    """BitCast bool → uint8: TVM's bool is one bit wide and reinterpreting it failed LLVM's verifier
    (exit 70); a bool byte is 0 or 1, the same bits as that uint8."""
    from amptool.app.convert import ConvertConfig, build_model

    model = _model([helper.make_node("BitCast", ["x"], ["y"], name="bits", to=T.UINT8)],
                   [("x", T.BOOL, [5])], [("y", T.UINT8, [5])], opset=26)
    model.ir_version = 11
    x = np.array([True, False, True, True, False])
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "bitcast"), dtype="float32")).compiled().run({"x": x})
    np.testing.assert_array_equal(got["y"], x.view(np.uint8))


def test_int4_input_diffs_against_onnxruntime(tmp_path: Path) -> None:
    """An int4 model input (weights-as-input, packed ids): it was refused; now carried as int8, and
    onnxruntime's reference gets the values too (fed as an ml_dtypes array it read them packed two
    a byte: other values, a FAILED verdict on a correct conversion)."""
    nodes = [helper.make_node("Cast", ["q"], ["qf"], name="dequant", to=T.FLOAT),
             helper.make_node("MatMul", ["x", "qf"], ["y"], name="matmul")]
    model = _model(nodes, [("q", T.INT4, [4, 3]), ("x", T.FLOAT, [2, 4])], [("y", T.FLOAT, [2, 3])])
    _passes(_cli("diff", _save(model, tmp_path, "int4_in"), "--dtype", "float16", "--iterations", "2"))


@pytest.mark.parametrize("elem", ["INT4", "UINT4", "INT2", "UINT2"])
def test_small_integer_inputs_cast_like_and_quantize(elem: str, tmp_path: Path) -> None:
    """A small-integer graph input read by Cast, CastLike (as the type to cast to) and QuantizeLinear
    (as its zero point): the container is int8/uint8, yet CastLike still wraps to the narrow type and
    QuantizeLinear saturates to its range, as the onnx reference does."""
    from onnx.reference import ReferenceEvaluator

    from amptool.app.convert import ConvertConfig, build_model

    narrow = getattr(T, elem)
    nodes = [helper.make_node("Cast", ["q"], ["wide"], name="wide", to=T.FLOAT),
             helper.make_node("CastLike", ["x", "q"], ["like"], name="like"),
             helper.make_node("QuantizeLinear", ["x", "scale", "q0"], ["quant"], name="quant")]
    model = _model(nodes, [("q", narrow, [6]), ("q0", narrow, []), ("x", T.FLOAT, [6])],
                   [("wide", T.FLOAT, [6]), ("like", narrow, [6]), ("quant", narrow, [6])],
                   initializers=[numpy_helper.from_array(np.array(0.5, np.float32), "scale")])
    dtype = getattr(ml_dtypes, elem.lower())
    low, high = int(ml_dtypes.iinfo(dtype).min), int(ml_dtypes.iinfo(dtype).max)
    feeds = {"q": np.arange(low, low + 6).clip(low, high).astype(dtype), "q0": np.array(high // 2 + 1, dtype),
             "x": np.array([-9.0, -3.0, -1.0, 0.0, 2.0, 11.0], np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "small_in"), dtype="float32")).compiled().run(feeds)
    for name, expected in zip(("wide", "like", "quant"), want, strict=True):
        np.testing.assert_array_equal(np.asarray(got[name]).astype(np.int64), expected.astype(np.int64), err_msg=name)


@pytest.mark.parametrize("elem", ["FLOAT8E4M3FN", "FLOAT8E5M2"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_float8_quantize_dequantize_per_axis(elem: str, saturate: int, tmp_path: Path) -> None:
    """QuantizeLinear to float8 and DequantizeLinear back, per channel, with a float8 zero point:
    TVM's converter refused the zero point (exit 2). Bit for bit as the onnx reference, overflow
    (saturated, or NaN/inf with saturate=0) included."""
    from onnx.reference import ReferenceEvaluator

    from amptool.app.convert import ConvertConfig, build_model

    f8 = getattr(T, elem)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quant", axis=1, saturate=saturate),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="dequant", axis=1)]
    model = _model(nodes, [("x", T.FLOAT, [2, 3])], [("q", f8, [2, 3]), ("y", T.FLOAT, [2, 3])],
                   initializers=[numpy_helper.from_array(np.array([0.5, 2.0, 1e-3], np.float32), "scale"),
                                 helper.make_tensor("zero", f8, [3], [0.0, 0.0, 0.0])])  # float8: zero (spec)
    feeds = {"x": np.array([[1.3, -7.1, 0.05], [1e5, 3.0, -1e4]], np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = build_model(ConvertConfig(model=_save(model, tmp_path, "f8q"), dtype="float32")).compiled().run(feeds)
    np.testing.assert_array_equal(np.asarray(got["q"]).astype(np.float32), want[0].astype(np.float32))
    np.testing.assert_array_equal(np.asarray(got["y"]), want[1])


def test_onnxruntime_reference_of_an_int4_input_returned_as_it_is() -> None:
    """The reference runner feeds int4 inputs in int8 (onnxruntime packs them two a byte); an input that
    is also an output comes back in the container too, not as a second definition of the name."""
    from amptool.runtime.onnxruntime_runner import OnnxruntimeRunner

    model = _model([helper.make_node("Cast", ["q"], ["f"], name="wide", to=T.FLOAT)], [("q", T.INT4, [4])],
                   [("f", T.FLOAT, [4]), ("q", T.INT4, [4])])
    q = np.array([-8, -1, 3, 7]).astype(ml_dtypes.int4)
    out = OnnxruntimeRunner(model).run({"q": q})
    np.testing.assert_array_equal(out["f"], [-8.0, -1.0, 3.0, 7.0])
    np.testing.assert_array_equal(out["q"].astype(np.int64), [-8, -1, 3, 7])
