"""Relax variable names that are legal C identifiers, before GPU kernels are generated.

TVM 0.27's CUDA codegen names a kernel's parameters after the Relax variables they come from
(``<name>_ptr``). amptool names bindings after ONNX nodes and tensors, which may hold ``/``,
``.``, ``:`` or ``-`` (``gpu_0/data_0`` in the onnx wheel's ResNet-50, ``/encoder/layer.0/…``
in every torch export): the kernel source then does not compile (nvcc: 'expected a ")"'), and
the CUDA runtime compiles it only when the library is loaded on the GPU. The LLVM path never
sees the names. ``SanitizeNames`` renames such variables (characters outside [A-Za-z0-9_] →
``_``, a leading digit prefixed); the VM calls functions by position, so nothing observable
changes. Names stay unique enough for C: TVM de-duplicates kernel parameter names itself.
"""

from __future__ import annotations

import re
from typing import Any

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from amptool import _tvm

_ILLEGAL = re.compile(r"[^A-Za-z0-9_]")


def c_identifier(name: str) -> str:
    """``name`` with every character outside [A-Za-z0-9_] replaced by '_' (never empty, never
    starting with a digit)."""
    clean = _ILLEGAL.sub("_", name) or "v"
    return f"v{clean}" if clean[0].isdigit() else clean


@mutator
class _Sanitize(PyExprMutator):
    def visit_var_def_(self, var: Any) -> Any:
        return self._renamed(var, relax.Var)

    def visit_dataflow_var_def_(self, var: Any) -> Any:
        return self._renamed(var, relax.DataflowVar)

    def _renamed(self, var: Any, ctor: Any) -> Any:
        name = str(var.name)
        clean = c_identifier(name)
        if clean == name:
            return var
        return ctor(clean, var.ty)


@tvm.transform.module_pass(opt_level=0, name="amptool.SanitizeNames")
def sanitize_names(mod: Any, _ctx: Any) -> Any:
    """Every Relax variable of ``mod`` named with C-identifier characters only."""
    return _tvm.rewrite_functions(mod, _Sanitize(mod))
