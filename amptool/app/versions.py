"""What every JSON amptool writes carries: ``schema_version`` and the versions of what made it.

Versions come from the installed distributions' metadata (``importlib.metadata``), so stamping a
report imports neither TVM nor onnxruntime. A report that already lists versions (bench's, the
convert manifest's: read from the imported modules, with the toolchain) keeps its own values;
the stamp only adds the names it lacks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from amptool import __version__

#: Bumped when a key of a JSON report is renamed or removed (adding keys keeps it).
SCHEMA_VERSION = 1

#: Distributions whose versions decide a result, in the order reports list them; each with the
#: other distributions that install the same module (onnxruntime's GPU build).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "apache-tvm": ("apache-tvm",), "apache-tvm-ffi": ("apache-tvm-ffi",), "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "numpy": ("numpy",),
}


@functools.cache
def versions() -> dict[str, str]:
    """``{"amptool": …, "apache-tvm": …, …}``; "not installed" for a missing distribution."""
    found = {"amptool": __version__}
    for name, candidates in DISTRIBUTIONS.items():
        found[name] = next(filter(None, map(_installed, candidates)), "not installed")
    return found


def engine_versions() -> dict[str, str]:
    """onnx, onnxruntime and numpy: what the convert manifest and bench add to TVM's own versions."""
    found = versions()
    return {name: found[name] for name in ("onnx", "onnxruntime", "numpy")}


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def stamp(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` with ``schema_version`` first and ``versions`` completed; no key renamed or dropped."""
    own = payload.get("versions")
    merged = {**versions(), **(own if isinstance(own, Mapping) else {})}
    return {"schema_version": SCHEMA_VERSION, **payload, "versions": merged}
