"""Compiled kernels kept across the builds of one search, so a build compiles only what changed.

Why: ``--auto-fallback`` builds the same model again and again with a few more nodes kept
float32; most kernels come out identical, and LLVM (TIR lowering, optimisation, the JIT's
instruction selection) was ~5 of the ~8 s each probed MobileNetV2 step took (measured).

How: a kernel is named after its content (``<name>_<hash>``, ``global_symbol`` and then the
GlobalVar through TVM's ``NormalizeGlobalVar``), so the VM of a later build finds a kernel it
shares with an earlier one in that build's already-compiled (and JIT-compiled) LLVM module,
imported into the new executable. Only in-memory builds: an executable holding modules of
earlier builds is never exported (it would carry their unused kernels too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax


@dataclass(frozen=True)
class _Compiled:
    kernel: Any  # the PrimFunc, global_symbol removed: what a later kernel must equal
    module: Any  # the LLVM module holding it, as ``symbol``
    quick: bool  # compiled at split_codegen.QUICK_OPT_LEVEL, for a secondary entry only


class KernelCache:
    """Kernels compiled for one target, by structural hash; see the module docstring."""

    def __init__(self) -> None:
        self._target: str | None = None
        self._kernels: dict[int, list[tuple[str, _Compiled]]] = {}
        self._symbols: set[str] = set()
        self.compiled = 0
        self.reused = 0

    def name_kernels(self, mod: Any, target: Any, primary: frozenset[Any] = frozenset()) -> tuple[Any, dict[str, Any]]:
        """``mod`` with every kernel named after its content, and the modules already holding some
        of them (symbol → module); kernels compiled for another target are forgotten first. A kernel
        in ``primary`` (GlobalVars) is never taken from a quick compile."""
        if str(target) != self._target:
            self._target, self._kernels, self._symbols = str(target), {}, set()
        names: dict[Any, str] = {}
        cached: dict[str, Any] = {}
        taken = set()
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            bare = func.without_attr("global_symbol")
            digest = tvm_ffi.structural_hash(bare)
            hit = next(((symbol, c) for symbol, c in self._kernels.get(digest, ())
                        if not (c.quick and gv in primary) and tvm_ffi.structural_equal(c.kernel, bare)), None)
            if hit is not None and hit[0] not in taken:  # (a twin kernel of this module has it: compile this one)
                symbol, compiled = hit
                cached[symbol] = compiled.module
                names[gv] = symbol
            else:
                name = f"{gv.name_hint}_{digest & 0xFFFFFFFFFFFF:012x}"
                while name in taken or name in self._symbols:
                    name += "_"
                names[gv] = name
            taken.add(names[gv])
        renamed = tvm.IRModule({gv: (func.with_attr("global_symbol", names[gv]) if gv in names else func)
                                for gv, func in mod.functions_items()}, attrs=mod.attrs,
                               global_infos=mod.global_infos)
        self.reused += len(cached)
        return relax.transform.NormalizeGlobalVar()(renamed), cached

    def remember(self, part: Any, module: Any, quick: bool = False) -> None:
        """The kernels of ``part`` (an IRModule named by ``name_kernels``) compiled into ``module``
        (``quick``: at ``split_codegen.QUICK_OPT_LEVEL``)."""
        for gv, func in part.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc):
                bare = func.without_attr("global_symbol")
                self._kernels.setdefault(tvm_ffi.structural_hash(bare), []).append(
                    (gv.name_hint, _Compiled(bare, module, quick)))
                self._symbols.add(gv.name_hint)
                self.compiled += 1
