"""The artifact directory: compiled library + manifest.json, written atomically.

Layout of OUTDIR:
  model.so        the exported library (a Relax VM executable); loads without the compiler:
                  ``load_artifact`` uses only the TVM runtime (see README "Deploying")
  manifest.json   what was built, how, and what it cost (see README "manifest.json")
  lowered.py      instead of model.so after ``convert --lower-only``: the scheduled module

Everything is written into a private temporary sibling first and swapped into place
atomically; only a new, empty or artifact directory is ever written (:mod:`amptool.app.outdir`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from amptool import _tvm
from amptool.app.outdir import MANIFEST_NAME, artifact_files, write_directory
from amptool.compiler.targets import host_arch, triple_arch
from amptool.errors import TargetUnavailableError, UserError
from amptool.runtime.tvm_runner import CompiledModel

LIBRARY_NAME = "model.so"


def write_artifact(output_dir: str, write_files: Callable[[str], None]) -> None:
    """Call ``write_files(tmpdir)`` (which writes the manifest last, with :func:`write_manifest`),
    then let the new directory replace ``output_dir`` atomically; see :mod:`amptool.app.outdir`."""

    def write(tmp: str) -> list[str]:
        write_files(tmp)
        return sorted(artifact_files(tmp) or ())

    write_directory(output_dir, write)


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` last: its ``files`` key lists what amptool wrote into ``directory``,
    so a later convert into the same directory knows what it may replace."""
    names = {n for n in os.listdir(directory) if not n.startswith(".")} | {MANIFEST_NAME}
    manifest["files"] = sorted(names)
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=False, default=_json_default)
        handle.write("\n")


def read_manifest(directory: str, label: str | None = None) -> dict[str, Any]:
    """``directory``'s manifest; ``label`` names the directory in messages (default: itself)."""
    label = label or directory
    if not os.path.isdir(directory):
        raise UserError(f"Artifact directory not found: {label}",
                        "Pass a directory written by 'amptool convert -o DIR'.")
    path = os.path.join(directory, MANIFEST_NAME)
    shown = os.path.join(label, MANIFEST_NAME)
    if not os.path.isfile(path):
        raise UserError(
            f"{label} is not an amptool artifact (no {MANIFEST_NAME})",
            "Pass a directory written by 'amptool convert -o DIR'.",
        )
    try:
        with open(path, encoding="utf-8") as handle:
            manifest: dict[str, Any] = json.load(handle)
    except (OSError, ValueError) as err:
        raise UserError(f"{shown} is not readable JSON ({err})") from err
    if not isinstance(manifest, dict):
        raise UserError(f"{shown} is not an amptool manifest (not a JSON object)")
    missing = [key for key in ("inputs", "outputs") if not isinstance(manifest.get(key), list)]
    if missing:
        raise UserError(f"{shown} has no {' or '.join(repr(k) for k in missing)} list: not an amptool manifest")
    return manifest


@contextlib.contextmanager
def _pinned(directory: str) -> Iterator[str]:
    """A path to ``directory`` as it is now: files read through it come from one artifact even
    if a concurrent ``convert`` swaps a new one in meanwhile (``/proc/self/fd`` on Linux)."""
    if not os.path.isdir("/proc/self/fd") or not os.path.isdir(directory):
        yield directory
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def load_artifact(directory: str, device: str | None = None) -> tuple[dict[str, Any], CompiledModel]:
    """The manifest and the loaded library, on ``device`` (default: the one it was built for).

    Loads through the TVM runtime alone, so this works under a runtime-only TVM. The manifest and
    the library come from the same artifact: if a concurrent convert replaced the directory
    between the two reads (and removed the old library), the load starts again on the new one."""
    for attempt in range(3):
        with _pinned(directory) as base:
            manifest = read_manifest(base, label=directory)
            check_runnable(directory, manifest)
            check_host_arch(directory, manifest)
            name = manifest.get("library") or LIBRARY_NAME
            library = os.path.join(base, name)
            if not os.path.isfile(library):
                if attempt < 2 and base != directory:
                    continue
                raise UserError(f"{directory} has a manifest but no library {name}")
            built_for = str(manifest.get("device", "cpu"))
            use = check_device(device, built_for) if device else built_for
            vm = _load_vm(library, use, directory, name)
            break
    model = CompiledModel(
        vm=vm,
        input_names=[i["name"] for i in manifest["inputs"]],
        output_names=[o["name"] for o in manifest["outputs"]],
        device=use,
        input_dtypes=[i["dtype"] for i in manifest["inputs"]],
        deep_stack=bool(manifest.get("run_time_loops")),
        index_limits={str(k): int(v) for k, v in (manifest.get("index_inputs") or {}).items()},
    )
    return manifest, model


def _load_vm(library: str, device: str, directory: str, name: str) -> Any:
    try:
        return _tvm.load_vm(library, device=device)
    except LookupError as err:
        raise TargetUnavailableError(f"Cannot run {directory} on {device}: {err}",
                                     "Run it on a machine with that device, or pick another with --device.") from err
    except (RuntimeError, OSError) as err:
        raise UserError(f"{os.path.join(directory, name)} does not load: {_tvm.error_line(err)}",
                        "Was it built by another TVM version? Convert again with this one.") from err


def check_runnable(directory: str, manifest: dict[str, Any]) -> None:
    """A --lower-only artifact has no library: say so before anything else is checked."""
    if manifest.get("lower_only"):
        raise UserError(
            f"{directory} was written by 'convert --lower-only': it holds the lowered module, no library",
            f"Convert again without --lower-only, with a TVM that can build for {manifest.get('target')}.",
        )


def check_host_arch(directory: str, manifest: dict[str, Any]) -> None:
    """A library cross-compiled for another architecture (``-mtriple``) cannot load here: say so in
    one line instead of the dynamic loader's "wrong ELF class". Manifests before 'triple' pass."""
    triple = manifest.get("triple")
    if isinstance(triple, str) and triple and triple_arch(triple) != host_arch():
        raise TargetUnavailableError(
            f"{directory} was built for {triple}; this machine is {host_arch()}",
            "Run it on such a device: copy OUTDIR there, or run from here with --rpc/--rpc-server (docs/remote.md).",
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
