"""The artifact directory: compiled library + manifest.json, written atomically.

Layout of OUTDIR:
  model.so        the exported library (a Relax VM executable); loads without the compiler
  manifest.json   what was built, how, and what it cost (see README "manifest.json")

Everything is written into a temporary sibling directory first and renamed into place, so
a failed or interrupted run never leaves a half-written OUTDIR (an existing OUTDIR is only
replaced once the new one is complete).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from amptool import _tvm
from amptool.errors import UserError
from amptool.runtime.tvm_runner import CompiledModel

LIBRARY_NAME = "model.so"
MANIFEST_NAME = "manifest.json"


def write_artifact(output_dir: str, write_files: Callable[[str], None]) -> None:
    """Call ``write_files(tmpdir)``, then move tmpdir to ``output_dir`` atomically."""
    target = os.path.abspath(output_dir)
    if os.path.exists(target) and not os.path.isdir(target):
        raise UserError(f"Output path exists and is not a directory: {output_dir}")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise UserError(f"Cannot create output directory {parent}: {err.strerror}") from err
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    try:
        write_files(tmp)
        if os.path.isdir(target):
            backup = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
            os.rmdir(backup)
            os.rename(target, backup)
            os.rename(tmp, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=False, default=_json_default)
        handle.write("\n")


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.isfile(path):
        raise UserError(
            f"{directory} is not an amptool artifact (no {MANIFEST_NAME})",
            "Pass a directory written by 'amptool convert -o DIR'.",
        )
    try:
        with open(path, encoding="utf-8") as handle:
            manifest: dict[str, Any] = json.load(handle)
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is not readable JSON ({err})") from err
    return manifest


def load_artifact(directory: str) -> tuple[dict[str, Any], CompiledModel]:
    manifest = read_manifest(directory)
    library = os.path.join(directory, manifest.get("library", LIBRARY_NAME))
    if not os.path.isfile(library):
        raise UserError(f"{directory} has a manifest but no library {os.path.basename(library)}")
    vm = _tvm.load_vm(library, device=manifest.get("device", "cpu"))
    model = CompiledModel(
        vm=vm,
        input_names=[i["name"] for i in manifest["inputs"]],
        output_names=[o["name"] for o in manifest["outputs"]],
        device=manifest.get("device", "cpu"),
        input_dtypes=[i["dtype"] for i in manifest["inputs"]],
    )
    return manifest, model


def _json_default(value: Any) -> Any:
    if hasattr(value, "as_json"):
        return value.as_json()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
