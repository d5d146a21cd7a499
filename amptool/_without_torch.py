"""Import TVM without PyTorch where the process has not imported PyTorch itself.

``tvm_ffi`` (apache-tvm-ffi 0.1.14) and ``tvm.relax.base_py_module`` (apache-tvm 0.27) import
``torch`` at TVM's import when torch is installed (a Windows symbol-clash workaround, torch-tensor
conversion, DLPack patches). amptool never hands TVM a torch tensor, and on a machine with torch
2.13 CPU installed that made ``import tvm`` take 3.9 s instead of 1.2 s (``python -X importtime``,
2 cores): a ResNet-50 convert went from ~5.5 to ~9 s. While those modules' bodies run, ``torch``
is marked absent in ``sys.modules`` (their ``import torch`` raises ImportError, which they catch);
afterwards the mark is removed, so a later ``import torch`` anywhere works as usual. A process that
imported torch before TVM keeps TVM's torch support: nothing is hidden then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_HIDDEN = "torch"
#: The modules whose import (with everything they import) runs with torch hidden.
_TARGETS = frozenset({"tvm_ffi", "tvm", "tvm.relax"})


class _LoaderWithoutTorch(importlib.abc.Loader):
    """Delegates to the module's own loader, with ``torch`` hidden while the module body runs."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        hide = _HIDDEN not in sys.modules
        if hide:
            sys.modules[_HIDDEN] = None  # type: ignore[assignment]
        try:
            self._loader.exec_module(module)
        finally:
            if hide and sys.modules.get(_HIDDEN, ...) is None:
                del sys.modules[_HIDDEN]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _FinderWithoutTorch(importlib.abc.MetaPathFinder):
    """Finds each target through the normal path finder and wraps its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _TARGETS:
            return None
        if _HIDDEN in sys.modules or all(name in sys.modules for name in _TARGETS - {fullname}):
            uninstall()
        if _HIDDEN in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithoutTorch(spec.loader)
        return spec


_FINDER = _FinderWithoutTorch()


def install() -> None:
    """Hide torch from TVM's first import (a no-op once TVM or torch is imported)."""
    if sys.modules.keys() >= _TARGETS or _HIDDEN in sys.modules or _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
