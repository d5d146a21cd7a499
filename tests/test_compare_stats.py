"""Tests for amptool.compare.stats: error statistics and the pass/fail verdict (pure numpy)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from amptool.compare.aggregate import mean_over, severity, worst_case
from amptool.compare.stats import (
    CHECK_STATS,
    DEFAULT_TOLERANCES,
    Tolerance,
    compare_output,
    default_tolerance,
)

# Every key compare_output promises, whatever the case (None where it does not apply).
RESULT_KEYS = (
    "max_abs", "mean_abs", "median_abs", "p90_abs", "p99_abs", "std_abs", "max_rel",
    "max_rel_index", "max_abs_index", "mean_rel", "cosine", "snr_db", "min_tolerance",
    "nan", "inf", "nan_reference", "inf_reference", "passed", "failure", "name", "shape",
    "psnr_db", "topk_agree", "tolerance_ratio", "failed_check", "tolerance", "converted_shape", "dtype",
    "scale_error", "unchecked",
)

FP16 = default_tolerance("float16")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(shape, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    return _rng(seed).normal(0.0, scale, size=shape).astype(np.float32)


# --------------------------------------------------------------------------- basics


def test_identical_arrays_pass_with_zero_error():
    ref = _normal((4, 8))
    res = compare_output("y", ref, ref.copy(), FP16)
    assert res["passed"] is True
    assert res["failure"] is None
    assert res["name"] == "y"
    assert res["shape"] == [4, 8]
    assert res["max_abs"] == 0.0
    assert res["mean_abs"] == 0.0
    np.testing.assert_allclose(res["cosine"], 1.0, rtol=0, atol=1e-12)
    assert res["snr_db"] == math.inf
    assert res["min_tolerance"] == 0.0
    assert (res["nan"], res["inf"], res["nan_reference"], res["inf_reference"]) == (0, 0, 0, 0)


def _all_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    ref = _normal((3, 5))
    nan_out = ref.copy()
    nan_out[1, 2] = np.nan
    nan_both = ref.copy()
    nan_both[0, 0] = np.nan
    return {
        "identical": (ref, ref.copy()),
        "noisy": (ref, ref + _normal((3, 5), 1e-3, seed=1)),
        "shape_mismatch": (ref, ref.reshape(5, 3)),
        "nan_in_output": (ref, nan_out),
        "nan_in_both": (nan_both, nan_both.copy()),
        "all_nan": (np.full(4, np.nan), np.full(4, np.nan)),
        "zero_size": (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)),
        "all_zero": (np.zeros(6, np.float32), np.zeros(6, np.float32)),
        "int": (np.array([1, 2, 3]), np.array([1, 2, 4])),
        "bool": (np.array([True, False]), np.array([True, False])),
        "string": (np.array(["a", "b"]), np.array(["a", "c"])),
    }


@pytest.mark.parametrize("case", sorted(_all_cases()))
def test_every_key_is_always_present(case):
    ref, out = _all_cases()[case]
    res = compare_output(case, ref, out, FP16)
    missing = [k for k in RESULT_KEYS if k not in res]
    assert missing == []
    assert isinstance(res["passed"], bool)
    assert (res["failure"] is None) == res["passed"]


# --------------------------------------------------------------------------- verdicts


def _rounding_noise(ref: np.ndarray, peak_fraction: float, seed: int) -> np.ndarray:
    """Noise uncorrelated with ref whose largest entry is ``peak_fraction·max|ref|``."""
    noise = _normal(ref.shape, seed=seed).astype(np.float64)
    return peak_fraction * float(np.abs(ref).max()) * noise / float(np.abs(noise).max())


def test_one_percent_scale_fails_on_scale_error_not_cosine_or_magnitude():
    ref = _normal((1000,), scale=10.0, seed=3)
    # A systematic 1 % drift: within atol + rtol·max|ref| at rtol 1e-2 and invisible to cosine,
    # but the converted output is 1.01× the reference, which rounding noise never is.
    res = compare_output("y", ref, ref * np.float32(1.01), FP16)
    np.testing.assert_allclose(res["cosine"], 1.0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(res["scale_error"], 0.01, rtol=1e-5)  # 1.01 in float32
    assert res["tolerance_ratio"] < 1.0, "magnitude alone cannot tell this from rounding"
    assert res["passed"] is False
    assert res["failed_check"] == "scale_error"
    assert res["failure"].startswith("scale_error 0.01 > max_scale_error ")
    assert "converted ≈ 1.01 × reference" in res["failure"]


def test_a_one_value_output_is_judged_by_its_tolerance_not_its_direction():
    """One value: its cosine is ±1 and its gain its relative error — calling 1.4% off "systematic,
    not rounding" said more than one value can. The element-wise tolerance judges it."""
    res = compare_output("loss", np.array([2.0], np.float32), np.array([2.0 * 0.986], np.float32), FP16)
    assert res["unchecked"] == ["cosine", "scale_error"]
    assert res["passed"] is False and res["failed_check"] == "tolerance"
    assert "systematic" not in res["failure"]
    assert compare_output("loss", np.array([2.0], np.float32), np.array([2.01], np.float32), FP16)["passed"]


def test_rounding_noise_of_the_same_magnitude_passes():
    # What trained models show after a correct fp16 conversion (PP-OCRv4 rec: max_abs ≈ 0.8 %
    # of max|ref|): as large as the 1 % scale above, but uncorrelated with the reference.
    ref = _normal((1000,), scale=10.0, seed=3).astype(np.float64)
    res = compare_output("y", ref, ref + _rounding_noise(ref, 8e-3, seed=30), FP16)
    assert res["passed"] is True, res["failure"]
    assert res["scale_error"] < 1e-3
    np.testing.assert_allclose(res["max_abs"] / np.abs(ref).max(), 8e-3, rtol=1e-9)


def test_gain_is_least_squares_over_elements_finite_on_both_sides():
    ref = np.array([1.0, 2.0, np.nan, -3.0, 4.0])
    out = np.array([1.1, 2.0, 5.0, -3.0, np.inf])
    res = compare_output("y", ref, out, Tolerance(atol=0.0, rtol=0.0, min_cosine=-1.0))
    gain = (1.1 * 1.0 + 2.0 * 2.0 + 9.0) / (1.0 + 4.0 + 9.0)  # elements 0, 1, 3
    np.testing.assert_allclose(res["scale_error"], abs(gain - 1.0), rtol=1e-12)


@pytest.mark.parametrize("factor", [0.99, 1.01])
def test_scale_error_is_symmetric_and_says_which_way(factor):
    ref = _normal((500,), seed=31).astype(np.float64)
    res = compare_output("y", ref, ref * factor, FP16)
    np.testing.assert_allclose(res["scale_error"], 0.01, rtol=1e-9)
    assert f"converted ≈ {factor:.4g} × reference" in res["failure"]


def test_scale_error_is_finite_for_huge_values():
    ref = np.array([1e300, -2e300, 3e300])
    res = compare_output("y", ref, ref * 1.5, Tolerance(atol=0.0, rtol=1.0, min_cosine=-1.0))
    np.testing.assert_allclose(res["scale_error"], 0.5, rtol=1e-12)


@pytest.mark.parametrize(
    ("ref", "out"),
    [
        (np.zeros(5, np.float32), np.ones(5, np.float32)),  # all-zero reference: no gain
        (np.arange(5), np.arange(5)),  # integers are compared exactly
        (np.array([np.nan, 0.0]), np.array([np.nan, 1.0])),  # zero where both are finite
    ],
)
def test_scale_error_is_none_where_it_does_not_apply(ref, out):
    assert compare_output("y", ref, out, FP16)["scale_error"] is None


def test_scale_error_threshold_is_a_tolerance_field():
    ref = _normal((1000,), seed=32)
    tol = Tolerance(atol=1e-3, rtol=0.1, min_cosine=0.9, max_scale_error=0.02)
    assert compare_output("y", ref, ref * np.float32(1.01), tol)["passed"] is True
    res = compare_output("y", ref, ref * np.float32(1.03), tol)
    assert res["failed_check"] == "scale_error"
    assert compare_output("y", ref, ref * np.float32(1.5), dataclasses.replace(tol, max_scale_error=math.inf,
                                                                              rtol=1.0))["passed"] is True


# --------------------------------------------------------------------------- signal below atol


def test_cosine_of_a_signal_below_atol_is_reported_but_not_judged():
    # PP-OCRv4 det's probability map on random inputs: ~3e-5 everywhere, error 1.5e-5, cosine 0.85.
    ref = np.abs(_normal((64, 64), scale=1e-5, seed=33)).astype(np.float64)
    out = ref + _rounding_noise(ref, 0.5, seed=34)
    res = compare_output("y", ref, out, FP16)
    assert res["cosine"] < 0.999 and res["scale_error"] is not None
    assert res["unchecked"] == ["cosine", "scale_error"]
    assert res["passed"] is True, res["failure"]


def test_below_atol_output_is_still_judged_on_absolute_error():
    ref = np.full(16, 1e-4)
    res = compare_output("y", ref, ref + 5e-3, FP16)  # 5e-3 > atol 1e-3 + rtol·1e-4
    assert res["unchecked"] == ["cosine", "scale_error"]
    assert res["failed_check"] == "tolerance"


def test_direction_is_not_judged_when_every_error_is_within_atol():
    # PP-OCRv4 det, another seed: one pixel reaches 1.3e-3 (> atol), the rest are ~1e-5; errors
    # stay ≤ 1.4e-4 yet the cosine of that sub-atol noise is 0.9988.
    ref = np.abs(_normal((64, 64), scale=1e-5, seed=36)).astype(np.float64)
    ref[10, 10] = 1.3e-3
    out = ref + _rounding_noise(ref, 0.1, seed=37)
    res = compare_output("y", ref, out, FP16)
    assert res["max_abs"] <= 1e-3 < float(np.abs(ref).max())
    assert res["cosine"] < 0.999
    assert res["unchecked"] == ["cosine", "scale_error"]
    assert res["passed"] is True, res["failure"]


def test_signal_and_error_above_atol_are_judged_on_cosine_and_scale():
    ref = _normal((1000,), seed=35).astype(np.float64)
    ref *= 0.2 / np.abs(ref).max()  # a 1 % scale moves the peak by 2e-3 > atol
    res = compare_output("y", ref, ref * 1.01, FP16)
    assert res["unchecked"] == [] and res["failed_check"] == "scale_error"
    res = compare_output("y", ref, -ref, FP16)
    assert res["unchecked"] == [] and res["failed_check"] == "cosine"
    small = compare_output("y", ref * 0.05, ref * 0.05 * 1.01, FP16)  # moves values by ≤ 1e-4: below atol
    assert small["unchecked"] == ["cosine", "scale_error"] and small["passed"] is True


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_output_where_reference_finite_always_fails(bad):
    ref = _normal((4, 4), seed=6)
    out = ref.copy()
    out[2, 1] = bad
    out[0, 3] = bad
    huge = Tolerance(atol=1e30, rtol=1e30, min_cosine=-1.0)
    res = compare_output("y", ref, out, huge)
    assert res["passed"] is False
    assert "reference is finite" in res["failure"]
    if np.isnan(bad):
        assert (res["nan"], res["inf"]) == (2, 0)
        assert "2 NaN" in res["failure"]
    else:
        assert (res["nan"], res["inf"]) == (0, 2)
        assert "2 Inf" in res["failure"]
    assert (res["nan_reference"], res["inf_reference"]) == (0, 0)


def test_nan_in_both_at_same_places_does_not_fail():
    ref = _normal((5, 5), seed=7)
    ref[1, 1] = ref[3, 4] = np.nan
    out = ref.copy()
    res = compare_output("y", ref, out, FP16)
    assert res["passed"] is True
    assert (res["nan"], res["nan_reference"]) == (2, 2)
    assert res["max_abs"] == 0.0


def test_nan_in_both_but_output_also_nan_elsewhere_fails():
    ref = _normal((5, 5), seed=7)
    ref[1, 1] = np.nan
    out = ref.copy()
    out[2, 2] = np.nan
    res = compare_output("y", ref, out, FP16)
    assert res["passed"] is False
    assert (res["nan"], res["nan_reference"]) == (2, 1)
    assert "1 NaN" in res["failure"]


def test_inf_of_opposite_sign_fails():
    ref = np.array([np.inf, 1.0, 2.0, 3.0])
    out = np.array([-np.inf, 1.0, 2.0, 3.0])
    assert compare_output("y", ref, out, FP16)["passed"] is False


def test_shape_mismatch_fails_and_mentions_shape():
    ref = _normal((2, 6))
    res = compare_output("y", ref, ref.reshape(3, 4), FP16)
    assert res["passed"] is False
    assert "shape" in res["failure"]
    assert "[3, 4]" in res["failure"] and "[2, 6]" in res["failure"]
    assert res["shape"] == [2, 6]


def test_max_abs_index_points_at_largest_error():
    ref = _normal((6, 7), seed=8)
    out = ref + _normal((6, 7), 1e-4, seed=9)
    out[4, 2] += 0.5
    res = compare_output("y", ref, out, FP16)
    assert res["max_abs_index"] == [4, 2]
    np.testing.assert_allclose(res["max_abs"], abs(float(out[4, 2]) - float(ref[4, 2])), rtol=1e-12)


def test_max_abs_index_skips_nonfinite_positions():
    # diff is taken over finite elements only; the index must still be in the full array.
    ref = _normal((3, 4), seed=10)
    ref[0, 0] = np.nan
    out = ref.copy()
    out[2, 3] += 1.0
    res = compare_output("y", ref, out, FP16)
    assert res["max_abs_index"] == [2, 3]


def test_max_rel_index_points_at_largest_relative_error():
    ref = np.array([[100.0, 200.0], [0.5, 300.0]])
    out = ref.copy()
    out[0, 0] += 1.0  # rel 0.01, largest absolute
    out[1, 0] += 0.1  # rel 0.2, largest relative
    res = compare_output("y", ref, out, FP16)
    assert res["max_abs_index"] == [0, 0]
    assert res["max_rel_index"] == [1, 0]
    np.testing.assert_allclose(res["max_rel"], 0.2, rtol=1e-9)


def test_float16_is_cast_up_to_float64():
    src = _normal((256,), seed=11)
    half = src.astype(np.float16)
    res = compare_output("y", src, half, FP16)
    expected = np.abs(half.astype(np.float64) - src.astype(np.float64))
    assert res["max_abs"] > 0.0
    np.testing.assert_allclose(res["max_abs"], expected.max(), rtol=0, atol=0)
    np.testing.assert_allclose(res["mean_abs"], expected.mean(), rtol=1e-12)


# --------------------------------------------------------------------------- min_tolerance


@pytest.mark.parametrize("stat", ["max", "elemwise", "mean", "median", "p99"])
def test_min_tolerance_is_the_smallest_passing_atol(stat):
    ref = _normal((500,), scale=2.0, seed=12)
    out = ref + _normal((500,), 0.05, seed=13)
    tol = Tolerance(atol=0.0, rtol=1e-3, min_cosine=0.9, check_stat=stat)
    res = compare_output("y", ref, out, tol)
    min_tol = res["min_tolerance"]
    assert min_tol > 0.0
    assert res["passed"] is False
    assert compare_output("y", ref, out, dataclasses.replace(tol, atol=min_tol + 1e-12))["passed"] is True
    assert compare_output("y", ref, out, dataclasses.replace(tol, atol=0.5 * min_tol))["passed"] is False


def test_min_tolerance_is_zero_when_rtol_alone_suffices():
    ref = _normal((100,), scale=5.0, seed=14)
    out = ref * np.float32(1.001)
    res = compare_output("y", ref, out, Tolerance(atol=0.0, rtol=1e-2, min_cosine=0.9))
    assert res["min_tolerance"] == 0.0
    assert res["passed"] is True


# --------------------------------------------------------------------------- check_stat


def _one_outlier() -> tuple[np.ndarray, np.ndarray]:
    ref = _normal((1000,), seed=15)
    out = ref + _normal((1000,), 1e-5, seed=16)
    out[123] += 0.5
    return ref, out


@pytest.mark.parametrize("stat", ["mean", "median", "p99"])
def test_robust_statistics_pass_where_max_fails(stat):
    ref, out = _one_outlier()
    base = Tolerance(atol=1e-3, rtol=0.0, min_cosine=0.9)
    res_max = compare_output("y", ref, out, base)
    assert res_max["passed"] is False
    assert res_max["failure"].startswith("max_abs")
    res = compare_output("y", ref, out, dataclasses.replace(base, check_stat=stat))
    assert res["passed"] is True, res["failure"]


@pytest.mark.parametrize("stat", ["mean", "median", "p99"])
def test_robust_statistics_fail_when_error_is_widespread(stat):
    ref = _normal((1000,), seed=17)
    out = ref + 0.01
    tol = Tolerance(atol=1e-3, rtol=0.0, min_cosine=0.9, check_stat=stat)
    res = compare_output("y", ref, out, tol)
    assert res["passed"] is False
    assert res["failure"].startswith(f"{stat}_abs")


def test_elemwise_uses_each_elements_own_reference():
    ref = np.array([1000.0, 0.001])
    out = np.array([1000.5, 0.011])  # 0.5 ≤ 1e-3·1000; 0.01 > 1e-3·0.001 + 1e-3
    tol = Tolerance(atol=1e-3, rtol=1e-3, min_cosine=0.9)
    assert compare_output("y", ref, out, tol)["passed"] is True  # max: 0.5 ≤ 1e-3 + 1e-3·1000
    res = compare_output("y", ref, out, dataclasses.replace(tol, check_stat="elemwise"))
    assert res["passed"] is False
    assert res["failure"].startswith("elemwise: 1 elements exceed")
    assert res["failed_check"] == "tolerance"


def test_check_stats_constant():
    assert set(CHECK_STATS) == {"max", "elemwise", "mean", "median", "p99"}


# --------------------------------------------------------------------------- edge cases


def test_zero_size_arrays_pass():
    ref = np.zeros((0, 4), np.float32)
    res = compare_output("y", ref, ref.astype(np.float16), FP16)
    assert res["passed"] is True
    assert res["shape"] == [0, 4]


def test_all_zero_reference_and_output_have_cosine_one():
    ref = np.zeros((3, 3), np.float32)
    res = compare_output("y", ref, ref.copy(), FP16)
    assert res["passed"] is True
    assert res["cosine"] == 1.0
    assert res["max_abs"] == 0.0


def test_zero_reference_nonzero_output_fails():
    ref = np.zeros(8, np.float32)
    out = np.full(8, 0.5, np.float32)
    res = compare_output("y", ref, out, FP16)
    assert res["passed"] is False
    assert res["cosine"] == 0.0


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_equal_integer_outputs_pass(dtype):
    ref = _rng(18).integers(0, 100, size=(4, 5)).astype(dtype)
    res = compare_output("idx", ref, ref.copy(), FP16)
    assert res["passed"] is True
    assert res["max_abs"] == 0.0


def test_different_small_integer_outputs_fail():
    ref = np.array([1, 2, 3, 4], np.int64)
    out = np.array([1, 2, 3, 5], np.int64)
    assert compare_output("idx", ref, out, FP16)["passed"] is False


def test_different_integer_outputs_fail_whatever_their_magnitude():
    ref = np.array([500, 999], np.int64)  # e.g. argmax over 1000 classes
    out = np.array([501, 999], np.int64)
    assert compare_output("idx", ref, out, FP16)["passed"] is False


def test_bool_outputs_equal_pass_different_fail():
    ref = _rng(19).random(64) > 0.5
    assert compare_output("mask", ref, ref.copy(), FP16)["passed"] is True
    flipped = ref.copy()
    flipped[10] = not flipped[10]
    assert compare_output("mask", ref, flipped, FP16)["passed"] is False


def test_non_numeric_outputs_compared_exactly():
    ref = np.array(["a", "b"])
    assert compare_output("s", ref, ref.copy(), FP16)["passed"] is True
    res = compare_output("s", ref, np.array(["a", "c"]), FP16)
    assert res["passed"] is False
    assert res["failure"] == "values differ"


# --------------------------------------------------------------------------- defaults


def test_default_tolerances_exist():
    for dtype in ("float16", "bfloat16", "float32"):
        tol = default_tolerance(dtype)
        assert isinstance(tol, Tolerance)
        assert tol.check_stat == "max"
        assert tol.atol > 0 and tol.rtol > 0 and 0 < tol.min_cosine < 1 and 0 < tol.max_scale_error < 1
    assert set(DEFAULT_TOLERANCES) == {"float16", "bfloat16", "float32"}


def test_bfloat16_is_looser_than_float16_is_looser_than_float32():
    f32, f16, bf16 = (default_tolerance(d) for d in ("float32", "float16", "bfloat16"))
    assert bf16.atol > f16.atol > f32.atol
    assert bf16.rtol > f16.rtol > f32.rtol
    assert bf16.min_cosine < f16.min_cosine < f32.min_cosine
    assert bf16.max_scale_error > f16.max_scale_error > f32.max_scale_error


def test_float16_scale_check_sits_between_measured_noise_and_a_one_percent_scale():
    # Measured (tolerance.py): correct fp16 conversions ≤ 9.4e-4 outside PP-OCRv4 rec; a
    # 1.01-scaled reference ≥ 9.6e-3. The bound must leave headroom on both sides.
    assert 2 * 9.4e-4 < FP16.max_scale_error < 9.6e-3 / 1.5


def test_unknown_dtype_has_no_default():
    with pytest.raises(KeyError):
        default_tolerance("int8")


# --------------------------------------------------------------------------- new statistics


def test_psnr_uses_the_reference_peak():
    ref = np.array([4.0, -2.0, 1.0, 0.0])
    out = ref + np.array([0.1, -0.1, 0.0, 0.0])
    res = compare_output("y", ref, out, FP16)
    np.testing.assert_allclose(res["psnr_db"], 10 * math.log10(16.0 / (0.02 / 4)), rtol=1e-12)
    assert compare_output("y", ref, ref.copy(), FP16)["psnr_db"] == math.inf
    assert compare_output("y", np.zeros(3), np.ones(3), FP16)["psnr_db"] is None


def test_snr_of_a_one_percent_scale_is_40_db():
    ref = _normal((100,), seed=20).astype(np.float64)
    res = compare_output("y", ref, ref * 1.01, FP16)
    np.testing.assert_allclose(res["snr_db"], 40.0, rtol=1e-9)


def test_topk_agreement_on_class_scores():
    rng = _rng(21)
    ref = rng.normal(size=(4, 10))
    out = ref.copy()
    # row 0: swap the two largest → top-1 disagrees, top-5 still holds the reference's label
    order = np.argsort(ref[0])[::-1]
    out[0, order[0]], out[0, order[1]] = ref[0, order[1]], ref[0, order[0]]
    # row 1: push the reference's label to the bottom → both disagree
    out[1, np.argmax(ref[1])] = -100.0
    res = compare_output("logits", ref, out, Tolerance(atol=1e9, rtol=0.0, min_cosine=-1.0))
    assert res["topk_agree"] == {"top1": 0.5, "top5": 0.75, "rows": 4}
    assert res["passed"] is True, "top-k agreement is informational, not part of the verdict"


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        ((1, 1000), np.float32, "top1+top5"),
        ((2, 7, 50), np.float16, "top1+top5"),
        ((1, 5), np.float32, "top1"),  # ≤ 5 classes: top-5 holds trivially, so it is None
        ((8,), np.float32, "top1+top5"),
        ((1, 3, 8, 8), np.float32, None),  # feature map (rank 4): not class scores
        ((4, 1), np.float32, None),  # one entry on the last axis: nothing to rank
        ((), np.float32, None),
        ((2, 10), np.int64, None),  # integer outputs are compared exactly instead
    ],
)
def test_topk_applies_to_class_score_shapes_only(shape, dtype, expected):
    ref = _normal(shape, seed=22).astype(dtype)
    agree = compare_output("y", ref, ref.copy(), FP16)["topk_agree"]
    if expected is None:
        assert agree is None
    else:
        assert agree["top1"] == 1.0
        assert (agree["top5"] == 1.0) if "top5" in expected else (agree["top5"] is None)


def test_topk_ignores_rows_with_nonfinite_values():
    ref = _normal((3, 8), seed=23)
    out = ref.copy()
    out[2, 0] = np.nan
    assert compare_output("y", ref, out, FP16)["topk_agree"]["rows"] == 2


def test_nan_in_reference_only_fails_and_says_so():
    ref = _normal((4, 4), seed=24)
    ref[1, 1] = np.nan
    out = np.nan_to_num(ref, nan=0.0)
    res = compare_output("y", ref, out, Tolerance(atol=1e30, rtol=1e30, min_cosine=-1.0))
    assert res["passed"] is False
    assert res["failed_check"] == "nonfinite"
    assert res["failure"] == "1 finite where the reference has 1 NaN / 0 Inf"
    assert (res["nan"], res["nan_reference"]) == (0, 1)


def test_nan_where_reference_has_inf_fails():
    ref = np.array([np.inf, 1.0])
    out = np.array([np.nan, 1.0])
    res = compare_output("y", ref, out, FP16)
    assert res["failed_check"] == "nonfinite"
    assert "another kind or sign" in res["failure"]


def test_failed_check_names_each_kind_of_failure():
    ref = _normal((50,), seed=25)
    cases = {
        "shape": (ref, ref[:10]),
        "cosine": (ref, _normal((50,), seed=26)),
        "scale_error": (ref, ref * 1.05),
        "tolerance": (ref, ref + np.where(np.arange(50) == 7, 0.05, 0.0)),  # one element off
        None: (ref, ref.copy()),
    }
    for check, (r, o) in cases.items():
        res = compare_output("y", r, o, FP16)
        assert res["failed_check"] == check, res["failure"]
    assert compare_output("i", np.arange(3), np.arange(3) + 1, FP16)["failed_check"] == "exact"
    assert compare_output("s", np.array(["a"]), np.array(["b"]), FP16)["failed_check"] == "values"


def test_resolved_tolerance_is_reported_with_each_output():
    tol = Tolerance(atol=0.5, rtol=0.25, min_cosine=0.9, check_stat="p99")
    res = compare_output("y", _normal((4,)), _normal((4,)), tol)
    assert res["tolerance"] == {"atol": 0.5, "rtol": 0.25, "min_cosine": 0.9, "check_error_stat": "p99",
                                "max_scale_error": math.inf}


def test_default_float16_tolerance_passes_measured_fp16_drift():
    # Measured on trained models: a correct fp16 conversion reached 4.1e-3·max|ref| (ddddocr det);
    # rtol 1e-2 leaves 2× headroom.
    ref = _normal((1000,), scale=3.0, seed=27)
    res = compare_output("y", ref, ref + _rounding_noise(ref, 4.1e-3, seed=28), FP16)
    assert res["passed"] is True
    assert res["tolerance_ratio"] < 0.5


# --------------------------------------------------------------------------- iterations


def _run(values: list[float]) -> list[dict]:
    """One iteration's results for a single output whose error is ``values``."""
    ref = np.linspace(1.0, 2.0, len(values))
    return [compare_output("y", ref, ref + np.array(values), FP16)]


def test_worst_case_takes_each_statistic_from_its_worst_iteration():
    runs = [_run([0.0, 1e-4, 0.0]), _run([5e-4, 0.0, 0.0]), _run([1e-4, 1e-4, 1e-4])]
    worst = worst_case(runs)[0]
    assert worst["max_abs"] == max(r[0]["max_abs"] for r in runs)
    assert worst["mean_abs"] == max(r[0]["mean_abs"] for r in runs)
    assert worst["cosine"] == min(r[0]["cosine"] for r in runs)
    assert worst["snr_db"] == min(r[0]["snr_db"] for r in runs)
    assert worst["max_abs_index"] == [0]  # from iteration 1, which holds the maximum
    assert worst["worst_iteration"] == 1
    assert worst["passed"] is True


def test_worst_case_fails_when_any_iteration_fails():
    runs = [_run([0.0, 0.0, 0.0]), _run([0.0, 0.5, 0.0]), _run([0.0, 0.0, 1e-4])]
    worst = worst_case(runs)[0]
    assert worst["passed"] is False
    assert worst["worst_iteration"] == 1
    assert worst["failure"] == runs[1][0]["failure"]


def test_mean_over_iterations():
    runs = [_run([1e-4, 0.0]), _run([3e-4, 0.0])]
    mean = mean_over(runs)[0]
    np.testing.assert_allclose(mean["max_abs"], 2e-4, rtol=1e-9)
    assert mean["failed_iterations"] == 0
    assert mean["name"] == "y"


def test_severity_ranks_basic_failures_before_tolerance():
    shape = compare_output("y", np.ones(3), np.ones(2), FP16)
    scale = compare_output("y", np.ones(3), np.ones(3) * 2, FP16)
    tol = compare_output("y", np.ones(3), np.ones(3) * 2, Tolerance(atol=0.0, rtol=0.0, min_cosine=0.0))
    fine = compare_output("y", np.ones(3), np.ones(3), FP16)
    assert (scale["failed_check"], tol["failed_check"]) == ("scale_error", "tolerance")
    assert severity(shape) > severity(scale) > severity(tol) > severity(fine)


def test_worst_case_keeps_the_largest_scale_error():
    ref = _normal((100,), seed=29).astype(np.float64)
    runs = [[compare_output("y", ref, ref * f, FP16)] for f in (1.001, 1.02, 0.997)]
    worst = worst_case(runs)[0]
    np.testing.assert_allclose(worst["scale_error"], 0.02, rtol=1e-9)
    assert worst["worst_iteration"] == 1 and worst["failed_check"] == "scale_error"
    np.testing.assert_allclose(mean_over(runs)[0]["scale_error"], (0.001 + 0.02 + 0.003) / 3, rtol=1e-9)


def test_a_reference_within_atol_of_zero_is_flagged():
    """Random weights that shrink logits to ~1e-7: every value is within float16's atol, so an output
    of zeros passes too — the result says so (the report's note), and names the scale."""
    ref = np.full((1, 10), 3e-7, np.float32)
    res = compare_output("y", ref, np.zeros_like(ref), FP16)
    assert res["passed"] and res["reference_below_atol"]
    assert res["reference_max_abs"] == pytest.approx(3e-7)
    normal = compare_output("y", ref * 1e6, ref * 1e6, FP16)
    assert not normal["reference_below_atol"] and normal["reference_max_abs"] == pytest.approx(0.3)
