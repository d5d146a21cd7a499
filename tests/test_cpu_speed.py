"""The slow-low-precision warning: judged from the target CPU's LLVM features, after -mattr."""

from __future__ import annotations

import logging

import pytest

from amptool.compiler import cpu_speed
from amptool.compiler.cpu_speed import low_precision_speed_note
from tests.conftest import read_json


@pytest.mark.parametrize(("spec", "dtype", "needle"), [
    ({"kind": "llvm", "mcpu": "znver4", "mattr": ["-f16c"]}, "float16", "lacks F16C"),
    ({"kind": "llvm"}, "float16", "lacks F16C"),  # generic x86-64: the 12-16x case of plain "llvm"
    ({"kind": "llvm", "mcpu": "znver4"}, "float16", "no AVX512-FP16"),
    # AVX512-FP16 is there, but amptool's kernels accumulate in float32: no faster than float32
    ({"kind": "llvm", "mcpu": "sapphirerapids"}, "float16", "compute float16 in float32"),
    ({"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512bf16"]}, "bfloat16", "no AVX512-BF16"),
    # AMX-BF16 without AVX512-BF16: amptool emits no AMX code, so bfloat16 is still not fast
    ({"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["-avx512bf16", "-amx-bf16"]}, "bfloat16", "no AVX512-BF16"),
    # AVX512-BF16 at half the FMA rate: the products are float32 FMAs, no faster than float32
    # AMX off (a VM's): the vector kernels' case
    ({"kind": "llvm", "mcpu": "emeraldrapids", "mattr": ["-amx-tile"]}, "bfloat16", "half its float32 FMA rate"),
    ({"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["-amx-bf16"]}, "bfloat16", "half its float32 FMA rate"),
])
def test_notes_name_the_missing_feature(spec, dtype, needle):
    note = low_precision_speed_note(dtype, spec)
    assert note is not None and needle in note and "measured" in note


@pytest.mark.parametrize("mcpu", ["znver3", "skylake", "haswell"])
def test_no_bf16_note_on_avx2_cpus_where_bf16_measured_faster(mcpu):
    """AVX2 only: bfloat16 weights read as pairs of vectors made bfloat16 0.75-0.95x float32
    (ResNet-50, MobileNetV2, BERT-base on an AVX2 EPYC); no warning of a slow dtype there."""
    assert low_precision_speed_note("bfloat16", {"kind": "llvm", "mcpu": mcpu}) is None


@pytest.mark.parametrize(("spec", "dtype"), [
    ({"kind": "llvm", "mcpu": "znver4"}, "bfloat16"),
    ({"kind": "llvm", "mcpu": "sapphirerapids"}, "bfloat16"),  # AMX tiles (cpu_amx)
    ({"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-bf16", "+amx-tile"]}, "bfloat16"),
    ({"kind": "llvm", "mcpu": "znver4"}, "float32"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"}, "float16"),  # not judged off x86
    ({"kind": "cuda", "arch": "sm_90"}, "float16"),
])
def test_no_note_where_the_dtype_is_fast_or_not_judged(spec, dtype):
    assert low_precision_speed_note(dtype, spec) is None


def test_convert_warns_once_and_records_the_note(zoo_model, run_cli, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cpu_speed, "_warned", set())
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="amptool.compiler.cpu_speed"):
        # An AVX-512 CPU without AVX512-BF16 (an AVX2 host gets no note: bfloat16 measured faster there).
        result = run_cli("convert", zoo_model("tiny_cnn"), "--dtype", "bf16",
                         "--target-options=-mcpu=znver4 -mattr=-avx512bf16", "-o", str(out))
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if r.name == "amptool.compiler.cpu_speed"]
    assert len(warnings) == 1 and "AVX512-BF16" in warnings[0]
    assert read_json(out / "manifest.json")["cpu_speed_note"] == warnings[0]
