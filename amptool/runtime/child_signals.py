"""Ctrl-C belongs to the parent: child processes (bench workers, remote sessions) start with SIGINT
ignored, and the parent decides when they stop."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a child is started: a spawned child keeps SIG_IGN through exec."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a child may then see Ctrl-C too
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
