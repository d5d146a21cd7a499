"""Attributes of a class or module replaced while any thread is inside a block: nestable and
thread-safe, the originals back when the last block exits. How amptool speeds up TVM's Python
layer (``script.cheap_frame_stack``, ``schedule.unchecked_schedules``) without changing TVM for
the rest of a process that imports amptool as a library."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


class SwappedAttributes:
    """``owner()``'s attributes set to ``replacements()`` inside ``block()``; both are called at the
    first entry, so a lazily imported owner (TVM) is imported only when a block runs."""

    def __init__(self, owner: Callable[[], Any], replacements: Callable[[Any], dict[str, Any]]) -> None:
        self._owner = owner
        self._replacements = replacements
        self._lock = threading.Lock()
        self._depth = 0
        self._original: dict[str, Any] = {}
        self._target: Any = None

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._target = self._owner()
                for name, value in self._replacements(self._target).items():
                    self._original[name] = self._target.__dict__[name]
                    setattr(self._target, name, value)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for name, value in self._original.items():
                        setattr(self._target, name, value)
                    self._original.clear()
