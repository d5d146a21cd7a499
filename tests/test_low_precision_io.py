"""--low-precision-io: float32 inputs/outputs become the low dtype, with no round-trip casts."""

from __future__ import annotations

import pytest

from amptool.app.convert import ConvertConfig, rewrite_model
from tests.conftest import read_json


def test_signature_is_low_and_the_input_is_read_directly(zoo_model):
    rewritten = rewrite_model(ConvertConfig(model=zoo_model("tiny_cnn"), low_precision_io=True))
    main = rewritten.passes.mod["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["float16"]
    assert str(main.ret_ty.dtype) == "float16"
    text = str(main)
    assert "R.astype(input," not in text  # the first conv reads the fp16 input itself
    assert [s.dtype for s in rewritten.inputs] == ["float16"]


def test_integer_inputs_keep_their_dtype(zoo_model):
    rewritten = rewrite_model(ConvertConfig(model=zoo_model("transformer_encoder"), low_precision_io=True))
    assert {s.dtype for s in rewritten.inputs} == {"int64"}
    assert {str(f.dtype) for f in rewritten.passes.mod["main"].ret_ty.fields} == {"float16"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_convert_and_diff_with_low_precision_io(zoo_model, run_cli, tmp_path, dtype):
    model = zoo_model("tiny_cnn")
    out = tmp_path / "art"
    assert run_cli("convert", model, "--dtype", dtype, "--low-precision-io", "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    assert manifest["low_precision_io"] is True
    assert manifest["inputs"][0]["dtype"] == dtype and manifest["outputs"][0]["dtype"] == dtype
    result = run_cli("diff", model, "--artifact", str(out))
    assert result.exit_code == 0, result.output


def test_float32_ignores_the_flag(zoo_model):
    rewritten = rewrite_model(ConvertConfig(model=zoo_model("tiny_cnn"), dtype="float32", low_precision_io=True))
    assert [s.dtype for s in rewritten.inputs] == ["float32"]


def test_diff_accepts_the_flag(zoo_model, run_cli):
    result = run_cli("diff", zoo_model("tiny_cnn"), "--low-precision-io", "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
