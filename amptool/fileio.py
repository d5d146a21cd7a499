"""Never leave a half-written output: write to a temporary sibling, then rename."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = "") -> Iterator[str]:
    """Yield a temporary path next to ``path``; it replaces ``path`` only on success."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, payload: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, allow_nan=False)
        handle.write("\n")


def finite_only(value: Any) -> Any:
    """JSON has no Inf/NaN: non-finite floats become null (counts elsewhere say what happened)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_only(v) for v in value]
    return value
