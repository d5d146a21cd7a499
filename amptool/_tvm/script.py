"""TVMScript parsing without its quadratic call-stack walk.

Every ``@T.prim_func`` calls ``inspect.stack()`` (twice: once more when the parser evaluates the
decorator), and ``inspect.stack`` resolves each frame's module: for a frame whose file is no
module's (``<frozen importlib._bootstrap>`` while a module imports, ``<ast>`` inside the parser)
``inspect.getmodule`` scans every loaded module, each time. Inside a convert, with ~1,200 modules
loaded, importing ``tvm.s_tir.tensor_intrin`` (248 TVMScript functions, which DLight's tensor-core
rule imports for any CUDA float16 GEMM) took 37 s of CPU; with ``cheap_frame_stack`` 3.9 s
(measured on this 2-core machine). TVMScript reads only ``frame``, ``lineno`` and ``code_context``
of the records.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
from types import FrameType

from amptool._tvm.swap import SwappedAttributes


def _frame_record(frame: FrameType, context: int) -> inspect.FrameInfo:
    """``inspect.getframeinfo`` for one frame, its source lines read through ``linecache`` with the
    frame's globals (so a zip-imported module's source is found as inspect finds it) and without
    asking which module the file belongs to. ``positions`` (3.11+) is left None."""
    filename = frame.f_code.co_filename
    lineno = frame.f_lineno
    code_context: list[str] | None = None
    index: int | None = None
    if context > 0:
        lines = linecache.getlines(filename, frame.f_globals)
        if lines and 0 < lineno <= len(lines):
            start = max(0, min(lineno - 1 - context // 2, len(lines) - context))
            code_context = lines[start:start + context]
            index = lineno - 1 - start
    return inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, code_context, index)


def _outer_frames(frame: FrameType | None, context: int = 1) -> list[inspect.FrameInfo]:
    records = []
    while frame is not None:
        records.append(_frame_record(frame, context))
        frame = frame.f_back
    return records


def _stack(context: int = 1) -> list[inspect.FrameInfo]:
    return _outer_frames(sys._getframe(1), context)


_CHEAP_FRAME_STACK = SwappedAttributes(lambda: inspect,
                                       lambda _inspect: {"stack": _stack, "getouterframes": _outer_frames})


def cheap_frame_stack() -> contextlib.AbstractContextManager[None]:
    """Within the block, ``inspect.stack`` and ``inspect.getouterframes`` skip the module lookup
    (see the module docstring). Nestable and thread-safe: the originals come back when the last
    block in any thread exits; a caller in another thread meanwhile gets the same records, less
    ``positions``."""
    return _CHEAP_FRAME_STACK.block()
