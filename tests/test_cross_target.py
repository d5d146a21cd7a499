"""Cross-compiled artifacts: ``--target-options '-mtriple=…'`` links with the target's toolchain, the
manifest names the triple, and ``amptool run`` refuses a library for another architecture in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from amptool.compiler.targets import host_arch, parse_llvm_options, resolve_target, triple_arch
from amptool.errors import TargetUnavailableError, UserError
from tests.conftest import read_json, single_error

AARCH64 = "aarch64-linux-gnu"
ELF_MACHINE_AARCH64 = 183  # e_machine of an AArch64 ELF file


def _cross_toolchain() -> str | None:
    return shutil.which(f"{AARCH64}-g++") or shutil.which(f"{AARCH64}-gcc")


def test_mtriple_is_a_target_option():
    assert parse_llvm_options(["-mtriple=aarch64-linux-gnu -mcpu=cortex-a72"]) == {
        "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}
    assert triple_arch("arm64-apple-darwin") == "aarch64"
    assert triple_arch("x86_64-pc-linux-gnu") == "x86_64"


@pytest.mark.skipif(host_arch() == "aarch64", reason="checks a build for another architecture than this host's")
def test_cpu_is_checked_against_the_triple_and_host_cpu_is_not_inherited():
    target = resolve_target("llvm", options=["-mtriple=aarch64-linux-gnu"], lower_only=True)
    assert target.spec["mtriple"] == AARCH64 and "mcpu" not in target.spec  # not this x86 host's CPU
    assert resolve_target("llvm", options=["-mtriple=aarch64-linux-gnu -mcpu=cortex-a72"],
                          lower_only=True).spec["mcpu"] == "cortex-a72"
    with pytest.raises(UserError, match="LLVM does not know this CPU"):
        resolve_target("llvm", options=["-mtriple=aarch64-linux-gnu -mcpu=znver4"], lower_only=True)
    with pytest.raises(UserError, match="does not know this triple"):
        resolve_target("llvm", options=["-mtriple=nonsense-arch-os"], lower_only=True)


@pytest.mark.skipif(host_arch() == "aarch64", reason="checks a build for another architecture than this host's")
def test_no_cross_compiler_is_exit_3_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(TargetUnavailableError, match="no cross compiler") as caught:
        resolve_target("llvm", options=["-mtriple=aarch64-linux-gnu"])
    assert "apt-get install g++-aarch64-linux-gnu" in str(caught.value.hint)


@pytest.mark.skipif(host_arch() == "aarch64", reason="checks a build for another architecture than this host's")
@pytest.mark.skipif(_cross_toolchain() is None,
                    reason="no aarch64 cross toolchain: apt-get install g++-aarch64-linux-gnu (docs/remote.md)")
def test_aarch64_artifact_names_its_triple_and_run_here_refuses_it(zoo_model, run_cli, tmp_path):
    out = tmp_path / "a64"
    converted = run_cli("-q", "convert", zoo_model("tiny_cnn"), "--dtype", "float16",
                        "--target-options", "-mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "-o", str(out))
    assert converted.exit_code == 0, converted.output
    manifest = read_json(out / "manifest.json")
    assert manifest["triple"] == AARCH64
    assert manifest["target_spec"]["mtriple"] == AARCH64
    header = (out / "model.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == ELF_MACHINE_AARCH64

    np.savez(tmp_path / "x.npz", **{i["name"]: np.zeros(i["shape"], i["dtype"]) for i in manifest["inputs"]})
    result = run_cli("run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert f"was built for {AARCH64}; this machine is {host_arch()}" in result.output
    assert not (tmp_path / "y.npz").exists()


def test_run_refuses_a_manifest_for_another_architecture(zoo_model, run_cli, tmp_path):
    """Without a cross toolchain: a native artifact whose manifest names another architecture."""
    out = tmp_path / "out"
    assert run_cli("-q", "convert", zoo_model("tiny_cnn"), "--dtype", "float16", "-o", str(out)).exit_code == 0
    manifest = read_json(out / "manifest.json")
    assert triple_arch(manifest["triple"]) == host_arch()  # a native build names this machine's triple
    other = "riscv64-linux-gnu" if host_arch() != "riscv64" else AARCH64
    Path(out / "manifest.json").write_text(json.dumps({**manifest, "triple": other}))
    np.savez(tmp_path / "x.npz", **{i["name"]: np.zeros(i["shape"], i["dtype"]) for i in manifest["inputs"]})
    result = run_cli("run", str(out), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert f"was built for {other}" in result.output


@pytest.mark.skipif(host_arch() == "aarch64", reason="checks a build for another architecture than this host's")
@pytest.mark.skipif(_cross_toolchain() is None,
                    reason="no aarch64 cross toolchain: apt-get install g++-aarch64-linux-gnu (docs/remote.md)")
def test_diff_of_a_cross_build_without_rpc_exits_3_before_building(zoo_model, run_cli):
    result = run_cli("diff", zoo_model("tiny_cnn"), "--target-options", f"-mtriple={AARCH64}")
    assert result.exit_code == 3 and single_error(result.output), result.output
    assert "cannot run on this" in result.output and "--rpc" in result.output
