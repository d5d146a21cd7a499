"""Real PyTorch exports (TorchScript and dynamo exporters) through convert + diff.

The architectures people ship, exported the two ways torch offers — each exporter emits its
own shape chains, masks and opsets. Needs the ``zoo`` extra (torch 2.13 CPU, transformers,
onnxscript); run with ``make zoo``. Skipped when torch is not installed.
"""

from __future__ import annotations

import pytest

from tests.conftest import read_json

pytest.importorskip("torch")
pytest.importorskip("transformers")

from amptool.testing import torch_zoo

pytestmark = pytest.mark.zoo

CASES = [(name, exporter) for name in torch_zoo.ALL_CASES for exporter in torch_zoo.EXPORTERS]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache: dict[tuple[str, str], str] = {}

    def get(name: str, exporter: str) -> str:
        if (name, exporter) not in cache:
            path = tmp_path_factory.mktemp("zoo") / f"{name}-{exporter}.onnx"
            torch_zoo.export(name, exporter, str(path))
            cache[(name, exporter)] = str(path)
        return cache[(name, exporter)]

    return get


@pytest.mark.parametrize(("name", "exporter"), CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_float16_diff_passes(name, exporter, exported, run_cli, tmp_path):
    report_path = tmp_path / "diff.json"
    result = run_cli("diff", exported(name, exporter), "--dtype", "float16", "--json", str(report_path))
    assert result.exit_code == 0, result.output
    for output in read_json(report_path)["outputs"]:
        assert output["cosine"] >= 0.999 and output["nan"] == 0 and output["inf"] == 0


@pytest.mark.parametrize("name", ["resnet18_like", "bert_encoder", "lstm_tagger"])
def test_bfloat16_diff_passes(name, exported, run_cli):
    result = run_cli("diff", exported(name, "torchscript"), "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output


def test_weights_are_stored_in_float16(exported, run_cli, tmp_path):
    out = tmp_path / "art"
    assert run_cli("convert", exported("resnet18_like", "dynamo"), "-o", str(out)).exit_code == 0
    weights = read_json(out / "manifest.json")["weight_bytes"]
    assert weights["after"] / weights["before"] <= 0.55
