"""Compilation pipelines per target: the Relax → TIR → machine-code half of amptool.

TVM 0.27's ``tvm.compile(mod, target="llvm")`` runs a plain pipeline (no constant folding, no
fusion, no schedules): every kernel single-threaded and unvectorized. ``cpu`` replaces it for
LLVM targets with fusion, packed-weight kernels and schedule rules of amptool's own. Like
``amptool._tvm`` this package talks to TVM directly; nothing else in amptool should.
"""
