"""Dynamic parallel shares: a CPU kernel's parallel loop hands its iterations out on demand.

What: ``DynamicShares``, a host TIR pass for LLVM targets. A ``T.parallel`` loop with enough work
is cut into ``segments`` contiguous ranges of iterations, each with its own counter on its own
cache line. The pool's threads still get consecutive tasks, as TVM's codegen splits any parallel
loop, but a task now walks the ring of segments from its own: it claims pieces of each segment
(``lock xadd``) until none are left, so a thread that finishes its own segments goes on with
the pieces a slower thread has not started. A claim first reads the counter: once a segment is
done, passing it costs one load, not a contended atomic.

Why: with static shares the launch waits for the slowest thread. On a VM whose two vCPUs do not
run at the same speed from one millisecond to the next (a neighbour on the sibling hyperthread,
host interrupts), that is most launches: amptool's medians sat 15–25% above its minima where
onnxruntime's pool, which hands out work dynamically, lost less. Segments keep what static shares
were good at — a thread's iterations stay contiguous (a conv's output-channel blocks, so each
core's cache holds half the weights); claiming one iteration at a time from a single counter
interleaved the threads and read every weight block into both cores (ResNet-50 5–7% slower).
Measured, outputs bit-identical (benchmarks/README.md, twentieth session): paired medians
ResNet-50 0.97–0.99×, Whisper encoder 0.94–0.98×, BERT-base 0.98–0.99×, MobileNetV2 0.99×;
per-kernel minima level.

When not: loops with less than ``MIN_WORK`` statement executions (a launch's claims would cost
more than an imbalance can), loops of symbolic extent or one iteration, GPU targets
(``split_codegen`` compiles them with TVM's default pipeline).
"""

from __future__ import annotations

import os
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx

#: Segments a loop is cut into: at least the threads a pool may run (a task beyond the segments
#: would get no work), and 16 on small machines so an imbalance moves in pieces of ~1/32.
SEGMENTS = max(16, min(os.cpu_count() or 1, 256))

#: Pieces a segment is claimed in: the finest unit a faster thread takes over.
PIECES = 2

#: Statement executions (stores, calls; each loop's extent multiplied in) below which a loop keeps
#: TVM's static shares: a transpose or a small elementwise kernel is over in microseconds.
MIN_WORK = 1 << 16

#: Statement executions a piece has at least, so that claims stay a small part of the work.
PIECE_WORK = 1 << 13

#: ``amptool_claim(counter, piece, end)``: the next piece's first iteration within a segment,
#: ``end`` or more once the segment is done. Linked into the kernel's LLVM module and inlined
#: (TVM's ``pragma_import_llvm``): TIR has no CPU atomic (``tirx.atomic_add`` is refused by the
#: LLVM CPU codegen of TVM 0.27). Monotonic is enough: the counter only splits the work, and the
#: pool's launch and join order the data.
CLAIM_IR = """
define i32 @amptool_claim(ptr %counter, i32 %piece, i32 %end) {
entry:
  %seen = load atomic i32, ptr %counter monotonic, align 4
  %done = icmp sge i32 %seen, %end
  br i1 %done, label %gone, label %take
take:
  %first = atomicrmw add ptr %counter, i32 %piece monotonic
  ret i32 %first
gone:
  ret i32 %seen
}
"""

#: int32 slots from one segment's counter to the next: a cache line, so owners share none.
_COUNTER_STRIDE = 16

#: Iterations a loop may have: claims count in int32, and a piece may overshoot the end once.
_MAX_EXTENT = 1 << 30


def work(stmt: Any) -> int:
    """Statement executions in ``stmt``, each loop's extent multiplied in (a symbolic one counts once)."""
    if isinstance(stmt, tirx.SeqStmt):
        return sum(work(s) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        extent = stmt.extent.value if isinstance(stmt.extent, tirx.IntImm) else 1
        return extent * work(stmt.body)
    if isinstance(stmt, tirx.IfThenElse):
        return max(work(stmt.then_case), work(stmt.else_case) if stmt.else_case is not None else 0)
    if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)):
        return 1
    body = getattr(stmt, "body", None)
    return work(body) if isinstance(body, tirx.Stmt) else 0


def _on_demand(loop: Any) -> Any:
    """``loop`` as claimed segments (see the module docstring), or unchanged."""
    if loop.kind != tirx.ForKind.PARALLEL or not isinstance(loop.extent, tirx.IntImm):
        return loop
    extent = loop.extent.value
    total = extent * work(loop.body)
    if not 1 < extent <= _MAX_EXTENT or total < MIN_WORK:
        return loop
    length = -(-extent // min(extent, SEGMENTS))
    segments = -(-extent // length)
    piece = -(-length // max(1, min(length, PIECES, total // (segments * PIECE_WORK))))
    i32 = "int32"
    counters = tirx.decl_buffer((segments * _COUNTER_STRIDE,), i32, name="claimed")
    first = tirx.decl_buffer((1,), i32, name="first")
    task, step, segment, offset = (tirx.Var(name, i32) for name in ("task", "step", "segment", "offset"))
    low = segment * length
    size = tirx.min(length, extent - low)
    start = tirx.BufferLoad(first, [0])
    index = loop.min + tirx.Cast(str(loop.loop_var.ty), low + start + offset)
    run = tirx.For(offset, 0, tirx.min(piece, size - start), tirx.ForKind.SERIAL,
                   tirx.SeqStmt([tirx.Bind(loop.loop_var, index), loop.body]))
    counter = tirx.address_of(tirx.BufferLoad(counters, [segment * _COUNTER_STRIDE]))
    claim = tirx.BufferStore(first, tirx.call_extern(i32, "amptool_claim", counter, piece, size), [0])
    pieces = -(-length // piece)
    one_segment = tirx.SeqStmt([
        tirx.Bind(segment, tirx.floormod(task + step, segments)),
        claim,
        tirx.For(tirx.Var("piece", i32), 0, pieces, tirx.ForKind.SERIAL,
                 tirx.IfThenElse(start < size, tirx.SeqStmt([run, claim]), None)),
    ])
    task_body = tirx.SeqStmt([tirx.AllocBuffer(first), tirx.For(step, 0, segments, tirx.ForKind.SERIAL, one_segment)])
    linked = tirx.AttrStmt(tirx.IntImm(i32, 0), "pragma_import_llvm", tvm.ir.StringImm(CLAIM_IR), task_body)
    tasks = tirx.For(task, 0, segments, tirx.ForKind.PARALLEL, linked, annotations=loop.annotations)
    zero = tirx.Var("s", i32)
    reset = tirx.For(zero, 0, segments, tirx.ForKind.SERIAL,
                     tirx.BufferStore(counters, tirx.IntImm(i32, 0), [zero * _COUNTER_STRIDE]))
    return tirx.SeqStmt([tirx.AllocBuffer(counters), reset, tasks])


def _dynamic_shares(func: Any, _mod: Any, _ctx: Any) -> Any:
    return tvm_ffi.structural_map(func, (tirx.For, _on_demand))


DynamicShares = tirx.transform.prim_func_pass(_dynamic_shares, opt_level=0, name="DynamicShares")
