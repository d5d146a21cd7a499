"""Before/Expected tests of the mixed-precision pass, as TVM pins its own passes.

Each test writes a small Relax module in TVMScript, runs ``to_mixed_precision`` and compares
the result with the expected module (``tvm.ir.assert_structural_equal``, then the binding
names: the pass keeps names for ONNX provenance and names its casts ``<value>_f16``). The
policy is spelled out here (``POLICY``), not read from a preset, so that a change to the
shipped colour lists does not change what these tests pin.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from amptool import _tvm
from amptool.colors.policy import Color, ColorPolicy, NodeRule
from amptool.frontend.importer import NodeOrigin
from amptool.passes.low_precision_io import lower_io
from amptool.passes.mixed_precision import MixedPrecisionReport, to_mixed_precision

ALWAYS, FOLLOW, NEVER = Color.ALWAYS, Color.FOLLOW, Color.NEVER
POLICY = ColorPolicy(
    relax_colors={
        "relax.matmul": ALWAYS,
        "relax.nn.conv2d": ALWAYS,
        "relax.add": FOLLOW,
        "relax.multiply": FOLLOW,
        "relax.nn.relu": FOLLOW,
        "relax.nn.softmax": NEVER,
        "relax.exp": NEVER,
        "relax.full": NEVER,
    },
    onnx_colors={},
    accumulation={"relax.matmul": "float32", "relax.nn.conv2d": "float32"},
)
_BINDING = re.compile(r"^\s+(\w+): R\.", re.MULTILINE)


def _binding_names(mod: Any) -> list[str]:
    return _BINDING.findall(_tvm.module_script(mod))


def _check(
    before: Any,
    expected: Any,
    *,
    dtype: str = "float16",
    policy: ColorPolicy = POLICY,
    provenance: dict[str, NodeOrigin] | None = None,
    range_guards: bool = True,
    activation_peaks: Mapping[str, float] | None = None,
) -> MixedPrecisionReport:
    """Run the pass on ``before``; assert it gives ``expected`` (structure and names)."""
    after, report = to_mixed_precision(before, policy, dtype, provenance, range_guards=range_guards,
                                       activation_peaks=activation_peaks)
    _tvm.assert_well_formed(after, "test")
    tvm.ir.assert_structural_equal(after, expected)
    assert _binding_names(after) == _binding_names(expected)
    return report


# --------------------------------------------------------------------------- colours


def test_always_casts_inputs_down_and_accumulates_in_float32():
    """The matmul is the dataflow block's output: so is its cast down (a Var, not a DataflowVar)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                R.output(m)
            return m

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                R.output(m, m_f16)
            m_f16_f32 = R.astype(m_f16, dtype="float32")
            return m_f16_f32

    _check(Before, Expected)


def test_conv2d_accumulates_in_float32_then_casts_down():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(x, w)
                y = R.nn.relu(c)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                c = R.nn.conv2d(x_f16, w_f16, out_dtype="float32")
                c_f16 = R.astype(c, dtype="float16")
                y = R.nn.relu(c_f16)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    _check(Before, Expected)


def test_accumulation_dtype_comes_from_the_policy():
    """With float16 accumulation the matmul's result is already low: no cast after it."""
    policy = ColorPolicy(POLICY.relax_colors, {}, accumulation={"relax.matmul": "float16"})

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                y = R.nn.relu(m)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float16")
                y = R.nn.relu(m)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    _check(Before, Expected, policy=policy)


def test_follow_with_all_inputs_low_computes_low():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.matmul(x, w)
                b = R.nn.relu(a)
                y = R.add(a, b)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                a = R.matmul(x_f16, w_f16, out_dtype="float32")
                a_f16 = R.astype(a, dtype="float16")
                b = R.nn.relu(a_f16)
                y = R.add(a_f16, b)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    _check(Before, Expected)


def test_follow_with_mixed_inputs_computes_float32_and_casts_the_low_one_up():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                a = R.matmul(x, w)
                b = R.nn.relu(a)
                y = R.add(b, x)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                a = R.matmul(x_f16, w_f16, out_dtype="float32")
                a_f16 = R.astype(a, dtype="float16")
                b = R.nn.relu(a_f16)
                b_f32 = R.astype(b, dtype="float32")
                y = R.add(b_f32, x)
                R.output(y)
            return y

    _check(Before, Expected)


def test_follow_with_float32_inputs_leaves_the_module_as_it_was():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

    report = _check(Before, Before)
    assert [(d.var, d.color, d.dtype) for d in report.decisions] == [("y", FOLLOW, "float32")]


def test_never_reads_the_float32_accumulator_not_a_widened_copy():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                y = R.nn.softmax(m)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")  # noqa: F841 (unused: left for dead-code elimination)
                y = R.nn.softmax(m)
                R.output(y)
            return y

    _check(Before, Expected)


def test_a_value_is_cast_once_for_two_consumers():
    """``x`` and ``w`` feed two matmuls, the low ``r`` two NEVER ops: one cast each."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                p = R.matmul(x, w)
                q = R.matmul(w, x)
                r = R.add(p, q)
                s = R.nn.softmax(r)
                e = R.exp(r)
                y = R.add(s, e)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                p = R.matmul(x_f16, w_f16, out_dtype="float32")
                p_f16 = R.astype(p, dtype="float16")
                q = R.matmul(w_f16, x_f16, out_dtype="float32")
                q_f16 = R.astype(q, dtype="float16")
                r = R.add(p_f16, q_f16)
                r_f32 = R.astype(r, dtype="float32")
                s = R.nn.softmax(r_f32)
                e = R.exp(r_f32)
                y = R.add(s, e)
                R.output(y)
            return y

    report = _check(Before, Expected)
    assert report.casts_inserted == 5


def test_unknown_op_is_never_and_reported():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                r = R.nn.relu(m)
                y = R.sin(r)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                r = R.nn.relu(m_f16)
                r_f32 = R.astype(r, dtype="float32")
                y = R.sin(r_f32)
                R.output(y)
            return y

    report = _check(Before, Expected)
    assert dict(report.unknown_ops) == {"relax.sin": 1}


# --------------------------------------------------------------------------- range guards


def test_constant_beyond_float16_keeps_its_consumer_float32():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                y = R.multiply(m, R.const(100000.0, "float32"))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")  # noqa: F841
                y = R.multiply(m, R.const(100000.0, "float32"))
                R.output(y)
            return y

    @I.ir_module
    class Unguarded:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                lv = R.astype(R.const(100000.0, "float32"), dtype="float16")
                y = R.multiply(m_f16, lv)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    report = _check(Before, Expected)
    assert [(g.node, g.kind) for g in report.guarded] == [("y", "constant")]
    _check(Before, Unguarded, range_guards=False)


def test_activation_guard_keeps_a_node_that_overflowed_in_calibration_float32():
    """``activation_peaks`` (ONNX node → calibrated max |x|) over the limit: the op stays float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                hot = R.matmul(x, w)
                cool = R.matmul(hot, w)
                R.output(cool)
            return cool

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                hot = R.matmul(x, w)
                hot_f16 = R.astype(hot, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                cool = R.matmul(hot_f16, w_f16, out_dtype="float32")
                cool_f16 = R.astype(cool, dtype="float16")
                R.output(cool, cool_f16)
            cool_f16_f32 = R.astype(cool_f16, dtype="float32")
            return cool_f16_f32

    provenance = {"hot": NodeOrigin("/hot/MatMul", "MatMul"), "cool": NodeOrigin("/cool/MatMul", "MatMul")}
    report = _check(Before, Expected, provenance=provenance,
                    activation_peaks={"/hot/MatMul": 1e5, "/cool/MatMul": 100.0})
    assert [(g.node, g.kind) for g in report.guarded] == [("/hot/MatMul", "activation")]


# --------------------------------------------------------------------------- per-node and per-ONNX-op rules


def test_node_rule_overrides_the_op_colour_by_binding_name():
    policy = ColorPolicy(POLICY.relax_colors, {}, POLICY.accumulation, node_rules=(NodeRule("/head/*", NEVER),))

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                body = R.matmul(x, w)
                head = R.matmul(body, w)
                R.output(head)
            return head

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                body = R.matmul(x_f16, w_f16, out_dtype="float32")
                body_f16 = R.astype(body, dtype="float16")  # noqa: F841
                head = R.matmul(body, w)
                R.output(head)
            return head

    provenance = {"body": NodeOrigin("/body/MatMul", "MatMul"), "head": NodeOrigin("/head/MatMul", "MatMul")}
    report = _check(Before, Expected, policy=policy, provenance=provenance)
    assert [(d.node, d.color) for d in report.decisions] == [("/body/MatMul", ALWAYS), ("/head/MatMul", NEVER)]


def test_onnx_op_colour_wins_over_the_relax_op_colour():
    """A Gemm listed NEVER stays float32 though it imports as relax.matmul (ALWAYS)."""
    policy = ColorPolicy(POLICY.relax_colors, {"Gemm": NEVER}, POLICY.accumulation)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                fc = R.matmul(x, w)
                y = R.nn.relu(fc)
                R.output(y)
            return y

    report = _check(Before, Before, policy=policy, provenance={"fc": NodeOrigin("/fc/Gemm", "Gemm")})
    assert [(d.var, d.color, d.dtype) for d in report.decisions] == [
        ("fc", NEVER, "float32"), ("y", FOLLOW, "float32")]


# --------------------------------------------------------------------------- creation ops


def test_creation_op_reads_as_a_castable_constant():
    """A run-time ``full`` of a castable fill does not pull its FOLLOW consumer to float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                z = R.full(R.shape([2, 4]), R.const(0.5, "float32"), "float32")
                y = R.add(m, z)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                z = R.full(R.shape([2, 4]), R.const(0.5, "float32"), "float32")
                z_f16 = R.astype(z, dtype="float16")
                y = R.add(m_f16, z_f16)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    _check(Before, Expected)


def test_creation_op_whose_fill_overflows_is_not_castable():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                z = R.full(R.shape([2, 4]), R.const(1e6, "float32"), "float32")
                y = R.add(m, z)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")  # noqa: F841
                z = R.full(R.shape([2, 4]), R.const(1e6, "float32"), "float32")
                y = R.add(m, z)
                R.output(y)
            return y

    _check(Before, Expected)


# --------------------------------------------------------------------------- scopes: If, tuples, signatures


def test_if_branches_outside_dataflow_are_rewritten_and_cast_back():
    """Both branches of an ``If`` in a non-dataflow function; each returns its original dtype."""

    @I.ir_module
    class Before:
        @R.function
        def main(
            c: R.Tensor((), "bool"), x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")
        ) -> R.Tensor((2, 4), "float32"):
            if c:
                m = R.matmul(x, w)
                y = R.nn.relu(m)
            else:
                y = R.nn.softmax(x)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(
            c: R.Tensor((), "bool"), x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")
        ) -> R.Tensor((2, 4), "float32"):
            if c:
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                y_then = R.nn.relu(m_f16)
                y_then_f32 = R.astype(y_then, dtype="float32")
                y = y_then_f32
            else:
                y = R.nn.softmax(x)
            return y

    _check(Before, Expected)


def test_tuple_result_is_cast_back_field_by_field():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")
        ) -> R.Tuple(R.Tensor((2, 4), "float32"), R.Tensor((2, 4), "float32")):
            with R.dataflow():
                m = R.matmul(x, w)
                r = R.nn.relu(m)
                s = R.nn.softmax(m)
                t = (r, s)
                R.output(t)
            return t

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")
        ) -> R.Tuple(R.Tensor((2, 4), "float32"), R.Tensor((2, 4), "float32")):
            with R.dataflow():
                x_f16 = R.astype(x, dtype="float16")
                w_f16 = R.astype(w, dtype="float16")
                m = R.matmul(x_f16, w_f16, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                r = R.nn.relu(m_f16)
                s = R.nn.softmax(m)
                t = (r, s)
                R.output(t)
            gv = t[0]
            gv_f32 = R.astype(gv, dtype="float32")
            gv1 = t[1]
            gv2 = (gv_f32, gv1)
            return gv2

    _check(Before, Expected)


# --------------------------------------------------------------------------- bfloat16 and low-precision IO


def test_bfloat16_casts_and_keeps_a_constant_float16_could_not_hold():
    """bfloat16 has float32's range: the 1e5 that keeps a float16 multiply in float32 is cast."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                y = R.multiply(m, R.const(100000.0, "float32"))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                x_bf16 = R.astype(x, dtype="bfloat16")
                w_bf16 = R.astype(w, dtype="bfloat16")
                m = R.matmul(x_bf16, w_bf16, out_dtype="float32")
                m_bf16 = R.astype(m, dtype="bfloat16")
                lv = R.astype(R.const(100000.0, "float32"), dtype="bfloat16")
                y = R.multiply(m_bf16, lv)
                R.output(y)
            y_f32 = R.astype(y, dtype="float32")
            return y_f32

    report = _check(Before, Expected, dtype="bfloat16")
    assert not report.guarded


def test_low_precision_io_then_the_pass_cancels_the_entry_casts():
    """lower_io makes ``main`` take and return float16 (cast up on entry, down on exit); the
    pass then reads the float16 parameters directly: cast up → cast down is the identity."""

    @I.ir_module
    class Float32:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                m = R.matmul(x, w)
                y = R.nn.relu(m)
                R.output(y)
            return y

    @I.ir_module
    class Lowered:
        @R.function
        def main(x: R.Tensor((2, 4), "float16"), w: R.Tensor((4, 4), "float16")) -> R.Tensor((2, 4), "float16"):
            x_1 = R.astype(x, dtype="float32")
            w_1 = R.astype(w, dtype="float32")
            with R.dataflow():
                m = R.matmul(x_1, w_1)
                y = R.nn.relu(m)
                R.output(y)
            y_float16 = R.astype(y, dtype="float16")
            return y_float16

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float16"), w: R.Tensor((4, 4), "float16")) -> R.Tensor((2, 4), "float16"):
            x_1 = R.astype(x, dtype="float32")  # noqa: F841 (unused now: left for dead-code elimination)
            w_1 = R.astype(w, dtype="float32")  # noqa: F841
            with R.dataflow():
                m = R.matmul(x, w, out_dtype="float32")
                m_f16 = R.astype(m, dtype="float16")
                y = R.nn.relu(m_f16)
                R.output(y)
            y_float16 = R.astype(y, dtype="float16")  # float16 → float16: lower_io's exit cast, kept
            return y_float16

    lowered = lower_io(Float32, "float16")
    tvm.ir.assert_structural_equal(lowered, Lowered)
    _check(lowered, Expected)
