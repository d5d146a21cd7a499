"""The artifact directory: compiled library + manifest.json, written atomically.

Layout of OUTDIR:
  model.so        the exported library (a Relax VM executable); loads without the compiler:
                  ``load_artifact`` uses only the TVM runtime (see README "Deploying")
  manifest.json   what was built, how, and what it cost (see README "manifest.json")
  lowered.py      instead of model.so after ``convert --lower-only``: the scheduled module

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
from amptool.errors import TargetUnavailableError, UserError
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
    if not os.path.isdir(directory):
        raise UserError(f"Artifact directory not found: {directory}",
                        "Pass a directory written by 'amptool convert -o DIR'.")
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
    missing = [key for key in ("inputs", "outputs") if not isinstance(manifest.get(key), list)]
    if missing:
        raise UserError(f"{path} has no {' or '.join(repr(k) for k in missing)} list: not an amptool manifest")
    return manifest


def load_artifact(directory: str, device: str | None = None) -> tuple[dict[str, Any], CompiledModel]:
    """The manifest and the loaded library, on ``device`` (default: the one it was built for).

    Loads through the TVM runtime alone, so this works under a runtime-only TVM."""
    manifest = read_manifest(directory)
    check_runnable(directory, manifest)
    library = os.path.join(directory, manifest.get("library") or LIBRARY_NAME)
    if not os.path.isfile(library):
        raise UserError(f"{directory} has a manifest but no library {os.path.basename(library)}")
    built_for = str(manifest.get("device", "cpu"))
    use = check_device(device, built_for) if device else built_for
    try:
        vm = _tvm.load_vm(library, device=use)
    except LookupError as err:
        raise TargetUnavailableError(f"Cannot run {directory} on {use}: {err}",
                                     "Run it on a machine with that device, or pick another with --device.") from err
    except (RuntimeError, OSError) as err:
        raise UserError(f"{library} does not load: {_tvm.error_line(err)}",
                        "Was it built by another TVM version? Convert again with this one.") from err
    model = CompiledModel(
        vm=vm,
        input_names=[i["name"] for i in manifest["inputs"]],
        output_names=[o["name"] for o in manifest["outputs"]],
        device=use,
        input_dtypes=[i["dtype"] for i in manifest["inputs"]],
    )
    return manifest, model


def check_runnable(directory: str, manifest: dict[str, Any]) -> None:
    """A --lower-only artifact has no library: say so before anything else is checked."""
    if manifest.get("lower_only"):
        raise UserError(
            f"{directory} was written by 'convert --lower-only': it holds the lowered module, no library",
            f"Convert again without --lower-only, with a TVM that can build for {manifest.get('target')}.",
        )


#: Device kinds an artifact can name (``--device KIND[:INDEX]``).
DEVICE_KINDS = ("cpu", "cuda", "vulkan")


def check_device(device: str, built_for: str) -> str:
    """``device`` if it is ``KIND[:INDEX]`` of the kind the library was built for; else UserError."""
    kind, sep, index = device.partition(":")
    if kind not in DEVICE_KINDS or (sep and not index.isdigit()) or (kind == "cpu" and index not in ("", "0")):
        raise UserError(f"--device '{device}' is not a device like cpu, cuda:0 or vulkan:0",
                        f"Device kinds: {', '.join(DEVICE_KINDS)}; an index after ':' picks one GPU.")
    if kind != built_for.partition(":")[0]:
        raise UserError(f"--device {device}: this library was built for {built_for}, not {kind}",
                        f"Use --device {built_for}, or convert again with the --target for {kind}.")
    return device


def _json_default(value: Any) -> Any:
    if hasattr(value, "as_json"):
        return value.as_json()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
