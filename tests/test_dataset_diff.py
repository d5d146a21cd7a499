"""Dataset diff: a directory of .npz samples or one .npz with a sample axis, statistics over all
samples, the worst one named, decision flip rates and the thresholds that gate on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amptool.compare.labels import CLASSES, LABELS, PIXELS, Agreement, DecisionTracker, decision_kind
from tests.conftest import read_json, single_error


def _samples_dir(root: Path, count: int, shape: tuple[int, ...] = (1, 3, 32, 32), name: str = "input") -> Path:
    folder = root / "val"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        np.savez(folder / f"sample{i:02d}.npz", **{name: rng.standard_normal(shape).astype(np.float32)})
    return folder


def _near_tie_classifier(path: Path) -> str:
    """Two class scores that differ by at most 1e-4 around 1..2: float16 (spacing ~1e-3 there)
    rounds them to one value, so argmax picks class 0 wherever the reference picked class 1.
    Values stay within any tolerance; the decisions flip."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 1.0, 0.0, 1e-4])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"], name="scores")], "near_tie",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def test_directory_of_16_samples_on_a_classifier(zoo_model, run_cli, tmp_path):
    folder = _samples_dir(tmp_path, 16)
    out = tmp_path / "d.json"
    result = run_cli("diff", zoo_model("tiny_cnn"), "--inputs", str(folder), "--json", str(out))
    assert result.exit_code == 0, result.output
    data = read_json(out)
    dataset = data["dataset"]
    assert dataset["samples"] == 16 and dataset["source"] == "directory"
    assert dataset["top1_flip_rate"] == 0.0 and dataset["per_output"]["probs"]["rows"] == 16
    assert dataset["worst_sample"] == f"sample{dataset['worst_sample_index']:02d}.npz"
    assert data["iterations"]["count"] == 16 and len(data["iterations"]["labels"]) == 16
    assert data["inputs"]["source"] == "directory"
    assert "× 16 samples" in result.output.strip().splitlines()[-1]


@pytest.mark.parametrize("shape", [(16, 3, 32, 32), (16, 1, 3, 32, 32)])
def test_sample_axis_splits_one_file(zoo_model, run_cli, tmp_path, shape):
    """Samples stacked along the batch axis, or along a new leading axis: both give 16 batch-1 sets."""
    stacked = tmp_path / "stack.npz"
    np.savez(stacked, input=np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    out = tmp_path / "d.json"
    result = run_cli("diff", zoo_model("tiny_cnn"), "--inputs", str(stacked), "--sample-axis", "0",
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    dataset = read_json(out)["dataset"]
    assert dataset["samples"] == 16 and dataset["source"] == "sample-axis"
    assert dataset["worst_sample"].startswith("sample ")


def test_flip_rate_gates_when_values_pass(run_cli, tmp_path):
    model = _near_tie_classifier(tmp_path / "tie.onnx")
    stacked = tmp_path / "x.npz"
    rng = np.random.default_rng(2)
    x = np.stack([rng.uniform(1.0, 2.0, 16), np.where(np.arange(16) < 8, 1.0, -1.0)], axis=1)
    np.savez(stacked, x=x.astype(np.float32))
    out = tmp_path / "d.json"
    common = ("diff", model, "--inputs", str(stacked), "--sample-axis", "0", "--atol", "0.01", "--json", str(out))
    passed = run_cli(*common)
    assert passed.exit_code == 0, passed.output
    dataset = read_json(out)["dataset"]
    assert dataset["per_output"]["scores"]["top1_flips"] == 8
    assert dataset["top1_flip_rate"] == pytest.approx(0.5)
    assert dataset["top5_flip_rate"] is None  # two classes: no top-5

    gated = run_cli(*common, "--max-top1-flip", "0.1")
    assert gated.exit_code == 1, gated.output
    last = gated.output.strip().splitlines()[-1]
    assert last.startswith("FAILED") and "top1 flip rate 50.00% > --max-top1-flip 10.00%" in last
    assert read_json(out)["dataset"]["failures"] and read_json(out)["passed"] is False


@pytest.mark.parametrize(("extra", "needle"), [
    (("--sample-axis", "0"), "--sample-axis splits"),
    (("--max-top1-flip", "1.5"), "between 0 and 1"),
])
def test_bad_dataset_flags_without_files(zoo_model, run_cli, extra, needle):
    result = run_cli("diff", zoo_model("tiny_cnn"), *extra)
    assert result.exit_code == 2 and single_error(result.output) and needle in result.output


def test_bad_datasets_are_one_line_errors(zoo_model, run_cli, tmp_path):
    model = zoo_model("tiny_cnn")
    empty = tmp_path / "empty"
    empty.mkdir()
    uneven = tmp_path / "uneven.npz"
    np.savez(uneven, input=np.zeros((4, 3, 32, 32), np.float32), extra=np.zeros((3, 2), np.float32))
    folder = _samples_dir(tmp_path, 3)
    cases = [
        (("--inputs", str(empty)), "holds no .npz"),
        (("--inputs", str(folder), "--sample-axis", "0"), "is a directory"),
        (("--inputs", str(uneven), "--sample-axis", "0"), "different numbers of samples"),
        (("--inputs", str(folder), "--save-inputs", str(tmp_path / "s.npz")), "holds 3 samples"),
        (("--inputs", str(folder), "--min-pixel-agreement", "0.9"), "segmentation map"),
    ]
    for args, needle in cases:
        result = run_cli("diff", model, *args)
        assert result.exit_code == 2 and single_error(result.output), (args, result.output)
        assert needle in result.output, (args, result.output)
    assert not (tmp_path / "s.npz").exists()


def test_a_bad_sample_names_its_file(zoo_model, run_cli, tmp_path):
    folder = _samples_dir(tmp_path, 2)
    np.savez(folder / "sample02.npz", wrong=np.zeros((1, 3, 32, 32), np.float32))
    result = run_cli("diff", zoo_model("tiny_cnn"), "--inputs", str(folder))
    assert result.exit_code == 2 and single_error(result.output)
    assert "sample02.npz" in result.output


def test_decision_kinds():
    assert decision_kind(np.zeros((1, 1000), np.float32)) == CLASSES
    assert decision_kind(np.zeros((2, 16, 50257), np.float32)) == CLASSES
    assert decision_kind(np.zeros((1, 21, 64, 64), np.float32)) == PIXELS
    assert decision_kind(np.zeros((1, 1), np.float32)) is None
    assert decision_kind(np.zeros((1, 10), np.int64)) is None
    assert decision_kind(np.zeros((1, 64, 64), np.int64)) == LABELS
    assert decision_kind(np.zeros((1, 1, 64, 64), np.int32)) == LABELS
    assert decision_kind(np.zeros((1, 2, 64, 64), np.int64)) is None  # two maps: not one label per pixel
    assert decision_kind(np.zeros((1, 64, 64), bool)) is None  # a mask: must match exactly


def test_top5_and_pixel_agreement_counts():
    reference = np.arange(10, dtype=np.float32)[None, :].repeat(4, axis=0)  # top-5 = classes 5..9, top-1 = 9
    converted = reference.copy()
    converted[1, 0] = 100.0  # row 1: top-1 and top-5 change
    converted[2, 5] = -1.0  # row 2: top-5 changes (class 4 enters), top-1 stays
    converted[3, 9] = np.nan  # row 3: no decision = flipped
    classes = Agreement(CLASSES)
    classes.add(reference, converted)
    assert (classes.rows, classes.top1_flips, classes.top5_flips) == (4, 2, 3)

    ref_map = np.zeros((1, 3, 4, 4), np.float32)
    ref_map[:, 1] = 1.0
    out_map = ref_map.copy()
    out_map[0, 2, 0, :] = 5.0  # 4 of 16 pixels change class
    tracker = DecisionTracker()
    tracker.add({"seg": ref_map}, {"seg": out_map}, ["seg"])
    assert tracker.summary()["pixel_agreement"] == pytest.approx(0.75)


def _near_tie_segmenter(path: Path) -> str:
    """A 1×1 conv to two class maps whose weights differ by at most 2e-2, then the model's own ArgMax:
    an int64 [1, 32, 32] label map where the pixels whose two scores nearly tie flip in float16."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal(4).astype(np.float32)
    weight = np.stack([base, base + rng.uniform(-2e-2, 2e-2, 4).astype(np.float32)])[:, :, None, None]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["scores"], name="head"),
         helper.make_node("ArgMax", ["scores"], ["labels"], axis=1, keepdims=0, name="labels")], "segmenter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32, 32])],
        [helper.make_tensor_value_info("labels", TensorProto.INT64, [1, 32, 32])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 4, 1, 1], weight.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def test_integer_label_maps_are_judged_by_pixel_agreement(run_cli, tmp_path):
    """A segmenter ending in ArgMax: near-tie pixels flip in float16, so exact equality fails it;
    --min-pixel-agreement judges the label map by the fraction of equal labels instead."""
    model = _near_tie_segmenter(tmp_path / "seg.onnx")
    exact = run_cli("diff", model, "--dtype", "float16", "--json", str(tmp_path / "exact.json"))
    assert exact.exit_code == 1, exact.output
    failure = read_json(tmp_path / "exact.json")["outputs"][0]
    assert failure["failed_check"] == "exact"
    agreement = read_json(tmp_path / "exact.json")["dataset"]["pixel_agreement"]
    assert 0.9 < agreement < 1.0  # a few near-tie pixels flipped
    assert read_json(tmp_path / "exact.json")["dataset"]["per_output"]["labels"]["kind"] == LABELS

    loose = run_cli("diff", model, "--dtype", "float16", "--min-pixel-agreement", "0.9",
                    "--json", str(tmp_path / "loose.json"))
    assert loose.exit_code == 0, loose.output
    assert "pixel agreement" in loose.output.strip().splitlines()[-1]
    passed = read_json(tmp_path / "loose.json")["outputs"][0]
    assert passed["passed"] and 0 < passed["tolerance_ratio"] < 1  # share differing / share allowed

    strict = run_cli("diff", model, "--dtype", "float16", "--min-pixel-agreement", "0.99999",
                     "--json", str(tmp_path / "strict.json"))
    assert strict.exit_code == 1, strict.output
    output = read_json(tmp_path / "strict.json")["outputs"][0]
    assert output["failed_check"] == "pixel_agreement" and "labels differ" in output["failure"]
