"""Data-dependent results inside the graph (amptool/frontend/detection.py): NonMaxSuppression,
TopK with a run-time K, and an If whose branches differ in length, each feeding further nodes.

The small models compare amptool float32 with onnxruntime exactly (shapes and values). The
torchvision detectors (marker ``detection``, ``make detection``) need torch + torchvision and skip
without them."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import amptool

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _compare(path, feeds, dtype="float32"):
    """amptool's outputs equal onnxruntime's (integer outputs exactly, float ones to 1e-5)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = session.run(names, feeds)
    actual = amptool.convert(path, dtype=dtype).run(feeds)
    for name, want in zip(names, expected, strict=True):
        assert actual[name].shape == want.shape, name
        np.testing.assert_allclose(actual[name], want, rtol=1e-5, atol=1e-5, err_msg=name)
    return expected


def _info(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _boxes(rng, batch, n, center=False):
    xy = rng.uniform(0, 50, (batch, n, 2)).astype(np.float32)
    wh = rng.uniform(2, 20, (batch, n, 2)).astype(np.float32)
    if center:
        return np.concatenate([xy, wh], axis=2)
    corners = np.concatenate([xy, xy + wh], axis=2)[..., [1, 0, 3, 2]]  # [y1, x1, y2, x2]
    corners[:, ::3] = corners[:, ::3][..., [2, 3, 0, 1]]  # some boxes with flipped corners
    return corners


@pytest.mark.parametrize(("center", "iou", "score", "limit"), [
    (0, 0.5, 0.3, 4),  # the usual case, few boxes per class
    (1, 0.3, None, 100),  # centre boxes, no score threshold
    (0, 0.0, 0.0, 9223372036854775807),  # iou 0: any overlap suppresses; torchvision's "no limit"
])
def test_nms_run_time_thresholds_match_onnxruntime(tmp_path, center, iou, score, limit):
    rng = np.random.default_rng(0)
    feeds = {"boxes": _boxes(rng, 2, 30, bool(center)),
             "scores": rng.random((2, 3, 30)).astype(np.float32),
             "limit": np.array([limit], np.int64), "iou": np.array([iou], np.float32)}
    feeds["scores"][0, 0, 5:9] = feeds["scores"][0, 0, 4]  # ties: the lower index first
    names = ["boxes", "scores", "limit", "iou"]
    if score is not None:
        feeds["score"] = np.array([score], np.float32)
        names.append("score")
    node = helper.make_node("NonMaxSuppression", names, ["sel"], center_point_box=center)
    path = _save(tmp_path, [node], [_info("boxes", F, [2, 30, 4]), _info("scores", F, [2, 3, 30]),
                                    _info("limit", I64, [1]), _info("iou", F, [1])]
                 + ([_info("score", F, [1])] if score is not None else []), [_info("sel", I64, ["n", 3])])
    (selected,) = _compare(path, feeds)
    assert 0 < len(selected) < 2 * 3 * 30  # something kept, something suppressed


def test_nms_iou_equal_to_threshold_keeps_the_box(tmp_path):
    """onnxruntime suppresses only above the threshold; IoU(unit box, shifted by half) is exactly 1/7."""
    inits = [numpy_helper.from_array(np.array([3], np.int64), "limit"),
             numpy_helper.from_array(np.array([1 / 7], np.float32), "iou")]
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["sel"])
    path = _save(tmp_path, [node], [_info("boxes", F, [1, 2, 4]), _info("scores", F, [1, 1, 2])],
                 [_info("sel", I64, ["n", 3])], inits)
    feeds = {"boxes": np.array([[[0, 0, 1, 1], [0.5, 0.5, 1.5, 1.5]]], np.float32),
             "scores": np.array([[[0.9, 0.8]]], np.float32)}
    (selected,) = _compare(path, feeds)
    assert len(selected) == 2


def _nms_gather_model(tmp_path):
    """NMS, then the kept boxes' coordinates and scores gathered by its box-index column."""
    inits = [numpy_helper.from_array(np.array([10], np.int64), "limit"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "thr"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [helper.make_node("Relu", ["scores"], ["s"]),
             helper.make_node("NonMaxSuppression", ["boxes", "s", "limit", "iou", "thr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["index"], axis=1),
             helper.make_node("Squeeze", ["boxes", "zero_axes"], ["flat"]),
             helper.make_node("Gather", ["flat", "index"], ["kept"], axis=0),
             helper.make_node("Squeeze", ["s", "zero_axes"], ["flat_scores"]),
             helper.make_node("Gather", ["flat_scores", "index"], ["picked"], axis=1),
             helper.make_node("ReduceSum", ["kept"], ["total"], keepdims=0)]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero_axes"))
    return _save(tmp_path, nodes, [_info("boxes", F, [1, 50, 4]), _info("scores", F, [1, 1, 50])],
                 [_info("kept", F, ["n", 4]), _info("picked", F, [1, "n"]), _info("total", F, [])], inits)


def test_nms_result_feeding_gathers_has_its_run_time_length(tmp_path):
    rng = np.random.default_rng(1)
    feeds = {"boxes": _boxes(rng, 1, 50), "scores": rng.standard_normal((1, 1, 50)).astype(np.float32)}
    kept, _picked, _total = _compare(_nms_gather_model(tmp_path), feeds)
    assert 0 < len(kept) <= 10


def test_nms_model_converts_to_float16(tmp_path):
    rng = np.random.default_rng(2)
    feeds = {"boxes": _boxes(rng, 1, 50), "scores": rng.standard_normal((1, 1, 50)).astype(np.float32)}
    outputs = amptool.convert(_nms_gather_model(tmp_path), dtype="float16").run(feeds)
    assert outputs["kept"].ndim == 2 and outputs["kept"].shape[1] == 4 and 0 < len(outputs["kept"]) <= 10


@pytest.mark.parametrize("negative", [False, True])
def test_scatter_nd_of_a_count_nms_decides_reached_two_ways(tmp_path, negative):
    """tf2onnx's CombinedNonMaxSuppression: ScatterND with indices of [kept, 2] from NMS and updates of
    Range(0, Shape(kept)[0]) — one length, two symbols at import, which TVM's type check refused.
    ``negative``: the indices counted from the end, as ONNX allows."""
    n = 32
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (
        ("limit", [10]), ("c0", [0]), ("c1", [1]), ("c2", [2]), ("c3", [3]), ("axis1", [1]), ("zero", 0), ("one", 1),
        ("shift", [[-1, -n]] if negative else [[0, 0]]))]
    inits += [numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
              numpy_helper.from_array(np.array([0.0], np.float32), "thr"),
              numpy_helper.from_array(np.zeros((1, n), np.float32), "data")]
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "thr"], ["sel"]),
             helper.make_node("Slice", ["sel", "c0", "c1", "axis1"], ["batch"]),
             helper.make_node("Slice", ["sel", "c2", "c3", "axis1"], ["box"]),
             helper.make_node("Concat", ["batch", "box"], ["at"], axis=1),
             helper.make_node("Add", ["at", "shift"], ["idx"]),
             helper.make_node("Shape", ["sel"], ["shape"]),
             helper.make_node("Slice", ["shape", "c0", "c1"], ["count1"]),
             helper.make_node("Squeeze", ["count1"], ["count"]),
             helper.make_node("Range", ["zero", "count", "one"], ["rank"]),
             helper.make_node("Cast", ["rank"], ["value"], to=F),
             helper.make_node("ScatterND", ["data", "idx", "value"], ["out"])]
    path = _save(tmp_path, nodes, [_info("boxes", F, [1, n, 4]), _info("scores", F, [1, 2, n])],
                 [_info("out", F, [1, n])], inits)
    rng = np.random.default_rng(3)
    feeds = {"boxes": _boxes(rng, 1, n), "scores": rng.uniform(0, 1, (1, 2, n)).astype(np.float32)}
    (out,) = _compare(path, feeds)
    assert np.count_nonzero(out) >= 5  # the kept boxes' ranks landed


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_run_time_k_feeding_gather(tmp_path, largest):
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=largest),
             helper.make_node("Gather", ["table", "indices"], ["rows"], axis=0)]
    path = _save(tmp_path, nodes, [_info("x", F, [2, 9]), _info("k", I64, [1]), _info("table", F, [9, 3])],
                 [_info("values", F, [2, "k"]), _info("indices", I64, [2, "k"]), _info("rows", F, [2, "k", 3])])
    x = np.random.default_rng(3).standard_normal((2, 9)).astype(np.float32)
    x[0, 6] = x[0, 2]  # a tie
    table = np.arange(27, dtype=np.float32).reshape(9, 3)
    model = amptool.convert(path, dtype="float32")  # K stays a graph input: one library for every k
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for k in (3, 9):
        feeds = {"x": x, "k": np.array([k], np.int64), "table": table}
        actual = model.run(feeds)
        for name, want in zip(["values", "indices", "rows"], session.run(None, feeds), strict=True):
            assert actual[name].shape == want.shape == (2, k, 3)[: want.ndim], name
            np.testing.assert_array_equal(actual[name], want, err_msg=name)


def _roi_align_case(tmp_path, opset, **attrs):
    nodes = [helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], output_height=3, output_width=4, **attrs)]
    path = _save(tmp_path, nodes, [_info("x", F, [2, 3, 12, 10]), _info("rois", F, [5, 4]), _info("batch", I64, [5])],
                 [_info("y", F, [5, 3, 3, 4])], opset=opset)
    rng = np.random.default_rng(7)
    rois = np.array([[1.3, 2.1, 7.7, 9.4],  # inside, between pixels
                     [-3.0, -2.5, 4.2, 3.9],  # over the top-left edge
                     [8.4, 10.1, 14.0, 16.5],  # past the bottom-right edge
                     [5.0, 5.0, 5.0, 5.0],  # empty: 1×1 in output_half_pixel, no samples in half_pixel
                     [2.0, 1.0, 9.5, 11.0]], np.float32)
    feeds = {"x": rng.standard_normal((2, 3, 12, 10)).astype(np.float32), "rois": rois,
             "batch": np.array([0, 1, 1, 0, 1], np.int64)}
    return path, feeds


@pytest.mark.parametrize("attrs", [
    {"mode": "max", "sampling_ratio": 2},
    {"mode": "max"},  # samples per bin from each box's size
    {"mode": "max", "coordinate_transformation_mode": "output_half_pixel", "spatial_scale": 0.5},
    {"mode": "avg", "sampling_ratio": 3},  # TVM's converter, unchanged
])
def test_roi_align_matches_onnxruntime(tmp_path, attrs):
    """ONNX's max pools each sample's largest *weighted* corner (TVM's the largest bilinear sample:
    71 of 75 values of the conformance case differed)."""
    _compare(*_roi_align_case(tmp_path, 16, **attrs))


def test_roi_align_max_matches_the_onnx_reference_at_opset_22(tmp_path):
    """Opset 22 (bfloat16/float16 types), which onnxruntime 1.32 cannot run: the reference decides."""
    from onnx.reference import ReferenceEvaluator

    path, feeds = _roi_align_case(tmp_path, 22, mode="max", coordinate_transformation_mode="output_half_pixel")
    want = ReferenceEvaluator(str(path)).run(None, feeds)[0]
    got = amptool.convert(path, dtype="float32").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    low = amptool.convert(path, dtype="float16").run(feeds)["y"]
    np.testing.assert_allclose(low, want, rtol=1e-5, atol=1e-6)  # a float32 gather in any dtype


def test_if_branches_of_different_lengths_and_a_shape_min_feed_topk(tmp_path):
    """torchvision's pattern: ``If(no boxes, empty, boxes kept)`` read by further ops, and
    ``k = min(300, boxes kept)`` as a ReduceMin over a Concat of a constant and a Shape."""
    then_graph = helper.make_graph([helper.make_node("Constant", [], ["empty"], value=numpy_helper.from_array(
        np.zeros(0, np.int64)))], "then", [], [_info("empty", I64, [0])])
    else_graph = helper.make_graph([helper.make_node("NonZero", ["pos"], ["nz"]),
                                    helper.make_node("Squeeze", ["nz", "zero_axes"], ["found"])],
                                   "else", [], [_info("found", I64, ["m"])])
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero_axes"),
             numpy_helper.from_array(np.array([4], np.int64), "cap"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(0.0, np.float32), "fzero")]
    nodes = [helper.make_node("Greater", ["x", "fzero"], ["pos"]),
             helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
             helper.make_node("Less", ["top", "fzero"], ["none"]),
             helper.make_node("If", ["none"], ["picked"], then_branch=then_graph, else_branch=else_graph),
             helper.make_node("Gather", ["x", "picked"], ["vals"], axis=0),
             helper.make_node("Shape", ["vals"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["count"], axis=0),
             helper.make_node("Unsqueeze", ["count", "zero_axes"], ["count1"]),
             helper.make_node("Concat", ["cap", "count1"], ["both"], axis=0),
             helper.make_node("ReduceMin", ["both"], ["k0"], keepdims=0),
             helper.make_node("Unsqueeze", ["k0", "zero_axes"], ["k"]),
             helper.make_node("TopK", ["vals", "k"], ["best", "where"], axis=0)]
    path = _save(tmp_path, nodes, [_info("x", F, [12])], [_info("best", F, ["k"]), _info("where", I64, ["k"])],
                 inits)
    rng = np.random.default_rng(4)
    for positives in (2, 7, 0):
        x = -rng.random(12).astype(np.float32)
        x[rng.choice(12, positives, replace=False)] = rng.random(positives).astype(np.float32)
        best, _ = _compare(path, {"x": x})
        assert len(best) == min(4, positives)


# torchvision detectors: `make detection` (its own venv: PyPI's torchvision needs torch 2.14.1).
@pytest.fixture(scope="module")
def detector_path(tmp_path_factory):
    pytest.importorskip("torchvision")
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import detection_models

    def export(name):
        path = tmp_path_factory.mktemp("detection") / f"{name}.onnx"
        detection_models.export(name, str(path))
        return path, detection_models.image(0)

    return export


def _assert_well_conditioned(path, image):
    """onnxruntime against itself with the image one ulp away: a detector whose kept boxes swap on
    that (near-equal scores) cannot be compared at 1e-4, whatever amptool does."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    base = session.run(None, {"image": image})
    moved = session.run(None, {"image": np.nextafter(image, np.float32(2))})
    for a, b in zip(base, moved, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-3)


@pytest.mark.detection
@pytest.mark.parametrize("name", ["ssdlite", "faster_rcnn"])
def test_torchvision_detector_matches_onnxruntime_and_converts_to_float16(detector_path, name):
    path, image = detector_path(name)
    _assert_well_conditioned(path, image)
    report = amptool.diff(path, dtype="float32", inputs={"image": image})
    assert report.passed, report.verdict
    boxes = next(o for o in report.outputs if o["name"] == "boxes")
    assert boxes["shape"][0] > 0, "no detections: the comparison would be empty"
    converted = amptool.convert(path, dtype="float16")
    assert converted.run({"image": image})["boxes"].shape[1] == 4


def test_a_run_time_k_runs_where_tvm_was_imported_without_device_backends(tmp_path):
    """The CLI's CPU commands import TVM without its device backends, which also skipped the library
    registering the CPU's sort kernels: a TopK with a run-time k then failed to run ("Cannot find
    function tvm.contrib.sort.argsort") in such a process — the CLI's, or a Python session that ran
    one first. A fresh process, so the import is the test's own."""
    import subprocess

    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)]
    path = _save(tmp_path, nodes, [_info("x", F, [2, 9]), _info("k", I64, [1])],
                 [_info("values", F, [2, "k"]), _info("indices", I64, [2, "k"])])
    script = ("import numpy as np, amptool\n"
              "from amptool._tvm import common\n"
              "common.without_device_backends()\n"
              "with common._device_backends_as_wanted():\n"
              "    import tvm\n"
              "print(tvm.get_global_func('tvm.contrib.sort.argsort', allow_missing=True) is not None)\n"
              f"model = amptool.convert({str(path)!r}, dtype='float32')\n"
              "x = np.arange(18, dtype=np.float32).reshape(2, 9)\n"
              "print(model.run({'x': x, 'k': np.array([3], np.int64)})['values'].tolist())\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-2:] == ["True", "[[8.0, 7.0, 6.0], [17.0, 16.0, 15.0]]"]
