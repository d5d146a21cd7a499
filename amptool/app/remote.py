"""Artifacts and in-memory builds on a remote device (``--rpc``/``--rpc-server`` of run, diff, bench).

The verbs keep their own logic; this module only turns "an artifact directory" or "a build" into
a ``RemoteModel`` (``amptool.runtime.remote``) with the same ``run(feeds)`` as a local
``CompiledModel``, so diff compares remote outputs with the local onnxruntime reference exactly as
it compares local ones. Nothing is loaded locally: a library cross-compiled for aarch64, or built
for a GPU this machine lacks, runs only there.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from amptool import _tvm
from amptool.app.artifact import LIBRARY_NAME, check_device, check_runnable, read_manifest
from amptool.compiler.targets import cross_compiler
from amptool.errors import UserError
from amptool.runtime.remote import RemoteModel, RemoteSpec, open_remote

if TYPE_CHECKING:  # the deployment path (amptool run --rpc) imports this module, not the compiler
    from amptool.app.convert import BuildResult


@contextlib.contextmanager
def remote_artifact(spec: RemoteSpec, directory: str, device: str | None = None) -> Iterator[
        tuple[dict[str, Any], RemoteModel]]:
    """The manifest and the artifact's library loaded on the remote's ``device`` (default: the
    kind it was built for); the library is removed from the remote when the block ends."""
    manifest = read_manifest(directory)
    check_runnable(directory, manifest)
    library = os.path.join(directory, str(manifest.get("library") or LIBRARY_NAME))
    if not os.path.isfile(library):
        raise UserError(f"{directory} has a manifest but no library {os.path.basename(library)}")
    built_for = str(manifest.get("device", "cpu"))
    use = check_device(device, built_for) if device else built_for
    with open_remote(spec, library, use, [i["name"] for i in manifest["inputs"]],
                     [o["name"] for o in manifest["outputs"]], [i["dtype"] for i in manifest["inputs"]]) as model:
        yield manifest, model


@contextlib.contextmanager
def remote_build(spec: RemoteSpec, build: BuildResult) -> Iterator[RemoteModel]:
    """An in-memory build exported to a private temporary file (linked with the cross compiler when
    it targets another architecture), uploaded and loaded on the remote."""
    with tempfile.TemporaryDirectory(prefix="amptool-rpc-") as scratch:
        library = os.path.join(scratch, LIBRARY_NAME)
        _tvm.export_library(build.executable, library, cross_compiler(build.target_spec))
        with open_remote(spec, library, build.device, [s.name for s in build.inputs],
                         [s.name for s in build.outputs], [s.dtype for s in build.inputs]) as model:
            yield model


def remote_json(model: RemoteModel) -> dict[str, Any]:
    """What reports say about where a run happened."""
    found = {**model.spec.as_json(), "server": model.info.get("server"), "device": model.device}
    return found if model.removed is None else {**found, "library_removed": model.removed}
