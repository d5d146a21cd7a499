"""Regression tests for amptool/frontend/signal_ops.py: DFT, STFT, windows, MelWeightMatrix, TfIdfVectorizer,
TensorScatter, DeformConv.

One-node models built with onnx.helper; amptool float32 is compared with numpy's FFT in float64 for the
transforms (onnxruntime's own DFT is off by ~3e-4 on length 10) and with onnxruntime for the rest.
Operands that decide shapes are initializers (what pinning makes of them)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import amptool
from tests.onnx_checks import info

F = TensorProto.FLOAT


def _save(tmp_path, nodes, inputs, outputs, opset, weights=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def _amptool(path, feeds, name="y"):
    return amptool.convert(path, dtype="float32").run(feeds)[name]


def _ort(path, feeds, name="y"):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run([name], feeds)[0]


def _pairs(z):
    """Complex numpy array → ONNX's [..., 2] real/imag layout."""
    return np.stack([z.real, z.imag], axis=-1).astype(np.float32)


def test_dft_real_512_onesided_is_accurate_in_float32(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 512, 1)).astype(np.float32)
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], onesided=1)
    path = _save(tmp_path, [node], [info("x", [2, 512, 1])], [info("y", [2, 257, 2])], 20,
                 [("axis", np.array(1, np.int64))])
    want = np.fft.rfft(x[..., 0].astype(np.float64), axis=1)
    got = _amptool(path, {"x": x})
    assert got.shape == (2, 257, 2)
    np.testing.assert_allclose(got, _pairs(want), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("length", [6, 12])  # truncate, zero-pad
def test_dft_inverse_complex_along_axis_2_with_dft_length(tmp_path, length):
    rng = np.random.default_rng(1)
    z = rng.standard_normal((2, 3, 8)) + 1j * rng.standard_normal((2, 3, 8))
    x = _pairs(z)
    node = helper.make_node("DFT", ["x", "n"], ["y"], inverse=1, axis=2)  # opset 17: axis attribute
    path = _save(tmp_path, [node], [info("x", [2, 3, 8, 2])], [info("y", [2, 3, length, 2])], 17,
                 [("n", np.array(length, np.int64))])
    np.testing.assert_allclose(_amptool(path, {"x": x}), _pairs(np.fft.ifft(z, n=length, axis=2)),
                               rtol=1e-4, atol=1e-5)


def test_dft_irfft_odd_length_ignores_imaginary_dc(tmp_path):
    rng = np.random.default_rng(2)
    spec = rng.standard_normal((1, 5, 3)) + 1j * rng.standard_normal((1, 5, 3))
    node = helper.make_node("DFT", ["x", "n", "axis"], ["y"], inverse=1, onesided=1)
    path = _save(tmp_path, [node], [info("x", [1, 5, 3, 2])], [info("y", [1, 9, 3, 1])], 20,
                 [("n", np.array(9, np.int64)), ("axis", np.array(-3, np.int64))])
    want = np.fft.irfft(spec, n=9, axis=1)[..., None]
    np.testing.assert_allclose(_amptool(path, {"x": _pairs(spec)}), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("opset", "axis"), [(17, 1), (20, 2)])  # numpy axes of x[..., 0]
def test_dft_default_axis_follows_the_opset_on_rank_4(tmp_path, opset, axis):
    """No axis given: opset 17 means axis 1, opset 20 means -2 — different axes of a rank-4 input."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 6, 1)).astype(np.float32)
    node = helper.make_node("DFT", ["x"], ["y"], name="fft")
    shape = [1, 4, 6, 2]
    path = _save(tmp_path, [node], [info("x", [1, 4, 6, 1])], [info("y", shape)], opset)
    want = np.fft.fft(x[..., 0].astype(np.float64), axis=axis)
    np.testing.assert_allclose(_amptool(path, {"x": x}), _pairs(want), rtol=1e-3, atol=1e-4)


def test_stft_run_time_window_and_hops_shorter_than_frames(tmp_path):
    rng = np.random.default_rng(3)
    signal = rng.standard_normal((2, 100, 1)).astype(np.float32)
    window = rng.random(20).astype(np.float32)
    node = helper.make_node("STFT", ["s", "step", "w", "len"], ["y"])
    frames = 1 + (100 - 20) // 7
    path = _save(tmp_path, [node], [info("s", [2, 100, 1]), info("w", [20])], [info("y", [2, frames, 11, 2])], 17,
                 [("step", np.array(7, np.int64)), ("len", np.array(20, np.int64))])
    idx = np.arange(frames)[:, None] * 7 + np.arange(20)
    want = np.fft.rfft(signal[:, idx, 0].astype(np.float64) * window, axis=-1)
    np.testing.assert_allclose(_amptool(path, {"s": signal, "w": window}), _pairs(want), rtol=1e-3, atol=1e-4)


def test_stft_complex_two_sided_with_hann_window_node(tmp_path):
    rng = np.random.default_rng(4)
    z = rng.standard_normal((1, 64)) + 1j * rng.standard_normal((1, 64))
    nodes = [helper.make_node("HannWindow", ["size"], ["w"]),
             helper.make_node("STFT", ["s", "step", "w"], ["y"], onesided=0)]
    path = _save(tmp_path, nodes, [info("s", [1, 64, 2])], [info("y", [1, 4, 16, 2])], 17,
                 [("step", np.array(16, np.int64)), ("size", np.array(16, np.int64))])
    hann = np.sin(np.pi * np.arange(16) / 16) ** 2
    want = np.fft.fft(z[:, np.arange(4)[:, None] * 16 + np.arange(16)] * hann, axis=-1)
    np.testing.assert_allclose(_amptool(path, {"s": _pairs(z)}), _pairs(want), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_onnxruntime(tmp_path, op, periodic):
    node = helper.make_node(op, ["size"], ["y"], periodic=periodic)
    path = _save(tmp_path, [node], [info("size", [], TensorProto.INT64)], [info("y", [33])], 17)
    feeds = {"size": np.array(33, np.int64)}
    got = amptool.convert(path, dtype="float32", fixed_inputs=feeds).run(feeds)["y"]
    np.testing.assert_allclose(got, _ort(path, feeds), rtol=1e-5, atol=1e-6)


def test_window_output_datatype_double(tmp_path):
    node = helper.make_node("HammingWindow", ["size"], ["y"], output_datatype=TensorProto.DOUBLE)
    path = _save(tmp_path, [node], [], [info("y", [8], TensorProto.DOUBLE)], 17, [("size", np.array(8, np.int32))])
    got = _amptool(path, {})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, 25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(8) / 8), rtol=1e-12)


def test_mel_weight_matrix_matches_onnxruntime(tmp_path):
    names = ["bins", "n", "rate", "lo", "hi"]
    values = [np.array(10, np.int64), np.array(64, np.int64), np.array(16000, np.int64),
              np.array(20.0, np.float32), np.array(7600.0, np.float32)]
    node = helper.make_node("MelWeightMatrix", names, ["y"])
    path = _save(tmp_path, [node], [], [info("y", [33, 10])], 17, list(zip(names, values, strict=True)))
    got = _amptool(path, {})
    assert got.shape == (33, 10) and got.max() == 1.0
    np.testing.assert_allclose(got, _ort(path, {}), rtol=1e-6)


@pytest.mark.parametrize(("mode", "lo", "hi", "skips", "weights"), [
    ("TF", 2, 3, 2, None), ("IDF", 1, 2, 0, None), ("TFIDF", 1, 3, 1, [0.5, 1, 2, 3, 4, 5, 6])])
def test_tfidf_vectorizer_int_pools_match_onnxruntime(tmp_path, mode, lo, hi, skips, weights):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 5, (3, 9)).astype(np.int32)
    attrs = {"mode": mode, "min_gram_length": lo, "max_gram_length": hi, "max_skip_count": skips,
             "ngram_counts": [0, 3, 7], "ngram_indexes": [6, 0, 1, 2, 3, 4, 5],
             # unigrams 1 2 3; bigrams (0, 1) (2, 2); trigrams (1, 0, 1) (4, 4, 4)
             "pool_int64s": [1, 2, 3, 0, 1, 2, 2, 1, 0, 1, 4, 4, 4]}
    if weights is not None:
        attrs["weights"] = weights
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
    path = _save(tmp_path, [node], [info("x", [3, 9], TensorProto.INT32)], [info("y", [3, 7])], 9)
    got, want = _amptool(path, {"x": x}), _ort(path, {"x": x})
    assert got.shape == want.shape and want.any()
    np.testing.assert_allclose(got, want)


def test_tfidf_vectorizer_string_pool_is_refused(tmp_path):
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1, max_gram_length=1,
                            max_skip_count=0, ngram_counts=[0], ngram_indexes=[0], pool_strings=["a"])
    path = _save(tmp_path, [node], [info("x", [4], TensorProto.STRING)], [info("y", [1])], 9)
    with pytest.raises(amptool.UserError):
        amptool.convert(path, dtype="float32")


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_write_indices_match_onnxruntime(tmp_path, mode):
    rng = np.random.default_rng(6)
    feeds = {"past": rng.standard_normal((3, 2, 6, 4)).astype(np.float32),
             "upd": rng.standard_normal((3, 2, 3, 4)).astype(np.float32),
             "at": np.array([0, 2, 5 if mode == "circular" else 3], np.int64)}
    node = helper.make_node("TensorScatter", ["past", "upd", "at"], ["y"], mode=mode, axis=2)
    path = _save(tmp_path, [node], [info("past", [3, 2, 6, 4]), info("upd", [3, 2, 3, 4]),
                                    info("at", [3], TensorProto.INT64)], [info("y", [3, 2, 6, 4])], 24)
    np.testing.assert_array_equal(_amptool(path, feeds), _ort(path, feeds))


def test_deform_conv_strided_dilated_grouped_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    oh, ow = (9 + 2 - 5) // 2 + 1, (8 + 1 - 2) // 1 + 1
    offset = (3 * rng.standard_normal((2, 2 * 6 * 2, oh, ow))).astype(np.float32)  # some taps land outside
    mask = rng.random((2, 2 * 6, oh, ow)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "off", "b", "m"], ["y"], group=2, offset_group=2,
                            strides=[2, 1], dilations=[2, 1], pads=[1, 0, 1, 1], kernel_shape=[3, 2])
    feeds = {"x": x, "w": w, "off": offset, "b": bias, "m": mask}
    path = _save(tmp_path, [node], [info(k, list(v.shape)) for k, v in feeds.items()],
                 [info("y", [2, 6, oh, ow])], 22)
    np.testing.assert_allclose(_amptool(path, feeds), _ort(path, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_spectrum_stays_float32_in_a_low_precision_build(tmp_path, dtype):
    """DFT and STFT are float32 in the default colour list: a spectrum's bins span orders of magnitude
    and a log-spectrogram reads the small ones, while a float16 cos/sin matrix errs ~1e-4 of the largest
    bin (a ramp's STFT in float16: bins near 0 off by 0.07 beside a DC bin of 950)."""
    signal = np.arange(128, dtype=np.float32).reshape(1, 128, 1)
    window = np.hanning(16).astype(np.float32)
    nodes = [helper.make_node("STFT", ["s", "step", "w"], ["spec"]),
             helper.make_node("DFT", ["s", "", "axis"], ["y"], onesided=1)]
    path = _save(tmp_path, nodes, [info("s", [1, 128, 1]), info("w", [16])],
                 [info("spec", [1, 15, 9, 2]), info("y", [1, 65, 2])], 20,
                 [("step", np.array(8, np.int64)), ("axis", np.array(1, np.int64))])
    idx = np.arange(15)[:, None] * 8 + np.arange(16)
    want = {"spec": _pairs(np.fft.rfft(signal[:, idx, 0].astype(np.float64) * window, axis=-1)),
            "y": _pairs(np.fft.rfft(signal[..., 0].astype(np.float64), axis=1))}
    model = amptool.convert(path, dtype=dtype)
    got = model.run({"s": signal, "w": window})
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=2e-6 * np.abs(value).max(), err_msg=name)
    assert model.manifest["ops_by_dtype"].get(dtype, 0) == 0, model.manifest["ops_by_dtype"]
